/* resolver.c - see resolver.h.
 *
 * Data: a watch per transaction that has held requests or our read in
 * flight, found through a hash table; each watch has its waiters (a list),
 * a timer (when hold_step() wants to look again) and at most one read. The
 * decisions are hold_step()'s; this file does the bookkeeping and the I/O
 * around them: the API client, the state's outcomes, the log lines. A
 * watch the budget's plan holds back waits in its key's turn (turnset.h)
 * rather than on a timer of its own: the key is looked at once, when each
 * would have looked, and its members stepped only when it may let one
 * through. */
#include "resolver.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "coord.h"
#include "kasera.h"
#include "log.h"
#include "state_redis.h"
#include "turnset.h"
#include "util.h"
#include "watchset.h"

#define WAKE_POLL_MS 100   /* how often the wake thread looks at its stop flag */

struct rread;

struct resolver_watch {
    struct watchset_node node;        /* first: its (key, id), in rs->ws */
    struct resolver *rs;
    struct resolver_waiter *waiters;  /* newest first: it leads (schedule, budget) */
    size_t nwaiters;
    struct rread *reading;            /* our read of it in flight, or NULL */
    struct loop_timer timer;
    struct turnset_node turn;         /* withheld by the budget's plan: in its key's turn */
    bool budget_waited;               /* counted in budget_waits: its read waited for the key's budget */
    int refused;                      /* our reads of it the per-transaction window refused in a row */
    uint32_t heard;                   /* messages from Redis about it so far (on_redis_msg) */
};

struct rread {
    struct kasera_read kr;
    struct coord_read cr;             /* the claim, here and at Redis (its shop: the key) */
    struct state_redis_op *claiming;  /* asking Redis for it (not reading yet), or NULL */
    uint32_t heard;                   /* w->heard when the claim went out */
    struct config *cfg;               /* a reference: the key and base URL */
    struct resolver *rs;
    struct resolver_watch *w;         /* NULL once the watch is gone */
    struct rread *prev, *next;        /* all reads in flight */
};

struct resolver {
    struct app *app;
    struct loop *loop;
    struct kasera_client *api;
    struct state_redis *redis;        /* the state across hosts, or NULL */
    struct state_redis_id host;       /* this host in Redis: from the state's salt, shared by its processes */
    struct coord_names names;         /* every shop key's name in Redis (another host's reads heard) */
    resolver_answer_fn *answer;
    void *ctx;
    bool stopping;
    bool quiet;                       /* resolver_quiet: no read starts */
    size_t held;
    struct watchset ws;               /* the watches, found by what changed */
    struct turnset turns;             /* the withheld ones, by key */
    uint64_t cursor;                  /* the state's change log read up to here (state_changes) */
    struct rread *reads;
    /* the scratch arrays of one step, grown to the largest watch */
    struct hold_waiter *hw;
    bool *ans;
    size_t scratch;
    /* the state's wake: a thread on the futex, an eventfd on the loop */
    int wake_fd;
    struct loop_io wake_io;
    pthread_t waker;
    bool waker_started;
    atomic_bool waker_stop;
};

/* ---- watches ---- */

/* The watch of node n (its first member), or NULL. */
static struct resolver_watch *watch_of(struct watchset_node *n)
{
    return (struct resolver_watch *)n;
}

static struct resolver_watch *watch_find(struct resolver *rs, const struct state_key *k, const char *id)
{
    return watch_of(watchset_find(&rs->ws, k, id));
}

static void on_watch_timer(struct loop *l, struct loop_timer *t);

static struct resolver_watch *watch_get(struct resolver *rs, const struct state_key *k, const char *id)
{
    struct resolver_watch *w = watch_find(rs, k, id);
    if (w != NULL)
        return w;
    w = calloc(1, sizeof *w);
    if (w == NULL)
        return NULL;
    w->rs = rs;
    watchset_add(&rs->ws, &w->node, k, id);
    loop_timer_init(&w->timer, on_watch_timer, w);
    return w;
}

/* The watch of turn member n. */
static struct resolver_watch *watch_of_turn(struct turnset_node *n)
{
    return (struct resolver_watch *)(void *)((char *)n - offsetof(struct resolver_watch, turn));
}

static void watch_drop(struct resolver *rs, struct resolver_watch *w)
{
    turnset_leave(&w->turn); /* its turn, maybe empty now, goes at its timer */
    watchset_remove(&rs->ws, &w->node);
    if (w->reading)
        w->reading->w = NULL;
    loop_timer_stop(rs->loop, &w->timer);
    free(w);
}

