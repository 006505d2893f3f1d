/* test_hold.c - the pace's decisions (hold.c), with a fake clock.
 *
 * Two parts: hold_plan() rule by rule on hand-made facts, and whole
 * episodes simulated with hold_step() over a real in-memory state: requests
 * arrive, reads take a set time and return what a script says, timers fire
 * (on time, or late), and the test checks when reads started and when and
 * how each request was answered, to the millisecond. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "hold.h"
#include "util.h"

#define HOLD_MS 34000 /* the default schedule's sum plus 1.5 s */

static struct state_fact fact_fresh(int64_t now)
{
    struct state_fact f = {.status = TXS_NONE, .status_word = "unknown", .next_read = now};
    return f;
}

static struct hold_waiter html(int64_t deadline)
{
    return (struct hold_waiter){.deadline = deadline};
}

static struct hold_waiter json(int64_t deadline, bool wants_read)
{
    return (struct hold_waiter){.deadline = deadline, .json = true, .wants_read = wants_read};
}

/* ---- hold_plan, rule by rule ---- */

static void test_final_answers_everybody(void **unused)
{
    (void)unused;
    struct state_fact f = fact_fresh(1000);
    f.final = true;
    f.status = TXS_SUCCEEDED;
    struct hold_waiter w[] = {html(5000), json(2000, false), html(900)};
    bool a[3];
    struct hold_plan p;
    hold_plan(&f, false, false, w, 3, 1000, a, &p);
    assert_true(a[0] && a[1] && a[2]);
    assert_int_equal(p.nanswer, 3);
    assert_false(p.claim);
    assert_true(p.wake == HOLD_NEVER);
    f.final = false;
    f.not_found = true;
    hold_plan(&f, false, false, w, 3, 1000, a, &p);
    assert_true(a[0] && a[1] && a[2]);
    assert_false(p.claim);
}

static void test_fresh_html_claims_and_waits(void **unused)
{
    (void)unused;
    struct state_fact f = fact_fresh(0);
    struct hold_waiter w[] = {html(HOLD_MS)};
    bool a[1];
    struct hold_plan p;
    hold_plan(&f, false, false, w, 1, 0, a, &p);
    assert_true(p.claim);
    assert_false(a[0]);
    assert_int_equal(p.wake, HOLD_MS);
}

static void test_in_flight_everybody_waits(void **unused)
{
    (void)unused;
    struct state_fact f = fact_fresh(100);
    f.in_flight = true;
    f.in_flight_until = 6100;
    f.next_read = 1500;
    struct hold_waiter w[] = {html(HOLD_MS), json(6600, false)};
    bool a[2];
    struct hold_plan p;
    /* another process's read: look again at its lease's end at the latest */
    hold_plan(&f, false, false, w, 2, 100, a, &p);
    assert_false(a[0] || a[1] || p.claim);
    assert_int_equal(p.wake, 6100);
    /* our own read: its end is an event; only deadlines need a timer */
    hold_plan(&f, true, false, w, 2, 100, a, &p);
    assert_false(a[0] || a[1] || p.claim);
    assert_int_equal(p.wake, 6600);
    /* our read outlived its lease in the state (a stalled loop): still ours,
     * still in flight; no second read of the transaction */
    f = fact_fresh(7000);
    hold_plan(&f, true, false, w, 2, 7000, a, &p);
    assert_false(p.claim);
    assert_false(a[0]);
}

static void test_html_waits_for_the_pace(void **unused)
{
    (void)unused;
    struct state_fact f = fact_fresh(200);
    f.next_read = 1500;
    f.wait = WAIT_PACE;
    struct hold_waiter w[] = {html(HOLD_MS)};
    bool a[1];
    struct hold_plan p;
    hold_plan(&f, false, false, w, 1, 200, a, &p);
    assert_false(a[0] || p.claim);
    assert_int_equal(p.wake, 1500);
    /* exactly at next_read the read starts */
    f.next_read = 1500;
    f.wait = WAIT_NONE;
    hold_plan(&f, false, false, w, 1, 1500, a, &p);
    assert_true(p.claim);
    assert_false(a[0]);
}

