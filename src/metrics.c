/* metrics.c - see metrics.h. */
#include "metrics.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>

#include "classify.h"
#include "render.h"
#include "word.h"

/* METRIC_COUNTER_MS: a counter of milliseconds, shown in seconds (the
 * base unit promtool asks for), its thousandths kept. */
enum metrics_type { METRIC_COUNTER, METRIC_GAUGE, METRIC_COUNTER_MS };

/* Which source a row's value is read from. */
enum metrics_from { FROM_APP, FROM_STATE, FROM_FRONT, FROM_HELD, FROM_SHOP, FROM_REDIS, FROM_SENTINEL };

/* One metric. Its value is the long (an atomic_long for FROM_APP) at `off`
 * in its source (FROM_SENTINEL: src->redis, its rows only with Sentinels); a
 * labelled metric has `labels` values at consecutive longs from there, the
 * i-th named label_value(src, i), a sample left out where that is NULL (and
 * the metric, HELP and TYPE too, where every one is). A FROM_SHOP row has
 * one sample per listed shop (src->nshops, `labels` unused): the long at
 * `off` in src->shops[i], labelled with its id. */
struct metrics_row {
    const char *name;
    enum metrics_type type;
    const char *help;           /* one line: no newline, no backslash */
    enum metrics_from from;
    size_t off;
    const char *label;          /* NULL: one sample without labels */
    int labels;
    const char *(*label_value)(const struct metrics_src *src, int i);
};

/* The offset of field f of T, which must be a `want` (else no case of the
 * _Generic matches and the build fails): a field of another type can't be
 * read as a long by mistake. */
#define FIELD(T, f, want) (offsetof(T, f) + 0 * _Generic(&((T *)0)->f, want *: 0))
#define APP(f) FROM_APP, FIELD(struct app_metrics, f, atomic_long)
#define STATE(f) FROM_STATE, FIELD(struct state_metrics, f, long)
#define FRONT(f) FROM_FRONT, FIELD(struct metrics_front, f, long)
#define HELD(f) FROM_HELD, FIELD(struct metrics_held, f, long)
#define SHOP(f) FROM_SHOP, FIELD(struct metrics_shop, f, long)
#define REDIS(f) FROM_REDIS, FIELD(struct state_redis_metrics, f, long)
#define SENTINEL(f) FROM_SENTINEL, FIELD(struct state_redis_metrics, f, long)
#define C METRIC_COUNTER
#define G METRIC_GAUGE

static const char *word_label(const struct metrics_src *src, int i)
{
    (void)src;
    return word_name((enum word)i);
}

static const char *outcome_label(const struct metrics_src *src, int i)
{
    (void)src;
    return classify_outcome_name((enum outcome_kind)i);
}

/* Why a held request's next read could not be made (enum state_wait):
 * the reason of kembali_checking_answers_total. */
static const char *wait_label(const struct metrics_src *src, int i)
{
    static const char *const names[] = {
        [WAIT_NONE] = "none",          [WAIT_PACE] = "pace",          [WAIT_RETRY] = "retry_after",
        [WAIT_KEY_PAUSE] = "key_paused", [WAIT_HOST_PAUSE] = "host_paused", [WAIT_BUDGET] = "budget",
        [WAIT_FULL] = "full",          [WAIT_CLIENT] = "client",      [WAIT_AUTH] = "auth_allowance",
    };
    (void)src;
    return (unsigned)i < sizeof names / sizeof names[0] ? names[i] : NULL;
}

static const char *shop_label(const struct metrics_src *src, int i)
{
    return src->shops[i].id;
}

/* The master last joined, "IP:PORT" (nothing to escape); NULL before the
 * first. */
static const char *master_label(const struct metrics_src *src, int i)
{
    (void)i;
    return src->redis.master[0] != '\0' ? src->redis.master : NULL;
}

/* Every metric, in the page's order. The names are kept as dashboards and
 * tests know them. */