static void waiter_unlink(struct resolver_watch *w, struct resolver_waiter *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        w->waiters = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
    r->w = NULL;
    if (r->registered) {
        coord_unhold(w->rs->app->state, w->rs->redis, r->shop, w->node.id, &w->rs->host, util_mono_ms());
        r->registered = false;
    }
    w->nwaiters--;
    w->rs->held--;
    atomic_fetch_sub(&w->rs->app->m.held, 1);
}

/* ---- reads ---- */

/* One line per read. `ms` is the time since the read started, read back to
 * back with the line's stamp, so that ts minus ms is the read's start;
 * `answered` is when its end was recorded (the floor and a Retry-After
 * count from there), or 0 when it is recorded after this line. */
static void log_read(const struct rread *rd, const struct outcome *oc, uint64_t answered)
{
    long long ms = (long long)(util_mono_ms() - rd->cr.ticket.started);
    struct log_line l;
    log_begin(&l, oc->kind == OUT_STATUS || oc->kind == OUT_NOT_FOUND ? LOG_LV_INFO : LOG_LV_WARN, "read");
    log_str(&l, "shop", rd->cr.shop->id);
    log_str(&l, "id", rd->cr.ticket.id);
    log_int(&l, "http", rd->kr.http);
    log_str(&l, "outcome", classify_outcome_name(oc->kind));
    if (oc->kind == OUT_STATUS)
        log_str(&l, "status", oc->status_word);
    if (oc->error_code[0])
        log_str(&l, "error_code", oc->error_code);
    if (oc->request_id[0])
        log_str(&l, "request_id", oc->request_id);
    if (kasera_retry_after(&rd->kr)[0])
        log_str(&l, "retry_after", kasera_retry_after(&rd->kr));
    if (oc->message[0] && oc->kind != OUT_STATUS)
        log_str(&l, "message", oc->message);
    if (rd->kr.http == 0)
        log_str(&l, "error", rd->kr.error);
    log_int(&l, "ms", ms);
    if (rd->kr.sent > 0) /* when the request went out (after connecting): the pace counts from there */
        log_int(&l, "sent_ms", (long long)(rd->kr.sent - rd->cr.ticket.started));
    if (answered > 0)
        log_int(&l, "answered_ms", (long long)(answered - rd->cr.ticket.started));
    log_int(&l, "new_connection", rd->kr.connects > 0);
    log_end(&l);
}

/* The one line when a client's block starts, here or (with Redis) by
 * every host's count. */
static void log_client_blocked(const char *shop_id, const char *id)
{
    struct log_line l;
    log_begin(&l, LOG_LV_WARN, "client_blocked");
    log_str(&l, "shop", shop_id);
    log_str(&l, "id", id);
    log_str(&l, "msg", "a client had 5 ids answered 404 within 10 minutes on this shop: for 10 minutes its "
                       "requests there for ids nobody has paid for cost no read (checking)");
    log_end(&l);
}

/* Redis's count of a 404 this process's read got started the block. */
static void on_redis_blocked(void *ctx, const char *shop_id, const char *id)
{
    (void)ctx;
    log_client_blocked(shop_id, id);
}

static void log_report(const struct rread *rd, const struct outcome *oc, const struct state_report *rep)
{
    struct log_line l;
    if (oc->kind == OUT_UNAUTHORIZED && rep->key_paused) {
        log_begin(&l, LOG_LV_ERROR, "key_rejected");
        log_str(&l, "shop", rd->cr.shop->id);
        log_str(&l, "msg", "Kasera answered 401: the shop's secret key is wrong or revoked; "
                           "no read with it for 5 minutes (fix the key and reload)");
        log_end(&l);
    } else if (oc->kind == OUT_KEY_LIMITED && rep->key_paused) {
        log_begin(&l, LOG_LV_WARN, "key_paused");
        log_str(&l, "shop", rd->cr.shop->id);
        log_str(&l, "msg", "the key's requests per minute are spent; no read with it for about 60 s");
        log_end(&l);
    } else if (oc->kind == OUT_AUTH_BLOCKED && rep->host_paused) {
        log_begin(&l, LOG_LV_ERROR, "host_blocked");
        log_str(&l, "shop", rd->cr.shop->id);
        log_str(&l, "last_401_shop", rep->last_401_shop[0] ? rep->last_401_shop : NULL);
        log_str(&l, "msg", "Kasera is blocking this host after failed authentications; "
                           "no read with any key for about 60 s");
        log_end(&l);
    } else if (oc->kind == OUT_REJECTED) {
        log_begin(&l, LOG_LV_WARN, "read_rejected");
        log_str(&l, "shop", rd->cr.shop->id);
        log_str(&l, "id", rd->cr.ticket.id);
        log_str(&l, "error_code", oc->error_code);
        log_str(&l, "request_id", oc->request_id[0] ? oc->request_id : NULL);
        log_str(&l, "msg", strncmp(oc->error_code, "unverified_", 11) == 0
                               ? "the Kasera account is not verified: a person must finish verification"
                               : "Kasera refused this read; not retried in this episode");
        log_end(&l);
    }
    if (rep->client_blocked)
        log_client_blocked(rd->cr.shop->id, rd->cr.ticket.id);
    if (rep->first_unknown) {
        log_begin(&l, LOG_LV_WARN, "unknown_status");
        log_str(&l, "shop", rd->cr.shop->id);
        log_str(&l, "id", rd->cr.ticket.id);
        log_str(&l, "status", oc->status_word);
        log_str(&l, "msg", "a status kembali does not know; treated like pending");
        log_end(&l);
    }
}

