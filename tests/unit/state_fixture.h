/* state_fixture.h - what the state's unit tests share (test_state.c,
 * test_state_client.c): a state made with simulated `now` values, and
 * claim, lookup, finish and tell with the default schedule and budget.
 * Static inline: a file uses what it needs. */
#ifndef KEMBALI_TEST_STATE_FIXTURE_H
#define KEMBALI_TEST_STATE_FIXTURE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "plan.h"
#include "rules.h"
#include "state.h"
#include "util.h"

#define T0 10000000LL     /* an arbitrary monotonic start, far from 0 */
#define TIMEOUT 5000      /* read_timeout_ms of the states made here */
#define LEASE (TIMEOUT + 1000)
#define BUDGET 120

static inline struct pace_schedule sched_default(void)
{
    struct pace_schedule s;
    pace_default(&s);
    return s;
}

/* A state made with o (its read timeout TIMEOUT), its keys taken by
 * Kasera (rejected keys have their own tests: mk_fresh). */
static inline struct state *mk_opts(struct state_opts o)
{
    o.read_timeout_ms = TIMEOUT;
    char err[256] = "";
    struct state *st = state_new(&o, err, sizeof err);
    if (st == NULL)
        print_error("state_new: %s\n", err);
    assert_non_null(st);
    state_test_keys_accepted(st, true);
    return st;
}

/* A state of tx_slots transactions whose one key may take them all (most
 * tests here use one key; the per-key quota has its own: mk_quota). */
static inline struct state *mk_quota(int tx_slots, int per_key)
{
    return mk_opts((struct state_opts){.tx_slots = tx_slots, .tx_per_key = per_key});
}

static inline struct state *mk(int tx_slots)
{
    return mk_quota(tx_slots, tx_slots);
}

static inline struct outcome oc_kind(enum outcome_kind k)
{
    struct outcome o;
    memset(&o, 0, sizeof o);
    o.kind = k;
    o.retry_after_ms = -1;
    return o;
}

static inline struct outcome oc_status(enum tx_status s, const char *word)
{
    struct outcome o = oc_kind(OUT_STATUS);
    o.status = s;
    snprintf(o.status_word, sizeof o.status_word, "%s", word ? word : tx_status_word(s));
    return o;
}

static inline struct state_key key_of(struct state *st, const char *secret)
{
    struct state_key k;
    state_key_id(st, secret, &k);
    return k;
}

/* Claim with the default schedule and budget. */
static inline enum state_told tell(struct state *st, const struct state_key *k, const char *id, enum tx_status s,
                            int64_t now)
{
    return state_tell(st, k, id, s, tx_status_word(s), now);
}

/* Ids prefix0 .. prefix(n-1) are payments kembali has seen (told pending
 * at now): the 404 quarter never holds their reads back. */
static inline void known_ids(struct state *st, const struct state_key *k, const char *prefix, int from, int n,
                             int64_t now)
{
    for (int i = from; i < from + n; i++) {
        char id[32];
        snprintf(id, sizeof id, "%s%d", prefix, i);
        tell(st, k, id, TXS_PENDING, now);
    }
}

static inline bool claim(struct state *st, const struct state_key *k, const char *id, int64_t now,
                  struct state_ticket *t, struct state_fact *f)
{
    struct pace_schedule s = sched_default();
    struct state_ticket dummy;
    struct state_fact fd;
    return state_claim(st, k, id, &s, BUDGET, TIMEOUT, now, t ? t : &dummy, f ? f : &fd);
}

static inline struct state_fact lookup(struct state *st, const struct state_key *k, const char *id, int64_t now)
{
    struct pace_schedule s = sched_default();
    struct state_fact f;
    memset(&f, 0x77, sizeof f);
    state_lookup(st, k, id, &s, BUDGET, now, &f);
    return f;
}

static inline struct state_report finish(struct state *st, const struct state_ticket *t, const char *shop,
                                  struct outcome o, int64_t now)
{
    struct state_report r;
    memset(&r, 0x77, sizeof r);
    state_finish(st, t, shop, &o, now, &r);
    return r;
}

/* A state of key_slots keys (1024 transactions). */
static inline struct state *mk_keys(int key_slots)
{
    return mk_opts((struct state_opts){.tx_slots = 1024, .key_slots = key_slots});
}

/* The key of secret sk_test_I. */
static inline struct state_key key_n(struct state *st, int i)
{
    char secret[32];
    snprintf(secret, sizeof secret, "sk_test_%d", i);
    return key_of(st, secret);
}

#endif
