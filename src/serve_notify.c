/* serve_notify.c - the admin notify POST: checked, recorded here or
 * through Redis, answered (serve_private.h). */
#include "serve_private.h"

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
        rc = serve_build_response(r, t->http, t->http == 400 ? "invalid" : t->http == 404 ? "unknown_shop" : NULL,
                            "text/plain; charset=utf-8", t->http == 503 ? 1 : -1, NULL, &b, &out);
    dynbuf_free(&b);
    serve_send_out(r, &out, rc);
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
void serve_notify_unlink(struct serve *s, struct serve_notify *n)
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
void serve_on_told(void *data, const struct state_redis_told *rt)
{
    struct serve_notify *n = data;
    struct serve *s = n->r.s;
    n->op = NULL;
    serve_notify_unlink(s, n);
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
bool serve_respond_notify(struct serve_req *r, const char *query, const char *sig)
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
                                     tx_status_final(t.status), &r->cfg->sched, serve_on_told, n);
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
