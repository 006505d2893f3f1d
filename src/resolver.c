/* resolver.c - see resolver.h.
 *
 * Data: a watch per transaction that has waiting requests or a read in
 * flight, found through a small hash table; a read context per read in
 * flight. Everything here is touched by the resolver thread only, except
 * the inbox (requests handed over by accept threads), guarded by inbox_mu.
 *
 * The loop: take new requests from the inbox, collect finished reads, step
 * every watch whose time has come, then sleep in curl_multi_poll until the
 * earliest timer, a network event, or a wakeup from resolver_park(). */
#include "resolver.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kasera.h"
#include "log.h"
#include "util.h"

#define WATCH_BUCKETS 4096
#define LOOP_MAX_SLEEP_MS 1000

struct rread;

struct watch {
    struct state_key key;
    char id[STATE_ID_MAX + 1];
    struct req *waiters;
    struct rread *reading;      /* our read of it in flight, or NULL */
    int64_t next_step;          /* when to look at it again */
    struct watch *hnext, *prev, *next;
};

struct rread {
    struct kasera_read kr;
    struct state_ticket ticket;
    struct config *cfg;         /* a reference: the key and base URL */
    const struct shop *shop;
    struct watch *w;            /* NULL once the watch is gone */
    struct rread *prev, *next;  /* all reads in flight */
};

struct resolver {
    struct app *app;
    struct kasera_client *api;
    pthread_t thread;
    bool started;
    pthread_mutex_t inbox_mu;
    struct req *inbox;
    bool stop, stopped;         /* guarded by inbox_mu */
    struct watch *buckets[WATCH_BUCKETS];
    struct watch *all;
    struct rread *reads;        /* in flight */
    pthread_t watcher;          /* learns of reads ended by other processes */
    atomic_bool changed;        /* the state's generation moved */
    atomic_bool watcher_stop;
};

/* ---- watches ---- */

static uint32_t watch_hash(const struct state_key *k, const char *id)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < 16; i++)
        h = (h ^ k->b[i]) * 16777619u;
    for (; *id; id++)
        h = (h ^ (uint8_t)*id) * 16777619u;
    return h % WATCH_BUCKETS;
}

static struct watch *watch_find(struct resolver *rs, const struct state_key *k, const char *id)
{
    for (struct watch *w = rs->buckets[watch_hash(k, id)]; w; w = w->hnext)
        if (memcmp(w->key.b, k->b, 16) == 0 && strcmp(w->id, id) == 0)
            return w;
    return NULL;
}

static struct watch *watch_get(struct resolver *rs, const struct state_key *k, const char *id)
{
    struct watch *w = watch_find(rs, k, id);
    if (w != NULL)
        return w;
    w = calloc(1, sizeof *w);
    if (w == NULL)
        return NULL;
    w->key = *k;
    util_copy(w->id, sizeof w->id, id);
    uint32_t h = watch_hash(k, id);
    w->hnext = rs->buckets[h];
    rs->buckets[h] = w;
    w->next = rs->all;
    if (rs->all)
        rs->all->prev = w;
    rs->all = w;
    return w;
}

static void watch_drop(struct resolver *rs, struct watch *w)
{
    struct watch **pp = &rs->buckets[watch_hash(&w->key, w->id)];
    while (*pp != w)
        pp = &(*pp)->hnext;
    *pp = w->hnext;
    if (w->prev)
        w->prev->next = w->next;
    else
        rs->all = w->next;
    if (w->next)
        w->next->prev = w->prev;
    if (w->reading)
        w->reading->w = NULL;
    free(w);
}

/* ---- answering ---- */

static void answer(struct resolver *rs, struct req *r, const struct state_fact *f, int64_t now)
{
    struct answer ans;
    request_answer(f, now, &ans);
    atomic_fetch_sub(&rs->app->m.held, 1);
    front_respond(rs->app, r, &ans);
}

/* Answer and unlink every waiter for which keep(r) is false. */
static void answer_where(struct resolver *rs, struct watch *w, const struct state_fact *f, int64_t now,
                         bool (*done)(const struct req *, const struct state_fact *, int64_t))
{
    struct req **pp = &w->waiters;
    while (*pp) {
        struct req *r = *pp;
        if (done(r, f, now)) {
            *pp = r->next;
            answer(rs, r, f, now);
        } else {
            pp = &r->next;
        }
    }
}