static void test_html_answered_when_no_read_can_start_before_its_deadline(void **unused)
{
    (void)unused;
    enum state_wait why[] = {WAIT_PACE, WAIT_RETRY, WAIT_KEY_PAUSE, WAIT_HOST_PAUSE, WAIT_BUDGET};
    for (size_t i = 0; i < ARRAY_LEN(why); i++) {
        struct state_fact f = fact_fresh(33000);
        f.next_read = 45500; /* past the deadline */
        f.wait = why[i];
        struct hold_waiter w[] = {html(HOLD_MS), html(50000)};
        bool a[2];
        struct hold_plan p;
        hold_plan(&f, false, false, w, 2, 33000, a, &p);
        assert_true(a[0]);   /* nothing can change before 34 s */
        assert_false(a[1]);  /* the later one still has a read coming */
        assert_false(p.claim);
        assert_int_equal(p.wake, 45500);
        /* a read that may start exactly at the deadline still counts */
        f.next_read = HOLD_MS;
        hold_plan(&f, false, false, w, 2, 33000, a, &p);
        assert_false(a[0]);
        assert_int_equal(p.wake, HOLD_MS);
    }
}

static void test_no_room_answers_at_once(void **unused)
{
    (void)unused;
    struct state_fact f = fact_fresh(0);
    f.wait = WAIT_FULL;
    f.next_read = 1000;
    struct hold_waiter w[] = {html(HOLD_MS), json(6500, false)};
    bool a[2];
    struct hold_plan p;
    hold_plan(&f, false, false, w, 2, 0, a, &p);
    assert_true(a[0] && a[1]);
    assert_false(p.claim);
}

static void test_late_timer_reads_for_nobody_late(void **unused)
{
    (void)unused;
    /* the timer for a 34 s deadline fires 14 ms late, when a read is allowed */
    struct state_fact f = fact_fresh(HOLD_MS + 14);
    struct hold_waiter w[] = {html(HOLD_MS), json(HOLD_MS + 10, false)};
    bool a[2];
    struct hold_plan p;
    hold_plan(&f, false, false, w, 2, HOLD_MS + 14, a, &p);
    assert_true(a[0] && a[1]);
    assert_false(p.claim);
    assert_true(p.wake == HOLD_NEVER);
    /* with one waiter still in time, the read is for it, the late one goes */
    struct hold_waiter w2[] = {html(HOLD_MS), html(HOLD_MS + 5000)};
    hold_plan(&f, false, false, w2, 2, HOLD_MS + 14, a, &p);
    assert_true(a[0]);
    assert_false(a[1]);
    assert_true(p.claim);
    /* on time, at the deadline exactly: answered, and no read for it */
    f = fact_fresh(HOLD_MS);
    hold_plan(&f, false, false, w, 1, HOLD_MS, a, &p);
    assert_true(a[0]);
    assert_false(p.claim);
}

static void test_json_rules(void **unused)
{
    (void)unused;
    struct state_fact f = fact_fresh(0);
    bool a[3];
    struct hold_plan p;
    /* a fresh transaction: the JSON request gets one read */
    struct hold_waiter w1[] = {json(6500, false)};
    hold_plan(&f, false, false, w1, 1, 0, a, &p);
    assert_true(p.claim);
    assert_false(a[0]);
    /* its read ended, pending: answered, even though another read could start */
    struct hold_waiter w2[] = {json(6500, true)};
    hold_plan(&f, false, false, w2, 1, 1500, a, &p);
    assert_true(a[0]);
    assert_false(p.claim);
    /* no read allowed now: answered at once with what is known */
    f.next_read = 1500;
    f.wait = WAIT_PACE;
    struct hold_waiter w3[] = {json(7000, false)};
    hold_plan(&f, false, false, w3, 1, 500, a, &p);
    assert_true(a[0]);
    assert_false(p.claim);
    /* mixed: a read allowed now for a new JSON and an HTML waiter; the JSON
     * one whose read ended is answered, the others wait for the new read */
    f = fact_fresh(1500);
    struct hold_waiter w4[] = {json(6500, true), json(8000, false), html(HOLD_MS)};
    hold_plan(&f, false, false, w4, 3, 1500, a, &p);
    assert_true(p.claim);
    assert_true(a[0]);
    assert_false(a[1] || a[2]);
    assert_int_equal(p.nanswer, 1);
}

