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

/* The reason of a 409: what is known stays (looked up after state_tell). */
static void conflict_why(struct state *st, const struct shop *shop, const struct pace_schedule *sched, const char *id,
                         enum tx_status s, int64_t now, char *why, size_t whylen)
{
    struct state_fact f;
    state_lookup(st, &shop->key, id, sched, shop->read_budget, now, &f);
    snprintf(why, whylen, "%s is already known for this transaction and %s may not replace it; it stays",
             f.status != TXS_NONE && f.status != TXS_UNKNOWN ? f.status_word : "a final status", tx_status_word(s));
}

int notify_request(struct state *st, const struct shop *shop, const struct pace_schedule *sched,
                   const struct notify_post *p, int64_t now, int64_t wall_s, char *why, size_t whylen)
{
    struct log_line l;
    log_begin(&l, "info", "notify"); /* stamped before the status is recorded */
    char id[STATE_ID_MAX + 2] = "";
    enum tx_status s = TXS_NONE;
    const char *result = "refused";
    int http = 400;
    why[0] = '\0';
    if (shop == NULL) {
        snprintf(why, whylen, "no shop matches this request (KEMBALI_SHOP or the host)");
        http = 404;
    } else if (shop->notify_secret == NULL) {
        snprintf(why, whylen, "telling is off for this shop: it has no notify secret (notify_secret_file)");
        http = 403;
    } else if (!request_query_param(p->query, shop->id_param, id, sizeof id) || !config_valid_id(id)) {
        snprintf(why, whylen, "the query needs %s=ID, 1 to %d characters of A-Z a-z 0-9 _ -", shop->id_param,
                 STATE_ID_MAX);
        id[0] = '\0';
    } else if (p->len > REQUEST_NOTIFY_BODY_MAX) {
        request_notify_status(p->body, p->len, &s, why, whylen); /* refused for its size, unread */
        s = TXS_NONE;
    } else if (notify_sig_check(p->signature, shop->notify_secret, id, p->body, p->len, wall_s, why, whylen) !=
               NOTIFY_SIG_OK) {
        http = 401;
    } else if (request_notify_status(p->body, p->len, &s, why, whylen)) {
        http = tell(st, shop, id, s, now, &result, why, whylen) == 0 ? 204 : 503;
        if (http == 204 && strcmp(result, "kept") == 0) {
            http = 409;
            conflict_why(st, shop, sched, id, s, now, why, whylen);
            log_begin(&l, "error", "notify_conflict");
        }
    }
    log_str(&l, "shop", shop ? shop->id : NULL);
    log_str(&l, "id", id[0] ? id : NULL);
    log_str(&l, "status", s != TXS_NONE ? tx_status_word(s) : NULL);
    log_str(&l, "result", result);
    log_int(&l, "http", http);
    log_str(&l, "reason", why[0] ? why : NULL);
    log_end(&l);
    return http;
}

int notify_command(const char *config_path, const char *shop_id, const char *id, const char *status, FILE *err)
{
    static const char words[] = "pending, succeeded, failed, canceled or expired";
    enum tx_status s = tx_status_parse(status);
    if (s == TXS_UNKNOWN) {
        fprintf(err, "kembali --notify: status %s: give one of %s\n", status, words);
        return 1;
    }
    if (!config_valid_id(id)) {
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
    struct state_opts so = {.tx_slots = c->state_slots, .key_slots = state_key_slots_for(c->nshops),
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
