/* metrics.h - the metrics page: one table of every metric, and its text.
 *
 * Every metric kembali exports is one row of the table in metrics.c:
 * {name, type, help, where its value is read, label}. The page is written
 * from that table only, so each metric gets exactly one `# HELP` and one
 * `# TYPE` line (Prometheus text format 0.0.4), counters end in `_total`
 * and gauges do not (the unit tests check the rendered page; the
 * integration tests run `promtool check metrics` on it). Adding a metric:
 * a field where it is counted (struct app_metrics, struct state_metrics,
 * struct state_redis_metrics or struct metrics_front) and one row. */
#ifndef KEMBALI_METRICS_H
#define KEMBALI_METRICS_H

#include <stdbool.h>

#include "app.h"
#include "dynbuf.h"
#include "state.h"
#include "state_redis.h"

/* The FastCGI front's counts (front.h), read by the caller. */
struct metrics_front {
    long connections;           /* open now */
    long accepted;              /* accepted since the start */
};

/* Everything a page is written from, read by the caller just before. */
struct metrics_src {
    struct app_metrics *app;    /* read here with atomic loads */
    struct state_metrics state;
    struct metrics_front front;
    bool has_redis;             /* without Redis its rows are left out */
    struct state_redis_metrics redis;
};

/* Append the page for `src` to b. DYNBUF_OK, or b's failure (dynbuf.h):
 * then b holds nothing and there is no page to send. */
enum dynbuf_rc metrics_render(const struct metrics_src *src, struct dynbuf *b) DYNBUF_CHECKED;

#endif
