/* pace.h - the read schedule as arithmetic.
 *
 * Pure functions over times in ms (the caller passes `now`). The schedule is
 * the list of waits before each read of an episode: by default
 * 0, 1500, 2000, 3000, 5000, 8000, 13000 (reads at 0, 1.5, 3.5, 6.5, 11.5,
 * 19.5 and 32.5 s). After the last wait, the last wait repeats. An episode
 * ends when its last read started more than PACE_EPISODE_MS ago. */
#ifndef KEMBALI_PACE_H
#define KEMBALI_PACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PACE_MAX_STEPS 16
#define PACE_EPISODE_MS 60000
#define PACE_MIN_WAIT_MS 1100   /* every wait after the first: a margin over Kasera's 1 s */
#define PACE_MAX_WAIT_MS 30000
#define PACE_GRACE_MS 1500      /* a held request's deadline is the schedule's sum plus this */

struct pace_schedule {
    int n;
    int64_t wait_ms[PACE_MAX_STEPS];
};

/* The default schedule of the seed. This function can't fail. */
void pace_default(struct pace_schedule *s);

/* Check a schedule; on error writes a plain-words reason into err and
 * returns false. */
bool pace_valid(const struct pace_schedule *s, char *err, size_t errlen);

/* Sum of all waits (32500 by default). */
int64_t pace_sum(const struct pace_schedule *s);

/* How long a held HTML request may wait: the sum plus PACE_GRACE_MS. */
int64_t pace_hold_ms(const struct pace_schedule *s);

/* How many reads the schedule makes in its first `span` ms (the first at
 * 0). This function can't fail. */
int pace_reads_within(const struct pace_schedule *s, int64_t span);

/* True when a transaction whose last read started at last_start (reads > 0)
 * is still in the same episode at `now`. */
bool pace_in_episode(int reads, int64_t last_start, int64_t now);

/* The earliest start of the next read, by the schedule alone, for an episode
 * in which `reads` reads were made, the last starting at last_start.
 * Returns `now` when no episode is running (reads == 0 or it has ended). */
int64_t pace_next_read(const struct pace_schedule *s, int reads, int64_t last_start, int64_t now);

/* The schedule's wait after the `reads`-th read of an episode (reads >= 1;
 * less is taken as 1): its wait at that step, the last one repeating, never
 * below PACE_MIN_WAIT_MS. pace_next_read() waits this long. Can't fail. */
int64_t pace_wait(const struct pace_schedule *s, int reads);

#endif
