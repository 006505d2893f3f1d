/* serve.c - see serve.h. */
#include "serve.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coord.h"
#include "dynbuf.h"
#include "log.h"
#include "metrics.h"
#include "notify.h"
#include "state_redis.h"
#include "pace.h"
#include "render.h"
#include "request.h"
#include "stream.h"
#include "util.h"
#include "word.h"

/* Requests held for one shop (by id: shops come and go with reloads). */
struct serve_shop {
    char id[STATE_SHOP_MAX + 1];
    long held;
    bool logged;                /* an "over the cap" line was written, */
    int64_t logged_at;          /* at this time */
    struct serve_shop *next;
};

#define SERVE_SHOP_BUCKETS 256
#define SERVE_CAP_RETRY_S 5      /* Retry-After of an answer given because every slot is taken */
#define SERVE_CAP_LOG_MS 60000   /* one line per shop per minute */
/* The ceiling of an answer's buffers (dynbuf.h): what the front takes in
 * one answer. A page is a template (under 256 KiB) with its values escaped;
 * one that does not fit, with its headers, is answered 503 and logged,
 * never cut. */
#define SERVE_ANSWER_MAX FRONT_REPLY_MAX
/* What an answer's buffers are first made for (dynbuf_expect), so that a
 * usual answer is built in one allocation, not grown in steps: a page as
 * the stock templates render it (2.5 KB) or a little larger, and the
 * headers every answer carries (under 1 KB). */
#define SERVE_PAGE_EXPECT 4096
#define SERVE_HEADERS_EXPECT 1024
#define SERVE_ADDR_MAX 64        /* REMOTE_ADDR kept for a handover (an IPv6 address is at most 45) */

struct serve_notify;

struct serve {
    struct app *app;
    struct loop *loop;
    struct front *front;
    struct resolver *rs;
    struct serve_shop *shops[SERVE_SHOP_BUCKETS];
    struct serve_notify *telling; /* admin POSTs waiting for Redis's word */
    int64_t auth_logged_at;       /* the last auth_allowance_spent line (0: none) */
    bool handing;                 /* handing over to a successor: hold nothing here (serve_handing) */
    struct serve_req *parked;     /* requests kept aside meanwhile */
};

/* One request, from its arrival to its answer. Held requests live on the
 * heap (a few hundred bytes, the parameters already copied out); the others
 * on the stack of the handler. */
struct serve_req {
    struct serve *s;
    struct front_req *fr;
    struct config *cfg;         /* a reference, dropped when answered */
    const struct shop *shop;    /* in cfg */
    char id[STATE_ID_MAX + 1];
    bool json, head;
    const char *origin;         /* an allowed CORS origin (in cfg), or NULL */
    int64_t arrived;
    bool held;
    char addr[SERVE_ADDR_MAX];  /* REMOTE_ADDR, for a successor (handover.h) */
    struct state_client client; /* REMOTE_ADDR's identity */
    struct state_redis_client rclient; /* the same in Redis (has_rclient) */
    bool has_rclient;
    struct serve_shop *counted; /* its shop's count of held requests */
    struct resolver_waiter rw;
    struct serve_notify *telling; /* an admin POST waiting for Redis (not held) */
    /* the streamed page (stream.h): held requests only */
    bool stream;                /* may get it (a browser's navigation, its shop and templates allow it) */
    bool undecided;             /* its transaction is known undecided */
    struct stream_clock sc;     /* sc.painted != 0: the top went out, the result ends the answer */
    struct loop_timer st;       /* its next part */
    bool parked;                /* kept while handing over, never given to the resolver */
    struct serve_req *pprev, *pnext; /* the parked ones (serve's list) */
    bool frozen;                /* saved for a successor: neither held nor answered here */
};

/* An admin POST ?format=notify waiting for Redis's word on its status. */
struct serve_notify {
    struct serve_req r;           /* a copy; r.telling is this */
    struct notify_told t;
    struct state_redis_op *op;
    struct serve_notify *prev, *next;
};

static const char csp[] =
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

static const char *http_reason(int code)
{
    switch (code) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 503: return "Service Unavailable";
    default: return "OK";
    }
}

/* The decimal n (no printf on the hot path). DYNBUF_OK or out's failure. */
static enum dynbuf_rc put_num(struct dynbuf *out, unsigned long long n)
{
    char d[24];
    size_t i = sizeof d;
    do
        d[--i] = (char)('0' + n % 10);
    while ((n /= 10) > 0 && i > 0);
    return dynbuf_add(out, d + i, sizeof d - i);
}

/* A header line: name, the decimal n, CRLF. DYNBUF_OK or out's failure. */
static enum dynbuf_rc put_num_line(struct dynbuf *out, const char *name, unsigned long long n)
{
    if (dynbuf_adds(out, name) != DYNBUF_OK || put_num(out, n) != DYNBUF_OK)
        return dynbuf_error(out);
    return dynbuf_add(out, "\r\n", 2);
}

