/* stream.h - when a held HTML request gets its page in two parts: the
 * decisions of the streamed page (docs/answers.md, "While a browser
 * waits: the streamed page"), as plain code.
 *
 * A browser's top-level navigation (Sec-Fetch-Dest: document) whose answer
 * is not known yet gets, as soon as its transaction is known undecided and
 * at the latest first_paint_ms after it came, the headers and the waiting
 * top of its page; then a comment every STREAM_COMMENT_MS while nothing
 * else is known; the result part goes out when the held request is
 * answered (the resolver decides that, not this module). Nothing here does
 * I/O or reads a clock: the caller passes `now`, the tests a fake one. */
#ifndef KEMBALI_STREAM_H
#define KEMBALI_STREAM_H

#include <stdbool.h>
#include <stdint.h>

#include "state.h"

#define STREAM_FIRST_PAINT_MS_DEFAULT 1000
#define STREAM_FIRST_PAINT_MS_MIN 0      /* 0: the top goes out as soon as the request is held */
#define STREAM_FIRST_PAINT_MS_MAX 10000  /* later than this leaves the buyer staring at the old page */
#define STREAM_COMMENT_MS 20000          /* a few bytes this often, so no proxy's read timeout ends a wait */

/* True when a request may get the streamed page: an HTML answer (not
 * JSON), not HEAD, its Sec-Fetch-Dest (NULL when absent) exactly
 * "document", its shop's `progressive` on and its templates able to stream.
 * This function can't fail. */
bool stream_wanted(bool json, bool head, const char *sec_fetch_dest, bool progressive, bool templates_can);

/* True when fact f shows the transaction undecided: a read came back
 * without a final status (pending, or a status kembali does not know), or,
 * with `in_flight_counts` (the fact seen when the request came, before it
 * started any read of its own), a read of it is under way. A final status,
 * a remembered 404 or nothing known yet is not. This function can't fail. */
bool stream_undecided(const struct state_fact *f, bool in_flight_counts);

/* The clock of one streamed request. */
struct stream_clock {
    int64_t arrived;    /* when the request came */
    int64_t painted;    /* when the top went out (0: not yet) */
    int64_t last_sent;  /* when the last part went out (the top or a comment) */
};

enum stream_do {
    STREAM_WAIT,        /* nothing to send now; look again at *wake */
    STREAM_PAINT,       /* send the headers and the waiting top now */
    STREAM_COMMENT,     /* send a comment now (the top went out long ago) */
};

/* When the next part of a request with clock c, whose transaction is
 * known `undecided` or not, is due: the top at once (c->arrived) when
 * undecided, else at arrived + first_paint_ms (0: at once too); once the
 * top went out, a comment STREAM_COMMENT_MS after the last part. Where
 * the caller arms its timer, from the request's arrival on. This function
 * can't fail. */
int64_t stream_due(const struct stream_clock *c, bool undecided, long first_paint_ms);

/* What to send at `now` for a request with clock c, whose transaction is
 * known `undecided` or not, and when to look again (*wake, after the
 * caller has done what it says and updated c): whatever stream_due()
 * says is due by now. This function can't fail. */
enum stream_do stream_step(const struct stream_clock *c, bool undecided, long first_paint_ms, int64_t now,
                           int64_t *wake);

#endif
