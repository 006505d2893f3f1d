/* serve_metrics.c - the metrics page as an answer (serve_private.h). */
#include "serve_private.h"

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
void serve_respond_metrics(struct serve_req *r)
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
        rc = serve_build_response(r, 200, NULL, "text/plain; version=0.0.4", -1, NULL, &b, &out);
    dynbuf_free(&b);
    serve_send_out(r, &out, rc);
    dynbuf_free(&out);
}