static bool all_done(const struct req *r, const struct state_fact *f, int64_t now)
{
    (void)r, (void)f, (void)now;
    return true;
}

static bool past_deadline(const struct req *r, const struct state_fact *f, int64_t now)
{
    (void)f;
    return r->deadline <= now;
}

static bool json_read_done(const struct req *r, const struct state_fact *f, int64_t now)
{
    (void)f;
    return (r->json && r->wants_read) || r->deadline <= now;
}

/* No read is in flight and none can start before the request's deadline:
 * waiting longer cannot change its answer. JSON requests never wait for a
 * read that cannot start now. */
static bool cannot_improve(const struct req *r, const struct state_fact *f, int64_t now)
{
    if (r->deadline <= now || r->json || f->wait == WAIT_FULL)
        return true;
    return f->next_read > r->deadline;
}

/* ---- reads ---- */

/* One line per read. `ms` is the time since the read started, read back to
 * back with the line's stamp, so that ts minus ms is the read's start. */
static void log_read(const struct rread *rd, const struct outcome *oc)
{
    long long ms = (long long)(util_mono_ms() - rd->ticket.started);
    struct log_line l;
    log_begin(&l, oc->kind == OUT_STATUS || oc->kind == OUT_NOT_FOUND ? "info" : "warn", "read");
    log_str(&l, "shop", rd->shop->id);
    log_str(&l, "id", rd->ticket.id);
    log_int(&l, "http", rd->kr.http);
    log_str(&l, "outcome", classify_outcome_name(oc->kind));
    if (oc->kind == OUT_STATUS)
        log_str(&l, "status", oc->status_word);
    if (oc->error_code[0])
        log_str(&l, "error_code", oc->error_code);
    if (oc->request_id[0])
        log_str(&l, "request_id", oc->request_id);
    if (rd->kr.retry_after[0])
        log_str(&l, "retry_after", rd->kr.retry_after);
    if (oc->message[0] && oc->kind != OUT_STATUS)
        log_str(&l, "message", oc->message);
    if (rd->kr.http == 0)
        log_str(&l, "error", rd->kr.error);
    log_int(&l, "ms", ms);
    if (rd->kr.sent > 0) /* when the request went out (after connecting): the pace counts from there */
        log_int(&l, "sent_ms", (long long)(rd->kr.sent - rd->ticket.started));
    log_int(&l, "new_connection", rd->kr.connects > 0);
    log_end(&l);
}

static void log_report(const struct rread *rd, const struct outcome *oc, const struct state_report *rep)
{
    struct log_line l;
    if (oc->kind == OUT_UNAUTHORIZED && rep->key_paused) {
        log_begin(&l, "error", "key_rejected");
        log_str(&l, "shop", rd->shop->id);
        log_str(&l, "msg", "Kasera answered 401: the shop's secret key is wrong or revoked; "
                           "no read with it for 5 minutes (fix the key and reload)");
        log_end(&l);
    } else if (oc->kind == OUT_KEY_LIMITED && rep->key_paused) {
        log_begin(&l, "warn", "key_paused");
        log_str(&l, "shop", rd->shop->id);
        log_str(&l, "msg", "the key's requests per minute are spent; no read with it for about 60 s");
        log_end(&l);
    } else if (oc->kind == OUT_AUTH_BLOCKED && rep->host_paused) {
        log_begin(&l, "error", "host_blocked");
        log_str(&l, "shop", rd->shop->id);
        log_str(&l, "last_401_shop", rep->last_401_shop[0] ? rep->last_401_shop : NULL);
        log_str(&l, "msg", "Kasera is blocking this host after failed authentications; "
                           "no read with any key for about 60 s");
        log_end(&l);
    } else if (oc->kind == OUT_REJECTED) {
        log_begin(&l, "warn", "read_rejected");
        log_str(&l, "shop", rd->shop->id);
        log_str(&l, "id", rd->ticket.id);
        log_str(&l, "error_code", oc->error_code);
        log_str(&l, "request_id", oc->request_id[0] ? oc->request_id : NULL);
        log_str(&l, "msg", strncmp(oc->error_code, "unverified_", 11) == 0
                               ? "the Kasera account is not verified: a person must finish verification"
                               : "Kasera refused this read; not retried in this episode");
        log_end(&l);
    }
    if (rep->first_unknown) {
        log_begin(&l, "warn", "unknown_status");
        log_str(&l, "shop", rd->shop->id);
        log_str(&l, "id", rd->ticket.id);
        log_str(&l, "status", oc->status_word);
        log_str(&l, "msg", "a status kembali does not know; treated like pending");
        log_end(&l);
    }
}