static void test_stopping_answers_and_never_reads(void **unused)
{
    (void)unused;
    struct state_fact f = fact_fresh(0);
    struct hold_waiter w[] = {html(HOLD_MS), json(6500, false)};
    bool a[2];
    struct hold_plan p;
    hold_plan(&f, false, true, w, 2, 0, a, &p);
    assert_true(a[0] && a[1]);
    assert_false(p.claim);
    f.in_flight = true;
    f.in_flight_until = 6000;
    hold_plan(&f, true, true, w, 2, 0, a, &p);
    assert_true(a[0] && a[1]);
}

/* ---- a client at its count: hold_step over a real state ---- */

static void test_client_at_its_count_waits_then_blocked_answers(void **unused)
{
    (void)unused;
    struct state_opts o = {.tx_slots = 64, .key_slots = 8, .read_timeout_ms = 5000};
    char err[128];
    struct state *st = state_new(&o, err, sizeof err);
    assert_non_null(st);
    state_test_keys_accepted(st, true); /* six reads in flight at once: a key Kasera took */
    struct state_key k;
    struct pace_schedule sched;
    struct state_client c;
    struct state_ticket t[6];
    struct state_fact f;
    struct hold_result r;
    bool a[2];
    state_key_id(st, "sk_test_sim", &k);
    pace_default(&sched);
    state_client_id(st, &k, "203.0.113.7", &c);
    const int64_t now = 1000000;
    for (int i = 0; i < 5; i++) { /* a burst: 5 guesses in flight */
        char id[8];
        snprintf(id, sizeof id, "G%d", i);
        assert_true(state_claim_client(st, &k, id, &sched, 120, 5000, &c, now, &t[i], &f));
    }
    /* the 6th: an HTML request waits for them (no read, no answer, looks
     * again soon); a JSON one is answered at once */
    struct hold_waiter w[] = {html(now + HOLD_MS), json(now + 5000, false)};
    hold_step(st, &k, "G5", &sched, 120, 5000, &c, false, false, w, 2, now + 10, a, &t[5], &r);
    assert_false(r.claimed);
    assert_int_equal(r.fact.wait, WAIT_CLIENT);
    assert_false(a[0]);
    assert_true(a[1]);
    assert_true(r.plan.wake <= now + 10 + STATE_CLIENT_RECHECK_MS);
    /* nobody's request for it would read */
    hold_step(st, &k, "G5", &sched, 120, 5000, NULL, false, false, w, 1, now + 10, a, &t[5], &r);
    assert_true(r.claimed);
    state_unclaim(st, &t[5], now + 10);
    /* the 5 answer 404: blocked; the 6th is answered at once, with no read */
    struct outcome nf = {.kind = OUT_NOT_FOUND, .retry_after_ms = -1};
    struct state_report rep;
    for (int i = 0; i < 5; i++)
        state_finish(st, &t[i], "toko-a", &nf, now + 300, &rep);
    assert_true(rep.client_blocked);
    hold_step(st, &k, "G5", &sched, 120, 5000, &c, false, false, w, 1, now + 301, a, &t[5], &r);
    assert_false(r.claimed);
    assert_true(a[0]);
    state_free(st);
}