static void read_release(struct resolver *rs, struct rread *rd)
{
    state_redis_cancel(rd->claiming);
    if (rd->prev)
        rd->prev->next = rd->next;
    else
        rs->reads = rd->next;
    if (rd->next)
        rd->next->prev = rd->prev;
    kasera_read_clear(&rd->kr);
    config_unref(rd->cfg);
    if (rd->w != NULL && rd->w->reading == rd)
        rd->w->reading = NULL;
    free(rd);
}

static bool step(struct resolver *rs, struct resolver_watch *w);

/* The API client's callback: a read ended. Record it, then decide again
 * for its transaction (its waiters may be answered now). */
static void on_read_done(void *ctx, struct kasera_read *kr)
{
    struct resolver *rs = ctx;
    struct rread *rd = kr->user;
    struct resolver_watch *w = rd->w;
    struct api_response resp;
    struct outcome oc;
    struct state_report rep;
    kasera_response(&rd->kr, &resp);
    classify_response(&resp, util_wall_s(), &oc);
    rd->cr.ticket.refused = w != NULL ? w->refused : 0; /* a refusal in a row moves the next read away */
    if (w != NULL)
        w->refused = oc.kind == OUT_TX_LIMITED ? w->refused + 1 : 0;
    uint64_t answered = util_mono_ms();
    coord_finish(rs->app->state, rs->redis, rs->app->keys, &rd->cr, &oc, rd->kr.sent, answered, &rep);
    atomic_fetch_add(&rs->app->m.reads[oc.kind], 1);
    atomic_fetch_add(&rs->app->m.connections, rd->kr.connects);
    log_read(rd, &oc, answered);
    log_report(rd, &oc, &rep);
    read_release(rs, rd);
    if (w != NULL)
        step(rs, w);
}

static void read_link(struct resolver *rs, struct resolver_watch *w, struct rread *rd)
{
    rd->w = w;
    w->reading = rd;
    rd->next = rs->reads;
    if (rs->reads)
        rs->reads->prev = rd;
    rs->reads = rd;
}

/* Make the read of rd (claimed here, and at Redis when it is used).
 * false when it could not even start: recorded as a read without answer
 * and rd freed. */
static bool read_go(struct resolver *rs, struct rread *rd)
{
    struct outcome none = {.kind = OUT_NO_ANSWER, .retry_after_ms = -1};
    struct state_report rep;
    if (kasera_start(rs->api, &rd->kr, rd->cfg->api_base, rd->cr.ticket.id, rd->cr.shop->secret,
                     rd->cfg->read_timeout_ms) != 0) {
        uint64_t answered = util_mono_ms();
        coord_finish(rs->app->state, rs->redis, rs->app->keys, &rd->cr, &none, 0, answered, &rep);
        log_read(rd, &none, answered);
        return false;
    }
    atomic_fetch_add(&rs->app->m.reads_started, 1);
    return true;
}

static void on_claimed(void *data, const struct state_redis_claim *c);

/* Start the read claimed with `t` for w's leading waiter's shop: with
 * Redis, ask it first (the read is then "claiming" until it answers).
 * Returns false when it could not even start (recorded as a read without
 * answer). */
