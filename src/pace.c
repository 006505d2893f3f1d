/* pace.c - see pace.h. */
#include <stdio.h>

#include "pace.h"

void pace_default(struct pace_schedule *s)
{
    static const int64_t def[] = {0, 1500, 2000, 3000, 5000, 8000, 13000};
    s->n = (int)(sizeof def / sizeof def[0]);
    for (int i = 0; i < s->n; i++)
        s->wait_ms[i] = def[i];
}

bool pace_valid(const struct pace_schedule *s, char *err, size_t errlen)
{
    if (s->n < 1 || s->n > PACE_MAX_STEPS) {
        snprintf(err, errlen, "must list 1 to %d waits", PACE_MAX_STEPS);
        return false;
    }
    if (s->wait_ms[0] < 0 || s->wait_ms[0] > PACE_MAX_WAIT_MS) {
        snprintf(err, errlen, "the first wait must be 0 to %d ms", PACE_MAX_WAIT_MS);
        return false;
    }
    for (int i = 1; i < s->n; i++) {
        if (s->wait_ms[i] < PACE_MIN_WAIT_MS || s->wait_ms[i] > PACE_MAX_WAIT_MS) {
            snprintf(err, errlen,
                     "wait %d is %lld ms; every wait after the first must be %d to %d ms "
                     "(Kasera allows one read per second per transaction)",
                     i + 1, (long long)s->wait_ms[i], PACE_MIN_WAIT_MS, PACE_MAX_WAIT_MS);
            return false;
        }
    }
    return true;
}

int64_t pace_sum(const struct pace_schedule *s)
{
    int64_t sum = 0;
    for (int i = 0; i < s->n; i++)
        sum += s->wait_ms[i];
    return sum;
}

int64_t pace_hold_ms(const struct pace_schedule *s)
{
    return pace_sum(s) + PACE_GRACE_MS;
}

bool pace_in_episode(int reads, int64_t last_start, int64_t now)
{
    return reads > 0 && now - last_start <= PACE_EPISODE_MS;
}

int64_t pace_next_read(const struct pace_schedule *s, int reads, int64_t last_start, int64_t now)
{
    if (!pace_in_episode(reads, last_start, now))
        return now;
    return last_start + pace_wait(s, reads);
}

int64_t pace_wait(const struct pace_schedule *s, int reads)
{
    if (reads < 1)
        reads = 1;
    int step = reads < s->n ? reads : s->n - 1;
    int64_t wait = s->wait_ms[step];
    if (wait < PACE_MIN_WAIT_MS)
        wait = PACE_MIN_WAIT_MS; /* a one-step schedule repeats its first wait */
    return wait;
}

int pace_reads_within(const struct pace_schedule *s, int64_t span)
{
    int n = 0;
    for (int64_t t = 0; t <= span && n < 1000; n++)
        t += pace_wait(s, n + 1);
    return n;
}