/* ---- whole episodes: hold_step over a real state, a fake clock ---- */

#define SIM_MAX 64

struct sim {
    struct state *st;
    struct state_key key;
    struct pace_schedule sched;
    int budget;
    /* the requests */
    size_t n;
    int64_t arrive[SIM_MAX];
    struct hold_waiter w[SIM_MAX];
    bool done[SIM_MAX];
    int64_t answered_at[SIM_MAX];
    bool answered_final[SIM_MAX];
    /* the reads */
    int64_t read_ms;          /* how long each read takes */
    int final_at_read;        /* the read (1-based) that finds succeeded; 0: never */
    int64_t timer_late_ms;    /* every timer fires this late */
    bool reading;
    int64_t read_end;
    struct state_ticket t;
    int nreads;
    int64_t reads[SIM_MAX];
    int64_t wake;
};

static void sim_init(struct sim *s, int64_t read_ms, int final_at_read)
{
    memset(s, 0, sizeof *s);
    struct state_opts o = {.tx_slots = 64, .key_slots = 8, .read_timeout_ms = 5000};
    char err[128];
    s->st = state_new(&o, err, sizeof err);
    assert_non_null(s->st);
    state_key_id(s->st, "sk_test_sim", &s->key);
    pace_default(&s->sched);
    s->budget = 120;
    s->read_ms = read_ms;
    s->final_at_read = final_at_read;
    s->wake = HOLD_NEVER;
}

static void sim_add(struct sim *s, int64_t at, bool is_json)
{
    assert_true(s->n < SIM_MAX);
    s->arrive[s->n] = at;
    s->w[s->n] = (struct hold_waiter){.deadline = at + (is_json ? 5000 + PACE_GRACE_MS : HOLD_MS), .json = is_json};
    s->n++;
}

/* One step of the transaction at `now`, as the resolver makes it. */
static void sim_step(struct sim *s, int64_t now)
{
    struct hold_waiter w[SIM_MAX];
    size_t idx[SIM_MAX], m = 0;
    bool a[SIM_MAX];
    for (size_t i = 0; i < s->n; i++)
        if (!s->done[i] && s->arrive[i] <= now) {
            idx[m] = i;
            w[m++] = s->w[i];
        }
    if (m == 0) {
        s->wake = HOLD_NEVER;
        return;
    }
    struct hold_result r;
    struct state_ticket t;
    hold_step(s->st, &s->key, "T1", &s->sched, s->budget, 5000, NULL, s->reading, false, w, m, now, a, &t, &r);
    for (size_t j = 0; j < m; j++) {
        s->w[idx[j]] = w[j];
        if (a[j]) {
            s->done[idx[j]] = true;
            s->answered_at[idx[j]] = now;
            s->answered_final[idx[j]] = r.fact.final;
        }
    }
    if (r.claimed) {
        assert_false(s->reading);
        assert_true(s->nreads < SIM_MAX);
        s->reading = true;
        s->t = t;
        s->read_end = now + s->read_ms;
        s->reads[s->nreads++] = now;
    }
    s->wake = r.plan.wake;
}

/* Run until nothing is left: events in time order (a read's end, then an
 * arrival, then the timer), each followed by a step. */
static void sim_run(struct sim *s)
{
    size_t next_arrival = 0;
    for (int guard = 0; guard < 10000; guard++) {
        int64_t ta = next_arrival < s->n ? s->arrive[next_arrival] : HOLD_NEVER;
        int64_t tr = s->reading ? s->read_end : HOLD_NEVER;
        int64_t tt = s->wake == HOLD_NEVER ? HOLD_NEVER : s->wake + s->timer_late_ms;
        int64_t now = tr <= ta && tr <= tt ? tr : ta <= tt ? ta : tt;
        if (now == HOLD_NEVER)
            return;
        if (now == tr) {
            bool final = s->final_at_read > 0 && s->nreads >= s->final_at_read;
            struct outcome oc = {.kind = OUT_STATUS, .status = final ? TXS_SUCCEEDED : TXS_PENDING,
                                 .retry_after_ms = -1};
            util_copy(oc.status_word, sizeof oc.status_word, final ? "succeeded" : "pending");
            struct state_report rep;
            s->t.sent = s->t.started;
            state_finish(s->st, &s->t, "toko-a", &oc, now, &rep);
            s->reading = false;
        } else if (now == ta) {
            next_arrival++;
        }
        sim_step(s, now);
    }
    fail_msg("the simulation did not end");
}

