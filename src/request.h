/* request.h - the pure parts of answering a request (no I/O, no clock).
 *
 * These decide what a request gets; serve.c sends it. */
#ifndef KEMBALI_REQUEST_H
#define KEMBALI_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "render.h"
#include "state.h"
#include "word.h"

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
 * Parameters are separated by '&' only (as browsers and the WHATWG URL
 * standard do: ';' is part of a value, so "id=a;b" gives "a;b"); names are
 * decoded like values ("%69d" is "id"), a name without '=' has the empty
 * value. Returns false when absent, when the first value does not fit
 * (cap includes the NUL), or when it would contain a NUL byte (%00); a
 * later parameter of the same name is never used instead. Pure. */
bool request_query_param(const char *query, const char *name, char *out, size_t cap);

/* True when an Accept header prefers JSON (docs/answers.md):
 * application/json itself is given with q > 0 (the highest q given for it
 * counts), and that q is not below text/html's, which comes from the most
 * specific of text/html, text/ *, * / * (0 when none is given; so "* / *"
 * alone is HTML, and a tie is JSON). Media types and the parameter name q
 * are case-insensitive; whitespace around ',' and ';', quoted parameter
 * values and empty list elements are allowed; parameters other than q are
 * ignored. A malformed media range, or one whose q is not a qvalue ("0",
 * "0.5", "1.000"; not "1.5", ".5", "0.1234", "\"1\""), is ignored as if it
 * were not there. Pure. */
bool request_wants_json(const char *accept);

#define REQUEST_NOTIFY_BODY_MAX 8192 /* bytes of a notify body */

/* The status a notify body tells. `body` (len bytes, not NUL-terminated)
 * must be a JSON object whose member "status" is one of Kasera's status
 * words: pending, succeeded, failed, canceled or expired (other members are
 * ignored). Returns true and sets *out, or false with a reason in plain
 * words in why (a body over REQUEST_NOTIFY_BODY_MAX bytes is refused
 * unread). Pure: no I/O. */
bool request_notify_status(const char *body, size_t len, enum tx_status *out, char *why, size_t whylen);

#endif
