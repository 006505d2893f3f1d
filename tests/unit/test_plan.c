/* test_plan.c - the budget's plan (plan.c) and a flash sale simulated over
 * a real in-memory state with hold_step() and a fake clock.
 *
 * The simulation: buyers come back over 10 s, each for a payment that turns
 * succeeded at a random moment 1 to 25 s after the buyer arrived; reads
 * take 100 ms; one key with the default budget (120 a minute). The same
 * rush runs first come first served (state_opts.greedy) and planned, and
 * the test checks who saw `succeeded`, that no 60 s span ever had more than
 * the budget's reads, and that no transaction was read sooner than its
 * schedule allows. Deterministic: a seeded generator, no real clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hold.h"
#include "plan.h"
#include "plan_lua.h"
#include "rules.h"
#include "util.h"

/* ---- plan.c alone ---- */

static struct plan_key key_view(int budget, int busiest, int busiest_late, int arrivals)
{
    /* the schedules want more than the budget has: the plan applies */
    return (struct plan_key){.budget = budget, .busiest = busiest, .busiest_late = busiest_late,
                             .arrivals = arrivals, .eligible = 1, .hold_ms = 34000, .demand = 1000};
}

static void test_headroom_follows_the_arrival_rate(void **unused)
{
    (void)unused;
    struct plan_key k = key_view(120, 0, 0, 0);
    assert_int_equal(plan_late_span(&k), 27500);
    assert_int_equal(plan_headroom(&k), 0);
    k.arrivals = 1; /* one a second, over the 27.5 s a read made now competes with */
    assert_int_equal(plan_headroom(&k), 27);
    k.arrivals = 8;
    assert_int_equal(plan_headroom(&k), 120); /* never more than the budget */
    k.arrivals = 1;
    k.hold_ms = 70000; /* a long schedule: later buyers' last reads fall outside the span */
    assert_int_equal(plan_headroom(&k), 0);
}

static void test_busiest_span(void **unused)
{
    (void)unused;
    /* reads at 0, 10 and 50 s, reservations at 65 and 69 s */
    const int64_t ev[] = {0, 10000, 50000, 65000, 69000};
    assert_int_equal(plan_busiest(ev, 5, 50000, INT64_MIN), 4);   /* [10, 70) */
    assert_int_equal(plan_busiest(ev, 5, 5000, INT64_MIN), 3);    /* [0, 60) */
    assert_int_equal(plan_busiest(ev, 5, 69000, INT64_MIN), 4);   /* [10, 70) */
    assert_int_equal(plan_busiest(ev, 5, 69000, 50001), 2);       /* [65, 125): only later spans */
    assert_int_equal(plan_busiest(ev, 5, 120000, INT64_MIN), 2);  /* [60.001, 120.001): the reservations */
    assert_int_equal(plan_busiest(ev, 5, 130000, INT64_MIN), 0);  /* nothing within a minute before */
    assert_int_equal(plan_busiest(ev, 0, 0, INT64_MIN), 0);
    const int64_t same[] = {100, 100, 100};
    assert_int_equal(plan_busiest(same, 3, 100, INT64_MIN), 3);
    assert_int_equal(plan_busiest(same, 3, 60099, INT64_MIN), 3);
    assert_int_equal(plan_busiest(same, 3, 60100, INT64_MIN), 0); /* a span is 60 s, end excluded */
}

static void test_reservations_fit_the_budget(void **unused)
{
    (void)unused;
    struct plan_key k = key_view(120, 0, 0, 0);
    assert_true(plan_may_reserve(&k, 119));
    assert_false(plan_may_reserve(&k, 120));
    assert_true(plan_may_reserve(&k, 0));
}

static void test_last_chance_reads_are_kept(void **unused)
{
    (void)unused;
    struct plan_key k = key_view(120, 120, 120, 50); /* no room for anything early */
    struct plan_tx t = {.reserved = true, .resv_at = 32500};
    assert_int_equal(plan_may_read(&k, &t, 32499), PLAN_NO);
    assert_int_equal(plan_may_read(&k, &t, 32500), PLAN_LAST_CHANCE);
    t.reserved = false;
    assert_int_equal(plan_may_read(&k, &t, 32500), PLAN_NO);
    /* reads held back: an early read now would push the reserved one, 13 s
     * later by the schedule, past the deadline (34 s) */
    k = key_view(120, 10, 0, 0);
    t = (struct plan_tx){.reserved = true, .resv_at = 32500, .next_gap = 13000, .drifted = true};
    assert_int_equal(plan_may_read(&k, &t, 19500), PLAN_EARLY); /* the reserved one right after the wait */
    assert_int_equal(plan_may_read(&k, &t, 19514), PLAN_NO);
    assert_int_equal(plan_may_read(&k, &t, 21000), PLAN_NO);
    assert_int_equal(plan_may_read(&k, &t, 32500), PLAN_LAST_CHANCE);
    /* on its schedule: the next read falls where the schedule puts it */
    t.drifted = false;
    assert_int_equal(plan_may_read(&k, &t, 21000), PLAN_EARLY);
}

