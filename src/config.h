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

#include "hostreg.h"
#include "pace.h"
#include "render.h"
#include "state.h"

#define CONFIG_MAX_HOSTS 32            /* a shop's hosts: more are refused */
#define CONFIG_NAME_MAX 200            /* characters of a shop's name: more are refused */
#define CONFIG_MAX_ORIGINS 16
#define CONFIG_MAX_HELD_DEFAULT 10000L
#define CONFIG_MAX_HELD_MAX 1000000L
#define CONFIG_FD_RESERVE 64L          /* descriptors kembali needs besides connections */
#define CONFIG_REDIS_HOSTS_MAX 64
#define CONFIG_REDIS_PASSWORD_MAX 512  /* bytes of redis_password_file's first line */
#define CONFIG_REDIS_PREFIX_MAX 64
#define CONFIG_REDIS_SENTINELS_MAX 8   /* HOST:PORT pairs in a redis-sentinel:// address */
#define CONFIG_REDIS_MASTER_MAX 64     /* a Sentinel master's name */

/* One Sentinel of redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER. */
struct config_sentinel {
    char host[256];       /* a name, an IPv4 or an IPv6 address (without its brackets) */
    int port;             /* 1..65535 */
};

/* The shared state's Redis (docs/redis.md): the top-level
 * keys redis, redis_password_file, redis_sentinel_password_file,
 * redis_prefix and redis_hosts. Without `redis`: on is false, no address,
 * no password, prefix and hosts their defaults (the other keys are refused
 * without `redis`; redis_sentinel_password_file without Sentinels). */
struct config_redis {
    bool on;              /* `redis` is set */
    bool unix_socket;     /* unix:///PATH[?db=N] */
    char host[256];       /* redis://HOST:PORT[/DB] (HOST: a name, an IPv4 or [IPv6]); an IPv6
                           * address is kept without its brackets, as getaddrinfo and hiredis take it */
    int port;             /* 1..65535 */
    char path[108];       /* the socket's path (absolute) */
    int db;               /* 0.. */
    char *password;       /* redis_password_file's first line, trimmed; NULL without; never logged */
    char prefix[CONFIG_REDIS_PREFIX_MAX + 1]; /* default "kembali:"; 1..64 chars of A-Z a-z 0-9 : _ - . */
    int hosts;            /* redis_hosts, default 2, 1..CONFIG_REDIS_HOSTS_MAX */
    int schema;           /* the key names' schema version (state_redis_name.h); 0, the build's own,
                           * except in tests (no configuration key sets it) */
    /* redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER[?db=N]: the master
     * is asked of the Sentinels (host and port unused) */
    bool sentinel;
    int nsentinels;       /* 1..CONFIG_REDIS_SENTINELS_MAX */
    struct config_sentinel sentinels[CONFIG_REDIS_SENTINELS_MAX]; /* in the order given */
    char master[CONFIG_REDIS_MASTER_MAX + 1]; /* the master's name: 1..64 of A-Z a-z 0-9 _ - . : */
    char *sentinel_password; /* redis_sentinel_password_file's first line; NULL without; never logged */
};

struct shop {
    char id[STATE_ID_MAX + 1];
    char *name;
    char *hosts[CONFIG_MAX_HOSTS];
    int nhosts;
    char *secret;                  /* never logged, never rendered */
    struct state_key key;          /* the secret's identity in the state */
    char *notify_secret;           /* signs told statuses (HMAC key); NULL: telling is off.
                                    * Never logged, never rendered */
    char *shop_url;
    char locale[3];                /* "id" or "en" */
    int read_budget;               /* reads per any 60 s span */
    char *origins[CONFIG_MAX_ORIGINS];
    int norigins;
    char id_param[33];
    bool progressive;              /* a browser's navigation may get the streamed page (stream.h) */
    const struct templates *tpl;   /* owned by the config */
    char *source;                  /* the file in shops_dir it came from; NULL: inline */
    char *key_file;                /* secret_key_file, resolved (NULL: secret_key_env, or not resolvable) */
};

/* A file in shops_dir that was skipped (a running kembali serves without
 * it, or with its previous version). */
struct config_skip {
    char *file;                    /* the shop file's path */
    char *why;                     /* every problem, "file: key: reason" lines */
    char *collides;                /* the shop whose id, host or key the file claimed; NULL: none */
    bool kept;                     /* its previous version keeps serving */
};

