/* serve.c - see serve.h: routes each request, holds the ones that wait,
 * their caps and streamed pages. */
#include "serve_private.h"

/* A held request's end: its shop's count, its configuration reference and
 * its memory. */
void serve_held_free(struct serve_req *r)
{
    serve_unpark(r);
    loop_timer_stop(r->s->loop, &r->st);
    if (r->counted != NULL)
        r->counted->held--;
    config_unref(r->cfg);
    free(r);
}

/* The end of a streamed page: the result part for ans, which ends the
 * answer; counted and logged with its final word. When the result cannot
 * be built, the answer ends without it (the status line went out with the
 * top: the browser keeps the waiting top, never a part of a result) and
 * one line says so. */
static void respond_stream_end(struct serve_req *r, const struct answer *ans)
{
    struct dynbuf out;
    dynbuf_init(&out, SERVE_ANSWER_MAX);
    dynbuf_expect(&out, SERVE_PAGE_EXPECT);
    char retry[STATE_ID_MAX + 40];
    struct page_vars v;
    serve_page_vars_of(r, retry, sizeof retry, &v);
    enum dynbuf_rc rc = render_wait_result(r->shop->tpl, ans->word, &v, &out);
    atomic_fetch_add(&r->s->app->m.requests[ans->word], 1);
    serve_log_request(r, 200, word_name(ans->word)); /* the status line went out with the top */
    if (rc != DYNBUF_OK) {
        atomic_fetch_add(&r->s->app->m.streamed_cut, 1);
        serve_log_answer_failed(r, "result", rc);
    }
    front_reply(r->s->front, r->fr, dynbuf_ptr(&out), dynbuf_len(&out)); /* a failed buffer holds nothing */
    r->fr = NULL;
    dynbuf_free(&out);
}

/* r is answered checking because its key, not accepted by Kasera yet,
 * may make no read while the host's auth_failures_per_minute is spent:
 * one line a minute (per process) says so. */
static void log_auth_spent(struct serve_req *r)
{
    int64_t now = util_mono_ms();
    if (r->s->auth_logged_at != 0 && now - r->s->auth_logged_at < SERVE_CAP_LOG_MS)
        return;
    r->s->auth_logged_at = now;
    struct log_line l;
    log_begin(&l, LOG_LV_ERROR, "auth_allowance_spent");
    log_str(&l, "shop", r->shop->id);
    log_int(&l, "auth_failures_per_minute", r->cfg->auth_failures_per_minute);
    log_str(&l, "msg", "this host's reads that may end in 401 are spent for now: keys Kasera has not accepted "
                       "make no read (checking) until the oldest is a minute old, so that Kasera's per-IP "
                       "limiter does not block the other shops; fix the rejected keys (this line at most once "
                       "a minute)");
    log_end(&l);
}

/* The resolver's callback: r's answer is due. */
void serve_on_answer(void *ctx, struct resolver_waiter *w, const struct state_fact *f)
{
    struct serve_req *r = (struct serve_req *)((char *)w - offsetof(struct serve_req, rw));
    struct answer ans;
    (void)ctx;
    request_answer(f, util_mono_ms(), &ans);
    if (ans.word == W_CHECKING && (unsigned)f->wait <= WAIT_AUTH)
        atomic_fetch_add(&r->s->app->m.checking[f->wait], 1);
    if (ans.word == W_CHECKING && f->wait == WAIT_AUTH)
        log_auth_spent(r);
    atomic_fetch_add(&r->s->app->m.held_answered, 1);
    atomic_fetch_add(&r->s->app->m.held_ms, (long)(util_mono_ms() - r->arrived));
    if (r->sc.painted != 0)
        respond_stream_end(r, &ans);
    else
        serve_respond_word(r, &ans);
    serve_held_free(r);
}

/* The resolver looked at r's transaction and still holds r: a read that
 * came back undecided paints its top now (from the loop, never inside the
 * resolver's step). */