static bool read_start(struct resolver *rs, struct resolver_watch *w, const struct resolver_waiter *lead,
                       const struct state_ticket *t)
{
    struct rread *rd = calloc(1, sizeof *rd);
    struct outcome none = {.kind = OUT_NO_ANSWER, .retry_after_ms = -1};
    struct state_report rep;
    if (rd == NULL) {
        state_finish(rs->app->state, t, lead->shop->id, &none, util_mono_ms(), &rep);
        return false;
    }
    rd->cr.ticket = *t; /* its client: the lead's, who a 404 is charged to (hold_step) */
    rd->cr.rclient = lead->rclient;
    rd->cr.has_rclient = lead->has_rclient;
    rd->cfg = config_ref(lead->cfg);
    rd->cr.shop = lead->shop;
    rd->cr.sched = &rd->cfg->sched;
    rd->kr.user = rd;
    rd->rs = rs;
    read_link(rs, w, rd);
    rd->heard = w->heard;
    rd->claiming = coord_ask(rs->app->state, rs->redis, &rd->cr, &rs->host, on_claimed, rd);
    if (rd->claiming != NULL)
        return true; /* Redis decides: on_claimed */
    if (!read_go(rs, rd)) {
        read_release(rs, rd);
        return false;
    }
    return true;
}

/* Answer now every waiter of w that asked from `client`'s address (a
 * blocked one: its address's, its /56's or its /48's block; waiters of
 * its other addresses ask Redis again), with what is known. */
static void answer_client(struct resolver *rs, struct resolver_watch *w, const struct state_redis_client *client,
                          int64_t now)
{
    struct state_fact f;
    const struct resolver_waiter *lead = w->waiters;
    if (lead == NULL)
        return;
    state_lookup(rs->app->state, &w->node.key, w->node.id, &lead->cfg->sched, lead->shop->read_budget, now, &f);
    for (struct resolver_waiter *r = w->waiters, *nx; r; r = nx) {
        nx = r->next;
        if (r->has_rclient && strcmp(r->rclient.tier[0].hex, client->tier[0].hex) == 0) {
            waiter_unlink(w, r);
            atomic_fetch_add(&rs->app->m.probes_refused, 1);
            rs->answer(rs->ctx, r, &f);
        }
    }
}

/* Redis answered a claim (or could not): read, or mirror what it says
 * here, give our claim back, and decide again. */
static void on_claimed(void *data, const struct state_redis_claim *c)
{
    struct rread *rd = data;
    struct resolver *rs = rd->rs;
    struct resolver_watch *w = rd->w;
    int64_t now = util_mono_ms();
    rd->claiming = NULL;
    enum coord_next next = coord_claimed(rs->app->state, &rd->cr, c, w != NULL && w->heard != rd->heard, now);
    if (next == COORD_READ) {
        if (read_go(rs, rd))
            return;
        read_release(rs, rd);
        if (w != NULL)
            step(rs, w);
        return;
    }
    /* no read was made for anybody: JSON waiters still want theirs */
    if (w != NULL)
        for (struct resolver_waiter *r = w->waiters; r; r = r->next)
            r->h.wants_read = false;
    if (next == COORD_BLOCKED && w != NULL) /* its requests get no read; the others decide again */
        answer_client(rs, w, &rd->cr.rclient, now);
    read_release(rs, rd);
    if (w != NULL)
        step(rs, w);
}

/* ---- the decision for one transaction ---- */

static bool scratch_fit(struct resolver *rs, size_t n)
{
    if (n <= rs->scratch)
        return true;
    size_t cap = rs->scratch ? rs->scratch : 16;
    while (cap < n)
        cap *= 2;
    struct hold_waiter *hw = realloc(rs->hw, cap * sizeof *hw);
    if (hw == NULL)
        return false;
    rs->hw = hw;
    bool *ans = realloc(rs->ans, cap * sizeof *ans);
    if (ans == NULL)
        return false;
    rs->ans = ans;
    rs->scratch = cap;
    return true;
}

static void on_turn_timer(struct loop *l, struct loop_timer *t);

/* w, withheld by the plan (fact f), waits in its key's turn; its own
 * timer runs only to its waiters' first deadline or its reservation.
 * false when out of memory (w stays in no turn). */
static bool turn_join(struct resolver *rs, struct resolver_watch *w, const struct state_fact *f)
{
    bool made;
    struct turnset_turn *t = turnset_join(&rs->turns, &w->turn, &w->node.key, &made);
    if (t == NULL)
        return false;
    if (made)
        loop_timer_init(&t->timer, on_turn_timer, rs);
    /* the key is looked at no later than this one would have looked */
    if ((!loop_timer_armed(&t->timer) || t->timer.at > f->next_read) &&
        loop_timer_at(rs->loop, &t->timer, f->next_read) != 0) {
        turnset_leave(&w->turn);
        return false;
    }
    int64_t own = f->withheld_own;
    for (const struct resolver_waiter *r = w->waiters; r; r = r->next)
        if (r->h.deadline < own)
            own = r->h.deadline;
    if (own == HOLD_NEVER)
        loop_timer_stop(rs->loop, &w->timer);
    else if (loop_timer_at(rs->loop, &w->timer, own) != 0) {
        turnset_leave(&w->turn);
        return false;
    }
    return true;
}

