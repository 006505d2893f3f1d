/* rules.h - how a read's outcome steers the next reads (the README's opening), as one pure module.
 *
 * What a read's outcome does (the status and its cache, a 404's memory and
 * its charge, the transaction's wait, a key or host pause with its jitter,
 * a rejected episode), which status may replace which, a hold's length and
 * the floor at Kasera. Both stores apply these effects: the mapped file
 * (state.c) directly, Redis (state_redis.c) by passing the same numbers to
 * its scripts, whose constants are generated from this file's
 * (rules_lua_prelude). Nothing here reads a clock or draws a random
 * number: the caller passes `now` and the jitter it drew. */
#ifndef KEMBALI_RULES_H
#define KEMBALI_RULES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "classify.h"
#include "pace.h"

#define RULES_TTL_FINAL_MS (3600 * 1000LL)   /* succeeded, failed, canceled */
#define RULES_TTL_EXPIRED_MS (60 * 1000LL)
#define RULES_TTL_NOT_FOUND_MS (30 * 1000LL)
#define RULES_KEY_PAUSE_MS (60 * 1000LL)     /* after the key's 300/min is spent */
#define RULES_UNAUTH_PAUSE_MS (300 * 1000LL) /* after a 401 */
#define RULES_HOST_PAUSE_MS (60 * 1000LL)    /* after the failed-authentication 429 */
#define RULES_RETRY_DEFAULT_MS 1000          /* a per-transaction 429 whose Retry-After is unreadable */
#define RULES_FLOOR_MS PACE_MIN_WAIT_MS      /* after the previous read's answer (the floor at Kasera) */
#define RULES_KEEP_MARGIN_MS 1000           /* Redis keeps a key this much longer than it matters */
#define RULES_PLAN_RECHECK_MS 250            /* a read the budget's plan withheld looks again after this */
#define RULES_AUTH_SPAN_MS (60 * 1000LL)     /* auth_failures_per_minute counts in any span this long */
#define RULES_AUTH_FAILS_MIN 1
#define RULES_AUTH_FAILS_MAX 9               /* under Kasera's per-IP limiter (10 in the sandbox) */
#define RULES_AUTH_FAILS_DEFAULT 5
#define RULES_NOT_FOUND_SHARE 4              /* reads ending 404 take at most 1/4 of a key's budget */
#define RULES_APART_MARGIN_MS (PACE_MIN_WAIT_MS - 1000) /* two paces apart: the pace's margin over Kasera's 1 s */

/* The longest jitter drawn for a pause of `pause_ms` (a tenth of it): the
 * caller draws the jitter in [0, this] and passes it to rules_outcome(). */
int64_t rules_jitter_max(int64_t pause_ms);

/* What one outcome does. Spans are from `now` (the read's end). */
struct rules_effect {
    bool has_status;          /* a status to record (as rules_may_replace allows) */
    enum tx_status status;
    bool final;               /* answered without reading while its cache runs */
    int64_t ttl_ms;           /* the cache of the status (0: none, pending) */
    bool not_found;           /* a 404 to remember for ttl_ms */
    bool charge;              /* a 404: charged to the client that asked */
    int64_t retry_ms;         /* no read of the transaction before now + this (0: none) */
    int64_t key_pause_ms;     /* no read with the key before now + this (0: none) */
    int64_t host_pause_ms;    /* no read with any key before now + this (0: none) */
    bool unauthorized;        /* the key got a 401 (the host remembers the shop) */
    bool rejected;            /* no further read in this episode (retry_ms says until when) */
    bool key_accepted;        /* Kasera took the key (only an authenticated read gets this answer) */
    bool auth_failed;         /* counted as a failed authentication at Kasera (a 401, or the
                               * failed-authentication 429): held against the host's
                               * auth_failures_per_minute (rules_auth_next) */
};

/* The effect of `oc`, a read whose pace counts from `pace_start` (the
 * read's start, or when its request went out) ending at `now`;
 * `key_jitter` and `host_jitter` are drawn by the caller in
 * [0, rules_jitter_max(pause)] for RULES_KEY_PAUSE_MS and
 * RULES_HOST_PAUSE_MS. Stated exhausted windows (oc->rl) extend the wait
 * they describe. This function can't fail. */
void rules_outcome(const struct outcome *oc, int64_t pace_start, int64_t now, int64_t key_jitter,
                   int64_t host_jitter, struct rules_effect *out);