static void on_note(struct resolver_waiter *w, const struct state_fact *f)
{
    struct serve_req *r = (struct serve_req *)((char *)w - offsetof(struct serve_req, rw));
    if (!r->stream || r->undecided || r->sc.painted != 0 || !stream_undecided(f, false))
        return;
    r->undecided = true;
    loop_timer_at(r->s->loop, &r->st, util_mono_ms());
}

/* r's streamed page: its top or a comment is due (stream_step). */
void serve_on_stream_timer(struct loop *l, struct loop_timer *t)
{
    static const char comment[] = "<!-- checking -->\n";
    struct serve_req *r = t->data;
    int64_t now = util_mono_ms(), wake;
    enum stream_do d = stream_step(&r->sc, r->undecided, r->cfg->first_paint_ms, now, &wake);
    int rc = 0;
    if (d == STREAM_PAINT) {
        struct dynbuf out;
        dynbuf_init(&out, SERVE_ANSWER_MAX);
        dynbuf_expect(&out, SERVE_HEADERS_EXPECT + SERVE_PAGE_EXPECT);
        char retry[STATE_ID_MAX + 40];
        struct page_vars v;
        serve_page_vars_of(r, retry, sizeof retry, &v);
        enum dynbuf_rc brc = serve_put_headers(r, 200, word_name(W_CHECKING), "text/html; charset=utf-8", -1,
                                         "X-Accel-Buffering: no\r\n", &out);
        if (brc == DYNBUF_OK)
            brc = dynbuf_adds(&out, "\r\n");
        if (brc == DYNBUF_OK)
            brc = render_wait_top(r->shop->tpl, &v, &out);
        if (brc != DYNBUF_OK) { /* no top: the single answer follows, as without streaming */
            serve_log_answer_failed(r, "top", brc);
            dynbuf_free(&out);
            r->stream = false;
            return;
        }
        rc = front_reply_part(r->s->front, r->fr, dynbuf_ptr(&out), dynbuf_len(&out));
        dynbuf_free(&out);
        r->sc.painted = r->sc.last_sent = now;
        atomic_fetch_add(&r->s->app->m.streamed, 1);
    } else if (d == STREAM_COMMENT) {
        rc = front_reply_part(r->s->front, r->fr, comment, sizeof comment - 1);
        r->sc.last_sent = now;
    }
    if (rc != 0) { /* the connection failed: r is ours to forget */
        r->fr = NULL;
        serve_log_request(r, 0, NULL);
        resolver_drop(r->s->rs, &r->rw);
        serve_held_free(r);
        return;
    }
    loop_timer_at(l, t, wake);
}

/* The front's callback: a held request's client went away. */
static void on_gone(void *ctx, struct front_req *fr, void *user)
{
    struct serve *s = ctx;
    struct serve_req *r = user;
    (void)fr;
    if (r == NULL)
        return;
    if (r->telling != NULL) { /* a told status whose web server gave up: Redis's word is not waited for */
        struct serve_notify *n = r->telling;
        state_redis_cancel(n->op);
        serve_notify_unlink(s, n);
        snprintf(n->t.why, sizeof n->t.why, "the client went away before Redis answered");
        n->t.http = 0;
        n->t.result = "gone";
        notify_log(&n->t);
        config_unref(n->r.cfg);
        free(n);
        return;
    }
    serve_log_request(r, 0, NULL);
    resolver_drop(s->rs, &r->rw);
    serve_held_free(r);
}

/* The held-request count of shop `id`, made on first use; NULL when out
 * of memory. */
