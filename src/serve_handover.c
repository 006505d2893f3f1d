/* serve_handover.c - requests in hand saved for a successor and taken
 * back, and the cached facts handed across layouts (serve.h, handover.h). */
#include "serve_private.h"

/* ---- handing over (handover.h) ---- */

/* The front's save: r's part of its record; r leaves the resolver (its
 * place in the budget's plan goes with it) and its streamed page's timer
 * stops. An admin POST waiting for Redis stays here. */
int serve_on_save(void *ctx, struct front_req *fr, void *user, struct handover_rec *rec)
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
        serve_unpark(r);
    else
        resolver_drop(s->rs, &r->rw);
    loop_timer_stop(s->loop, &r->st);
    r->frozen = true;
    return 0;
}

/* The front's restore: the successor did not take r; hold it here again
 * (or, while still handing over, park it for the next batch). */
void serve_on_restore(void *ctx, struct front_req *fr, void *user)
{
    struct serve *s = ctx;
    struct serve_req *r = user;
    (void)fr;
    if (r == NULL || !r->frozen)
        return;
    r->frozen = false;
    if (s->handing)
        serve_park(r);
    else
        serve_hold_go(r);
}

/* The front's release: the successor has r; forget it. */
void serve_on_release(void *ctx, struct front_req *fr, void *user)
{
    struct serve_req *r = user;
    (void)ctx, (void)fr;
    if (r != NULL)
        serve_held_free(r);
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
        serve_unpark(r);
        serve_hold_go(r);
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
            serve_log_request(&tmp, 0, NULL);
        } else {
            struct answer ans = {.word = tmp.shop == NULL ? W_UNKNOWN_SHOP : W_INVALID, .json_status = "unknown",
                                 .retry_after_s = -1};
            serve_respond_word(&tmp, &ans);
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
            serve_answer_now(&tmp, -1);
        }
        return -1;
    }
    *r = tmp;
    r->held = true;
    r->counted = serve_shop_count(s, r->shop->id);
    if (r->counted != NULL)
        r->counted->held++;
    r->stream = rec->stream;
    r->undecided = rec->undecided;
    r->sc = (struct stream_clock){.arrived = rec->arrived, .painted = rec->painted, .last_sent = rec->last_sent};
    serve_waiter_init(r, rec->deadline, rec->wants_read);
    loop_timer_init(&r->st, serve_on_stream_timer, r);
    front_req_set_user(fr, r);
    if (s->handing)
        serve_park(r);
    else
        serve_hold_go(r);
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