/* Rejected keys (docs/configuration.md, auth_failures_per_minute): a host makes at most `allowance` reads
 * that end in 401 in any RULES_AUTH_SPAN_MS, all keys together, and a key
 * Kasera has not accepted yet (no answer with rules_effect.key_accepted
 * since it was loaded) reads only while the allowance has room. The
 * allowance's n slots each count until until[i] (0, or not after `now`:
 * free): a read of such a key takes one until its lease has ended plus
 * the span, and keeps it until its end plus the span when it failed
 * (rules_effect.auth_failed), or gives it back (the key was accepted).
 * Returns the earliest time, at or after `now`, at which fewer than
 * `allowance` slots count: `now` when there is room. `allowance` is
 * clamped to RULES_AUTH_FAILS_MIN .. RULES_AUTH_FAILS_MAX and n to
 * RULES_AUTH_FAILS_MAX. Can't fail. */
int64_t rules_auth_next(const int64_t *until, int n, int allowance, int64_t now);

/* The cache of status s once read or told (0: not cached). Can't fail. */
int64_t rules_status_ttl(enum tx_status s);

/* What is left at `now` of the cache of status s read or told at `at`
 * (0 once it has run out, or when s is not cached): a status kept through
 * a Redis outage keeps its age. Can't fail. */
int64_t rules_ttl_left(enum tx_status s, int64_t at, int64_t now);

/* May status `s` replace `cur` (the last known status)? `cached`: cur's
 * cache still runs; `told`: s was told by the shop (a read's answer
 * replaces a final status whose cache ran out, a told one never does).
 * What is known never moves backwards: a final status is never replaced by
 * pending or an unknown word; expired may become another final status;
 * succeeded, failed and canceled only by themselves. Can't fail. */
bool rules_may_replace(enum tx_status cur, bool cached, enum tx_status s, bool told);

/* How long a held HTML request is held under `s`: the schedule's sum plus
 * PACE_GRACE_MS. Can't fail. */
int64_t rules_hold_ms(const struct pace_schedule *s);

/* Kasera's per-transaction window refused a read (a 429 whose
 * Retry-After, `retry_ms`, says when that window ends), after `refused`
 * refusals in a row of this process's reads of the transaction. Another
 * pace holds that window (another layout's process beside this one during
 * an upgrade, on the same schedule): this side's next read, paced from its
 * own refused read, would land right behind the other's next again, for
 * ever (lockstep), and its buyers would see only refusals. The first
 * refusal is honoured as Kasera states it (the Retry-After); from the
 * second in a row the schedule's wait (`wait_ms`, pace_wait) counts from
 * the window's end, plus the pace's own margin over Kasera's second
 * (RULES_APART_MARGIN_MS), instead of from the refused read: the next
 * read comes PACE_MIN_WAIT_MS after the other side's next one, when that
 * one's window has ended even if it came a little late (a busy machine),
 * and the two paces stay apart (each side's reads are then at least a
 * second from the other's). Never sooner than the Retry-After or the
 * schedule. Returns the wait from now. Can't fail. */
int64_t rules_tx_limited_wait(int64_t retry_ms, int64_t wait_ms, int refused);

/* The earliest start of the next read by the floor at Kasera: RULES_FLOOR_MS
 * after the previous read's answer came back (`last_end`, 0: none). Can't
 * fail. */
int64_t rules_floor(int64_t last_end);

/* Why a read waits by rules_next_read(). */
enum rules_why { RULES_WHY_NONE, RULES_WHY_PACE, RULES_WHY_RETRY, RULES_WHY_KEY_PAUSE };

/* When a read may start, and why not sooner (enum rules_why). */
struct rules_next {
    int64_t at;
    int why;
};

/* What of a transaction and its key rules_next_read() reads, as either
 * store keeps it. */
struct rules_gate {
    int reads;                /* reads so far */
    int64_t last_start;       /* the last read's start */
    int64_t last_end;         /* the last read's end (0: none) */
    int64_t not_before;       /* Retry-After and the like */
    int64_t key_paused_until; /* the key's pause (a per-key 429 or 401) */
};

/* n->at raised to t, n->why to why, when t is later. Can't fail. */
void rules_raise(struct rules_next *n, int64_t t, int why);

/* The earliest start of the next read by the pace (pace_next_read), the
 * floor after the last read's end (rules_floor), the transaction's own
 * not-before and its key's pause: the latest of them, and why (the first
 * of these on a tie); now and RULES_WHY_NONE when none holds a read
 * back. Both stores decide a read by it (the claim script translated:
 * plan_lua.h). Can't fail. */
void rules_next_read(const struct pace_schedule *s, const struct rules_gate *g, int64_t now, struct rules_next *n);

/* When the 404 quarter has room again, at[0..n) being the times of the
 * key's reads it counts in the span ending now (those that ended 404, and
 * those of ids never answered still under way: probe[i]), newest first:
 * now while there are fewer than cap; else when the cap-th newest leaves
 * the span, or `recheck` from now when a newer one is under way (it may
 * end otherwise). Never before now. Both stores gather, this decides
 * (plan_lua.h). Can't fail. */