struct serve_shop *serve_shop_count(struct serve *s, const char *id)
{
    uint32_t h = 2166136261u;
    for (const char *p = id; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    struct serve_shop **pp = &s->shops[h % SERVE_SHOP_BUCKETS];
    for (struct serve_shop *c = *pp; c; c = c->next)
        if (strcmp(c->id, id) == 0)
            return c;
    struct serve_shop *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    util_copy(c->id, sizeof c->id, id);
    c->next = *pp;
    *pp = c;
    return c;
}

/* Every slot for holding this request is taken (max_held, or
 * max_held_per_shop for its shop): log that once a minute per shop. */
static bool over_cap(struct serve_req *r, struct serve_shop *c)
{
    long all = (long)resolver_held(r->s->rs), cap = r->cfg->max_held, shop_cap = r->cfg->max_held_per_shop;
    if (all < cap && (c == NULL || c->held < shop_cap))
        return false;
    int64_t now = util_mono_ms();
    if (c != NULL && (!c->logged || now - c->logged_at >= SERVE_CAP_LOG_MS)) {
        c->logged = true;
        c->logged_at = now;
        struct log_line l;
        log_begin(&l, LOG_LV_WARN, "held_cap");
        log_str(&l, "shop", r->shop->id);
        log_int(&l, "held", all);
        log_int(&l, "held_shop", c->held);
        log_int(&l, "max_held", cap);
        log_int(&l, "max_held_per_shop", shop_cap);
        log_str(&l, "msg", "every slot for held requests is taken: answering checking at once with Retry-After "
                           "(this line at most once a minute per shop)");
        log_end(&l);
    }
    atomic_fetch_add(&r->s->app->m.over_cap, 1);
    return true;
}

/* Answer now with what is known: no memory or no slot to wait in. */
void serve_answer_now(struct serve_req *r, long retry_after)
{
    struct state_fact f;
    struct answer ans;
    state_lookup(r->s->app->state, &r->shop->key, r->id, &r->cfg->sched, r->shop->read_budget, util_mono_ms(), &f);
    request_answer(&f, util_mono_ms(), &ans);
    if (retry_after >= 0 && !ans.final) {
        ans.retry_after_s = retry_after;
        char extra[48];
        snprintf(extra, sizeof extra, "Retry-After: %ld\r\n", retry_after);
        serve_respond(r, &ans, word_http(ans.word), r->json ? NULL : extra);
    } else {
        serve_respond_word(r, &ans);
    }
    config_unref(r->cfg);
}

/* Give r to the resolver (its streamed page's timer armed first: the
 * resolver may answer, and free, r at once). */
void serve_hold_go(struct serve_req *r)
{
    /* armed before the resolver may answer (and free r): when the top is
     * due (first_paint_ms 0: at once, whatever the first read says) */
    if (r->stream)
        loop_timer_at(r->s->loop, &r->st, stream_due(&r->sc, r->undecided, r->cfg->first_paint_ms));
    r->rw.note = r->stream ? on_note : NULL;
    resolver_hold(r->s->rs, &r->rw);
}

/* Keep r aside while handing over (serve_handing). */
void serve_park(struct serve_req *r)
{
    struct serve *s = r->s;
    r->parked = true;
    r->pprev = NULL;
    r->pnext = s->parked;
    if (s->parked)
        s->parked->pprev = r;
    s->parked = r;
}

/* r is no longer parked (held, handed over or gone). */
void serve_unpark(struct serve_req *r)
{
    if (!r->parked)
        return;
    if (r->pprev)
        r->pprev->pnext = r->pnext;
    else
        r->s->parked = r->pnext;
    if (r->pnext)
        r->pnext->pprev = r->pprev;
    r->pprev = r->pnext = NULL;
    r->parked = false;
}

void serve_waiter_init(struct serve_req *r, int64_t deadline, bool wants_read)
{
    r->rw = (struct resolver_waiter){
        .cfg = r->cfg,
        .shop = r->shop,
        .id = r->id,
        .client = r->client,
        .rclient = r->rclient,
        .has_rclient = r->has_rclient,
        .h = {.deadline = deadline, .json = r->json, .wants_read = wants_read},
    };
}

/* Hold r: copy it to the heap and give it to the resolver. */
void serve_hold(struct serve_req *tmp)
{
    struct serve_shop *c = serve_shop_count(tmp->s, tmp->shop->id);
    if (over_cap(tmp, c)) {
        serve_answer_now(tmp, SERVE_CAP_RETRY_S);
        return;
    }
    struct serve_req *r = malloc(sizeof *r);
    if (r == NULL) { /* no memory to wait: answer with what is known now */
        serve_answer_now(tmp, -1);
        return;
    }
    *r = *tmp;
    r->held = true;
    r->counted = c;
    if (c != NULL)
        c->held++;
    int64_t hold_ms = r->json ? r->cfg->read_timeout_ms + PACE_GRACE_MS : pace_hold_ms(&r->cfg->sched);
    serve_waiter_init(r, r->arrived + hold_ms, false);
    loop_timer_init(&r->st, serve_on_stream_timer, r);
    if (r->stream)
        r->sc = (struct stream_clock){.arrived = r->arrived};
    front_req_set_user(r->fr, r);
    if (r->s->handing) /* the successor holds it: it goes with the next batch */
        serve_park(r);
    else
        serve_hold_go(r); /* may answer at once */
}

/* The FastCGI parameters a request is routed by. */
enum { P_METHOD, P_QUERY, P_HOST, P_SERVER_NAME, P_ADMIN, P_SHOP, P_ACCEPT, P_ORIGIN, P_ADDR, P_SIG, P_DEST, P_COUNT };
static const char *const param_names[P_COUNT] = {
    "REQUEST_METHOD", "QUERY_STRING", "HTTP_HOST", "SERVER_NAME", "KEMBALI_ADMIN", "KEMBALI_SHOP",
    "HTTP_ACCEPT", "HTTP_ORIGIN", "REMOTE_ADDR", "HTTP_KEMBALI_SIGNATURE", "HTTP_SEC_FETCH_DEST"};

/* What the routes know of a request so far: its parameters, and what an
 * earlier route's test found (a route's test may note what it finds here
 * and in r for the routes after it). */
struct route_ctx {
    const char *const *p;       /* param_names' values */
    char fmt[16];               /* the format parameter */
    bool admin;                 /* KEMBALI_ADMIN=1: the admin location */
    struct state_fact f;        /* the lookup (`cached`) */
};

/* One route: when `takes` r, `answer` answers it; true when r lives on
 * (held, or a notify waiting for Redis) and owns r->cfg, false when it was
 * answered and route() drops r->cfg. A route whose test only notes what
 * it finds has no answer and never takes. */
struct route {
    bool (*takes)(struct serve_req *r, struct route_ctx *c);
    bool (*answer)(struct serve_req *r, struct route_ctx *c);
};

static bool answer_word(struct serve_req *r, enum word w)
{
    struct answer ans = {.json_status = "unknown", .retry_after_s = -1, .word = w};
    serve_respond_word(r, &ans);
    return false;
}

/* the metrics page, at the admin location */
static bool takes_metrics(struct serve_req *r, struct route_ctx *c)
{
    (void)r;
    return c->admin && strcmp(c->fmt, "metrics") == 0;
}

static bool answer_metrics(struct serve_req *r, struct route_ctx *c)
{
    (void)c;
    serve_respond_metrics(r);
    return false;
}

/* takes nothing: notes the request's shop, its format and its origin for
 * the routes after it (the metrics page has none of them) */
static bool notes_shop(struct serve_req *r, struct route_ctx *c)
{
    const char *const *p = c->p;
    r->shop = config_pick_shop(r->cfg, p[P_SHOP], p[P_HOST] ? p[P_HOST] : p[P_SERVER_NAME]);
    r->json = strcmp(c->fmt, "json") == 0 || request_wants_json(p[P_ACCEPT]);
    for (int i = 0; r->shop != NULL && p[P_ORIGIN] != NULL && i < r->shop->norigins; i++)
        if (strcmp(p[P_ORIGIN], r->shop->origins[i]) == 0)
            r->origin = r->shop->origins[i];
    return false;
}

/* more parameters than any real request has: costs no read */
static bool takes_too_large(struct serve_req *r, struct route_ctx *c)
{
    (void)c;
    return front_params_too_large(r->fr);
}

static bool answer_invalid(struct serve_req *r, struct route_ctx *c)
{
    (void)c;
    return answer_word(r, W_INVALID);
}

/* the admin notify POST */
static bool takes_notify(struct serve_req *r, struct route_ctx *c)
{
    (void)r;
    const char *method = c->p[P_METHOD];
    return c->admin && strcmp(c->fmt, "notify") == 0 && method != NULL && strcmp(method, "POST") == 0;
}

static bool answer_notify(struct serve_req *r, struct route_ctx *c)
{
    return serve_respond_notify(r, c->p[P_QUERY], c->p[P_SIG]);
}

/* a method other than GET and HEAD */
static bool takes_other_method(struct serve_req *r, struct route_ctx *c)
{
    const char *method = c->p[P_METHOD];
    return method == NULL || (strcmp(method, "GET") != 0 && !r->head);
}

static bool answer_405(struct serve_req *r, struct route_ctx *c)
{
    (void)c;
    serve_respond_405(r);
    return false;
}

/* no shop has the request's host (or KEMBALI_SHOP) */
static bool takes_no_shop(struct serve_req *r, struct route_ctx *c)
{
    (void)c;
    return r->shop == NULL;
}

static bool answer_unknown_shop(struct serve_req *r, struct route_ctx *c)
{
    (void)c;
    return answer_word(r, W_UNKNOWN_SHOP);
}

/* a missing or malformed id: costs no read (a good one is noted in r->id) */
static bool takes_bad_id(struct serve_req *r, struct route_ctx *c)
{
    char id[STATE_ID_MAX + 2];
    if (!request_query_param(c->p[P_QUERY], r->shop->id_param, id, sizeof id) || !ids_valid_id(id))
        return true;
    util_copy(r->id, sizeof r->id, id);
    return false;
}

/* the hot path: a cached final status or a remembered 404 */
static bool takes_cached(struct serve_req *r, struct route_ctx *c)
{
    state_lookup(r->s->app->state, &r->shop->key, r->id, &r->cfg->sched, r->shop->read_budget, r->arrived, &c->f);
    return c->f.final || c->f.not_found;
}

static bool answer_cached(struct serve_req *r, struct route_ctx *c)
{
    struct answer ans = {.json_status = "unknown", .retry_after_s = -1};
    request_answer(&c->f, r->arrived, &ans);
    atomic_fetch_add(&r->s->app->m.cache_answers, 1);
    serve_respond_word(r, &ans);
    return false;
}

/* ids nobody has paid for, from a client that has walked several: no read
 * (the client's names are noted in r for the hold) */
static bool takes_blocked(struct serve_req *r, struct route_ctx *c)
{
    struct app *app = r->s->app;
    const char *addr = c->p[P_ADDR] ? c->p[P_ADDR] : "";
    util_copy(r->addr, sizeof r->addr, addr);
    state_client_id(app->state, &r->shop->key, addr, &r->client);
    r->has_rclient = state_redis_client_id(app->redis, addr, &r->rclient);
    return state_fact_unknown(&c->f) && state_client_blocked(app->state, &r->client, r->arrived);
}

static bool answer_blocked(struct serve_req *r, struct route_ctx *c)
{
    struct answer ans = {.json_status = "unknown", .retry_after_s = -1};
    request_answer(&c->f, r->arrived, &ans);
    atomic_fetch_add(&r->s->app->m.probes_refused, 1);
    serve_respond_word(r, &ans);
    return false;
}

/* everything else: held for its read */
static bool takes_all(struct serve_req *r, struct route_ctx *c)
{
    (void)r;
    (void)c;
    return true;
}

static bool answer_held(struct serve_req *r, struct route_ctx *c)
{
    r->stream = stream_wanted(r->json, r->head, c->p[P_DEST], r->shop->progressive, templates_stream(r->shop->tpl));
    r->undecided = stream_undecided(&c->f, true); /* its read, if any, is another request's */
    serve_hold(r); /* takes r->cfg, whatever it does */
    return true;
}

/* In order: the first route that takes a request answers it. */
static const struct route routes[] = {
    {takes_metrics, answer_metrics},
    {notes_shop, NULL},
    {takes_too_large, answer_invalid},
    {takes_notify, answer_notify},
    {takes_other_method, answer_405},
    {takes_no_shop, answer_unknown_shop},
    {takes_bad_id, answer_invalid},
    {takes_cached, answer_cached},
    {takes_blocked, answer_blocked},
    {takes_all, answer_held},
};

/* Answer r, whose parameters are p (param_names), or hold it, by the
 * first of routes[] that takes it. Returns true when r lives on (held, or
 * a notify waiting for Redis) and owns r->cfg; false when it was answered
 * here and the caller drops r->cfg, the one place that does. */
static bool route(struct serve_req *r, const char *const *p)
{
    struct route_ctx c; /* c.f: written by takes_cached before a route reads it (not zeroed: the hot path) */
    c.p = p;
    /* all of it: a value too long is cut without its NUL (request_query_param) */
    memset(c.fmt, 0, sizeof c.fmt);
    const char *method = p[P_METHOD], *admin = p[P_ADMIN];
    request_query_param(p[P_QUERY], "format", c.fmt, sizeof c.fmt);
    r->head = method != NULL && strcmp(method, "HEAD") == 0;
    c.admin = admin != NULL && strcmp(admin, "1") == 0;
    /* unrolled, so that each route's functions are called directly (the
     * cached answer's cost: docs/performance.md) */
#define ROUTES_N (sizeof routes / sizeof routes[0])
#pragma GCC unroll 16
    for (size_t i = 0; i < ROUTES_N; i++)
        if (routes[i].takes(r, &c))
            return routes[i].answer(r, &c);
#undef ROUTES_N
    return false; /* not reached: the last takes everything */
}

static void on_request(void *ctx, struct front_req *fr)
{
    struct serve *s = ctx;
    struct serve_req r = {.s = s, .fr = fr, .arrived = util_mono_ms()};
    const char *p[P_COUNT];
    front_params(fr, param_names, P_COUNT, p);
    r.cfg = app_config(s->app);
    if (!route(&r, p))
        config_unref(r.cfg);
}


struct serve *serve_new(struct app *a, struct loop *l, char *err, size_t errlen)
{
    struct serve *s = calloc(1, sizeof *s);
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->app = a;
    s->loop = l;
    s->rs = resolver_new(a, l, serve_on_answer, s, err, errlen);
    if (s->rs == NULL) {
        free(s);
        return NULL;
    }
    return s;
}

struct front_handler serve_handler(struct serve *s)
{
    return (struct front_handler){.on_request = on_request, .on_gone = on_gone, .save = serve_on_save,
                                  .restore = serve_on_restore, .release = serve_on_release, .ctx = s};
}

void serve_attach(struct serve *s, struct front *f)
{
    s->front = f;
}

void serve_stop(struct serve *s)
{
    while (s->telling != NULL) { /* decided here: Redis's word is not waited for */
        state_redis_cancel(s->telling->op);
        serve_on_told(s->telling, &(struct state_redis_told){.down = true});
    }
    resolver_stop(s->rs);
}

size_t serve_reading(const struct serve *s)
{
    return resolver_reading(s->rs);
}

size_t serve_held(const struct serve *s)
{
    return resolver_held(s->rs);
}

void serve_free(struct serve *s)
{
    if (s == NULL)
        return;
    for (int i = 0; i < SERVE_SHOP_BUCKETS; i++)
        while (s->shops[i]) {
            struct serve_shop *c = s->shops[i];
            s->shops[i] = c->next;
            free(c);
        }
    resolver_free(s->rs);
    free(s);
}