static void read_release(struct resolver *rs, struct rread *rd)
{
    if (rd->prev)
        rd->prev->next = rd->next;
    else
        rs->reads = rd->next;
    if (rd->next)
        rd->next->prev = rd->prev;
    kasera_read_clear(&rd->kr);
    config_unref(rd->cfg);
    if (rd->w != NULL)
        rd->w->reading = NULL;
    free(rd);
}

/* Report a read's outcome and release it. */
static void read_finished(struct resolver *rs, struct rread *rd, int64_t now)
{
    struct api_response resp;
    struct outcome oc;
    struct state_report rep;
    kasera_response(&rd->kr, &resp);
    classify_response(&resp, util_wall_s(), &oc);
    rd->ticket.sent = rd->kr.sent;
    state_finish(rs->app->state, &rd->ticket, rd->shop->id, &oc, now, &rep);
    atomic_fetch_add(&rs->app->m.reads[oc.kind], 1);
    atomic_fetch_add(&rs->app->m.connections, rd->kr.connects);
    log_read(rd, &oc);
    log_report(rd, &oc, &rep);
    read_release(rs, rd);
}

/* Start a read claimed with `t` for waiter r's shop. */
static void read_start(struct resolver *rs, struct watch *w, const struct req *r, const struct state_ticket *t)
{
    struct rread *rd = calloc(1, sizeof *rd);
    struct outcome none = {.kind = OUT_NO_ANSWER, .retry_after_ms = -1};
    struct state_report rep;
    if (rd == NULL) {
        state_finish(rs->app->state, t, r->shop->id, &none, util_mono_ms(), &rep);
        return;
    }
    rd->ticket = *t;
    rd->cfg = config_ref(r->cfg);
    rd->shop = r->shop;
    rd->kr.user = rd;
    if (kasera_start(rs->api, &rd->kr, rd->cfg->api_base, t->id, r->shop->secret, rd->cfg->read_timeout_ms) != 0) {
        int64_t now = util_mono_ms();
        log_read(rd, &none);
        state_finish(rs->app->state, t, r->shop->id, &none, now, &rep);
        config_unref(rd->cfg);
        free(rd);
        return;
    }
    atomic_fetch_add(&rs->app->m.reads_started, 1);
    rd->w = w;
    w->reading = rd;
    rd->next = rs->reads;
    if (rs->reads)
        rs->reads->prev = rd;
    rs->reads = rd;
}

/* ---- the decision for one transaction ---- */

static int64_t min_deadline(const struct watch *w)
{
    int64_t m = INT64_MAX;
    for (const struct req *r = w->waiters; r; r = r->next)
        if (r->deadline < m)
            m = r->deadline;
    return m;
}