struct config {
    atomic_int refs;
    char *path;
    char *api_base;
    char *state_dir;
    char *templates_dir;
    struct pace_schedule sched;
    long read_timeout_ms;
    long first_paint_ms;           /* the streamed page's top goes out by then at the latest (stream.h) */
    int state_slots;
    int state_slots_per_key;       /* 0: not given, the default (state_per_key_default) */
    bool read_planning;            /* plan a scarce budget (plan.h); false: first come, first served */
    int auth_failures_per_minute;  /* reads that may end in 401 per host in any 60 s (state_auth_allowance) */
    struct shop *shops;
    int nshops;
    const struct templates *default_tpl; /* templates_dir, "id": for answers without a shop */
    struct templates **tpls;       /* distinct template sets, owned */
    int ntpls;
    struct templates **kept_tpls;  /* references held for shops kept from the previous configuration */
    int nkept_tpls;
    char *keys_dir;                /* resolved (realpath), or NULL */
    char *shop_templates_root;     /* resolved (realpath), or NULL */
    long max_held;                 /* requests held at once, after the descriptor cap */
    long max_held_per_shop;        /* <= max_held */
    long max_held_wanted;          /* what the file asked (0: not given), before the cap */
    bool has_shops_dir;            /* shops_dir is set (a hosting box: no one-shop fallback) */
    struct config_skip *skipped;   /* bad files in shops_dir */
    int nskipped;
    struct config_redis redis;     /* the shared state's Redis; redis.on false: state_dir only */
    struct hostreg held_read;      /* the host registry as read before deciding (hostreg.h; empty: none read) */
    struct hostreg held;           /* who holds which host of shops_dir after this load */
    struct hostreg contested;      /* hosts nobody holds that two files claim ("A and B") */
    bool held_known;               /* the registry was read (CONFIG_HOSTS_READ, CONFIG_HOSTS_KEEP) */
};

/* ---- the keys of the configuration file (config_keys.c) ---- */

/* Every key, top level then per shop, in the order the docs list them. */
enum config_key_id {
    CK_API_BASE, CK_STATE_DIR, CK_TEMPLATES_DIR, CK_SHOPS, CK_SHOPS_DIR, CK_SCHEDULE_MS, CK_READ_TIMEOUT_MS,
    CK_FIRST_PAINT_MS, CK_STATE_SLOTS, CK_STATE_SLOTS_PER_KEY, CK_READ_PLANNING, CK_AUTH_FAILURES_PER_MINUTE,
    CK_KEYS_DIR,
    CK_SHOP_TEMPLATES_ROOT, CK_MAX_HELD, CK_MAX_HELD_PER_SHOP, CK_REDIS, CK_REDIS_PASSWORD_FILE,
    CK_REDIS_SENTINEL_PASSWORD_FILE, CK_REDIS_PREFIX, CK_REDIS_HOSTS,
    CK_SHOP_ID, CK_SHOP_NAME, CK_SHOP_HOSTS, CK_SHOP_SECRET_KEY_FILE, CK_SHOP_SECRET_KEY_ENV,
    CK_SHOP_NOTIFY_SECRET_FILE, CK_SHOP_SHOP_URL, CK_SHOP_LOCALE, CK_SHOP_READ_BUDGET, CK_SHOP_CORS_ORIGINS,
    CK_SHOP_TEMPLATES_DIR, CK_SHOP_ID_PARAM, CK_SHOP_PROGRESSIVE,
    CK_COUNT
};

enum config_scope { CONFIG_TOP, CONFIG_SHOP };
enum config_type { CONFIG_STRING, CONFIG_INT, CONFIG_BOOL, CONFIG_LIST, CONFIG_OBJECTS };

/* One key of the configuration file, nginx's ngx_command_t the model: the
 * one place its name, type, range and default are typed. Parsing reads
 * them from here (config.c, config_shops.c, config_redis.c), and a unit
 * test (test_config_doc) holds the tables of docs/configuration.md and the man page to
 * them. */
struct config_key {
    const char *name;
    enum config_scope scope;
    enum config_type type;
    long lo, hi;            /* CONFIG_INT with a fixed range: the values taken (hi 0: none fixed) */
    long def;               /* CONFIG_INT, CONFIG_BOOL: the default */
    const char *def_str;    /* CONFIG_STRING: the default value; NULL: none */
    const char *def_doc;    /* the default in the docs' words, when not def or def_str ("half of `max_held`") */
    size_t at;              /* a plain CONFIG_INT the table fills: offsetof in struct config (0: its own code) */
    size_t size;            /* ... and the field's size (sizeof (int) or sizeof (long)) */
    const char *help;       /* what it is, in a few words */
};