static void test_early_reads_leave_room(void **unused)
{
    (void)unused;
    struct plan_tx t = {0};
    struct plan_key k = key_view(120, 0, 0, 0);
    assert_int_equal(plan_may_read(&k, &t, 0), PLAN_EARLY); /* plenty: the seed's schedule */
    k = key_view(120, 119, 100, 0);
    assert_int_equal(plan_may_read(&k, &t, 0), PLAN_EARLY);
    k.busiest = 120;
    assert_int_equal(plan_may_read(&k, &t, 0), PLAN_NO);
    /* a rush under way: keep room for the buyers it brings */
    k = key_view(120, 20, 20, 4);
    assert_int_equal(plan_may_read(&k, &t, 0), PLAN_NO);
    k.arrivals = 1;
    assert_int_equal(plan_may_read(&k, &t, 0), PLAN_EARLY);
    k.busiest_late = 93; /* 93 + 27 headroom: full */
    assert_int_equal(plan_may_read(&k, &t, 0), PLAN_NO);
}

static void test_no_second_early_read_while_another_has_none(void **unused)
{
    (void)unused;
    struct plan_key k = key_view(120, 116, 0, 0); /* room for 4 early reads */
    k.eligible = 6;                               /* six could read now */
    k.starved = true;                             /* one of them never has */
    struct plan_tx first = {.early_reads = 0}, again = {.early_reads = 2};
    assert_int_equal(plan_may_read(&k, &first, 0), PLAN_EARLY);
    assert_int_equal(plan_may_read(&k, &again, 0), PLAN_NO);
    k.starved = false;
    assert_int_equal(plan_may_read(&k, &again, 0), PLAN_EARLY);
    /* with room for everybody eligible, nobody waits for fairness */
    k = key_view(120, 0, 0, 0);
    k.eligible = 6;
    k.starved = true;
    assert_int_equal(plan_may_read(&k, &again, 0), PLAN_EARLY);
}

/* ---- a flash sale, simulated ---- */

#define SIM_BUYERS 200
#define SIM_READS 4000
#define READ_MS 100
#define HOLD_MS 34000

struct buyer {
    char id[16];
    int64_t arrive, success, leave; /* leave: closes the tab then (0: never) */
    bool arrived, done, saw_final, reading;
    int64_t answered_at, wake, read_end;
    struct hold_waiter w;
    struct state_ticket t;
    int nreads;
    int64_t last_read;
};

struct sim {
    struct state *st;
    struct state_key key;
    struct pace_schedule sched;
    int budget, n;
    struct buyer b[SIM_BUYERS];
    int64_t reads[SIM_READS];
    char read_id[SIM_READS][16];
    int nreads;
    int64_t pause_at;               /* the first read started from then gets a 429 without Retry-After */
    int64_t paused_from;            /* when that answer came: the key's pause began */
};

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void sim_init(struct sim *s, int n, int64_t spread_ms, bool greedy, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    struct state_opts o = {.tx_slots = 1024, .key_slots = 8, .read_timeout_ms = 5000, .greedy = greedy};
    char err[128];
    s->st = state_new(&o, err, sizeof err);
    assert_non_null(s->st);
    state_key_id(s->st, "sk_test_flash", &s->key);
    pace_default(&s->sched);
    s->budget = 120;
    s->n = n;
    for (int i = 0; i < n; i++) {
        struct buyer *b = &s->b[i];
        snprintf(b->id, sizeof b->id, "tx%d", i);
        b->arrive = (int64_t)(rng_next(&seed) % (uint64_t)spread_ms);
        b->success = b->arrive + 1000 + (int64_t)(rng_next(&seed) % 24001);
        b->w = (struct hold_waiter){.deadline = b->arrive + HOLD_MS};
        b->wake = HOLD_NEVER;
    }
}

static void sim_step(struct sim *s, struct buyer *b, int64_t now)
{
    bool a;
    struct hold_result r;
    struct state_ticket t;
    hold_step(s->st, &s->key, b->id, &s->sched, s->budget, 5000, NULL, b->reading, false, &b->w, 1, now, &a, &t, &r);
    if (r.claimed) {
        assert_false(b->reading);
        assert_true(s->nreads < SIM_READS);
        for (int i = s->nreads - 1; i >= 0 && s->reads[i] > now - 1500; i--)
            if (strcmp(s->read_id[i], b->id) == 0)
                fail_msg("%s read %lld ms after its previous read", b->id, (long long)(now - s->reads[i]));
        b->reading = true;
        b->t = t;
        b->read_end = now + READ_MS;
        b->nreads++;
        b->last_read = now;
        util_copy(s->read_id[s->nreads], sizeof s->read_id[0], b->id);
        s->reads[s->nreads++] = now;
    }
    if (a) {
        b->done = true;
        b->answered_at = now;
        b->saw_final = r.fact.final;
        state_unhold(s->st, &s->key, b->id, now, NULL);
        b->wake = HOLD_NEVER;
    } else {
        b->wake = r.plan.wake;
    }
}