/* The headers every answer carries (without Content-Length and the blank
 * line). DYNBUF_OK, or out's failure: then out holds nothing (a failed
 * buffer stays failed, so the writes below need no check between them; the
 * last one's result is the whole header's). */
static enum dynbuf_rc put_headers(const struct serve_req *r, int http, const char *word, const char *ctype,
                                  long retry_after, const char *extra, struct dynbuf *out)
{
    enum dynbuf_rc rc = dynbuf_adds(out, "Status: ");
    rc = put_num(out, (unsigned)http);
    rc = dynbuf_adds(out, " ");
    rc = dynbuf_adds(out, http_reason(http));
    rc = dynbuf_adds(out, "\r\nContent-Type: ");
    rc = dynbuf_adds(out, ctype);
    if (word != NULL) {
        rc = dynbuf_adds(out, "\r\nKembali-Status: ");
        rc = dynbuf_adds(out, word);
    }
    rc = dynbuf_adds(out, "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                          "Referrer-Policy: no-referrer\r\nX-Frame-Options: DENY\r\nContent-Security-Policy: ");
    rc = dynbuf_adds(out, csp);
    rc = dynbuf_adds(out, "\r\n");
    if (retry_after >= 0)
        rc = put_num_line(out, "Retry-After: ", (unsigned long long)retry_after);
    if (r->origin != NULL) {
        rc = dynbuf_adds(out, "Access-Control-Allow-Origin: ");
        rc = dynbuf_adds(out, r->origin);
        rc = dynbuf_adds(out, "\r\nVary: Origin\r\nAccess-Control-Expose-Headers: Kembali-Status, Retry-After\r\n");
    }
    if (extra != NULL)
        rc = dynbuf_adds(out, extra);
    return rc != DYNBUF_OK ? rc : dynbuf_error(out);
}

/* The headers every answer carries, then the body; one buffer. DYNBUF_OK,
 * or out's failure: then out holds nothing (as put_headers()). */
static enum dynbuf_rc build_response(const struct serve_req *r, int http, const char *word, const char *ctype,
                                     long retry_after, const char *extra, const struct dynbuf *body,
                                     struct dynbuf *out)
{
    dynbuf_expect(out, dynbuf_len(out) + SERVE_HEADERS_EXPECT + (r->head ? 0 : dynbuf_len(body)));
    enum dynbuf_rc rc = put_headers(r, http, word, ctype, retry_after, extra, out);
    if (http != 204) /* a 204 has no body and no Content-Length */
        rc = put_num_line(out, "Content-Length: ", dynbuf_len(body));
    rc = dynbuf_adds(out, "\r\n");
    if (!r->head)
        rc = dynbuf_add(out, dynbuf_ptr(body), dynbuf_len(body));
    return rc != DYNBUF_OK ? rc : dynbuf_error(out);
}

/* One line per request, written before its answer goes out (so that
 * whoever has the answer finds the line). */
static void log_request(const struct serve_req *r, int http, const char *word)
{
    /* both clocks read back to back, so that ts minus ms is the arrival */
    long long ms = (long long)(util_mono_ms() - r->arrived);
    struct log_line l;
    log_begin(&l, LOG_LV_INFO, "request");
    log_str(&l, "shop", r->shop ? r->shop->id : NULL);
    log_str(&l, "id", r->id[0] ? r->id : NULL);
    log_str(&l, "format", r->json ? "json" : "html");
    log_str(&l, "word", word);
    if (http != 0)
        log_int(&l, "http", http);
    log_int(&l, "ms", ms);
    if (r->held)
        log_str(&l, "held", "yes");
    if (r->sc.painted != 0)
        log_int(&l, "streamed_ms", (long long)(r->sc.painted - r->arrived)); /* when its top went out */
    if (word == NULL)
        log_str(&l, "gone", "yes"); /* the client left before its answer */
    log_end(&l);
}

/* The one line saying that building r's answer (or a part of it, `part`:
 * NULL for a whole answer) failed with rc. */
static void log_answer_failed(const struct serve_req *r, const char *part, enum dynbuf_rc rc)
{
    struct log_line l;
    log_begin(&l, LOG_LV_ERROR, "answer_failed");
    log_str(&l, "shop", r->shop ? r->shop->id : NULL);
    log_str(&l, "id", r->id[0] ? r->id : NULL);
    log_str(&l, "part", part);
    log_str(&l, "reason", dynbuf_strerror(rc));
    log_end(&l);
}

/* Send `out` as r's answer; when building it failed (rc), a 503 instead
 * and one log line saying why (what was to be sent is not sent in part). */
static void send_out(struct serve_req *r, const struct dynbuf *out, enum dynbuf_rc rc)
{
    if (rc != DYNBUF_OK) {
        static const char fail[] = "Status: 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                                   "Cache-Control: no-store\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n";
        log_answer_failed(r, NULL, rc);
        front_reply(r->s->front, r->fr, fail, sizeof fail - 1);
    } else {
        front_reply(r->s->front, r->fr, dynbuf_ptr(out), dynbuf_len(out));
    }
    r->fr = NULL;
}

/* The values r's page shows (retry: room for its "check again" URL). */
static void page_vars_of(const struct serve_req *r, char *retry, size_t cap, struct page_vars *v)
{
    render_retry_url(retry, cap, r->shop ? r->shop->id_param : "id", r->id);
    *v = (struct page_vars){
        .id = r->id,
        .shop_name = r->shop ? r->shop->name : "",
        .shop_url = r->shop ? r->shop->shop_url : "",
        .retry_url = retry,
    };
}

/* Render and send `ans` with HTTP status `http` and optional extra header
 * lines; count and log it. */
static void respond(struct serve_req *r, const struct answer *ans, int http, const char *extra)
{
    struct app *a = r->s->app;
    struct dynbuf body, out;
    dynbuf_init(&body, SERVE_ANSWER_MAX);
    dynbuf_init(&out, SERVE_ANSWER_MAX);
    const char *word = word_name(ans->word);
    enum dynbuf_rc rc;
    if (r->json) {
        rc = render_json(r->id, ans->json_status ? ans->json_status : "unknown", ans->final, &body);
        if (rc == DYNBUF_OK)
            rc = build_response(r, http, word, "application/json", ans->final ? -1 : ans->retry_after_s, extra,
                                &body, &out);
    } else {
        const struct templates *t = r->shop ? r->shop->tpl : r->cfg->default_tpl;
        char retry[STATE_ID_MAX + 40];
        struct page_vars v;
        page_vars_of(r, retry, sizeof retry, &v);
        dynbuf_expect(&body, SERVE_PAGE_EXPECT);
        rc = render_html(t, ans->word, &v, &body);
        if (rc == DYNBUF_OK)
            rc = build_response(r, http, word, "text/html; charset=utf-8", -1, extra, &body, &out);
    }
    dynbuf_free(&body);
    atomic_fetch_add(&a->m.requests[ans->word], 1);
    if (r->json)
        atomic_fetch_add(&a->m.json_answers, 1);
    log_request(r, http, word);
    send_out(r, &out, rc);
    dynbuf_free(&out);
}

static void respond_word(struct serve_req *r, const struct answer *ans)
{
    respond(r, ans, word_http(ans->word), NULL);
}

/* Other methods: 405 with the invalid page (no word of its own). */
static void respond_405(struct serve_req *r)
{
    struct answer ans = {.word = W_INVALID, .json_status = "unknown", .retry_after_s = -1};
    atomic_fetch_add(&r->s->app->m.method_not_allowed, 1);
    respond(r, &ans, 405, "Allow: GET, HEAD\r\n");
}

/* The held requests' caps, and the most held now for one shop. */
static void held_of(const struct serve *s, const struct config *cfg, struct metrics_held *out)
{
    out->max_held = cfg->max_held;
    out->max_held_per_shop = cfg->max_held_per_shop;
    for (int i = 0; i < SERVE_SHOP_BUCKETS; i++) /* bounded: the shops that held a request */
        for (const struct serve_shop *c = s->shops[i]; c; c = c->next)
            if (c->held > out->busiest_shop)
                out->busiest_shop = c->held;
}

/* The shops of cfg in use now (their key read in the last 60 s, or is
 * paused): the first METRICS_SHOPS_MAX of them into shops[] (*n), all of
 * them counted in held->shops_active. */
static void shops_of(struct state *st, const struct config *cfg, struct metrics_shop *shops, int *n,
                     struct metrics_held *held)
{
    int64_t now = util_mono_ms();
    *n = 0;
    for (int i = 0; i < cfg->nshops; i++) {
        const struct shop *sh = &cfg->shops[i];
        int reads;
        bool paused;
        state_key_usage(st, &sh->key, now, &reads, &paused);
        if (reads == 0 && !paused)
            continue;
        held->shops_active++;
        if (shops != NULL && *n < METRICS_SHOPS_MAX)
            shops[(*n)++] = (struct metrics_shop){
                .id = sh->id, .reads = reads, .budget = sh->read_budget, .paused = paused};
    }
}

/* The metrics page (metrics.h): its values read now, its text from the
 * table. Out of memory for the shops' list, the page lists none (their
 * count stays). */
static void respond_metrics(struct serve_req *r)
{
    struct app *a = r->s->app;
    struct metrics_src src = {
        .app = &a->m,
        .front = {.connections = (long)front_connections(r->s->front), .accepted = (long)front_accepted(r->s->front)},
        .has_redis = a->redis != NULL,
    };
    state_metrics(a->state, &src.state);
    if (a->redis != NULL)
        state_redis_metrics(a->redis, &src.redis);
    held_of(r->s, r->cfg, &src.held);
    size_t cap = r->cfg->nshops < METRICS_SHOPS_MAX ? (size_t)r->cfg->nshops : METRICS_SHOPS_MAX;
    struct metrics_shop *shops = cap > 0 ? calloc(cap, sizeof *shops) : NULL;
    shops_of(a->state, r->cfg, shops, &src.nshops, &src.held);
    src.shops = shops;
    struct dynbuf b, out;
    dynbuf_init(&b, SERVE_ANSWER_MAX);
    dynbuf_init(&out, SERVE_ANSWER_MAX);
    enum dynbuf_rc rc = metrics_render(&src, &b);
    free(shops);
    if (rc == DYNBUF_OK)
        rc = build_response(r, 200, NULL, "text/plain; version=0.0.4", -1, NULL, &b, &out);
    dynbuf_free(&b);
    send_out(r, &out, rc);
    dynbuf_free(&out);
}

/* The answer to an admin POST ?format=notify, t decided: its log line and
 * metric, this process's held requests woken on a 204, and the status
 * with a reason in plain words otherwise (400 keeps Kembali-Status:
 * invalid). */
static void notify_answer(struct serve_req *r, struct notify_told *t)
{
    notify_log(t);
    if (t->http == 409)
        atomic_fetch_add(&r->s->app->m.notify_conflicts, 1);
    if (t->http == 204)
        resolver_poke(r->s->rs, &r->shop->key, t->id); /* this process's held requests: at once */
    struct dynbuf b, out;
    dynbuf_init(&b, SERVE_ANSWER_MAX);
    dynbuf_init(&out, SERVE_ANSWER_MAX);
    enum dynbuf_rc rc = t->http != 204 ? dynbuf_addf(&b, "%s\n", t->why) : DYNBUF_OK;
    if (rc == DYNBUF_OK)
        rc = build_response(r, t->http, t->http == 400 ? "invalid" : t->http == 404 ? "unknown_shop" : NULL,
                            "text/plain; charset=utf-8", t->http == 503 ? 1 : -1, NULL, &b, &out);
    dynbuf_free(&b);
    send_out(r, &out, rc);
    dynbuf_free(&out);
}

/* Record t here (Redis did not answer, or is not used) and tell Redis what
 * this state now holds: while it is down, a final status waits for the
 * write-back. */
static void notify_here(struct serve_req *r, struct notify_told *t)
{
    notify_record(t, r->s->app->state, &r->cfg->sched, NULL, util_mono_ms());
    if (t->http == 204)
        coord_told_here(r->s->app->state, r->s->app->redis, r->s->app->keys, r->shop, t->id, &r->cfg->sched,
                        util_mono_ms());
}

/* Take n off s's list of admin POSTs waiting for Redis. */
static void notify_unlink(struct serve *s, struct serve_notify *n)
{
    if (n->prev)
        n->prev->next = n->next;
    else
        s->telling = n->next;
    if (n->next)
        n->next->prev = n->prev;
    n->prev = n->next = NULL;
}

/* Redis's word on a told status (state_redis_tell_ask): a final status it
 * knows stays (409; that status is mirrored here); recorded there, it is
 * recorded here; no answer: decided here. */
static void on_told(void *data, const struct state_redis_told *rt)
{
    struct serve_notify *n = data;
    struct serve *s = n->r.s;
    n->op = NULL;
    notify_unlink(s, n);
    if (rt->down) {
        notify_here(&n->r, &n->t);
    } else {
        if (rt->kept) /* what Redis knows stays: this host may still hold an older told status */
            coord_mirror_final(s->app->state, &n->r.shop->key, n->t.id, rt->word, util_mono_ms());
        notify_record(&n->t, s->app->state, &n->r.cfg->sched, rt->kept ? rt->word : NULL, util_mono_ms());
        coord_keys_learn(s->app->keys, s->app->redis, n->r.shop, util_mono_ms()); /* known here now */
    }
    notify_answer(&n->r, &n->t);
    config_unref(n->r.cfg);
    free(n);
}

/* The admin POST ?format=notify (told by the shop, signed: sig is its
 * Kembali-Signature). With Redis up, the answer waits for Redis's word
 * (a final status another host was told may stay: 409); true when r was
 * kept for that (its configuration reference with it). */
static bool respond_notify(struct serve_req *r, const char *query, const char *sig)
{
    size_t len;
    bool truncated;
    const uint8_t *body = front_body(r->fr, &len, &truncated);
    if (truncated) /* refused for its size before anything reads it */
        len = REQUEST_NOTIFY_BODY_MAX + 1;
    struct notify_post np = {.query = query, .signature = sig, .body = (const char *)body, .len = len};
    struct notify_told t;
    if (!notify_check(&t, r->shop, &np, (int64_t)time(NULL))) {
        notify_answer(r, &t);
        return false;
    }
    struct state_redis *redis = r->s->app->redis;
    struct serve_notify *n = state_redis_up(redis) ? malloc(sizeof *n) : NULL;
    if (n != NULL) {
        n->r = *r;
        n->r.telling = n;
        n->t = t;
        n->prev = NULL;
        n->op = state_redis_tell_ask(redis, r->shop->secret, t.id, tx_status_word(t.status),
                                     tx_status_final(t.status), &r->cfg->sched, on_told, n);
        if (n->op != NULL) {
            n->next = r->s->telling;
            if (n->next)
                n->next->prev = n;
            r->s->telling = n;
            front_req_set_user(r->fr, &n->r);
            return true;
        }
        free(n);
    }
    notify_here(r, &t);
    notify_answer(r, &t);
    return false;
}

static void unpark(struct serve_req *r);

/* A held request's end: its shop's count, its configuration reference and
 * its memory. */
static void held_free(struct serve_req *r)
{
    unpark(r);
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
    page_vars_of(r, retry, sizeof retry, &v);
    enum dynbuf_rc rc = render_wait_result(r->shop->tpl, ans->word, &v, &out);
    atomic_fetch_add(&r->s->app->m.requests[ans->word], 1);
    log_request(r, 200, word_name(ans->word)); /* the status line went out with the top */
    if (rc != DYNBUF_OK) {
        atomic_fetch_add(&r->s->app->m.streamed_cut, 1);
        log_answer_failed(r, "result", rc);
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
static void on_answer(void *ctx, struct resolver_waiter *w, const struct state_fact *f)
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
        respond_word(r, &ans);
    held_free(r);
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
static void on_stream_timer(struct loop *l, struct loop_timer *t)
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
        page_vars_of(r, retry, sizeof retry, &v);
        enum dynbuf_rc brc = put_headers(r, 200, word_name(W_CHECKING), "text/html; charset=utf-8", -1,
                                         "X-Accel-Buffering: no\r\n", &out);
        if (brc == DYNBUF_OK)
            brc = dynbuf_adds(&out, "\r\n");
        if (brc == DYNBUF_OK)
            brc = render_wait_top(r->shop->tpl, &v, &out);
        if (brc != DYNBUF_OK) { /* no top: the single answer follows, as without streaming */
            log_answer_failed(r, "top", brc);
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
        log_request(r, 0, NULL);
        resolver_drop(r->s->rs, &r->rw);
        held_free(r);
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
        notify_unlink(s, n);
        snprintf(n->t.why, sizeof n->t.why, "the client went away before Redis answered");
        n->t.http = 0;
        n->t.result = "gone";
        notify_log(&n->t);
        config_unref(n->r.cfg);
        free(n);
        return;
    }
    log_request(r, 0, NULL);
    resolver_drop(s->rs, &r->rw);
    held_free(r);
}

/* The held-request count of shop `id`, made on first use; NULL when out
 * of memory. */
static struct serve_shop *shop_count(struct serve *s, const char *id)
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
static void answer_now(struct serve_req *r, long retry_after)
{
    struct state_fact f;
    struct answer ans;
    state_lookup(r->s->app->state, &r->shop->key, r->id, &r->cfg->sched, r->shop->read_budget, util_mono_ms(), &f);
    request_answer(&f, util_mono_ms(), &ans);
    if (retry_after >= 0 && !ans.final) {
        ans.retry_after_s = retry_after;
        char extra[48];
        snprintf(extra, sizeof extra, "Retry-After: %ld\r\n", retry_after);
        respond(r, &ans, word_http(ans.word), r->json ? NULL : extra);
    } else {
        respond_word(r, &ans);
    }
    config_unref(r->cfg);
}

/* Give r to the resolver (its streamed page's timer armed first: the
 * resolver may answer, and free, r at once). */
static void hold_go(struct serve_req *r)
{
    /* armed before the resolver may answer (and free r): when the top is
     * due (first_paint_ms 0: at once, whatever the first read says) */
    if (r->stream)
        loop_timer_at(r->s->loop, &r->st, stream_due(&r->sc, r->undecided, r->cfg->first_paint_ms));
    r->rw.note = r->stream ? on_note : NULL;
    resolver_hold(r->s->rs, &r->rw);
}

/* Keep r aside while handing over (serve_handing). */
static void park(struct serve_req *r)
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
static void unpark(struct serve_req *r)
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

/* Hold r: copy it to the heap and give it to the resolver. */
static void hold(struct serve_req *tmp)
{
    struct serve_shop *c = shop_count(tmp->s, tmp->shop->id);
    if (over_cap(tmp, c)) {
        answer_now(tmp, SERVE_CAP_RETRY_S);
        return;
    }
    struct serve_req *r = malloc(sizeof *r);
    if (r == NULL) { /* no memory to wait: answer with what is known now */
        answer_now(tmp, -1);
        return;
    }
    *r = *tmp;
    r->held = true;
    r->counted = c;
    if (c != NULL)
        c->held++;
    r->rw = (struct resolver_waiter){
        .cfg = r->cfg,
        .shop = r->shop,
        .id = r->id,
        .client = r->client,
        .rclient = r->rclient,
        .has_rclient = r->has_rclient,
        .h = {.deadline = r->arrived + (r->json ? r->cfg->read_timeout_ms + PACE_GRACE_MS
                                                : pace_hold_ms(&r->cfg->sched)),
              .json = r->json},
    };
    loop_timer_init(&r->st, on_stream_timer, r);
    if (r->stream)
        r->sc = (struct stream_clock){.arrived = r->arrived};
    front_req_set_user(r->fr, r);
    if (r->s->handing) /* the successor holds it: it goes with the next batch */
        park(r);
    else
        hold_go(r); /* may answer at once */
}

static void on_request(void *ctx, struct front_req *fr)
{
    struct serve *s = ctx;
    struct serve_req r = {.s = s, .fr = fr, .arrived = util_mono_ms()};
    enum { P_METHOD, P_QUERY, P_HOST, P_SERVER_NAME, P_ADMIN, P_SHOP, P_ACCEPT, P_ORIGIN, P_ADDR, P_SIG, P_DEST,
           P_COUNT };
    static const char *const names[P_COUNT] = {"REQUEST_METHOD", "QUERY_STRING", "HTTP_HOST", "SERVER_NAME",
                                               "KEMBALI_ADMIN", "KEMBALI_SHOP", "HTTP_ACCEPT", "HTTP_ORIGIN",
                                               "REMOTE_ADDR", "HTTP_KEMBALI_SIGNATURE", "HTTP_SEC_FETCH_DEST"};
    const char *p[P_COUNT];
    front_params(fr, names, P_COUNT, p);
    const char *method = p[P_METHOD], *query = p[P_QUERY], *host = p[P_HOST], *admin = p[P_ADMIN];
    char fmt[16] = "";

    r.cfg = app_config(s->app);
    request_query_param(query, "format", fmt, sizeof fmt);
    r.head = method != NULL && strcmp(method, "HEAD") == 0;

    if (admin != NULL && strcmp(admin, "1") == 0 && strcmp(fmt, "metrics") == 0) {
        respond_metrics(&r);
        config_unref(r.cfg);
        return;
    }
    r.shop = config_pick_shop(r.cfg, p[P_SHOP], host ? host : p[P_SERVER_NAME]);
    r.json = strcmp(fmt, "json") == 0 || request_wants_json(p[P_ACCEPT]);
    if (r.shop != NULL) {
        const char *origin = p[P_ORIGIN];
        for (int i = 0; origin && i < r.shop->norigins; i++)
            if (strcmp(origin, r.shop->origins[i]) == 0)
                r.origin = r.shop->origins[i];
    }
    struct answer ans = {.json_status = "unknown", .retry_after_s = -1};
    if (front_params_too_large(fr)) {
        ans.word = W_INVALID; /* more parameters than any real request has: costs no read */
        respond_word(&r, &ans);
        config_unref(r.cfg);
        return;
    }
    if (admin != NULL && strcmp(admin, "1") == 0 && strcmp(fmt, "notify") == 0 && method != NULL &&
        strcmp(method, "POST") == 0) {
        if (!respond_notify(&r, query, p[P_SIG]))
            config_unref(r.cfg);
        return;
    }
    if (method == NULL || (strcmp(method, "GET") != 0 && !r.head)) {
        respond_405(&r);
        config_unref(r.cfg);
        return;
    }
    if (r.shop == NULL) {
        ans.word = W_UNKNOWN_SHOP;
        respond_word(&r, &ans);
        config_unref(r.cfg);
        return;
    }
    char id[STATE_ID_MAX + 2];
    if (!request_query_param(query, r.shop->id_param, id, sizeof id) || !ids_valid_id(id)) {
        ans.word = W_INVALID; /* costs no read */
        respond_word(&r, &ans);
        config_unref(r.cfg);
        return;
    }
    util_copy(r.id, sizeof r.id, id);

    /* The hot path: a cached final status or a remembered 404. */
    struct state_fact f;
    state_lookup(s->app->state, &r.shop->key, r.id, &r.cfg->sched, r.shop->read_budget, r.arrived, &f);
    if (f.final || f.not_found) {
        request_answer(&f, r.arrived, &ans);
        atomic_fetch_add(&s->app->m.cache_answers, 1);
        respond_word(&r, &ans);
        config_unref(r.cfg);
        return;
    }
    /* ids nobody has paid for, from a client that has walked several: no read */
    util_copy(r.addr, sizeof r.addr, p[P_ADDR] ? p[P_ADDR] : "");
    state_client_id(s->app->state, &r.shop->key, p[P_ADDR] ? p[P_ADDR] : "", &r.client);
    r.has_rclient = state_redis_client_id(s->app->redis, p[P_ADDR] ? p[P_ADDR] : "", &r.rclient);
    if (state_fact_unknown(&f) && state_client_blocked(s->app->state, &r.client, r.arrived)) {
        request_answer(&f, r.arrived, &ans);
        atomic_fetch_add(&s->app->m.probes_refused, 1);
        respond_word(&r, &ans);
        config_unref(r.cfg);
        return;
    }
    r.stream = stream_wanted(r.json, r.head, p[P_DEST], r.shop->progressive, templates_stream(r.shop->tpl));
    r.undecided = stream_undecided(&f, true); /* its read, if any, is another request's */
    hold(&r);
}

/* ---- handing over (handover.h) ---- */

/* The front's save: r's part of its record; r leaves the resolver (its
 * place in the budget's plan goes with it) and its streamed page's timer
 * stops. An admin POST waiting for Redis stays here. */
static int on_save(void *ctx, struct front_req *fr, void *user, struct handover_rec *rec)
{
    struct serve *s = ctx;
    struct serve_req *r = user;
    (void)fr;
    if (r == NULL || r->telling != NULL || r->frozen)
        return -1;
    util_copy(rec->shop, sizeof rec->shop, r->shop->id);
    util_copy(rec->id, sizeof rec->id, r->id);
    util_copy(rec->addr, sizeof rec->addr, r->addr);
    util_copy(rec->origin, sizeof rec->origin, r->origin != NULL ? r->origin : "");
    rec->json = r->json;
    rec->head = r->head;
    rec->stream = r->stream;
    rec->undecided = r->undecided;
    rec->wants_read = r->rw.h.wants_read;
    rec->arrived = r->arrived;
    rec->deadline = r->rw.h.deadline;
    rec->painted = r->sc.painted;
    rec->last_sent = r->sc.last_sent;
    /* for a successor of another layout, which has another state file */
    rec->layout = state_layout_of(s->app->state);
    rec->has_snap = true;
    state_snapshot(s->app->state, &r->shop->key, r->id, util_mono_ms(), &rec->snap);
    if (r->parked)
        unpark(r);
    else
        resolver_drop(s->rs, &r->rw);
    loop_timer_stop(s->loop, &r->st);
    r->frozen = true;
    return 0;
}

/* The front's restore: the successor did not take r; hold it here again
 * (or, while still handing over, park it for the next batch). */
static void on_restore(void *ctx, struct front_req *fr, void *user)
{
    struct serve *s = ctx;
    struct serve_req *r = user;
    (void)fr;
    if (r == NULL || !r->frozen)
        return;
    r->frozen = false;
    if (s->handing)
        park(r);
    else
        hold_go(r);
}

/* The front's release: the successor has r; forget it. */
static void on_release(void *ctx, struct front_req *fr, void *user)
{
    struct serve_req *r = user;
    (void)ctx, (void)fr;
    if (r != NULL)
        held_free(r);
}

void serve_handing(struct serve *s, bool on)
{
    serve_handing_quiet(s, on, on);
}

void serve_handing_quiet(struct serve *s, bool on, bool quiet)
{
    s->handing = on;
    resolver_quiet(s->rs, quiet);
    if (on)
        return;
    while (s->parked != NULL) { /* requests parked meanwhile go to the resolver after all */
        struct serve_req *r = s->parked;
        unpark(r);
        hold_go(r);
    }
}

int serve_adopt(struct serve *s, struct front_req *fr, const struct handover_rec *rec)
{
    struct serve_req tmp = {.s = s, .fr = fr, .arrived = rec->arrived, .json = rec->json, .head = rec->head};
    tmp.cfg = app_config(s->app);
    tmp.shop = config_pick_shop(tmp.cfg, rec->shop, NULL);
    util_copy(tmp.id, sizeof tmp.id, rec->id);
    util_copy(tmp.addr, sizeof tmp.addr, rec->addr);
    if (tmp.shop == NULL || !ids_valid_id(rec->id)) {
        /* its shop is gone from this configuration: end what was begun */
        if (rec->painted != 0) {
            front_reply(s->front, fr, NULL, 0);
            log_request(&tmp, 0, NULL);
        } else {
            struct answer ans = {.word = tmp.shop == NULL ? W_UNKNOWN_SHOP : W_INVALID, .json_status = "unknown",
                                 .retry_after_s = -1};
            respond_word(&tmp, &ans);
        }
        config_unref(tmp.cfg);
        return -1;
    }
    for (int i = 0; rec->origin[0] && i < tmp.shop->norigins; i++)
        if (strcmp(rec->origin, tmp.shop->origins[i]) == 0)
            tmp.origin = tmp.shop->origins[i];
    /* a sender of another layout kept the pace, pauses and cache in its
     * own file: take in what this request needs (same layout: one file) */
    if (rec->has_snap && rec->layout != state_layout_of(s->app->state))
        state_import(s->app->state, &tmp.shop->key, tmp.id, &rec->snap, util_mono_ms());
    state_client_id(s->app->state, &tmp.shop->key, tmp.addr, &tmp.client);
    tmp.has_rclient = state_redis_client_id(s->app->redis, tmp.addr, &tmp.rclient);
    struct serve_req *r = malloc(sizeof *r);
    if (r == NULL) {
        if (rec->painted != 0) {
            front_reply(s->front, fr, NULL, 0);
            config_unref(tmp.cfg);
        } else {
            answer_now(&tmp, -1);
        }
        return -1;
    }
    *r = tmp;
    r->held = true;
    r->counted = shop_count(s, r->shop->id);
    if (r->counted != NULL)
        r->counted->held++;
    r->stream = rec->stream;
    r->undecided = rec->undecided;
    r->sc = (struct stream_clock){.arrived = rec->arrived, .painted = rec->painted, .last_sent = rec->last_sent};
    r->rw = (struct resolver_waiter){
        .cfg = r->cfg,
        .shop = r->shop,
        .id = r->id,
        .client = r->client,
        .rclient = r->rclient,
        .has_rclient = r->has_rclient,
        .h = {.deadline = rec->deadline, .json = rec->json, .wants_read = rec->wants_read},
    };
    loop_timer_init(&r->st, on_stream_timer, r);
    front_req_set_user(fr, r);
    if (s->handing)
        park(r);
    else
        hold_go(r);
    return 0;
}

long serve_facts(struct serve *s, int (*emit)(void *ctx, const struct handover_rec *rec), void *ctx)
{
    struct state_final *v;
    size_t n = state_finals(s->app->state, util_mono_ms(), &v);
    struct config *cfg = app_config(s->app);
    long sent = 0;
    struct handover_rec *rec = malloc(sizeof *rec);
    for (size_t i = 0; rec != NULL && i < n; i++) {
        const struct shop *shop = NULL;
        for (int j = 0; j < cfg->nshops && shop == NULL; j++)
            if (memcmp(&cfg->shops[j].key, &v[i].key, sizeof v[i].key) == 0)
                shop = &cfg->shops[j];
        if (shop == NULL)
            continue;
        memset(rec, 0, sizeof *rec);
        rec->kind = HANDOVER_FACT;
        util_copy(rec->shop, sizeof rec->shop, shop->id);
        util_copy(rec->id, sizeof rec->id, v[i].id);
        rec->layout = state_layout_of(s->app->state);
        rec->has_snap = true;
        rec->snap = v[i].snap;
        if (emit(ctx, rec) != 0)
            break;
        sent++;
    }
    free(rec);
    free(v);
    config_unref(cfg);
    return sent;
}

int serve_layout(const struct serve *s)
{
    return state_layout_of(s->app->state);
}

bool serve_take_fact(struct serve *s, const struct handover_rec *rec)
{
    if (rec->kind != HANDOVER_FACT || !rec->has_snap || rec->layout == state_layout_of(s->app->state) ||
        !ids_valid_id(rec->id))
        return false;
    struct config *cfg = app_config(s->app);
    const struct shop *shop = config_pick_shop(cfg, rec->shop, NULL);
    bool taken = shop != NULL && state_import(s->app->state, &shop->key, rec->id, &rec->snap, util_mono_ms());
    config_unref(cfg);
    return taken;
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
    s->rs = resolver_new(a, l, on_answer, s, err, errlen);
    if (s->rs == NULL) {
        free(s);
        return NULL;
    }
    return s;
}

struct front_handler serve_handler(struct serve *s)
{
    return (struct front_handler){.on_request = on_request, .on_gone = on_gone, .save = on_save,
                                  .restore = on_restore, .release = on_release, .ctx = s};
}

void serve_attach(struct serve *s, struct front *f)
{
    s->front = f;
}

void serve_stop(struct serve *s)
{
    while (s->telling != NULL) { /* decided here: Redis's word is not waited for */
        state_redis_cancel(s->telling->op);
        on_told(s->telling, &(struct state_redis_told){.down = true});
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