static const struct metrics_row rows[] = {
    {"kembali_answers_total", C, "Answers by status word.", APP(requests[0]), "status", W_COUNT, word_label},
    {"kembali_checking_answers_total", C,
     "Held requests answered checking, by why no further read could be made for them (pace: the schedule ran "
     "out without a final status; auth_allowance: a key Kasera has not accepted, while auth_failures_per_minute "
     "is spent).", APP(checking[0]), "reason", WAIT_AUTH + 1, wait_label},
    {"kembali_json_answers_total", C, "Answers in JSON (format=json, or an Accept that prefers it).",
     APP(json_answers), NULL, 0, NULL},
    {"kembali_held_answers_total", C, "Held requests answered (a client gone before its answer is not counted).",
     APP(held_answered), NULL, 0, NULL},
    {"kembali_held_answer_seconds_total", METRIC_COUNTER_MS,
     "Seconds the answered held requests waited for their answer, summed.",
     APP(held_ms), NULL, 0, NULL},
    {"kembali_method_not_allowed_total", C, "Requests with a method other than GET and HEAD (405).",
     APP(method_not_allowed), NULL, 0, NULL},
    {"kembali_api_reads_total", C, "Reads of the Kasera API by outcome.", APP(reads[0]), "outcome", OUT_NO_ANSWER + 1,
     outcome_label},
    {"kembali_api_reads_started_total", C, "Reads of the Kasera API started.", APP(reads_started), NULL, 0, NULL},
    {"kembali_api_connections_total", C, "Connections to the Kasera API opened.", APP(connections), NULL, 0, NULL},
    {"kembali_held_requests", G, "Requests held until their answer is due, now.", APP(held), NULL, 0, NULL},
    {"kembali_held_requests_peak", G, "The most requests held at once since the start.", APP(held_peak), NULL, 0,
     NULL},
    {"kembali_held_requests_max", G, "The most requests one process holds at once (max_held).", HELD(max_held),
     NULL, 0, NULL},
    {"kembali_held_requests_per_shop_max", G, "The most requests one process holds at once for one shop "
     "(max_held_per_shop).", HELD(max_held_per_shop), NULL, 0, NULL},
    {"kembali_held_requests_busiest_shop", G, "Requests held now for the shop with the most held.",
     HELD(busiest_shop), NULL, 0, NULL},
    {"kembali_budget_waits_total", C,
     "Held transactions whose next read waited for the key's read budget (spent, or kept for last-chance reads "
     "by the flash-sale plan), once per transaction held.", APP(budget_waits), NULL, 0, NULL},
    {"kembali_streamed_pages_total", C, "Streamed pages whose waiting top went out.", APP(streamed), NULL, 0, NULL},
    {"kembali_streamed_pages_cut_total", C,
     "Streamed pages that ended without their result (it could not be built): the buyer kept the waiting top.",
     APP(streamed_cut), NULL, 0, NULL},
    {"kembali_answers_without_wait_total", C, "Requests answered at once from what was known.", APP(cache_answers),
     NULL, 0, NULL},
    {"kembali_probe_answers_total", C,
     "Requests for unknown ids from a blocked client (per shop key and address), or one whose 404s and reads in "
     "flight make 5, answered without a read.", APP(probes_refused), NULL, 0, NULL},
    {"kembali_notify_conflicts_total", C, "Told statuses refused (409) because another final status is known.",
     APP(notify_conflicts), NULL, 0, NULL},
    {"kembali_held_cap_answers_total", C,
     "Requests answered at once because max_held or max_held_per_shop was reached.", APP(over_cap), NULL, 0, NULL},
    {"kembali_fastcgi_connections", G, "FastCGI connections open now.", FRONT(connections), NULL, 0, NULL},
    {"kembali_fastcgi_connections_total", C, "FastCGI connections accepted.", FRONT(accepted), NULL, 0, NULL},
    {"kembali_state_entries", G, "Transactions in the state now.", STATE(tx_used), NULL, 0, NULL},
    {"kembali_state_slots", G, "Transaction slots in the state.", STATE(tx_slots), NULL, 0, NULL},
    {"kembali_state_evictions_total", C, "Transactions forgotten to make room.", STATE(evictions), NULL, 0, NULL},
    {"kembali_state_full_total", C, "Transactions that found no slot (answered checking).", STATE(full), NULL, 0,
     NULL},
    {"kembali_state_slots_per_key", G, "The most slots one key's transactions may take (state_slots_per_key).",
     STATE(tx_per_key), NULL, 0, NULL},
    {"kembali_state_quota_full_total", C,
     "Times a new transaction found no room (checking) because its key held state_slots_per_key entries in use.",
     STATE(quota_full), NULL, 0, NULL},
    {"kembali_reads_reserved", G, "Last-chance reads reserved for held requests (the budget's plan).",
     STATE(reserved), NULL, 0, NULL},
    {"kembali_last_chance_reads_total", C, "Last-chance reads made from the reserve.", STATE(last_chance_reads), NULL,
     0, NULL},
    {"kembali_state_recoveries_total", C,
     "Times a process died holding the state lock and the state was rebuilt.", STATE(recoveries), NULL, 0, NULL},
    {"kembali_state_repairs_total", C, "State checks (open, recovery) that found something to repair.",
     STATE(repairs), NULL, 0, NULL},
    {"kembali_state_stale_locks_total", C, "State opens that found the lock held by no live user.",
     STATE(stale_locks), NULL, 0, NULL},
    {"kembali_state_keys", G, "API keys in the state now.", STATE(key_used), NULL, 0, NULL},
    {"kembali_state_key_slots", G, "API key slots in the state.", STATE(key_slots), NULL, 0, NULL},
    {"kembali_state_key_evictions_total", C, "Idle API keys forgotten to make room.", STATE(key_evictions), NULL, 0,
     NULL},
    {"kembali_state_key_full_total", C, "API keys that found no slot (answered checking).", STATE(key_full), NULL, 0,
     NULL},
    {"kembali_host_paused", G,
     "1 while Kasera's failed-authentication limiter blocks this host (every key paused), else 0.",
     STATE(host_paused), NULL, 0, NULL},
    {"kembali_auth_failures_last_minute", G,
     "Reads that ended in 401 in the last 60 s on this host, and reads in flight with a key Kasera has not "
     "accepted: at auth_failures_per_minute, such keys make no read.",
     STATE(auth_failures), NULL, 0, NULL},
    {"kembali_auth_failures_per_minute", G, "The host's auth_failures_per_minute (this process's configuration).",
     STATE(auth_allowance), NULL, 0, NULL},
    {"kembali_shops_active", G, "Shops whose key read in the last 60 s or is paused now.", HELD(shops_active), NULL,
     0, NULL},
    {"kembali_shop_reads_last_minute", G,
     "Reads started with the shop's key in the last 60 s (with Redis, other hosts' too; shops in use only).",
     SHOP(reads), "shop", 0,
     shop_label},
    {"kembali_shop_read_budget", G, "The shop's read_budget_per_minute (shops in use only).", SHOP(budget), "shop",
     0, shop_label},
    {"kembali_shop_key_paused", G, "1 while the shop's key is paused by a 401 or a per-key 429 (shops in use only).",
     SHOP(paused), "shop", 0, shop_label},
    {"kembali_clients_blocked", G, "Clients blocked for probing now.", STATE(clients_blocked), NULL, 0, NULL},
    {"kembali_client_blocks_total", C, "Blocks of probing clients started.", STATE(client_blocks), NULL, 0, NULL},
    {"kembali_client_full_total", C, "Answers 404 that found no room to be counted against their client.",
     STATE(client_full), NULL, 0, NULL},
    {"kembali_redis_up", G, "1 while this process uses Redis (joined, not fallen back to its own state).",
     REDIS(up), NULL, 0, NULL},
    {"kembali_redis_joins_total", C, "Times this process joined Redis.", REDIS(joins), NULL, 0, NULL},
    {"kembali_redis_leaves_total", C, "Times this process left Redis for its own state.", REDIS(leaves), NULL, 0,
     NULL},
    {"kembali_redis_round_trips_total", C, "Commands sent to Redis (idle PINGs not counted).", REDIS(round_trips),
     NULL, 0, NULL},
    {"kembali_redis_pings_total", C, "Idle PINGs sent to Redis.", REDIS(pings), NULL, 0, NULL},
    {"kembali_redis_claims_total", C, "Claims of a read asked of Redis.", REDIS(claims), NULL, 0, NULL},
    {"kembali_redis_claims_granted_total", C, "Claims of a read Redis granted.", REDIS(granted), NULL, 0, NULL},
    {"kembali_redis_messages_total", C, "Messages heard from other hosts through Redis.", REDIS(messages), NULL, 0,
     NULL},
    {"kembali_redis_written_back_total", C,
     "Final statuses written back to Redis after a stay down (those whose cache time had not run out).",
     REDIS(written_back), NULL, 0, NULL},
    {"kembali_redis_seeded_total", C,
     "This host's reads sent to Redis to make a key's count whole (at a join, or when it was found gone).",
     REDIS(seeded), NULL, 0, NULL},
    /* its value is `sentinel`, 1 wherever the row is shown */
    {"kembali_redis_master", G, "The master (named by the Sentinels) last joined.", SENTINEL(sentinel), "address", 1,
     master_label},
    {"kembali_redis_master_changes_total", C, "Joins of another master than the last (a failover seen).",
     SENTINEL(master_changes), NULL, 0, NULL},
    {"kembali_redis_sentinel_asks_total", C, "Questions put to one Sentinel.", SENTINEL(sentinel_asks), NULL, 0,
     NULL},
    {"kembali_redis_sentinel_failures_total", C,
     "Questions put to one Sentinel that it did not answer (down, too slow, refused, no such master).",
     SENTINEL(sentinel_failures), NULL, 0, NULL},
};

