/* notify.h - "told by the shop": what the admin POST ?format=notify and
 * `kembali --notify SHOP ID STATUS` share.
 *
 * The shop's webhook handler, having verified Kasera's event, tells kembali
 * a transaction's status; kembali records it in the shared state
 * (state_tell) as if a read had just returned it, so that returns are
 * answered without reading. Nothing here reads the payment API. */
#ifndef KEMBALI_NOTIFY_H
#define KEMBALI_NOTIFY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "state.h"

/* What the admin POST carries: its query string, its Kembali-Signature
 * header (NULL when absent) and its body (len bytes, any bytes). */
struct notify_post {
    const char *query;
    const char *signature;
    const char *body;
    size_t len;
};

/* The admin POST for `shop` (NULL when none matched), at `now` (the
 * state's monotonic ms) and wall_s (Unix seconds, for the signature's
 * timestamp). Checks, in this order: a shop (404), its notify secret (403:
 * telling is off for a shop without one), the id (the shop's id_param) and
 * the body's size (400), the signature (401: notify_sig_check), the body
 * (400: request_notify_status); then records the status (state_tell) and
 * logs one line: event=notify (its ts taken before the status is
 * recorded), or event=notify_conflict at level error when a final status
 * already known stays (`sched`: the shop's schedule, to look that status
 * up for the reason). Returns the HTTP status of the answer: 204 when
 * recorded (the same status told again included), 400, 401, 403, 404, 409
 * when a final status already known may not be replaced by this one, 503
 * when the state has no room for the transaction; for anything but 204 a
 * reason in plain words is in why. No refusal changes anything. */
int notify_request(struct state *st, const struct shop *shop, const struct pace_schedule *sched,
                   const struct notify_post *p, int64_t now, int64_t wall_s, char *why, size_t whylen);

/* `kembali --notify SHOP ID STATUS`: load the configuration at
 * config_path, open the state in its state_dir (as the user kembali serves
 * as: the state file must be this user's) and record STATUS for ID of SHOP.
 * Prints nothing on success; on error, one reason on `err`. Returns the exit
 * status: 0 when recorded (or a final status already known stays), 1 for a
 * bad configuration, shop, id or status, or a state that cannot be opened. */
int notify_command(const char *config_path, const char *shop_id, const char *id, const char *status, FILE *err);

#endif
