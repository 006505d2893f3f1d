/* config.h - the JSON configuration, validated, as one immutable value.
 *
 * A loaded configuration never changes; SIGHUP loads a new one and swaps it
 * in (see kembali.c). Requests in hand keep a reference to the one they
 * started with, so a reload never disturbs them. Every error names the file,
 * the JSON key and what is wrong, in plain words. */
#ifndef KEMBALI_CONFIG_H
#define KEMBALI_CONFIG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "pace.h"
#include "render.h"
#include "state.h"

#define CONFIG_MAX_HOSTS 32
#define CONFIG_MAX_ORIGINS 16

struct shop {
    char id[STATE_ID_MAX + 1];
    char *name;
    char *hosts[CONFIG_MAX_HOSTS];
    int nhosts;
    char *secret;                  /* never logged, never rendered */
    struct state_key key;          /* the secret's identity in the state */
    char *shop_url;
    char locale[3];                /* "id" or "en" */
    int read_budget;               /* reads per any 60 s span */
    char *origins[CONFIG_MAX_ORIGINS];
    int norigins;
    char id_param[33];
    const struct templates *tpl;   /* owned by the config */
};

struct config {
    atomic_int refs;
    char *path;
    char *api_base;
    char *state_dir;
    char *templates_dir;
    struct pace_schedule sched;
    long read_timeout_ms;
    int state_slots;
    bool read_planning;            /* plan a scarce budget (plan.h); false: first come, first served */
    struct shop *shops;
    int nshops;
    const struct templates *default_tpl; /* templates_dir, "id": for answers without a shop */
    struct templates **tpls;       /* distinct template sets, owned */
    int ntpls;
};

/* Load, validate and prepare (keys read, templates loaded) the
 * configuration at `path`. Returns NULL and writes every problem found, one
 * per line, into err (capacity errlen). */
struct config *config_load(const char *path, char *err, size_t errlen);

/* Fill each shop's key identity from the state's salt. Can't fail. */
void config_bind_state(struct config *c, const struct state *st);

/* Reference counting: a config is freed when its last reference is dropped. */
struct config *config_ref(struct config *c);
void config_unref(struct config *c);

/* The shop a request belongs to (interface.md): by KEMBALI_SHOP id, else by
 * host (port removed, case-insensitive), else the only shop; NULL if none. */
const struct shop *config_pick_shop(const struct config *c, const char *shop_param, const char *host);

/* True when id is 1..64 characters of A-Z a-z 0-9 _ -. */
bool config_valid_id(const char *id);

#endif