static void step(struct resolver *rs, struct watch *w, int64_t now)
{
    struct state_fact f;
    if (w->waiters == NULL) {
        if (w->reading == NULL)
            watch_drop(rs, w);
        else
            w->next_step = INT64_MAX; /* the read's end will bring us back */
        return;
    }
    if (w->reading != NULL) {
        /* our read is in flight: only deadlines, or a final status the shop
         * told meanwhile (state_tell), can answer anyone now */
        state_lookup(rs->app->state, &w->key, w->id, &w->waiters->cfg->sched, w->waiters->shop->read_budget, now, &f);
        answer_where(rs, w, &f, now, f.final ? all_done : past_deadline);
        w->next_step = min_deadline(w);
        return;
    }
    /* the newest request's configuration and shop decide schedule and budget */
    const struct req *lead = w->waiters;
    struct state_ticket t;
    /* a fresh clock for the claim: the start it records is what the pace counts from */
    bool claimed = state_claim(rs->app->state, &w->key, w->id, &lead->cfg->sched, lead->shop->read_budget,
                               util_mono_ms(), &t, &f);
    if (f.final || f.not_found) {
        answer_where(rs, w, &f, now, all_done);
        watch_drop(rs, w);
        return;
    }
    if (claimed) {
        read_start(rs, w, lead, &t);
        for (struct req *r = w->waiters; r; r = r->next)
            r->wants_read = true;
        if (w->reading == NULL) { /* could not even start: the pace goes on */
            step(rs, w, now);
            return;
        }
        w->next_step = min_deadline(w);
        return;
    }
    if (f.in_flight) {
        /* a read by someone else sharing the state: wait for it, up to its lease */
        answer_where(rs, w, &f, now, past_deadline);
        int64_t d = min_deadline(w);
        w->next_step = f.in_flight_until < d ? f.in_flight_until : d;
        return;
    }
    answer_where(rs, w, &f, now, cannot_improve);
    int64_t d = min_deadline(w);
    w->next_step = f.next_read < d ? f.next_read : d;
    if (w->waiters == NULL)
        watch_drop(rs, w);
}

/* A read of w ended: answer the JSON requests that waited for it, then decide. */
static void after_read(struct resolver *rs, struct watch *w, int64_t now)
{
    struct state_fact f;
    if (w->waiters != NULL) {
        state_lookup(rs->app->state, &w->key, w->id, &w->waiters->cfg->sched, w->waiters->shop->read_budget, now, &f);
        if (f.final || f.not_found)
            answer_where(rs, w, &f, now, all_done);
        else
            answer_where(rs, w, &f, now, json_read_done);
    }
    step(rs, w, now);
}

/* ---- the loop ---- */

static void take_inbox(struct resolver *rs, int64_t now)
{
    pthread_mutex_lock(&rs->inbox_mu);
    struct req *list = rs->inbox;
    rs->inbox = NULL;
    pthread_mutex_unlock(&rs->inbox_mu);
    /* the inbox is LIFO; restore arrival order */
    struct req *rev = NULL;
    while (list) {
        struct req *n = list->next;
        list->next = rev;
        rev = list;
        list = n;
    }
    while (rev) {
        struct req *r = rev;
        rev = r->next;
        struct watch *w = watch_get(rs, &r->shop->key, r->id);
        if (w == NULL) {
            struct state_fact f = {.wait = WAIT_FULL, .next_read = now};
            answer(rs, r, &f, now);
            continue;
        }
        r->wants_read = false;
        r->next = w->waiters; /* newest first: it leads */
        w->waiters = r;
        step(rs, w, now);
    }
}

static void answer_everything(struct resolver *rs, int64_t now)
{
    while (rs->all) {
        struct watch *w = rs->all;
        if (w->waiters) {
            struct state_fact f;
            state_lookup(rs->app->state, &w->key, w->id, &w->waiters->cfg->sched, w->waiters->shop->read_budget, now, &f);
            answer_where(rs, w, &f, now, all_done);
        }
        watch_drop(rs, w);
    }
}

static void *resolver_main(void *arg)
{
    struct resolver *rs = arg;
    for (;;) {
        int64_t now = util_mono_ms();
        pthread_mutex_lock(&rs->inbox_mu);
        bool stop = rs->stop;
        pthread_mutex_unlock(&rs->inbox_mu);
        take_inbox(rs, now);
        if (stop)
            break;

        struct kasera_read *kr;
        while ((kr = kasera_next_done(rs->api)) != NULL) {
            struct rread *rd = kr->user;
            struct watch *w = rd->w;
            now = util_mono_ms();
            read_finished(rs, rd, now);
            if (w != NULL)
                after_read(rs, w, now);
        }

        now = util_mono_ms();
        int64_t next = now + LOOP_MAX_SLEEP_MS;
        /* A read ended somewhere (maybe in another process), or the shop
         * told a status: every watch looks again; otherwise only those due. */
        bool changed = atomic_exchange(&rs->changed, false);
        for (struct watch *w = rs->all, *n; w; w = n) {
            n = w->next;
            if (w->next_step <= now || changed)
                step(rs, w, now);
        }
        for (struct watch *w = rs->all; w; w = w->next)
            if (w->next_step < next)
                next = w->next_step;
        int64_t sleep = next - util_mono_ms();
        kasera_poll(rs->api, sleep < 0 ? 0 : (int)sleep);
    }
    /* Stopping: answer all with what is known; abandon reads in flight. */
    int64_t now = util_mono_ms();
    answer_everything(rs, now);
    pthread_mutex_lock(&rs->inbox_mu);
    rs->stopped = true;
    pthread_mutex_unlock(&rs->inbox_mu);
    take_inbox(rs, now);
    answer_everything(rs, now);
    while (rs->reads) { /* abandoned: a read that gave no answer */
        struct rread *rd = rs->reads;
        struct outcome none = {.kind = OUT_NO_ANSWER, .retry_after_ms = -1};
        struct state_report rep;
        kasera_abort(rs->api, &rd->kr);
        rd->ticket.sent = rd->kr.sent;
        state_finish(rs->app->state, &rd->ticket, rd->shop->id, &none, now, &rep);
        read_release(rs, rd);
    }
    return NULL;
}

