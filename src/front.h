/* front.h - the FastCGI side: accept threads, request parsing, answers.
 *
 * A few accept threads take requests with FCGX_Accept_r, parse and
 * validate them, and answer at once whatever is known (invalid id, unknown
 * shop, 405, metrics, a cached final status). A request that must wait is
 * parked with the resolver (resolver_park) and the thread goes back to
 * accepting: a held request costs its FCGX_Request, not a thread. The
 * answer is written by whoever completes it, with front_respond(). */
#ifndef KEMBALI_FRONT_H
#define KEMBALI_FRONT_H

#include <fcgiapp.h>
#include <stdbool.h>
#include <stdint.h>

#include "app.h"
#include "request.h"
#include "state.h"

struct req {
    FCGX_Request fcgx;
    struct config *cfg;        /* a reference, dropped when answered */
    const struct shop *shop;   /* in cfg */
    char id[STATE_ID_MAX + 1];
    bool json, head;
    const char *origin;        /* an allowed CORS origin (in cfg), or NULL */
    int64_t arrived, deadline;
    bool wants_read;           /* JSON: answer when the read in flight ends */
    struct req *next;          /* the resolver's list */
};

/* Write the answer, finish the FastCGI request, log one line, free r.
 * Client errors (the buyer left) are ignored. Can't fail. */
void front_respond(struct app *a, struct req *r, const struct answer *ans);

/* Start n accept threads on a.listen_fd. Returns 0 or -1 (logged). */
int front_start(struct app *a, int nthreads);

/* Stop accepting and join the accept threads. */
void front_stop(struct app *a);

#endif
