/* request.h - the pure parts of answering a request (no I/O, no clock).
 *
 * These decide what a request gets; front.c only writes it. */
#ifndef KEMBALI_REQUEST_H
#define KEMBALI_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "render.h"
#include "state.h"

/* What to answer. retry_after_s < 0: no Retry-After header. */
struct answer {
    enum word word;
    const char *json_status;   /* Kasera's last known status word, or "unknown" */
    bool final;
    long retry_after_s;
};

/* The answer a request gets from what the state knows at `now`. */
void request_answer(const struct state_fact *f, int64_t now, struct answer *out);

/* Find `name` in a query string and URL-decode its first value into out.
 * Returns false when absent, when the decoded value does not fit, or when
 * it would contain a NUL byte (%00). */
bool request_query_param(const char *query, const char *name, char *out, size_t cap);
/* True when an Accept header asks for JSON. */
bool request_wants_json(const char *accept);

#endif