static void sim_run(struct sim *s)
{
    for (int guard = 0; guard < 2000000; guard++) {
        int64_t now = HOLD_NEVER;
        struct buyer *who = NULL;
        int what = 0; /* 1 read end, 2 arrival, 3 leave, 4 timer */
        for (int i = 0; i < s->n; i++) {
            struct buyer *b = &s->b[i];
            int64_t cand[4] = {b->reading ? b->read_end : HOLD_NEVER, !b->arrived ? b->arrive : HOLD_NEVER,
                               b->arrived && !b->done && b->leave ? b->leave : HOLD_NEVER,
                               b->arrived && !b->done ? b->wake : HOLD_NEVER};
            for (int k = 0; k < 4; k++)
                if (cand[k] < now) {
                    now = cand[k];
                    who = b;
                    what = k + 1;
                }
        }
        if (who == NULL)
            return;
        if (what == 1) {
            bool paid = who->t.started >= who->success;
            struct outcome oc = {.kind = OUT_STATUS, .status = paid ? TXS_SUCCEEDED : TXS_PENDING, .retry_after_ms = -1};
            if (s->pause_at && who->t.started >= s->pause_at) {
                oc = (struct outcome){.kind = OUT_KEY_LIMITED, .retry_after_ms = -1};
                s->pause_at = 0;
                s->paused_from = now;
            }
            util_copy(oc.status_word, sizeof oc.status_word, paid ? "succeeded" : "pending");
            struct state_report rep;
            who->t.sent = who->t.started;
            state_finish(s->st, &who->t, "toko-a", &oc, now, &rep);
            who->reading = false;
            if (!who->done)
                sim_step(s, who, now);
            /* a read's end wakes the others, as the state's generation does */
            for (int i = 0; i < s->n; i++)
                if (&s->b[i] != who && s->b[i].arrived && !s->b[i].done && !s->b[i].reading)
                    sim_step(s, &s->b[i], now);
        } else if (what == 2) {
            who->arrived = true;
            state_hold(s->st, &s->key, who->id, &s->sched, s->budget, who->w.deadline, now, NULL);
            sim_step(s, who, now);
        } else if (what == 3) {
            who->done = true; /* the tab was closed: no answer, the hold ends */
            who->answered_at = now;
            state_unhold(s->st, &s->key, who->id, now, NULL);
        } else {
            sim_step(s, who, now);
        }
    }
    fail_msg("the simulation did not end");
}

struct sim_result {
    int saw, reads, max_in_minute;
    int64_t delay_median;
};

static struct sim_result sim_result(struct sim *s)
{
    struct sim_result r = {.reads = s->nreads};
    int64_t delays[SIM_BUYERS];
    int nd = 0;
    for (int i = 0; i < s->n; i++) {
        const struct buyer *b = &s->b[i];
        assert_true(b->done);
        if (b->leave == 0)
            assert_true(b->answered_at <= b->w.deadline);
        if (b->saw_final) {
            r.saw++;
            delays[nd++] = b->answered_at - b->success;
        }
    }
    for (int i = 0; i < s->nreads; i++) {
        int c = 0;
        for (int j = i; j < s->nreads && s->reads[j] < s->reads[i] + 60000; j++)
            c++;
        if (c > r.max_in_minute)
            r.max_in_minute = c;
    }
    for (int i = 1; i < nd; i++) /* insertion sort: small */
        for (int j = i; j > 0 && delays[j] < delays[j - 1]; j--) {
            int64_t t = delays[j];
            delays[j] = delays[j - 1];
            delays[j - 1] = t;
        }
    r.delay_median = nd ? delays[nd / 2] : -1;
    return r;
}

/* With SIM_DEBUG set, the buyers who did not see their success, and their reads. */
static void sim_debug(const struct sim *s)
{
    if (getenv("SIM_DEBUG") == NULL)
        return;
    for (int i = 0; i < s->n; i++)
        if (!s->b[i].saw_final) {
            fprintf(stderr, "%s arrive %lld success %lld deadline %lld answered %lld reads:", s->b[i].id,
                    (long long)s->b[i].arrive, (long long)s->b[i].success, (long long)s->b[i].w.deadline,
                    (long long)s->b[i].answered_at);
            for (int j = 0; j < s->nreads; j++)
                if (strcmp(s->read_id[j], s->b[i].id) == 0)
                    fprintf(stderr, " %lld", (long long)s->reads[j]);
            fprintf(stderr, "\n");
        }
}