/* Answer the waiters of w that hold_step() picked, and arm w's timer (or
 * put w in its key's turn). True when a read of it started. */
static bool step(struct resolver *rs, struct resolver_watch *w)
{
    turnset_leave(&w->turn); /* looked at now: it joins again if still withheld */
    for (int round = 0; round < 2; round++) {
        if (w->waiters == NULL) {
            if (w->reading == NULL)
                watch_drop(rs, w);
            else
                loop_timer_stop(rs->loop, &w->timer); /* the read's end brings us back */
            return false;
        }
        struct state_fact none = {.wait = WAIT_FULL, .status_word = "unknown"};
        const struct state_fact *f = &none;
        struct hold_result res;
        struct state_ticket t;
        size_t n = w->nwaiters, i = 0;
        bool fit = scratch_fit(rs, n);
        if (fit) {
            for (struct resolver_waiter *r = w->waiters; r; r = r->next)
                rs->hw[i++] = r->h;
            /* a fresh clock: a claim records its start, which the pace counts from */
            const struct resolver_waiter *lead = w->waiters;
            coord_plan(rs->app->state, rs->redis);
            hold_step(rs->app->state, &w->node.key, w->node.id, &lead->cfg->sched,
                      state_redis_budget(rs->redis, lead->shop->read_budget),
                      lead->cfg->read_timeout_ms, &lead->client, w->reading != NULL, rs->stopping || rs->quiet, rs->hw, n,
                      util_mono_ms(), rs->ans, &t, &res);
            f = &res.fact;
            i = 0;
            for (struct resolver_waiter *r = w->waiters; r; r = r->next)
                r->h = rs->hw[i++];
        }
        if (fit && !res.claimed && f->wait == WAIT_BUDGET && !w->budget_waited) {
            w->budget_waited = true;
            atomic_fetch_add(&rs->app->m.budget_waits, 1);
        }
        bool started = !fit || !res.claimed || read_start(rs, w, w->waiters, &t);
        /* answer (the callback may free the waiter: take next first) */
        i = 0;
        for (struct resolver_waiter *r = w->waiters, *nx; r; r = nx, i++) {
            nx = r->next;
            if (!fit || rs->ans[i]) {
                waiter_unlink(w, r);
                if (f->wait == WAIT_CLIENT) /* its client is blocked, or at its count */
                    atomic_fetch_add(&rs->app->m.probes_refused, 1);
                rs->answer(rs->ctx, r, f);
            }
        }
        for (struct resolver_waiter *r = w->waiters; r; r = r->next)
            if (r->note != NULL)
                r->note(r, f);
        if (!started)
            continue; /* the read could not start: decide again (no read in flight now) */
        bool claimed = fit && res.claimed;
        if (w->waiters == NULL && w->reading == NULL) {
            watch_drop(rs, w);
            return claimed;
        }
        if (w->waiters == NULL || res.plan.wake == HOLD_NEVER)
            loop_timer_stop(rs->loop, &w->timer);
        else if (fit && f->withheld && w->reading == NULL && turn_join(rs, w, f))
            ; /* its key's turn looks again */
        else if (loop_timer_at(rs->loop, &w->timer, res.plan.wake) != 0)
            loop_timer_at(rs->loop, &w->timer, res.plan.wake); /* out of memory: try once more */
        return claimed;
    }
    /* two reads in a row could not even start: look again in a second */
    loop_timer_at(rs->loop, &w->timer, util_mono_ms() + 1000);
    return false;
}

/* May the plan of t's key let one of its members through now? *retry:
 * when that may change by itself (state_plan_open). */
static bool turn_open(struct resolver *rs, struct turnset_turn *t, int64_t *retry)
{
    const struct resolver_waiter *lead = watch_of_turn(t->head)->waiters;
    coord_plan(rs->app->state, rs->redis);
    return state_plan_open(rs->app->state, &t->key, &lead->cfg->sched,
                           state_redis_budget(rs->redis, lead->shop->read_budget), util_mono_ms(), retry);
}

/* Look at t's key: while it may let a member through, step its members
 * in the order they joined until one reads (then look at the key again).
 * Then arm t's timer for the key's next look, or drop t when empty. */
