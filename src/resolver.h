/* resolver.h - the one thread that reads the API and answers held requests.
 *
 * It owns the API client (one libcurl multi handle) and a timer per
 * transaction it watches. For each watched transaction it asks the state
 * whether a read may start (state_claim), starts it, and when the read ends
 * classifies the answer, reports it (state_finish) and answers the waiters
 * that can be answered: a final status, a 404, the JSON requests waiting for
 * that read, and HTML requests whose deadline passed or before whose
 * deadline no further read can start. No lock is held across network I/O. */
#ifndef KEMBALI_RESOLVER_H
#define KEMBALI_RESOLVER_H

#include <stddef.h>

#include "app.h"
#include "front.h"

/* Create the resolver (and its API client). NULL with a reason on failure. */
struct resolver *resolver_new(struct app *a, char *err, size_t errlen);

/* Start its thread. Returns 0, or -1 (logged). */
int resolver_start(struct resolver *rs);

/* Hand over a request that must wait; safe from any thread. The resolver
 * answers it (front_respond) no later than its deadline. */
void resolver_park(struct resolver *rs, struct req *r);

/* Answer every parked request with what is known, stop the thread.
 * Requests parked after this are answered at once. */
void resolver_stop(struct resolver *rs);

void resolver_free(struct resolver *rs);

#endif