#undef APP
#undef STATE
#undef FRONT
#undef HELD
#undef SHOP
#undef REDIS
#undef SENTINEL
#undef C
#undef G
#undef FIELD

/* The i-th value of row r. */
static long row_value(const struct metrics_row *r, const struct metrics_src *src, int i)
{
    size_t off = r->off + (size_t)i * sizeof(long);
    switch (r->from) {
    case FROM_APP:
        return atomic_load((atomic_long *)((char *)src->app + r->off) + i);
    case FROM_STATE:
        return *(const long *)((const char *)&src->state + off);
    case FROM_FRONT:
        return *(const long *)((const char *)&src->front + off);
    case FROM_HELD:
        return *(const long *)((const char *)&src->held + off);
    case FROM_SHOP:
        return *(const long *)((const char *)&src->shops[i] + r->off);
    case FROM_REDIS:
    case FROM_SENTINEL:
        return *(const long *)((const char *)&src->redis + off);
    }
    return 0;
}

enum dynbuf_rc metrics_render(const struct metrics_src *src, struct dynbuf *b)
{
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        const struct metrics_row *r = &rows[k];
        if ((r->from == FROM_REDIS || r->from == FROM_SENTINEL) && !src->has_redis)
            continue;
        if (r->from == FROM_SENTINEL && !src->redis.sentinel)
            continue;
        int labels = r->from == FROM_SHOP ? src->nshops : r->labels;
        if (r->label != NULL) {
            int shown = 0;
            for (int i = 0; i < labels; i++)
                shown += r->label_value(src, i) != NULL;
            if (shown == 0)
                continue;
        }
        if (dynbuf_addf(b, "# HELP %s %s\n# TYPE %s %s\n", r->name, r->help, r->name,
                        r->type == METRIC_GAUGE ? "gauge" : "counter") != DYNBUF_OK)
            return dynbuf_error(b);
        if (r->label == NULL) {
            long v = row_value(r, src, 0);
            enum dynbuf_rc rc = r->type == METRIC_COUNTER_MS
                                    ? dynbuf_addf(b, "%s %ld.%03ld\n", r->name, v / 1000, labs(v % 1000))
                                    : dynbuf_addf(b, "%s %ld\n", r->name, v);
            if (rc != DYNBUF_OK)
                return dynbuf_error(b);
            continue;
        }
        for (int i = 0; i < labels; i++) {
            const char *v = r->label_value(src, i);
            if (v != NULL &&
                dynbuf_addf(b, "%s{%s=\"%s\"} %ld\n", r->name, r->label, v, row_value(r, src, i)) != DYNBUF_OK)
                return dynbuf_error(b);
        }
    }
    return DYNBUF_OK;
}