static void turn_look(struct resolver *rs, struct turnset_turn *t)
{
    int64_t retry = 0;
    bool open = t->n > 0 && turn_open(rs, t, &retry);
    for (size_t left = t->n; open && left > 0 && t->n > 0; left--) {
        struct turnset_node *n = turnset_take(t);
        if (step(rs, watch_of_turn(n))) /* it may rejoin t, last */
            open = t->n > 0 && turn_open(rs, t, &retry);
    }
    if (t->n == 0) {
        loop_timer_stop(rs->loop, &t->timer);
        turnset_drop(&rs->turns, t);
        return;
    }
    if (loop_timer_at(rs->loop, &t->timer, retry) != 0 && !loop_timer_armed(&t->timer)) {
        /* out of memory: its members look on their own again */
        for (struct turnset_node *n; (n = turnset_take(t)) != NULL;)
            loop_timer_at(rs->loop, &watch_of_turn(n)->timer, retry);
        turnset_drop(&rs->turns, t);
    }
}

static void on_turn_timer(struct loop *l, struct loop_timer *tm)
{
    struct resolver *rs = tm->data;
    struct turnset_turn *t = (struct turnset_turn *)(void *)((char *)tm - offsetof(struct turnset_turn, timer));
    (void)l;
    turn_look(rs, t);
}


static void on_watch_timer(struct loop *l, struct loop_timer *t)
{
    struct resolver_watch *w = t->data;
    (void)l;
    step(w->rs, w);
}

/* Step every marked watch that has requests held (stepping may drop
 * watches: watchset_pop() never returns one that is gone). */
static void step_marked(struct resolver *rs)
{
    struct watchset_node *n;
    while ((n = watchset_pop(&rs->ws)) != NULL) {
        struct resolver_watch *w = watch_of(n);
        if (w->waiters != NULL)
            step(rs, w);
    }
}

#define WAKE_BATCH 64

/* Something changed in some process (the state's generation moved): read
 * what from the state's change log and look again only at the watches it
 * concerns (a read's end, a told status: that transaction's; a pause: its
 * key's or every one), those with a read of their own in flight too (a
 * told final status answers them at once; otherwise they go on waiting).
 * A log read too late (lost) looks at every watch. */
static void on_wake(struct loop *l, struct loop_io *io, uint32_t events)
{
    struct resolver *rs = io->data;
    uint64_t v;
    (void)l, (void)events;
    if (read(rs->wake_fd, &v, sizeof v) < 0 && errno != EAGAIN)
        return;
    struct state_change ch[WAKE_BATCH];
    bool lost = false;
    size_t n;
    do {
        n = state_changes(rs->app->state, &rs->cursor, ch, WAKE_BATCH, util_mono_ms(), &lost);
        for (size_t i = 0; i < n; i++)
            watchset_mark_change(&rs->ws, &ch[i]);
    } while (n == WAKE_BATCH);
    if (lost)
        watchset_mark_all(&rs->ws);
    step_marked(rs);
}

/* Redis asks for this host's reads with a key (rkey), or with every key
 * (NULL: a join): budget.h. */
static void on_redis_seed(void *ctx, const struct state_redis_id *rkey)
{
    struct resolver *rs = ctx;
    struct config *cfg = app_config(rs->app);
    coord_names_for(&rs->names, rs->redis, cfg);
    config_unref(cfg);
    coord_seed(rs->app->state, rs->redis, &rs->names, &rs->host, rkey, util_mono_ms());
}

/* Another process (maybe on another host) published a read's end or a
 * told status: mirror it in this host's state for the watches that wait
 * on it (its id's, under the key Redis names), and let them decide again. */
static void on_redis_msg(void *ctx, const struct state_redis_msg *m)
{
    struct resolver *rs = ctx;
    if (m->kind == STATE_REDIS_MSG_BLOCK)
        return; /* Redis refuses that client's claims itself */
    if (m->kind == STATE_REDIS_MSG_SEED) {
        on_redis_seed(rs, &m->key);
        return;
    }
    if (m->kind == STATE_REDIS_MSG_READ) { /* another host's read spends the key's budget here too */
        struct config *cfg = app_config(rs->app);
        coord_names_for(&rs->names, rs->redis, cfg);
        config_unref(cfg);
        coord_heard(rs->app->state, &rs->names, &rs->host, m, util_mono_ms());
        return;
    }
    struct state *st = rs->app->state;
    int64_t now = util_mono_ms();
    bool any = false;
    for (struct watchset_node *n = watchset_id_first(&rs->ws, m->id); n; n = watchset_id_next(n, m->id)) {
        struct resolver_watch *w = watch_of(n);
        if (w->waiters == NULL)
            continue;
        struct state_redis_id k;
        if (!state_redis_key_id(rs->redis, w->waiters->shop->secret, &k) || strcmp(k.hex, m->key.hex) != 0)
            continue;
        coord_mirror(st, &n->key, n->id, m, now);
        w->heard++;
        watchset_mark(&rs->ws, n);
        any = true;
    }
    if (!any) /* nobody waits here: what this host knows of it may still answer */
        coord_mirror_unwatched(st, rs->app->keys, m, now);
    step_marked(rs);
}

