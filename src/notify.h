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

/* The admin POST: `shop` (NULL when none matched), its query string and
 * body (len bytes). Validates the id (the shop's id_param) and the body
 * (request_notify_status), records the status at `now`, and logs one line
 * (event=notify; its ts is taken before the status is recorded). Returns
 * the HTTP status of the answer: 204 when recorded (or when a final status
 * already known stays, as the rules say), 400 for a bad id or body, 404 for
 * no shop, 503 when the state has no room for the transaction; for anything
 * but 204 a reason in plain words is in why. */
int notify_request(struct state *st, const struct shop *shop, const char *query, const char *body, size_t len,
                   int64_t now, char *why, size_t whylen);

/* `kembali --notify SHOP ID STATUS`: load the configuration at
 * config_path, open the state in its state_dir (as the user kembali serves
 * as: the state file must be this user's) and record STATUS for ID of SHOP.
 * Prints nothing on success; on error, one reason on `err`. Returns the exit
 * status: 0 when recorded (or a final status already known stays), 1 for a
 * bad configuration, shop, id or status, or a state that cannot be opened. */
int notify_command(const char *config_path, const char *shop_id, const char *id, const char *status, FILE *err);

#endif