/* The table, CK_COUNT entries indexed by enum config_key_id. */
extern const struct config_key config_keys[CK_COUNT];

/* Load, validate and prepare (keys read, templates loaded) the
 * configuration at `path`. Returns NULL and writes every problem found, one
 * per line, into err (capacity errlen), when the main configuration is
 * broken (out of memory included). A bad file in shops_dir does not fail
 * the load: it is left out and listed in c->skipped (file and reasons), and
 * err stays empty. Same as config_reload(path, NULL, err, errlen): the
 * host registry is not read. */
struct config *config_load(const char *path, char *err, size_t errlen);

/* Like config_load, for a reload while `prev` serves (prev may be NULL).
 * The file shops_dir/NAME.json is the shop NAME (docs/tenants.md):
 * its key is keys_dir/NAME; a file of another name is skipped. A host
 * belongs to a shop of the main configuration, else to the tenant that
 * held it (here: served it in prev; see config_reload_hosts for the
 * registry), else to the one file claiming it (hostreg_decide: a broken
 * file keeps its hosts and claims the free ones it lists); a file
 * claiming a host that belongs to another shop (or that another file
 * claims too while nobody holds it), the id or key file of a shop of the
 * main configuration, or the notify secret of a shop with another key, is
 * skipped, naming that shop (skip->collides). A skipped file whose
 * previous version is in prev keeps that version (its key and templates
 * as they were; skip->kept is true) while it holds that version's hosts.
 * prev is only read. */
struct config *config_reload(const char *path, const struct config *prev, char *err, size_t errlen);

/* What a load does with the host registry in state_dir (hostreg.h). */
enum config_hosts {
    CONFIG_HOSTS_NONE,   /* not read: who held a host comes from prev alone (tests, --notify) */
    CONFIG_HOSTS_READ,   /* read, not written (--check-config; a start as root before --user) */
    CONFIG_HOSTS_KEEP    /* locked, read, decided from, written when changed, unlocked (a start, SIGHUP) */
};

/* Like config_reload, deciding who holds which host of shops_dir from the
 * host registry in the configuration's state_dir as `hosts` says
 * (docs/tenants.md, "Who holds a host": a host belongs to the shop that held it first;
 * hosts the registry does not name fall back to prev's tenants). The
 * result is in c->held (c->held_read: what was read). With
 * CONFIG_HOSTS_KEEP the registry's lock is held from reading it to
 * writing c->held, so processes sharing state_dir never drop each
 * other's claims. A registry that cannot be read, locked or written
 * refuses the load (the reason in err), as a broken main configuration
 * does. Without shops_dir the registry is not touched. */
struct config *config_reload_hosts(const char *path, const struct config *prev, enum config_hosts hosts, char *err,
                                   size_t errlen);

/* The most requests one process may hold when it may open `nofile`
 * descriptors (RLIMIT_NOFILE's soft limit; < 0: unlimited): each held
 * request is one connection, and a quarter of the descriptors plus
 * CONFIG_FD_RESERVE stay free for the process's own files, API
 * connections and the connections answered at once beyond the cap:
 * nofile - 64 - nofile / 4, at least 1, at most CONFIG_MAX_HELD_MAX.
 * Pure; can't fail. */
long config_held_cap(long nofile);

/* Fill each shop's key identity from the state's salt. Can't fail. */
void config_bind_state(struct config *c, const struct state *st);

/* Reference counting: a config is freed when its last reference is dropped. */
struct config *config_ref(struct config *c);
void config_unref(struct config *c);

/* The shop a request belongs to (docs/configuration.md): by KEMBALI_SHOP id, else by
 * host (port removed, case-insensitive), else the only shop when exactly
 * one is configured and there is no shops_dir; NULL if none. */
const struct shop *config_pick_shop(const struct config *c, const char *shop_param, const char *host);

/* The Redis's address for messages and logs, as the configuration gives
 * it: "redis://HOST:PORT[/DB]" (an IPv6 host in brackets),
 * "unix:///PATH[?db=N]" or "redis-sentinel://HOST:PORT[,...]/MASTER[?db=N]"
 * (the db only when not 0); never a password.
 * "-" when r->on is false. Always NUL-terminated (cut to len). Can't fail. */
void config_redis_address(const struct config_redis *r, char *buf, size_t len);

#endif