/* The wake thread: waits on the state's futex generation; when it moves,
 * writes the eventfd. It touches nothing else. */
static void *waker_main(void *arg)
{
    struct resolver *rs = arg;
    uint32_t seen = state_generation(rs->app->state);
    while (!atomic_load(&rs->waker_stop)) {
        uint32_t g = state_wait_change(rs->app->state, seen, WAKE_POLL_MS);
        if (g != seen) {
            seen = g;
            uint64_t one = 1;
            if (write(rs->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
                break;
        }
    }
    return NULL;
}

/* ---- the interface ---- */

struct resolver *resolver_new(struct app *a, struct loop *l, resolver_answer_fn *answer, void *ctx,
                              char *err, size_t errlen)
{
    struct resolver *rs = calloc(1, sizeof *rs);
    if (rs == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    rs->app = a;
    rs->loop = l;
    rs->answer = answer;
    rs->ctx = ctx;
    rs->wake_fd = -1;
    watchset_init(&rs->ws);
    turnset_init(&rs->turns);
    rs->cursor = state_changes_head(a->state); /* what changes from now on */
    rs->api = kasera_new(l, on_read_done, rs);
    if (rs->api == NULL) {
        snprintf(err, errlen, "cannot start libcurl");
        goto fail;
    }
    rs->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (rs->wake_fd < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        goto fail;
    }
    loop_io_init(&rs->wake_io, rs->wake_fd, on_wake, rs);
    if (loop_io_set(l, &rs->wake_io, EPOLLIN) != 0) {
        snprintf(err, errlen, "epoll: %s", strerror(errno));
        goto fail;
    }
    int e = pthread_create(&rs->waker, NULL, waker_main, rs);
    if (e != 0) {
        snprintf(err, errlen, "cannot start the state's wake thread: %s", strerror(e));
        goto fail;
    }
    rs->waker_started = true;
    struct config *cfg = app_config(a);
    if (cfg->redis.on) {
        struct state_key hk;
        state_key_id(a->state, "kembali host", &hk); /* a keyed hash: the same for every process of this state */
        ids_hex(hk.b, 8, rs->host.hex);
        rs->redis = state_redis_new(l, &cfg->redis, on_redis_msg, on_redis_blocked, on_redis_seed, rs, err, errlen);
        a->redis = rs->redis;
        a->keys = calloc(1, sizeof *a->keys);
        if (a->keys == NULL && rs->redis != NULL) {
            snprintf(err, errlen, "out of memory");
            config_unref(cfg);
            goto fail;
        }
    }
    bool redis_failed = cfg->redis.on && rs->redis == NULL;
    config_unref(cfg);
    if (redis_failed)
        goto fail;
    return rs;
fail:
    resolver_free(rs);
    return NULL;
}

/* A hold asked of Redis (coord_hold), until its answer. */
struct held_ask {
    struct resolver *rs;
    struct state_key key;
    char id[STATE_ID_MAX + 1];
};

static void on_held(void *data, const struct state_redis_held *h)
{
    struct held_ask *ha = data;
    if (!h->down) /* down: maybe the resolver's own teardown; nothing to mirror */
        coord_held(ha->rs->app->state, &ha->key, ha->id, h, util_mono_ms());
    free(ha);
}

void resolver_hold(struct resolver *rs, struct resolver_waiter *r)
{
    long held = atomic_fetch_add(&rs->app->m.held, 1) + 1;
    if (held > atomic_load(&rs->app->m.held_peak))
        atomic_store(&rs->app->m.held_peak, held);
    rs->held++;
    r->h.wants_read = false;
    struct resolver_watch *w = watch_get(rs, &r->shop->key, r->id);
    if (w == NULL) {
        struct state_fact f = {.wait = WAIT_FULL, .status_word = "unknown"};
        rs->held--;
        atomic_fetch_sub(&rs->app->m.held, 1);
        rs->answer(rs->ctx, r, &f);
        return;
    }
    /* an HTML request waits through the schedule: the budget's plan counts
     * it, and reserves its transaction's last-chance read */
    r->registered = false;
    if (!r->h.json && !rs->stopping && !rs->quiet) {
        struct held_ask *ha = calloc(1, sizeof *ha);
        bool asked = false;
        if (ha != NULL) {
            ha->rs = rs;
            ha->key = w->node.key;
            util_copy(ha->id, sizeof ha->id, w->node.id);
        }
        r->registered = coord_hold(rs->app->state, ha != NULL ? rs->redis : NULL, r->shop, w->node.id, &r->cfg->sched,
                                   state_redis_budget(rs->redis, r->shop->read_budget), r->h.deadline, &rs->host,
                                   util_mono_ms(), on_held, ha, &asked);
        if (!asked)
            free(ha);
    }
    r->w = w;
    r->prev = NULL;
    r->next = w->waiters; /* newest first: it leads */
    if (w->waiters)
        w->waiters->prev = r;
    w->waiters = r;
    w->nwaiters++;
    step(rs, w);
}

void resolver_drop(struct resolver *rs, struct resolver_waiter *r)
{
    struct resolver_watch *w = r->w;
    if (w == NULL)
        return;
    waiter_unlink(w, r);
    if (w->waiters == NULL && w->reading == NULL)
        watch_drop(rs, w);
    /* otherwise the others' timer or the read's end looks again */
}

void resolver_poke(struct resolver *rs, const struct state_key *key, const char *id)
{
    struct resolver_watch *w = watch_find(rs, key, id);
    if (w != NULL && w->waiters != NULL)
        step(rs, w);
}

void resolver_quiet(struct resolver *rs, bool on)
{
    rs->quiet = on;
}

size_t resolver_reading(const struct resolver *rs)
{
    size_t n = 0;
    for (const struct rread *rd = rs->reads; rd != NULL; rd = rd->next)
        n++;
    return n;
}

size_t resolver_held(const struct resolver *rs)
{
    return rs->held;
}

void resolver_stop(struct resolver *rs)
{
    rs->stopping = true;
    int64_t now = util_mono_ms();
    struct watchset_node *n;
    while ((n = watchset_first(&rs->ws)) != NULL) {
        struct resolver_watch *w = watch_of(n);
        if (w->waiters) {
            struct state_fact f;
            const struct resolver_waiter *lead = w->waiters;
            state_lookup(rs->app->state, &w->node.key, w->node.id, &lead->cfg->sched, lead->shop->read_budget, now, &f);
            while (w->waiters) {
                struct resolver_waiter *r = w->waiters;
                waiter_unlink(w, r);
                rs->answer(rs->ctx, r, &f);
            }
        }
        watch_drop(rs, w);
    }
    while (rs->reads) { /* abandoned: a read that gave no answer */
        struct rread *rd = rs->reads;
        struct outcome none = {.kind = OUT_NO_ANSWER, .retry_after_ms = -1};
        struct state_report rep;
        if (rd->claiming != NULL) { /* not read yet: give the claim back */
            coord_abandon(rs->app->state, &rd->cr, now);
            read_release(rs, rd);
            continue;
        }
        kasera_abort(rs->api, &rd->kr);
        util_copy(rd->kr.error, sizeof rd->kr.error, "abandoned: kembali is stopping");
        coord_finish(rs->app->state, rs->redis, rs->app->keys, &rd->cr, &none, rd->kr.sent, now, &rep);
        log_read(rd, &none, now);
        read_release(rs, rd);
    }
}

void resolver_free(struct resolver *rs)
{
    if (rs == NULL)
        return;
    if (rs->waker_started) {
        atomic_store(&rs->waker_stop, true);
        pthread_join(rs->waker, NULL);
    }
    while (watchset_first(&rs->ws) != NULL)
        watch_drop(rs, watch_of(watchset_first(&rs->ws)));
    for (struct turnset_turn *t; (t = turnset_first(&rs->turns)) != NULL;) {
        loop_timer_stop(rs->loop, &t->timer);
        turnset_drop(&rs->turns, t);
    }
    while (rs->reads) {
        if (rs->reads->claiming != NULL)
            coord_abandon(rs->app->state, &rs->reads->cr, util_mono_ms());
        else
            kasera_abort(rs->api, &rs->reads->kr);
        read_release(rs, rs->reads);
    }
    state_redis_free(rs->redis);
    coord_names_free(&rs->names);
    rs->app->redis = NULL;
    free(rs->app->keys);
    rs->app->keys = NULL;
    if (rs->wake_fd >= 0) {
        loop_io_set(rs->loop, &rs->wake_io, 0);
        close(rs->wake_fd);
    }
    kasera_free(rs->api);
    free(rs->hw);
    free(rs->ans);
    free(rs);
}
