/* stream.c - see stream.h. */
#include "stream.h"

#include <string.h>

bool stream_wanted(bool json, bool head, const char *sec_fetch_dest, bool progressive, bool templates_can)
{
    return !json && !head && progressive && templates_can && sec_fetch_dest != NULL &&
           strcmp(sec_fetch_dest, "document") == 0;
}

bool stream_undecided(const struct state_fact *f, bool in_flight_counts)
{
    if (f->final || f->not_found)
        return false;
    if (f->status != TXS_NONE)
        return true; /* a read came back, and said nothing final */
    return in_flight_counts && f->in_flight;
}

enum stream_do stream_step(const struct stream_clock *c, bool undecided, long first_paint_ms, int64_t now,
                           int64_t *wake)
{
    if (c->painted == 0) {
        int64_t at = c->arrived + first_paint_ms;
        if (undecided || now >= at) {
            *wake = now + STREAM_COMMENT_MS;
            return STREAM_PAINT;
        }
        *wake = at;
        return STREAM_WAIT;
    }
    int64_t next = c->last_sent + STREAM_COMMENT_MS;
    if (now >= next) {
        *wake = now + STREAM_COMMENT_MS;
        return STREAM_COMMENT;
    }
    *wake = next;
    return STREAM_WAIT;
}
