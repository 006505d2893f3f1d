/* budget.h - what one host may spend with one key, from what it knows:
 * the rule that keeps a key's reads within read_budget_per_minute in any
 * BUDGET_SPAN_MS, over every host, whatever happens to Redis. Pure: no
 * I/O, no clock (the callers pass `now`).
 *
 * The invariant, stated once. At any time, each read made with a key is
 * counted by somebody who decides the next:
 *
 *   - Redis up and its count whole: Redis counts every host's reads (the
 *     key's budget set) and grants a read only under the budget;
 *   - Redis away (down, stalled, joining, rejoining): each host counts the
 *     reads of the span it knows of (its state: its own, every process's,
 *     and the others' that Redis granted, heard on its channel before it
 *     went away) and spends them within budget_share() of the budget;
 *   - Redis back: its count is made whole before it grants anything. Every
 *     host sends its own reads of the span (budget_seed) each named by
 *     budget_member(): unique per host and read, so a read Redis counted
 *     already is not counted twice. A count that took reads it lacked, or
 *     that is found gone (a restart without persistence, FLUSHALL, an
 *     eviction, a failover to a replica that lagged), grants nothing for
 *     BUDGET_GRACE_MS: the time every host that lost Redis with it needs
 *     to come back and send its own.
 *
 * So a fault changes who counts, never the total. One residue: a read
 * Redis granted another host in the moment before it went away, whose
 * message had not reached this host yet, is missing from this host's
 * count of the span until the count is made whole again, so this host
 * may spend that many more of its share meanwhile (at most the grants
 * still on the wire at the fault: milliseconds' worth). */
#ifndef KEMBALI_BUDGET_H
#define KEMBALI_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plan.h"

#define BUDGET_SPAN_MS PLAN_BUDGET_SPAN_MS
/* A host that lost Redis tries again every second and joins within a
 * second (state_redis.h's STATE_REDIS_RETRY_MS and STATE_REDIS_JOIN_MS,
 * checked there against this), and is on a new master within 5 s of a
 * Sentinel failover: after a count was found gone or short, every such
 * host's reads are in it by then (budget_grace_ms). */
#define BUDGET_GRACE_MS 2000
#define BUDGET_GRACE_SENTINEL_MS 5000
/* How long Redis keeps a key's count (and its mark) after its last claim:
 * a count found gone although this host read with the key within this
 * long was lost, not forgotten. */
#define BUDGET_MARK_KEEP_MS (3600 * 1000LL)
/* A read's name in a count: 16 hex digits of the host, ':', its time. */
#define BUDGET_MEMBER_MAX (16 + 1 + 20 + 1)

/* How long a count made whole, or found gone, grants nothing: long
 * enough for every host that lost Redis with it to be back, through
 * Sentinels (a failover) or not. Can't fail. */
int64_t budget_grace_ms(bool sentinel);

/* The reads per minute a host may count on for a key of `budget`: all of
 * it while Redis counts every host's (together), else its share among
 * `hosts` hosts (at least 1; hosts < 1 counts as 1). Can't fail. */
int budget_share(int budget, int hosts, bool together);

/* The time a read that starts at `now` is recorded under, given the
 * newest time recorded for the key (0: none): now, or one ms after the
 * newest when that is not earlier, so that each of a host's reads with a
 * key has a time, and thus a name, of its own. Can't fail. */
int64_t budget_stamp(int64_t newest, int64_t now);

/* The name of the read recorded at `at` by host `host_hex` (16 hex
 * digits) into out (BUDGET_MEMBER_MAX bytes): the same on every call, so
 * that sending it again counts nothing twice. Can't fail. */
void budget_member(char *out, size_t cap, const char *host_hex, int64_t at);

/* Of a host's reads recorded at at[0..n) (any order), those still in the
 * span ending at `now`: their indexes into idx[] and their ages (ms
 * before now) into ago[], both of room n. Returns how many. Can't fail. */
int budget_seed(const int64_t *at, int n, int64_t now, int *idx, int64_t *ago);

/* Redis has no count for a key that this host last read with at
 * `own_last` (0: never): was it lost (a restart, a flush, an eviction),
 * so that nothing may be granted before every host sent its reads? A
 * count nobody used for BUDGET_MARK_KEEP_MS simply ended. Can't fail. */
bool budget_count_lost(int64_t own_last, int64_t now);

#endif
