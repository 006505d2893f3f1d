/* notify.h - "told by the shop": what the admin POST ?format=notify and
 * `kembali --notify SHOP ID STATUS` share.
 *
 * The shop's webhook handler, having verified Kasera's event, tells kembali
 * a transaction's status; kembali records it in the shared state
 * (state_tell) as if a read had just returned it, so that returns are
 * answered without reading. Nothing here reads the payment API. */
#ifndef KEMBALI_NOTIFY_H
#define KEMBALI_NOTIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "log.h"
#include "state.h"

/* What the admin POST carries: its query string, its Kembali-Signature
 * header (NULL when absent) and its body (len bytes, any bytes). */
struct notify_post {
    const char *query;
    const char *signature;
    const char *body;
    size_t len;
};

/* One admin POST, from its check to its answer (with Redis, the answer
 * waits for Redis's word on the status). */
struct notify_told {
    struct log_line line;          /* begun at the check: stamped before the status is recorded */
    const struct shop *shop;
    char id[STATE_ID_MAX + 2];
    enum tx_status status;         /* TXS_NONE until the body is read */
    const char *result;            /* "recorded", "kept" or "refused" */
    int http;                      /* the answer: 0 while it may still be recorded */
    char why[512];                 /* for anything but 204, the reason in plain words */
};

/* Check the admin POST for `shop` (NULL when none matched) at wall_s (Unix
 * seconds, for the signature's timestamp), in this order: a shop (404), its
 * notify secret (403: telling is off for a shop without one), the id (the
 * shop's id_param) and the body's size (400), the signature (401:
 * notify_sig_check), the body (400: request_notify_status). True when the
 * status (t->status for t->id) may be recorded (t->http 0); false with
 * t->http and t->why. Changes nothing. */
bool notify_check(struct notify_told *t, const struct shop *shop, const struct notify_post *p, int64_t wall_s);

/* Record what t checked in st at `now` (the state's monotonic ms), unless
 * redis_kept names a final status that Redis knows and this one may not
 * replace (then Redis's final status is recorded here too, as a mirror): t->http becomes 204 (recorded; the same status told again
 * included), 409 when a final status already known (here, or redis_kept)
 * may not be replaced by this one (nothing changes; `sched`, the shop's
 * schedule, looks that status up for the reason), or 503 when the state
 * has no room for the transaction. */
void notify_record(struct notify_told *t, struct state *st, const struct pace_schedule *sched,
                   const char *redis_kept, int64_t now);

/* Log t's one line: event=notify, or event=notify_conflict at level error
 * for a 409 (shop, id, status, result, http, reason). */
void notify_log(struct notify_told *t);

/* All three at once, without Redis: the HTTP status (t->http). */
int notify_request(struct notify_told *t, struct state *st, const struct shop *shop, const struct pace_schedule *sched,
                   const struct notify_post *p, int64_t now, int64_t wall_s);

/* `kembali --notify SHOP ID STATUS`: load the configuration at
 * config_path, open the state in its state_dir (as the user kembali serves
 * as: the state file must be this user's) and record STATUS for ID of SHOP.
 * Prints nothing on success; on error, one reason on `err`. Returns the exit
 * status: 0 when recorded (or a final status already known stays), 1 for a
 * bad configuration, shop, id or status, or a state that cannot be opened. */
int notify_command(const char *config_path, const char *shop_id, const char *id, const char *status, FILE *err);

#endif