struct resolver *resolver_new(struct app *a, char *err, size_t errlen)
{
    struct resolver *rs = calloc(1, sizeof *rs);
    if (rs == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    rs->app = a;
    rs->api = kasera_new();
    if (rs->api == NULL) {
        snprintf(err, errlen, "cannot start libcurl");
        free(rs);
        return NULL;
    }
    pthread_mutex_init(&rs->inbox_mu, NULL);
    return rs;
}

/* Waits on the state's generation (a futex in the shared state) and wakes
 * the resolver when it moves: a read of another process ended. */
static void *watcher_main(void *arg)
{
    struct resolver *rs = arg;
    uint32_t seen = state_generation(rs->app->state);
    while (!atomic_load(&rs->watcher_stop)) {
        uint32_t g = state_wait_change(rs->app->state, seen, 200);
        if (g != seen) {
            seen = g;
            atomic_store(&rs->changed, true);
            kasera_wakeup(rs->api);
        }
    }
    return NULL;
}

int resolver_start(struct resolver *rs)
{
    if (pthread_create(&rs->thread, NULL, resolver_main, rs) != 0) {
        log_msg("error", "start", "cannot start the resolver thread");
        return -1;
    }
    rs->started = true;
    if (pthread_create(&rs->watcher, NULL, watcher_main, rs) != 0) {
        log_msg("error", "start", "cannot start the state watcher thread");
        return -1;
    }
    return 0;
}

void resolver_park(struct resolver *rs, struct req *r)
{
    long held = atomic_fetch_add(&rs->app->m.held, 1) + 1;
    long peak = atomic_load(&rs->app->m.held_peak);
    while (held > peak && !atomic_compare_exchange_weak(&rs->app->m.held_peak, &peak, held))
        ;
    pthread_mutex_lock(&rs->inbox_mu);
    bool stopped = rs->stopped;
    if (!stopped) {
        r->next = rs->inbox;
        rs->inbox = r;
    }
    pthread_mutex_unlock(&rs->inbox_mu);
    if (stopped) {
        struct state_fact f;
        struct answer ans;
        state_lookup(rs->app->state, &r->shop->key, r->id, &r->cfg->sched, r->shop->read_budget, util_mono_ms(), &f);
        request_answer(&f, util_mono_ms(), &ans);
        atomic_fetch_sub(&rs->app->m.held, 1);
        front_respond(rs->app, r, &ans);
        return;
    }
    kasera_wakeup(rs->api);
}

void resolver_stop(struct resolver *rs)
{
    if (!rs->started)
        return;
    pthread_mutex_lock(&rs->inbox_mu);
    rs->stop = true;
    pthread_mutex_unlock(&rs->inbox_mu);
    kasera_wakeup(rs->api);
    pthread_join(rs->thread, NULL);
    atomic_store(&rs->watcher_stop, true);
    pthread_join(rs->watcher, NULL);
    rs->started = false;
}

void resolver_free(struct resolver *rs)
{
    if (rs == NULL)
        return;
    while (rs->all)
        watch_drop(rs, rs->all);
    kasera_free(rs->api);
    pthread_mutex_destroy(&rs->inbox_mu);
    free(rs);
}