static void sim_free(struct sim *s)
{
    state_free(s->st);
}

static const int64_t default_reads[] = {0, 1500, 3500, 6500, 11500, 19500, 32500};

static void assert_reads(const struct sim *s, const int64_t *want, int n, int64_t offset)
{
    for (int i = 0; i < n && i < s->nreads; i++)
        if (s->reads[i] != want[i] + offset)
            fail_msg("read %d started at %lld, want %lld", i + 1, (long long)s->reads[i], (long long)(want[i] + offset));
    assert_int_equal(s->nreads, n);
}

static void test_sim_one_request_default_schedule(void **unused)
{
    (void)unused;
    struct sim s;
    sim_init(&s, 100, 0);
    sim_add(&s, 0, false);
    sim_run(&s);
    assert_reads(&s, default_reads, 7, 0);
    /* after the read at 32.5 s ends, the next could start at 45.5 s, past
     * the 34 s deadline: answered then, not at the deadline */
    assert_true(s.done[0]);
    assert_int_equal(s.answered_at[0], 32600);
    assert_false(s.answered_final[0]);
    sim_free(&s);
}

static void test_sim_final_answers_at_the_read_that_found_it(void **unused)
{
    (void)unused;
    struct sim s;
    sim_init(&s, 250, 3);
    for (int i = 0; i < 5; i++)
        sim_add(&s, i * 100, false);
    sim_run(&s);
    assert_reads(&s, default_reads, 3, 0);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(s.answered_at[i], 3500 + 250);
        assert_true(s.answered_final[i]);
    }
    sim_free(&s);
}

static void test_sim_twenty_tabs_one_schedule(void **unused)
{
    (void)unused;
    struct sim s;
    sim_init(&s, 80, 0);
    for (int i = 0; i < 20; i++)
        sim_add(&s, i * 50, false); /* tabs opened over the first second */
    sim_run(&s);
    /* the last tab's deadline is 34.95 s: the same seven reads */
    assert_reads(&s, default_reads, 7, 0);
    for (int i = 0; i < 20; i++)
        assert_int_equal(s.answered_at[i], 32580);
    sim_free(&s);
}

static void test_sim_late_joiner_follows_the_pace(void **unused)
{
    (void)unused;
    struct sim s;
    sim_init(&s, 100, 0);
    sim_add(&s, 0, false);
    sim_add(&s, 20000, false); /* deadline 54 s */
    sim_run(&s);
    /* the joiner does not restart the schedule: the pace goes on, the last
     * wait repeating (45.5 s), and reads stop at its deadline */
    static const int64_t want[] = {0, 1500, 3500, 6500, 11500, 19500, 32500, 45500};
    assert_reads(&s, want, 8, 0);
    assert_int_equal(s.answered_at[0], 32600);
    assert_int_equal(s.answered_at[1], 45600); /* 58.5 s would be past 54 s */
    sim_free(&s);
}

