/* metrics.h - the metrics page: one table of every metric, and its text.
 *
 * Every metric kembali exports is one row of the table in metrics.c:
 * {name, type, help, where its value is read, label}. The page is written
 * from that table only, so each metric gets exactly one `# HELP` and one
 * `# TYPE` line (Prometheus text format 0.0.4), counters end in `_total`
 * and gauges do not (the unit tests check the rendered page; the
 * integration tests run `promtool check metrics` on it). Adding a metric:
 * a field where it is counted (struct app_metrics, struct state_metrics,
 * struct state_redis_metrics, struct metrics_front, struct metrics_held or
 * struct metrics_shop) and one row. The alerting rules and the dashboard
 * (contrib/monitoring/) name these metrics: a test checks each is served. */
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

/* The held requests' caps and use (serve.c), read by the caller. */
struct metrics_held {
    long max_held;              /* the configuration's max_held (after the descriptor cap) */
    long max_held_per_shop;     /* its max_held_per_shop */
    long busiest_shop;          /* the most requests held now for one shop */
    long shops_active;          /* shops whose key read in the last 60 s or is paused */
};

/* The most shops the page lists one by one (struct metrics_shop): a box
 * with more in use at once lists the first of them in the configuration's
 * order (kembali_shops_active counts them all), so the page stays far
 * under its buffer's ceiling whatever the number of shops. */
#define METRICS_SHOPS_MAX 1000

/* One shop in use (its key read in the last 60 s, or is paused), listed
 * by the caller. Only such shops are listed: a box with 10,000 shops
 * mostly idle has a page of the few in use. */
struct metrics_shop {
    const char *id;             /* the configuration's id: [A-Za-z0-9_-], nothing to escape */
    long reads;                 /* reads started with its key in the last 60 s (state_key_usage) */
    long budget;                /* its read_budget_per_minute */
    long paused;                /* 1 while its key is paused (a 401 or a per-key 429), else 0 */
};

/* Everything a page is written from, read by the caller just before. */
struct metrics_src {
    struct app_metrics *app;    /* read here with atomic loads */
    struct state_metrics state;
    struct metrics_front front;
    struct metrics_held held;
    const struct metrics_shop *shops; /* nshops (at most METRICS_SHOPS_MAX) of them; may be NULL when 0 */
    int nshops;
    bool has_redis;             /* without Redis its rows are left out */
    struct state_redis_metrics redis;
};

/* Append the page for `src` to b. DYNBUF_OK, or b's failure (dynbuf.h):
 * then b holds nothing and there is no page to send. */
enum dynbuf_rc metrics_render(const struct metrics_src *src, struct dynbuf *b) DYNBUF_CHECKED;

#endif