static struct sim_result flash(int n, bool greedy, uint64_t seed)
{
    struct sim s;
    sim_init(&s, n, 10000, greedy, seed);
    sim_run(&s);
    struct sim_result r = sim_result(&s);
    sim_debug(&s);
    print_message("# %3d buyers, %s: %3d saw succeeded, %3d reads (at most %d in a minute), median delay %lld ms\n",
                  n, greedy ? "first come" : "planned   ", r.saw, r.reads, r.max_in_minute, (long long)r.delay_median);
    state_free(s.st);
    return r;
}

static void test_flash_sale_buyers_see_their_success(void **unused)
{
    (void)unused;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        struct sim_result g20 = flash(20, true, seed), p20 = flash(20, false, seed);
        assert_int_equal(g20.saw, 20);
        assert_int_equal(p20.saw, 20);
        struct sim_result g40 = flash(40, true, seed), p40 = flash(40, false, seed);
        assert_true(g40.saw < 38); /* what first come first served does to them */
        assert_true(p40.saw >= 38);
        struct sim_result g80 = flash(80, true, seed), p80 = flash(80, false, seed);
        assert_true(g80.saw < 76);
        assert_true(p80.saw >= 76);
        struct sim_result p150 = flash(150, false, seed);
        assert_true(p150.saw >= 110); /* more than the budget can read once each */
        const struct sim_result *all[] = {&g20, &p20, &g40, &p40, &g80, &p80, &p150};
        for (size_t i = 0; i < ARRAY_LEN(all); i++)
            assert_true(all[i]->max_in_minute <= 120);
    }
}

static void test_one_buyer_at_a_time_keeps_the_seed_schedule(void **unused)
{
    (void)unused;
    static const int64_t want[] = {0, 1500, 3500, 6500, 11500, 19500, 32500};
    struct sim s;
    sim_init(&s, 3, 1, false, 7);
    for (int i = 0; i < 3; i++) {
        s.b[i].arrive = i * 40000; /* one after the other */
        s.b[i].success = INT64_MAX / 2; /* never paid */
        s.b[i].w.deadline = s.b[i].arrive + HOLD_MS;
    }
    sim_run(&s);
    assert_int_equal(s.nreads, 21);
    for (int i = 0; i < 21; i++)
        assert_int_equal(s.reads[i], (i / 7) * 40000 + want[i % 7]);
    state_free(s.st);
}

/* 150 buyers, a third of them close the tab 2 s after arriving (leave) or
 * stay to the end but do not count (stay): how many of the other 100 saw
 * their success. */
static int stayers_who_saw(bool leave)
{
    struct sim s;
    sim_init(&s, 150, 10000, false, 11);
    for (int i = 0; i < 150; i += 3) {
        if (leave)
            s.b[i].leave = s.b[i].arrive + 2000;
        else
            s.b[i].success = INT64_MAX / 2; /* never paid: holds its reservation to the deadline */
    }
    sim_run(&s);
    struct sim_result r = sim_result(&s);
    assert_true(r.max_in_minute <= 120);
    int saw = 0;
    for (int i = 0; i < 150; i++)
        if (i % 3 != 0)
            saw += s.b[i].saw_final;
    struct state_metrics m;
    state_metrics(s.st, &m);
    assert_int_equal(m.reserved, 0); /* every reservation used or given back */
    state_free(s.st);
    return saw;
}

static void test_buyers_who_leave_give_their_reservation_back(void **unused)
{
    (void)unused;
    int left = stayers_who_saw(true), held = stayers_who_saw(false);
    print_message("# 150 buyers: of the 100 who stayed, %d saw succeeded when 50 others left, %d when those "
                  "held their reservations to the end\n", left, held);
    assert_true(left > held + 10); /* the leavers' reservations went to the others */
}

static void test_arrivals_spread_over_a_minute(void **unused)
{
    (void)unused;
    struct sim s;
    sim_init(&s, 100, 60000, false, 5);
    sim_run(&s);
    struct sim_result r = sim_result(&s);
    sim_debug(&s);
    print_message("# 100 buyers over 60 s: %d saw succeeded, %d reads, at most %d in a minute\n", r.saw, r.reads,
                  r.max_in_minute);
    assert_true(r.saw >= 95);
    assert_true(r.max_in_minute <= 120);
    state_free(s.st);
}