int64_t rules_nf_free(const int64_t *at, const bool *probe, int n, int cap, int64_t recheck, int64_t now);

/* Until when an early read of an id never answered waits for the 404
 * quarter (free_at: rules_nf_free), for a transaction held by `holders`
 * until hold_until whose reservation is at resv_at (0: none): not at all
 * (now) once its last-chance time has come (PLAN_LEAD_MS before the
 * deadline) or when there is room; else until there is room, its
 * last-chance time or its reservation, whichever comes first. Can't
 * fail. */
int64_t rules_nf_until(int64_t free_at, int holders, int64_t hold_until, int64_t resv_at, int64_t now);

/* What answers for a transaction without a read at `now`, the first that
 * holds: a final status whose cache runs (until final_until), a
 * remembered 404 (until nf_until), a read of it under way (until
 * busy_until); each 0 when there is none. */
enum rules_held { RULES_HELD_NONE, RULES_HELD_FINAL, RULES_HELD_NOT_FOUND, RULES_HELD_BUSY };

/* The enum rules_held that holds at `now` (above). Both stores' claims
 * and the news Redis publishes decide by it. Can't fail. */
int rules_held(int64_t final_until, int64_t nf_until, int64_t busy_until, int64_t now);

/* Is a client (docs/operations.md, "Ids nobody has paid for") blocked:
 * until the last of its tiers' blocks (blocked_until[0..n), 0: none)
 * ends, or 0 when none holds at `now`. A blocked client reads no id
 * nobody knows; its tiers' counts are asked only when this is 0
 * (rules_client_next). Can't fail. */
int64_t rules_client_blocked(const int64_t *blocked_until, int n, int64_t now);

/* When a read of an id nobody knows may start as far as one tier of its
 * client, not blocked (rules_client_blocked), is concerned: now while
 * `counted` (its 404s in the window and its reads of such ids in flight)
 * is under `allowance`; else the end of its first read in flight
 * (first_flight_end, 0: none), but at most `recheck` from now. The first
 * tier that holds the read back answers. Can't fail. */
int64_t rules_client_next(int counted, int64_t first_flight_end, int allowance, int64_t recheck, int64_t now);

/* Does a 404 just charged to a client's tier start its block? Yes when it
 * is not blocked (blocked_until) and its 404s in the window, this one
 * among them (counted), reach its allowance. Can't fail. */
bool rules_client_blocks(int64_t blocked_until, int counted, int allowance, int64_t now);

/* When the key's count lets a read start: now while fewer than `budget`
 * reads (`used`) are in the span ending now, else when the budget-th
 * newest of them (nth_newest) leaves it. Can't fail. */
int64_t rules_budget_free(int used, int budget, int64_t nth_newest, int64_t now);

/* Is the read of claim `serial` (0: none) still the transaction's current
 * one as it ends at `now`: the latest claimed (latest_serial), within its
 * lease (lease_until, 0 once it ended)? Can't fail. */
bool rules_read_current(int64_t serial, int64_t latest_serial, int64_t lease_until, int64_t now);

/* What a read found, and what is known of its transaction as it ends. */
struct rules_found {
    bool current;      /* still the current read (rules_read_current) */
    bool older;        /* a later read's outcome, or a told status, is recorded already */
    bool not_found;    /* it ended 404 (else it found a status) */
    bool final;        /* the status it found is final */
    bool forward;      /* that status may replace the known one as a told one would
                        * (rules_may_replace with told) */
    bool known;        /* a status is known */
    bool known_final;  /* ... and it is final */
    bool final_cached; /* ... and its cache runs */
    bool nf_cached;    /* a 404 is remembered and its memory runs */
};

/* Is what a read found recorded (state.h, "A read's outcome")?
 * The current read records what Kasera said unless a cached final status
 * says otherwise (a 404 never hides one; a status replaces it as
 * rules_may_replace allows a read's answer); a late read's final status
 * only moves what is known forward; its pending or 404 only fills what
 * nothing newer says. Both stores decide by it. Can't fail. */
bool rules_read_records(const struct rules_found *f);

/* The 404 quarter (docs/operations.md, "Ids nobody has paid for"): how many
 * reads that end in 404 (or, still under way, are of ids never answered)
 * a key with `budget` reads per 60 s makes in any 60 s before an id never
 * answered is read only with a held request's last-chance read: a
 * RULES_NOT_FOUND_SHARE-th of the budget, at least 1. Can't fail. */
int rules_not_found_cap(int budget);

/* Write the Lua prelude that gives Redis's scripts this module's numbers
 * and its replace table (a table R of words: R[cur][new] is true when a
 * told status may replace a final one) into buf; returns its length, or
 * -1 when buf is too small. Can't fail otherwise. */
int rules_lua_prelude(char *buf, size_t len);

#endif