static void test_sim_late_timers_never_read_for_the_late(void **unused)
{
    (void)unused;
    struct sim s;
    sim_init(&s, 100, 0);
    s.timer_late_ms = 14;
    sim_add(&s, 0, false);
    sim_add(&s, 12600, false); /* deadline 46.6 s: 45.5 s is a read for it */
    sim_run(&s);
    /* every read 14 ms late; the pace then counts from the late start */
    static const int64_t want[] = {0, 1514, 3528, 6542, 11556, 19570, 32584, 45598};
    assert_reads(&s, want, 8, 0);
    for (int i = 0; i < s.nreads; i++)
        for (size_t j = 0; j < s.n; j++)
            if (s.reads[i] >= s.w[j].deadline && s.answered_at[j] > s.w[j].deadline)
                fail_msg("a read at %lld for a request whose deadline %lld had passed",
                         (long long)s.reads[i], (long long)s.w[j].deadline);
    sim_free(&s);

    /* the deadline timer itself late while a read is allowed: no read */
    sim_init(&s, 100, 0);
    s.sched.n = 2;
    s.sched.wait_ms[0] = 0;
    s.sched.wait_ms[1] = 30000;
    s.timer_late_ms = 14;
    sim_add(&s, 0, false); /* deadline 34 s; the second read would be at 30 s */
    s.w[0].deadline = 30000; /* as if the request came with a deadline at that read */
    sim_run(&s);
    assert_int_equal(s.nreads, 1);
    assert_int_equal(s.answered_at[0], 30014);
    sim_free(&s);
}

static void test_sim_json_polling_gets_what_the_pace_allows(void **unused)
{
    (void)unused;
    struct sim s;
    sim_init(&s, 50, 0);
    for (int i = 0; i < 20; i++)
        sim_add(&s, i * 500, true); /* a storefront polling every 0.5 s for 10 s */
    sim_run(&s);
    static const int64_t want[] = {0, 1500, 3500, 6500};
    assert_reads(&s, want, 4, 0);
    for (size_t i = 0; i < s.n; i++) {
        bool starts_read = false;
        for (int k = 0; k < s.nreads; k++)
            starts_read |= s.reads[k] == s.arrive[i];
        /* a poll that starts a read is answered when it ends, others at once */
        assert_int_equal(s.answered_at[i], s.arrive[i] + (starts_read ? 50 : 0));
    }
    sim_free(&s);
}

static void test_sim_html_and_json_share_reads(void **unused)
{
    (void)unused;
    struct sim s;
    sim_init(&s, 100, 4);
    sim_add(&s, 0, false);
    sim_add(&s, 1000, true);  /* during the pace's wait: answered at once */
    sim_add(&s, 1550, true);  /* during the read at 1.5 s: answered at its end */
    sim_run(&s);
    assert_reads(&s, default_reads, 4, 0);
    assert_int_equal(s.answered_at[1], 1000);
    assert_int_equal(s.answered_at[2], 1600);
    assert_int_equal(s.answered_at[0], 6600);
    assert_true(s.answered_final[0]);
    sim_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_final_answers_everybody),
        cmocka_unit_test(test_fresh_html_claims_and_waits),
        cmocka_unit_test(test_in_flight_everybody_waits),
        cmocka_unit_test(test_html_waits_for_the_pace),
        cmocka_unit_test(test_html_answered_when_no_read_can_start_before_its_deadline),
        cmocka_unit_test(test_no_room_answers_at_once),
        cmocka_unit_test(test_late_timer_reads_for_nobody_late),
        cmocka_unit_test(test_json_rules),
        cmocka_unit_test(test_stopping_answers_and_never_reads),
        cmocka_unit_test(test_client_at_its_count_waits_then_blocked_answers),
        cmocka_unit_test(test_sim_one_request_default_schedule),
        cmocka_unit_test(test_sim_final_answers_at_the_read_that_found_it),
        cmocka_unit_test(test_sim_twenty_tabs_one_schedule),
        cmocka_unit_test(test_sim_late_joiner_follows_the_pace),
        cmocka_unit_test(test_sim_late_timers_never_read_for_the_late),
        cmocka_unit_test(test_sim_json_polling_gets_what_the_pace_allows),
        cmocka_unit_test(test_sim_html_and_json_share_reads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