static void test_a_key_pause_in_the_middle(void **unused)
{
    (void)unused;
    struct sim s;
    sim_init(&s, 60, 10000, false, 3);
    s.pause_at = 12000; /* the key's 300/min spent elsewhere: no read for about a minute */
    sim_run(&s);
    struct sim_result r = sim_result(&s);
    sim_debug(&s);
    if (getenv("SIM_DEBUG"))
        for (int i = 0; i < s.nreads; i++)
            fprintf(stderr, "read %s %lld\n", s.read_id[i], (long long)s.reads[i]);
    int during = 0;
    assert_true(s.paused_from > 0);
    for (int i = 0; i < s.nreads; i++)
        during += s.reads[i] >= s.paused_from && s.reads[i] < s.paused_from + 60000;
    print_message("# 60 buyers, the key paused at %.1f s: %d saw succeeded, %d reads\n", s.paused_from / 1000.0,
                  r.saw, r.reads);
    assert_int_equal(during, 0); /* the pause holds, reservations or not */
    assert_true(r.max_in_minute <= 120);
    for (int i = 0; i < s.n; i++)
        assert_true(s.b[i].answered_at <= s.b[i].w.deadline);
    state_free(s.st);
}

static void test_two_processes_one_plan(void **unused)
{
    (void)unused;
    /* 40 buyers each with a tab in two processes (mod_fcgid: a process per
     * held request): each tab is its own waiter with its own read flag, on
     * one shared state. One reservation and one pace per transaction,
     * whichever process makes the read; the other learns of its end. */
    struct sim s;
    sim_init(&s, 80, 10000, false, 9);
    for (int i = 0; i < 80; i += 2) {
        struct buyer *a = &s.b[i], *b = &s.b[i + 1];
        snprintf(b->id, sizeof b->id, "%s", a->id);
        b->arrive = a->arrive + 300;
        b->success = a->success;
        b->w.deadline = b->arrive + HOLD_MS;
    }
    sim_run(&s);
    struct sim_result r = sim_result(&s);
    struct state_metrics m;
    state_metrics(s.st, &m);
    print_message("# 40 buyers with a tab in each of two processes: %d tabs saw succeeded, %d reads, %ld last-chance\n",
                  r.saw, r.reads, m.last_chance_reads);
    assert_int_equal(r.saw, 80);
    assert_true(r.max_in_minute <= 120);
    assert_int_equal(m.reserved, 0); /* all used or given back */
    state_free(s.st);
}

/* ---- the shared cases (plan_vectors.txt): the C's answers; the Lua's
 * are checked on a real Redis by tests/integration/test_plan_lua.py ---- */

struct vector {
    struct plan_key k;
    struct plan_tx t;
    int64_t now, at_busiest, tt, from;
    bool has_from;
    int64_t ev[16];
    int nev;
    struct pace_schedule ws;   /* demand, ready, gap, drifted: the schedule */
    struct plan_waiter w;
    bool withheld;
    int64_t thins, recheck;    /* retry */
    bool has_thins;
    int64_t first_short, first_long; /* arrival_rate (with arrivals, arrivals_long) */
    struct plan_facts x;       /* waits, waiter: holders, cached_until, floor_until (the rest: w's) */
    bool probe[16];            /* nf_free (with ev, cap, recheck) */
    int cap;
    int64_t free_at;           /* nf_until (with holders, hold_until, resv_at) */
    int64_t last_end, key_paused_until; /* next_read (with ws, reads, last_start, not_before) */
    int64_t final_until, nf_until;      /* held (with busy_until) */
    int64_t blocked_until, first_flight_end; /* client_next, client_blocks (with counted, allowance, recheck) */
    int counted, allowance, used;
    int64_t nth_newest;                 /* budget_free (with used, budget) */
    int64_t serial, latest_serial, lease_until; /* read_current */
    struct rules_found found;           /* read_records */
    int64_t deadline;                   /* hold_chance */
    bool waiting;                       /* tx_fill (with ws, resv_at, reads, early_reads, withheld) */
};

