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

int64_t stream_due(const struct stream_clock *c, bool undecided, long first_paint_ms)
{
    if (c->painted == 0)
        return undecided ? c->arrived : c->arrived + first_paint_ms;
    return c->last_sent + STREAM_COMMENT_MS;
}

enum stream_do stream_step(const struct stream_clock *c, bool undecided, long first_paint_ms, int64_t now,
                           int64_t *wake)
{
    int64_t due = stream_due(c, undecided, first_paint_ms);
    if (now < due) {
        *wake = due;
        return STREAM_WAIT;
    }
    *wake = now + STREAM_COMMENT_MS;
    return c->painted == 0 ? STREAM_PAINT : STREAM_COMMENT;
}
