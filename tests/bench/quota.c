/* quota.c - what a refusal at a key's slot quota costs (state_table.c).
 *
 *     tests/bench/quota [SLOTS [REFUSALS]]     (make bench-quota)
 *
 * One key holds its whole quota (state_slots_per_key, a quarter of SLOTS,
 * default 262,144) with held requests, so none of its entries can make
 * room; the rest of the table holds other keys' idle entries (told
 * statuses). Each of REFUSALS (default 2000) requests held for a new id of
 * that key (state_hold) is refused (checking): printed are the
 * microseconds per refusal (mean, median, 99th percentile, max), wall
 * clock, one process, no contention. A figure, not a test: the unit tests
 * count what a refusal looks at (test_state.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pace.h"
#include "state.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int slots = argc > 1 ? atoi(argv[1]) : 262144;
    int refusals = argc > 2 ? atoi(argv[2]) : 2000;
    if (slots < 16 || refusals < 1) {
        fprintf(stderr, "usage: %s [SLOTS >= 16 [REFUSALS >= 1]]\n", argv[0]);
        return 2;
    }
    struct state_opts o = {.tx_slots = slots, .read_timeout_ms = 30000};
    char err[256];
    struct state *st = state_new(&o, err, sizeof err);
    if (st == NULL) {
        fprintf(stderr, "state_new: %s\n", err);
        return 1;
    }
    struct pace_schedule sched;
    pace_default(&sched);
    struct state_metrics m;
    state_metrics(st, &m);
    int quota = (int)m.tx_per_key;
    int64_t t0 = 10000000;
    char id[40];
    /* other keys' entries (told statuses: idle) */
    int others = slots - quota;
    for (int i = 0; i < others; i++) {
        char secret[32];
        struct state_key k;
        snprintf(secret, sizeof secret, "sk_other_%d", i % 128);
        state_key_id(st, secret, &k);
        snprintf(id, sizeof id, "O%d", i);
        state_tell(st, &k, id, TXS_SUCCEEDED, "succeeded", t0);
    }
    /* the hammered key: its whole quota held (none idle) */
    struct state_key a;
    state_key_id(st, "sk_hammered", &a);
    int64_t t1 = t0 + PACE_EPISODE_MS + 1000;
    for (int i = 0; i < quota; i++) {
        snprintf(id, sizeof id, "A%d", i);
        if (!state_hold(st, &a, id, &sched, 300, t1 + 34000, t1, NULL)) {
            fprintf(stderr, "filling the quota: hold %d refused\n", i);
            return 1;
        }
    }
    double *us = calloc((size_t)refusals, sizeof *us);
    if (us == NULL)
        return 1;
    int refused = 0;
    for (int i = 0; i < refusals; i++) {
        snprintf(id, sizeof id, "N%d", i);
        double s = now_us();
        bool ok = state_hold(st, &a, id, &sched, 300, t1 + 35000, t1 + 1000, NULL);
        us[i] = now_us() - s;
        refused += !ok;
    }
    qsort(us, (size_t)refusals, sizeof *us, cmp_double);
    double sum = 0;
    for (int i = 0; i < refusals; i++)
        sum += us[i];
    state_metrics(st, &m);
    printf("quota refusal at %d slots (quota %d, %d refused of %d, quota_full %ld): "
           "mean %.1f us, median %.1f us, p99 %.1f us, max %.1f us\n",
           slots, quota, refused, refusals, m.quota_full, sum / refusals, us[refusals / 2],
           us[(int)(refusals * 0.99)], us[refusals - 1]);
    free(us);
    state_free(st);
    return refused == refusals ? 0 : 1;
}