/* One FIELD=VALUE of a case into v; false when the field is unknown. */
static bool vector_field(struct vector *v, const char *name, const char *val)
{
    long long x = strtoll(val, NULL, 10);
    struct {
        const char *name;
        int *i;
        int64_t *l;
        bool *b;
    } f[] = {
        {"budget", &v->k.budget, NULL, NULL},         {"recent", &v->k.recent, NULL, NULL},
        {"schedule_reads", &v->k.schedule_reads, NULL, NULL},
        {"demand", &v->k.demand, NULL, NULL},         {"busiest", &v->k.busiest, NULL, NULL},
        {"busiest_late", &v->k.busiest_late, NULL, NULL},
        {"arrivals", &v->k.arrivals, NULL, NULL},     {"arrivals_long", &v->k.arrivals_long, NULL, NULL},
        {"eligible", &v->k.eligible, NULL, NULL},     {"starved", NULL, NULL, &v->k.starved},
        {"hold_ms", NULL, &v->k.hold_ms, NULL},       {"reserved", NULL, NULL, &v->t.reserved},
        {"resv_at", NULL, &v->t.resv_at, NULL},       {"next_gap", NULL, &v->t.next_gap, NULL},
        {"drifted", NULL, NULL, &v->t.drifted},       {"early_reads", &v->t.early_reads, NULL, NULL},
        {"now", NULL, &v->now, NULL},                 {"at_busiest", NULL, &v->at_busiest, NULL},
        {"t", NULL, &v->tt, NULL},                    {"from", NULL, &v->from, NULL},
        {"reads", &v->w.reads, NULL, NULL},           {"last_start", NULL, &v->w.last_start, NULL},
        {"hold_until", NULL, &v->w.hold_until, NULL}, {"busy_until", NULL, &v->w.busy_until, NULL},
        {"not_before", NULL, &v->w.not_before, NULL}, {"withheld", NULL, NULL, &v->withheld},
        {"thins", NULL, &v->thins, NULL},             {"recheck", NULL, &v->recheck, NULL},
        {"first_short", NULL, &v->first_short, NULL}, {"first_long", NULL, &v->first_long, NULL},
        {"holders", &v->x.holders, NULL, NULL},       {"cached_until", NULL, &v->x.cached_until, NULL},
        {"floor_until", NULL, &v->x.floor_until, NULL},
        {"cap", &v->cap, NULL, NULL},                 {"free_at", NULL, &v->free_at, NULL},
        {"last_end", NULL, &v->last_end, NULL},       {"key_paused_until", NULL, &v->key_paused_until, NULL},
        {"final_until", NULL, &v->final_until, NULL}, {"nf_until", NULL, &v->nf_until, NULL},
        {"blocked_until", NULL, &v->blocked_until, NULL},
        {"first_flight_end", NULL, &v->first_flight_end, NULL},
        {"counted", &v->counted, NULL, NULL},         {"allowance", &v->allowance, NULL, NULL},
        {"used", &v->used, NULL, NULL},               {"nth_newest", NULL, &v->nth_newest, NULL},
        {"serial", NULL, &v->serial, NULL},           {"latest_serial", NULL, &v->latest_serial, NULL},
        {"lease_until", NULL, &v->lease_until, NULL},
        {"current", NULL, NULL, &v->found.current},   {"older", NULL, NULL, &v->found.older},
        {"not_found", NULL, NULL, &v->found.not_found}, {"final", NULL, NULL, &v->found.final},
        {"forward", NULL, NULL, &v->found.forward},   {"known", NULL, NULL, &v->found.known},
        {"known_final", NULL, NULL, &v->found.known_final},
        {"final_cached", NULL, NULL, &v->found.final_cached},
        {"nf_cached", NULL, NULL, &v->found.nf_cached},
        {"deadline", NULL, &v->deadline, NULL},       {"waiting", NULL, NULL, &v->waiting},
    };
    if (strcmp(name, "thins") == 0)
        v->has_thins = true;
    if (strcmp(name, "ws") == 0) {
        for (const char *p = val; *p != '\0' && v->ws.n < PACE_MAX_STEPS; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
            v->ws.wait_ms[v->ws.n++] = strtoll(p, NULL, 10);
        return true;
    }
    if (strcmp(name, "ev") == 0) {
        for (const char *p = val; *p != '\0' && v->nev < 16; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
            v->ev[v->nev++] = strtoll(p, NULL, 10);
        return true;
    }
    if (strcmp(name, "probe") == 0) {
        int i = 0;
        for (const char *p = val; *p != '\0' && i < 16; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
            v->probe[i++] = strtoll(p, NULL, 10) != 0;
        return true;
    }
    if (strcmp(name, "from") == 0)
        v->has_from = true;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (strcmp(f[i].name, name) != 0)
            continue;
        if (f[i].i)
            *f[i].i = (int)x;
        else if (f[i].l)
            *f[i].l = x;
        else
            *f[i].b = x != 0;
        return true;
    }
    return false;
}

/* plan.c's answer to one case, as the file writes it. */
static void vector_answer(const char *op, const struct vector *v, char *out, size_t cap)
{
    if (strcmp(op, "late_span") == 0) {
        snprintf(out, cap, "%lld", (long long)plan_late_span(&v->k));
    } else if (strcmp(op, "headroom") == 0) {
        snprintf(out, cap, "%d", plan_headroom(&v->k));
    } else if (strcmp(op, "room") == 0) {
        snprintf(out, cap, "%d", plan_room(&v->k));
    } else if (strcmp(op, "reserve") == 0) {
        snprintf(out, cap, "%d", plan_may_reserve(&v->k, (int)v->at_busiest) ? 1 : 0);
    } else if (strcmp(op, "busiest") == 0) {
        snprintf(out, cap, "%d", plan_busiest(v->ev, v->nev, v->tt, v->has_from ? v->from : INT64_MIN));
    } else if (strcmp(op, "read") == 0) {
        enum plan_read r = plan_may_read(&v->k, &v->t, v->now);
        snprintf(out, cap, "%s", r == PLAN_LAST_CHANCE ? "last" : r == PLAN_EARLY ? "early" : "no");
    } else if (strcmp(op, "arrivals") == 0) {
        struct plan_key k = {0};
        int64_t thins = plan_arrivals(&k, v->ev, v->nev, v->now);
        if (thins == INT64_MAX)
            snprintf(out, cap, "%d,%d,none", k.arrivals, k.arrivals_long);
        else
            snprintf(out, cap, "%d,%d,%lld", k.arrivals, k.arrivals_long, (long long)thins);
    } else if (strcmp(op, "arrival_rate") == 0) {
        struct plan_key k = {0};
        int64_t thins = plan_arrival_rate(&k, v->k.arrivals, v->first_short, v->k.arrivals_long, v->first_long);
        if (thins == INT64_MAX)
            snprintf(out, cap, "%d,%d,none", k.arrivals, k.arrivals_long);
        else
            snprintf(out, cap, "%d,%d,%lld", k.arrivals, k.arrivals_long, (long long)thins);
    } else if (strcmp(op, "retry") == 0) {
        snprintf(out, cap, "%lld", (long long)plan_retry(&v->t, v->ev, v->nev, v->has_thins ? v->thins : INT64_MAX,
                                                          v->recheck, v->now));
    } else if (strcmp(op, "demand") == 0) {
        snprintf(out, cap, "%d", plan_demand(&v->ws, &v->w, v->now));
    } else if (strcmp(op, "ready") == 0) {
        snprintf(out, cap, "%d", plan_ready(&v->ws, &v->w, v->now) ? 1 : 0);
    } else if (strcmp(op, "gap") == 0) {
        snprintf(out, cap, "%lld", (long long)plan_next_gap(&v->ws, v->w.reads));
    } else if (strcmp(op, "waits") == 0 || strcmp(op, "waiter") == 0) {
        struct plan_facts x = v->x;
        x.reads = v->w.reads;
        x.last_start = v->w.last_start;
        x.hold_until = v->w.hold_until;
        x.busy_until = v->w.busy_until;
        x.not_before = v->w.not_before;
        struct plan_waiter w;
        plan_waiter_of(&x, &w);
        if (strcmp(op, "waits") == 0)
            snprintf(out, cap, "%d", plan_waits(&x, v->now) ? 1 : 0);
        else
            snprintf(out, cap, "%d,%lld,%lld,%lld,%lld", w.reads, (long long)w.last_start, (long long)w.hold_until,
                     (long long)w.busy_until, (long long)w.not_before);
    } else if (strcmp(op, "next_read") == 0) {
        struct rules_gate g = {.reads = v->w.reads, .last_start = v->w.last_start, .last_end = v->last_end,
                               .not_before = v->w.not_before, .key_paused_until = v->key_paused_until};
        struct rules_next n;
        rules_next_read(&v->ws, &g, v->now, &n);
        snprintf(out, cap, "%lld,%s", (long long)n.at,
                 n.why == RULES_WHY_PACE ? "pace" : n.why == RULES_WHY_RETRY ? "retry"
                 : n.why == RULES_WHY_KEY_PAUSE ? "key" : "none");
    } else if (strcmp(op, "nf_free") == 0) {
        snprintf(out, cap, "%lld", (long long)rules_nf_free(v->ev, v->probe, v->nev, v->cap, v->recheck, v->now));
    } else if (strcmp(op, "nf_until") == 0) {
        snprintf(out, cap, "%lld",
                 (long long)rules_nf_until(v->free_at, v->x.holders, v->w.hold_until, v->t.resv_at, v->now));
    } else if (strcmp(op, "held") == 0) {
        static const char *const held[] = {[RULES_HELD_NONE] = "none", [RULES_HELD_FINAL] = "final",
                                           [RULES_HELD_NOT_FOUND] = "nf", [RULES_HELD_BUSY] = "busy"};
        snprintf(out, cap, "%s", held[rules_held(v->final_until, v->nf_until, v->w.busy_until, v->now)]);
    } else if (strcmp(op, "client_next") == 0) {
        snprintf(out, cap, "%lld",
                 (long long)rules_client_next(v->counted, v->first_flight_end, v->allowance, v->recheck, v->now));
    } else if (strcmp(op, "client_blocked") == 0) {
        snprintf(out, cap, "%lld", (long long)rules_client_blocked(v->ev, v->nev, v->now));
    } else if (strcmp(op, "client_blocks") == 0) {
        snprintf(out, cap, "%d", rules_client_blocks(v->blocked_until, v->counted, v->allowance, v->now) ? 1 : 0);
    } else if (strcmp(op, "budget_free") == 0) {
        snprintf(out, cap, "%lld", (long long)rules_budget_free(v->used, v->k.budget, v->nth_newest, v->now));
    } else if (strcmp(op, "read_current") == 0) {
        snprintf(out, cap, "%d", rules_read_current(v->serial, v->latest_serial, v->lease_until, v->now) ? 1 : 0);
    } else if (strcmp(op, "read_records") == 0) {
        snprintf(out, cap, "%d", rules_read_records(&v->found) ? 1 : 0);
    } else if (strcmp(op, "tx_fill") == 0) {
        struct plan_tx t;
        plan_tx_fill(&v->ws, v->waiting, v->t.resv_at, v->w.reads, v->t.early_reads, v->withheld, v->now, &t);
        snprintf(out, cap, "%d,%lld,%d,%lld,%d", t.reserved ? 1 : 0, (long long)t.resv_at, t.early_reads,
                 (long long)t.next_gap, t.drifted ? 1 : 0);
    } else if (strcmp(op, "fresh_hold") == 0) {
        snprintf(out, cap, "%d", plan_fresh_hold(v->x.holders, v->w.hold_until, v->now) ? 1 : 0);
    } else if (strcmp(op, "hold_chance") == 0) {
        snprintf(out, cap, "%lld", (long long)plan_hold_chance(v->deadline, v->now));
    } else if (strcmp(op, "later_chance") == 0) {
        snprintf(out, cap, "%lld", (long long)plan_later_chance(v->x.holders, v->w.hold_until, v->now));
    } else if (strcmp(op, "drifted") == 0) {
        snprintf(out, cap, "%d", plan_drifted(&v->ws, v->t.resv_at, v->w.reads, v->withheld, v->now) ? 1 : 0);
    } else {
        snprintf(out, cap, "?op");
    }
}

/* The scripts' buffer for the translation (PLAN_LUA_MAX) holds it. */
static void test_the_translation_fits_its_buffer(void **unused)
{
    (void)unused;
    static char buf[PLAN_LUA_MAX];
    int n = plan_lua(buf, sizeof buf);
    assert_true(n > 0);
    assert_int_equal((size_t)n, strlen(buf));
}

static void test_shared_vectors(void **unused)
{
    (void)unused;
    FILE *fp = fopen(TEST_SRCDIR "/tests/unit/plan_vectors.txt", "r");
    assert_non_null(fp);
    char line[1024];
    int cases = 0, wrong = 0;
    while (fgets(line, sizeof line, fp) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#' || line[0] == '\0')
            continue;
        char copy[1024], *save = NULL, *want = strstr(line, "->");
        assert_non_null(want);
        want += 2;
        while (*want == ' ')
            want++;
        snprintf(copy, sizeof copy, "%.*s", (int)(strstr(line, "->") - line), line);
        struct vector v = {0};
        char *op = strtok_r(copy, " ", &save);
        assert_non_null(op);
        for (char *tok; (tok = strtok_r(NULL, " ", &save)) != NULL;) {
            char *eq = strchr(tok, '=');
            assert_non_null(eq);
            *eq = '\0';
            if (!vector_field(&v, tok, eq + 1))
                fail_msg("unknown field %s in: %s", tok, line);
        }
        char got[32];
        vector_answer(op, &v, got, sizeof got);
        if (strcmp(got, want) != 0) {
            print_message("plan.c answers %s to: %s\n", got, line);
            wrong++;
        }
        cases++;
    }
    fclose(fp);
    assert_true(cases >= 30);
    assert_int_equal(wrong, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_headroom_follows_the_arrival_rate),
        cmocka_unit_test(test_busiest_span),
        cmocka_unit_test(test_reservations_fit_the_budget),
        cmocka_unit_test(test_last_chance_reads_are_kept),
        cmocka_unit_test(test_early_reads_leave_room),
        cmocka_unit_test(test_no_second_early_read_while_another_has_none),
        cmocka_unit_test(test_flash_sale_buyers_see_their_success),
        cmocka_unit_test(test_one_buyer_at_a_time_keeps_the_seed_schedule),
        cmocka_unit_test(test_buyers_who_leave_give_their_reservation_back),
        cmocka_unit_test(test_arrivals_spread_over_a_minute),
        cmocka_unit_test(test_a_key_pause_in_the_middle),
        cmocka_unit_test(test_two_processes_one_plan),
        cmocka_unit_test(test_shared_vectors),
        cmocka_unit_test(test_the_translation_fits_its_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
