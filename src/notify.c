/* notify.c - see notify.h. */
#include "notify.h"

#include <string.h>

#include "classify.h"
#include "log.h"
#include "notify_sig.h"
#include "request.h"
#include "state_redis.h"
#include "util.h"

/* Record status s for (shop, id); 0, or -1 with why (no room). */
static int tell(struct state *st, const struct shop *shop, const char *id, enum tx_status s, int64_t now,
                const char **result, char *why, size_t whylen)
{
    enum state_told t = state_tell(st, &shop->key, id, s, tx_status_word(s), now);
    *result = t == STATE_TOLD_RECORDED ? "recorded" : t == STATE_TOLD_KEPT ? "kept" : "refused";
    if (t == STATE_TOLD_FULL) {
        snprintf(why, whylen, "no room in the state to track this transaction now (state_slots); try again");
        return -1;
    }
    if (t == STATE_TOLD_BAD) { /* callers validate: not expected */
        snprintf(why, whylen, "the id or status cannot be recorded");
        return -1;
    }
    return 0;
}

/* The reason of a 409: `known` stays. */
static void conflict_why(struct notify_told *t, const char *known)
{
    snprintf(t->why, sizeof t->why, "%s is already known for this transaction and %s may not replace it; it stays",
             known, tx_status_word(t->status));
}

bool notify_check(struct notify_told *t, const struct shop *shop, const struct notify_post *p, int64_t wall_s)
{
    log_begin(&t->line, LOG_LV_INFO, "notify");
    t->shop = shop;
    t->id[0] = t->why[0] = '\0';
    t->status = TXS_NONE;
    t->result = "refused";
    t->http = 400;
    if (shop == NULL) {
        snprintf(t->why, sizeof t->why, "no shop matches this request (KEMBALI_SHOP or the host)");
        t->http = 404;
    } else if (shop->notify_secret == NULL) {
        snprintf(t->why, sizeof t->why, "telling is off for this shop: it has no notify secret (notify_secret_file)");
        t->http = 403;
    } else if (!request_query_param(p->query, shop->id_param, t->id, sizeof t->id) || !ids_valid_id(t->id)) {
        snprintf(t->why, sizeof t->why, "the query needs %s=ID, 1 to %d characters of A-Z a-z 0-9 _ -",
                 shop->id_param, STATE_ID_MAX);
        t->id[0] = '\0';
    } else if (p->len > REQUEST_NOTIFY_BODY_MAX) {
        enum tx_status unused;
        request_notify_status(p->body, p->len, &unused, t->why, sizeof t->why); /* refused for its size, unread */
    } else if (notify_sig_check(p->signature, shop->notify_secret, t->id, p->body, p->len, wall_s, t->why,
                                sizeof t->why) != NOTIFY_SIG_OK) {
        t->http = 401;
    } else if (!request_notify_status(p->body, p->len, &t->status, t->why, sizeof t->why)) {
        t->status = TXS_NONE;
    } else {
        t->http = 0;
    }
    return t->http == 0;
}

void notify_record(struct notify_told *t, struct state *st, const struct pace_schedule *sched,
                   const char *redis_kept, int64_t now)
{
    if (redis_kept != NULL) {
        /* mirror what Redis knows: this host may still hold what it was
         * told before (an expired another host's succeeded replaced) */
        enum tx_status kept = tx_status_parse(redis_kept);
        if (tx_status_final(kept))
            state_tell(st, &t->shop->key, t->id, kept, redis_kept, now);
        t->result = "kept";
        t->http = 409;
        conflict_why(t, redis_kept);
        return;
    }
    t->http = tell(st, t->shop, t->id, t->status, now, &t->result, t->why, sizeof t->why) == 0 ? 204 : 503;
    if (t->http == 204 && strcmp(t->result, "kept") == 0) {
        struct state_fact f;
        state_lookup(st, &t->shop->key, t->id, sched, t->shop->read_budget, now, &f);
        t->http = 409;
        conflict_why(t, f.status != TXS_NONE && f.status != TXS_UNKNOWN ? f.status_word : "a final status");
    }
}

void notify_log(struct notify_told *t)
{
    if (t->http == 409)
        log_begin(&t->line, LOG_LV_ERROR, "notify_conflict");
    log_str(&t->line, "shop", t->shop ? t->shop->id : NULL);
    log_str(&t->line, "id", t->id[0] ? t->id : NULL);
    log_str(&t->line, "status", t->status != TXS_NONE ? tx_status_word(t->status) : NULL);
    log_str(&t->line, "result", t->result);
    log_int(&t->line, "http", t->http);
    log_str(&t->line, "reason", t->why[0] ? t->why : NULL);
    log_end(&t->line);
}

int notify_request(struct notify_told *t, struct state *st, const struct shop *shop, const struct pace_schedule *sched,
                   const struct notify_post *p, int64_t now, int64_t wall_s)
{
    if (notify_check(t, shop, p, wall_s))
        notify_record(t, st, sched, NULL, now);
    notify_log(t);
    return t->http;
}

int notify_command(const char *config_path, const char *shop_id, const char *id, const char *status, FILE *err)
{
    static const char words[] = "pending, succeeded, failed, canceled or expired";
    enum tx_status s = tx_status_parse(status);
    if (s == TXS_UNKNOWN) {
        fprintf(err, "kembali --notify: status %s: give one of %s\n", status, words);
        return 1;
    }
    if (!ids_valid_id(id)) {
        fprintf(err, "kembali --notify: id %s: give 1 to %d characters of A-Z a-z 0-9 _ -\n", id, STATE_ID_MAX);
        return 1;
    }
    char msg[8192];
    struct config *c = config_load(config_path, msg, sizeof msg);
    if (c == NULL) {
        fprintf(err, "kembali --notify: the configuration is not usable:\n%s", msg);
        return 1;
    }
    int rc = 1;
    struct state *st = NULL;
    const struct shop *shop = config_pick_shop(c, shop_id, NULL);
    if (shop == NULL || *shop_id == '\0') {
        fprintf(err, "kembali --notify: shop %s: no shop with that id in %s\n", shop_id, config_path);
        goto out;
    }
    struct state_opts so = {.tx_slots = c->state_slots, .tx_per_key = c->state_slots_per_key,
                            .key_slots = state_key_slots_for(c->nshops),
                            .read_timeout_ms = c->read_timeout_ms};
    st = state_open(c->state_dir, &so, msg, sizeof msg);
    if (st == NULL) {
        fprintf(err, "kembali --notify: %s\n", msg);
        goto out;
    }
    config_bind_state(c, st);
    const char *result;
    if (tell(st, shop, id, s, util_mono_ms(), &result, msg, sizeof msg) != 0) {
        fprintf(err, "kembali --notify: %s\n", msg);
        goto out;
    }
    rc = 0;
    if (c->redis.on) { /* every host: recorded here already, so a failure only warns */
        struct state_fact f;
        state_lookup(st, &shop->key, id, &c->sched, shop->read_budget, util_mono_ms(), &f);
        if (f.status != TXS_NONE && f.status != TXS_UNKNOWN &&
            state_redis_tell_once(&c->redis, shop->secret, id, f.status_word, f.final, 1000, msg, sizeof msg) != 0)
            fprintf(err, "kembali --notify: warning: recorded on this host only; Redis: %s\n", msg);
    }
out:
    state_free(st);
    config_unref(c);
    return rc;
}
