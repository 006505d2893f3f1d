/* config_private.h - what the files of the configuration share (config.c,
 * config_shops.c, config_redis.c, config_secret.c); not for other modules. */
#ifndef KEMBALI_CONFIG_PRIVATE_H
#define KEMBALI_CONFIG_PRIVATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "config.h"

#define SECRET_MAX 256            /* bytes of a shop's key or notify secret */

/* Where errors go while loading: appended one per line. */
struct cerr {
    char *buf;
    size_t cap, len;
    int count;
    bool oom;                  /* an allocation failed: the load is refused whatever else */
};

/* Record one problem, "file: key: message" (key may be NULL), in e. Never
 * cut without a word: a message over 511 bytes ends in "...", and when
 * e's buffer is full its last line ends in "...". */
void config_fail(struct cerr *e, const char *file, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Record that an allocation failed (once per load). */
void config_fail_oom(struct cerr *e, const char *file);

/* strdup (NULL reads as ""), with a failure recorded in e (NULL is
 * returned then). */
char *config_dup(struct cerr *e, const char *file, const char *s);

/* Record every key of obj (at `where`, "" or "shops[0].") that is not a
 * key of `scope` in config_keys as unknown. */
void config_check_keys(struct cerr *e, const char *file, const char *where, json_t *obj, enum config_scope scope);

/* Optional string member; NULL when absent, error when not a non-empty
 * string. */
const char *config_opt_str(struct cerr *e, const char *file, const char *where, json_t *obj, const char *key);

/* An optional integer member in [lo, hi]; *out keeps its value when absent.
 * False (error recorded) when present and not such an integer. given
 * (may be NULL): whether it is present. */
bool config_opt_long(struct cerr *e, const char *file, json_t *root, const char *key, long lo, long hi, long *out,
                     bool *given);

/* The templates of (dir, locale), loaded once per configuration. NULL with
 * an error recorded in e (out of memory included). */
const struct templates *config_templates(struct config *c, struct cerr *e, const char *file, const char *where,
                                         const char *dir, const char *locale, const char *confine);

/* ---- config_secret.c: key and secret files ---- */

/* First line of a secret's file (a shop's key, the Redis password),
 * trimmed; NULL with a reason on failure (with *oom set when out of
 * memory). `what` names the secret in the reasons ("key", "password");
 * a first line longer than max + 63 bytes is refused rather than cut. With
 * keys_dir (resolved), the file must lie inside it after resolving symbolic
 * links, and is opened by its resolved name without following a link
 * swapped in since. The mode is checked on the opened descriptor (fstat, no
 * window between the check and the read): a regular file that others cannot
 * read and that group and others cannot write. The reasons never hold the
 * file's content. */
char *config_read_secret(const char *path, const char *keys_dir, size_t max, const char *what, bool *oom, char *why,
                         size_t whylen);

/* The file keys_dir/NAME<suffix> of the tenant NAME (suffix "" for its key)
 * into out (capacity outlen). `given`: the path the tenant's file names for
 * it (NULL: left out), which must resolve to that very file. The file must
 * not be a symbolic link, so two tenants never share one. A missing file
 * is not this function's error (the reader says so). False with the reason
 * in why. */
bool config_tenant_file(const struct config *c, const char *name, const char *suffix, const char *given, char *out,
                        size_t outlen, char *why, size_t whylen);

/* The secrets of shop object o (at `where` in file) into s: its key
 * (secret_key_file or secret_key_env; a tenant's is keys_dir/NAME) and its
 * notify secret. Problems are recorded in e. */
void config_load_shop_secrets(struct config *c, struct cerr *e, const char *file, const char *where, json_t *o,
                              struct shop *s, const char *tenant);

/* Overwrite the secret s with zeros and free it. NULL is ignored. */
void config_wipe(char *s);

/* ---- config_shops.c: shops, shop files, tenants ---- */

/* `shops` and shops_dir (sdir, may be NULL) of root into c (docs/tenants.md;
 * see config_reload). Problems are recorded in e. */
void config_load_shops(struct config *c, const struct config *prev, struct cerr *e, const char *file, json_t *root,
                       const char *sdir);

/* Free what shop s holds (its secrets wiped) and zero it. */
void config_shop_clear(struct shop *s);

/* ---- config_redis.c: the shared state's Redis ---- */

/* The top-level Redis keys of root into c->redis (the defaults without
 * them). Problems are recorded in e. */
void config_load_redis(struct config *c, struct cerr *e, const char *file, json_t *root);

#endif
