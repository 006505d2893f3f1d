/* state_file.c - the region's file: creating, opening, mapping and
 * attaching it; the robust process-shared lock and the futex that wakes
 * the processes waiting for reads; the damage hooks of the tests. */
#include "state_private.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "siphash.h"
#include "util.h"

/* ---- the layout ---- */

/* The region's geometry for the given options. */
struct layout {
    int32_t txn, keyn, nb, knb, cln, per_key;
    size_t off_b, off_t, off_kb, off_k, off_c, size;
};

int state_per_key_default(int tx_slots)
{
    return tx_slots / 4 > 0 ? tx_slots / 4 : 1;
}

/* The quota `opts` asks for in a table of txn slots: its own, clamped to
 * 1 .. txn, or the default for txn. */
static int32_t per_key_for(const struct state_opts *opts, int32_t txn)
{
    if (opts->tx_per_key <= 0)
        return state_per_key_default(txn);
    return opts->tx_per_key < txn ? opts->tx_per_key : txn;
}

/* The region's geometry for txn transactions, keyn keys and cln clients
 * (each within its bounds): in the order of state_private.h, each table
 * aligned to 64 bytes. The one place the layout is decided. */
static void layout_of(int32_t txn, int32_t keyn, int32_t cln, struct layout *l)
{
    l->txn = txn;
    l->keyn = keyn;
    l->cln = cln;
    l->nb = 1;
    while (l->nb < l->txn && l->nb < (1 << 28))
        l->nb <<= 1;
    l->knb = 1;
    while (l->knb < l->keyn && l->knb < (1 << 28))
        l->knb <<= 1;
    l->off_b = (sizeof(struct st_hdr) + 63) & ~(size_t)63;
    l->off_t = (l->off_b + (size_t)l->nb * sizeof(int32_t) + 63) & ~(size_t)63;
    l->off_c = (l->off_t + (size_t)l->txn * sizeof(struct st_tx) + 63) & ~(size_t)63;
    l->off_k = (l->off_c + (size_t)l->cln * sizeof(struct st_client) + 63) & ~(size_t)63;
    l->off_kb = (l->off_k + (size_t)l->keyn * sizeof(struct st_keyent) + 63) & ~(size_t)63;
    l->size = l->off_kb + (size_t)l->knb * sizeof(int32_t);
}

#define ST_TX_SLOTS_MAX (1 << 28)

static void layout_for(const struct state_opts *opts, struct layout *l)
{
    int32_t txn = opts->tx_slots > 0 ? opts->tx_slots : STATE_SLOTS_DEFAULT;
    if (txn > ST_TX_SLOTS_MAX)
        txn = ST_TX_SLOTS_MAX;
    int32_t keyn = opts->key_slots > 0 ? opts->key_slots : STATE_KEY_SLOTS_DEFAULT;
    if (keyn > STATE_KEY_SLOTS_MAX)
        keyn = STATE_KEY_SLOTS_MAX;
    int32_t cln = opts->client_slots > 0 ? opts->client_slots : STATE_CLIENT_SLOTS_DEFAULT;
    if (cln > STATE_CLIENT_SLOTS_MAX)
        cln = STATE_CLIENT_SLOTS_MAX;
    layout_of(txn, keyn, cln, l);
    l->per_key = per_key_for(opts, l->txn);
}

/* Does the header describe exactly the layout of its slot counts, within
 * `len` bytes (a file may be longer: a growth whose process died before
 * it was whole)? Reads each field once (another process may be writing
 * them while a CGI opener looks). */
static bool hdr_geometry_ok(const struct st_hdr *h, size_t len, struct layout *l)
{
    int32_t txn = h->tx_slots, keyn = h->key_slots, cln = h->client_slots;
    if (txn < 1 || txn > ST_TX_SLOTS_MAX || keyn < 1 || keyn > STATE_KEY_SLOTS_MAX || cln < 1 ||
        cln > STATE_CLIENT_SLOTS_MAX)
        return false;
    layout_of(txn, keyn, cln, l);
    return h->nbuckets == l->nb && h->key_nbuckets == l->knb && h->buckets_off == l->off_b &&
           h->txs_off == l->off_t && h->clients_off == l->off_c && h->keys_off == l->off_k &&
           h->key_buckets_off == l->off_kb && h->size == l->size && l->size <= len;
}

/* A fingerprint of this build's data layout: a region written by a build
 * with other structure sizes must not be read. */
static uint64_t layout_stamp(void)
{
    return ((uint64_t)ST_VERSION << 48) ^ ((uint64_t)sizeof(struct st_hdr) << 32) ^
           ((uint64_t)sizeof(struct st_tx) << 16) ^ (uint64_t)sizeof(struct st_keyent) ^
           ((uint64_t)sizeof(pthread_mutex_t) << 40);
}

/* Point st's tables at `body` (the first mapping, or a later one of the
 * whole file) laid out as l says, and keep a copy of the geometry. */
static void attach_tables(struct state *st, uint8_t *body, const struct layout *l, uint32_t geom)
{
    st->txn = l->txn;
    st->keyn = l->keyn;
    st->nb = l->nb;
    st->knb = l->knb;
    st->cln = l->cln;
    st->geom = geom;
    st->size = l->size;
    st->buckets_off = l->off_b;
    st->txs_off = l->off_t;
    st->clients_off = l->off_c;
    st->keys_off = l->off_k;
    st->key_buckets_off = l->off_kb;
    st->buckets = (int32_t *)(body + l->off_b);
    st->txs = (struct st_tx *)(body + l->off_t);
    st->key_buckets = (int32_t *)(body + l->off_kb);
    st->keys = (struct st_keyent *)(body + l->off_k);
    st->clients = (struct st_client *)(body + l->off_c);
}

/* Point st at a region laid out as the header says (checked by
 * region_usable() for a file) and keep a copy of its geometry. */
static void attach(struct state *st, uint8_t *base)
{
    atomic_store(&st->auth_allowance, STATE_AUTH_FAILS_DEFAULT);
    st->h = (struct st_hdr *)base;
    struct layout l;
    layout_of(st->h->tx_slots, st->h->key_slots, st->h->client_slots, &l);
    attach_tables(st, base, &l, st->h->geom);
    st->fd = st->lock_fd = -1;
}

/* ---- locking ---- */

/* Map the file anew after another process grew it (the header's geom is
 * not ours), under the lock. The header is trusted only when it describes
 * a whole layout within the file (the grower bumps geom last); otherwise
 * it stays as it is for st_region_check() to restore from our copy.
 * Returns false when the header was not usable; a file this process cannot
 * map ends it (its tables are no longer where it knows them). */
static bool geometry_refresh(struct state *st)
{
    struct layout l;
    struct stat sb;
    if (st->fd < 0 || fstat(st->fd, &sb) != 0 || !hdr_geometry_ok(st->h, (size_t)sb.st_size, &l))
        return false;
    uint8_t *body = mmap(NULL, l.size, PROT_READ | PROT_WRITE, MAP_SHARED, st->fd, 0);
    if (body == MAP_FAILED) {
        int e = errno;
        struct log_line ll; /* the lock stays held: the others recover it (EOWNERDEAD) */
        log_begin(&ll, LOG_LV_ERROR, "state");
        log_str(&ll, "msg", "cannot map the state file after another process grew it; exiting");
        log_str(&ll, "error", strerror(e));
        log_int(&ll, "size", (long long)l.size);
        log_end(&ll);
        _exit(71);
    }
    if (st->body != NULL)
        munmap(st->body, st->body_len); /* never the first mapping: the lock lives there */
    st->body = body;
    st->body_len = l.size;
    attach_tables(st, body, &l, st->h->geom);
    return true;
}

void st_lock(struct state *st, int64_t now)
{
    int rc = pthread_mutex_lock(&st->h->mu);
    bool moved = __atomic_load_n(&st->h->geom, __ATOMIC_ACQUIRE) != st->geom;
    if (moved && !geometry_refresh(st) && rc != EOWNERDEAD) {
        /* a header that says another geometry yet none whole: damage */
        st_region_check(st, now, true);
    }
    if (rc == EOWNERDEAD) {
        /* A process died holding the lock (SIGKILL at any moment): what it
         * was changing may be half done. Leases of its reads stay and
         * expire on their own. */
        st->notice.owner_died = true;
        st_region_check(st, now, true);
        st->h->recoveries++;
        pthread_mutex_consistent(&st->h->mu);
    }
}

static const char *const dmg_names[DMG_N] = {"header", "tx_entries", "tx_links", "key_entries", "key_links", "clients", "times"};

/* Log what a check found (never under the lock). */
static void notice_log(const struct st_notice *n, const char *msg)
{
    struct log_line ll;
    log_begin(&ll, LOG_LV_WARN, "state");
    log_str(&ll, "msg", msg);
    for (int i = 0; i < DMG_N; i++)
        if (n->dmg[i] > 0)
            log_int(&ll, dmg_names[i], n->dmg[i]);
    log_end(&ll);
}

static bool notice_any(const struct st_notice *n)
{
    if (n->owner_died)
        return true;
    for (int i = 0; i < DMG_N; i++)
        if (n->dmg[i] > 0)
            return true;
    return false;
}

void st_unlock(struct state *st)
{
    struct st_notice n = st->notice;
    if (notice_any(&n))
        memset(&st->notice, 0, sizeof st->notice);
    pthread_mutex_unlock(&st->h->mu);
    if (n.owner_died)
        notice_log(&n, "a kembali process died holding the state lock; state checked and repaired");
}

/* ---- waiting for reads of other processes ---- */

static long futex(uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

void st_bump(struct state *st)
{
    __atomic_add_fetch(&st->h->gen, 1, __ATOMIC_SEQ_CST);
    futex(&st->h->gen, FUTEX_WAKE, INT_MAX, NULL); /* shared mapping: not FUTEX_PRIVATE */
}

uint32_t state_generation(struct state *st)
{
    return __atomic_load_n(&st->h->gen, __ATOMIC_SEQ_CST);
}

uint32_t state_wait_change(struct state *st, uint32_t seen, int timeout_ms)
{
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    if (state_generation(st) == seen)
        futex(&st->h->gen, FUTEX_WAIT, seen, &ts);
    return state_generation(st);
}

/* The mutex's lock word (glibc: the first int of pthread_mutex_t). Read
 * only when nobody else can use the region, to say in the log whether a
 * copy was taken while the lock was held. */
static uint32_t mutex_word(const pthread_mutex_t *mu)
{
    uint32_t w;
    memcpy(&w, mu, sizeof w);
    return w;
}

static int mutex_init(pthread_mutex_t *mu, char *err, size_t errlen)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    int rc = pthread_mutex_init(mu, &a);
    pthread_mutexattr_destroy(&a);
    if (rc != 0) {
        snprintf(err, errlen, "pthread_mutex_init: %s", strerror(rc));
        return -1;
    }
    return 0;
}

#ifdef KEMBALI_TESTING
void state_test_die_holding_lock(struct state *st, void (*damage)(struct state *st))
{
    pthread_mutex_lock(&st->h->mu);
    if (damage != NULL)
        damage(st);
    _exit(0);
}

/* The first entry in use (or the first free one), for the scribbles. */
static int32_t test_pick(struct state *st, bool used)
{
    for (int32_t i = 0; i < st->txn; i++)
        if ((st->txs[i].used != 0) == used)
            return i;
    return 0;
}

void state_test_damage(struct state *st, enum state_test_damage what)
{
    struct st_hdr *h = st->h;
    struct st_tx *u = &st->txs[test_pick(st, true)], *f = &st->txs[test_pick(st, false)];
    struct st_keyent *k = &st->keys[0];
    switch (what) {
    case STATE_TEST_BUCKET_OOB:
        for (int32_t b = 0; b < st->nb; b++)
            st->buckets[b] = b % 2 ? st->txn + b : -2 - b;
        break;
    case STATE_TEST_CHAIN_LOOP:
        u->next = (int32_t)(u - st->txs);
        break;
    case STATE_TEST_CHAIN_OOB:
        u->next = INT32_MAX;
        break;
    case STATE_TEST_FREE_OOB:
        h->free_head = st->txn;
        break;
    case STATE_TEST_FREE_LOOP:
        f->next = (int32_t)(f - st->txs);
        h->free_head = (int32_t)(f - st->txs);
        break;
    case STATE_TEST_TX_USED:
        h->tx_used = -3;
        break;
    case STATE_TEST_USED_FLAG:
        f->used = 7;
        break;
    case STATE_TEST_ID_NUL:
        memset(u->id, 'A', sizeof u->id);
        break;
    case STATE_TEST_WORD_NUL:
        memset(u->status_word, 'w', sizeof u->status_word);
        break;
    case STATE_TEST_STATUS:
        u->status = 200;
        u->not_found = 9;
        break;
    case STATE_TEST_TIMES:
        u->last_start = INT64_MAX;
        u->not_before = INT64_MAX - 5;
        u->known_until = INT64_MAX;
        u->inflight_until = INT64_MIN;
        u->reads = -4;
        h->host_paused_until = INT64_MAX;
        break;
    case STATE_TEST_REMOTE_TIMES:
        u->remote_until = INT64_MAX;
        u->remote_not_before = INT64_MAX - 3;
        u->remote_why = WAIT_PACE;
        break;
    case STATE_TEST_REMOTE_WAIT:
        u->remote_why = 200;
        break;
    case STATE_TEST_KEY_RING:
        k->ring_head = -1;
        k->ring_n = 100000;
        break;
    case STATE_TEST_KEY_TIMES:
        for (int32_t i = 0; i < STATE_BUDGET_MAX; i++)
            k->ring[i] = INT64_MAX - i;
        k->paused_until = INT64_MAX;
        break;
    case STATE_TEST_KEY_LINKS:
        for (int32_t b = 0; b < st->knb; b++)
            st->key_buckets[b] = b % 2 ? -9 : st->keyn;
        k->next = 0;
        h->key_free_head = INT32_MIN;
        h->key_used = st->keyn + 9;
        break;
    case STATE_TEST_KEY_USED_FLAG:
        for (int32_t i = 0; i < st->keyn; i++)
            if (!st->keys[i].used) {
                st->keys[i].used = 3;
                break;
            }
        break;
    case STATE_TEST_CLIENTS:
        for (int32_t i = 0; i < st->cln; i += 3) {
            st->clients[i].used = (uint8_t)(i % 2 ? 1 : 5);
            st->clients[i].nhits = (uint8_t)(i % 4 ? 200 : 1);
            st->clients[i].id[0] = (uint8_t)i;
            st->clients[i].blocked_until = INT64_MAX;
            st->clients[i].hit_at[0] = INT64_MAX;
        }
        break;
    case STATE_TEST_HEADER:
        h->tx_slots = 1 << 30;
        h->client_slots = 0;
        h->nbuckets = 3;
        h->key_slots = -1;
        h->key_nbuckets = 6;
        memset(h->last_401_shop, 'x', sizeof h->last_401_shop);
        h->serial = 0;
        h->recoveries = -8;
        h->read_timeout_ms = -1;
        h->tx_per_key = 0;
        break;
    }
}
#endif

/* ---- growing the key table ---- */

int st_grow_keys(struct state *st, int32_t key_slots, char *err, size_t errlen)
{
    if (key_slots > STATE_KEY_SLOTS_MAX)
        key_slots = STATE_KEY_SLOTS_MAX;
    if (key_slots <= st->keyn)
        return 0;
    if (st->fd < 0) {
        snprintf(err, errlen, "the state is not a file: its key table cannot grow");
        return -1;
    }
    struct layout l;
    layout_of(st->txn, key_slots, st->cln, &l);
    struct stat sb;
    if (fstat(st->fd, &sb) != 0 || ((size_t)sb.st_size < l.size && ftruncate(st->fd, (off_t)l.size) != 0)) {
        snprintf(err, errlen, "cannot make the state file %zu bytes long for %d key slots: %s", l.size,
                 (int)key_slots, strerror(errno));
        return -1;
    }
    /* Mappings of the old length stay valid in every process: the file
     * only ever grows. */
    uint8_t *body = mmap(NULL, l.size, PROT_READ | PROT_WRITE, MAP_SHARED, st->fd, 0);
    if (body == MAP_FAILED) {
        snprintf(err, errlen, "cannot map the grown state file: %s", strerror(errno));
        return -1;
    }
    int32_t old = st->keyn;
    /* The old bucket heads lie where the new entries go: zeroed as free
     * entries, then every link is rebuilt from the entries (a process
     * dying on the way leaves what st_region_check relinks the same way) */
    struct st_keyent *keys = (struct st_keyent *)(body + l.off_k);
    memset(&keys[old], 0, (size_t)(key_slots - old) * sizeof *keys);
    if (st->body != NULL)
        munmap(st->body, st->body_len);
    st->body = body;
    st->body_len = l.size;
    attach_tables(st, body, &l, st->geom + 1);
    st_key_relink(st);
    struct st_hdr *h = st->h;
    h->key_slots = l.keyn;
    h->key_nbuckets = l.knb;
    h->keys_off = l.off_k;
    h->key_buckets_off = l.off_kb;
    h->size = l.size;
    h->key_growths++;
    __atomic_store_n(&h->geom, st->geom, __ATOMIC_RELEASE); /* whole: the others may map it */
    return 0;
}

int state_grow_keys(struct state *st, int key_slots, char *err, size_t errlen)
{
    if (st->lock_fd >= 0 && flock(st->lock_fd, LOCK_EX) != 0) {
        snprintf(err, errlen, "kembali.lock: %s", strerror(errno));
        return -1;
    }
    int64_t now = util_mono_ms();
    st_lock(st, now);
    int32_t before = st->keyn;
    int rc = st_grow_keys(st, key_slots, err, errlen);
    int32_t after = st->keyn;
    st_unlock(st);
    if (st->lock_fd >= 0)
        flock(st->lock_fd, LOCK_UN);
    if (rc == 0 && after > before) {
        struct log_line ll;
        log_begin(&ll, LOG_LV_INFO, "state");
        log_str(&ll, "msg", "more keys are configured than the state file had key slots: grown, keeping what it holds");
        log_int(&ll, "key_slots", after);
        log_int(&ll, "before", before);
        log_end(&ll);
    }
    return rc;
}

/* ---- creation ---- */

/* Initialise a zeroed region of l->size bytes. */
static int region_init(uint8_t *base, const struct layout *l, const struct state_opts *opts,
                       char *err, size_t errlen)
{
    struct st_hdr *h = (struct st_hdr *)base;
    h->magic = ST_MAGIC;
    h->version = layout_stamp();
    h->size = l->size;
    h->tx_slots = l->txn;
    h->key_slots = l->keyn;
    h->nbuckets = l->nb;
    h->key_nbuckets = l->knb;
    h->client_slots = l->cln;
    h->tx_per_key = l->per_key;
    h->read_timeout_ms = opts->read_timeout_ms > 0 ? opts->read_timeout_ms : STATE_READ_TIMEOUT_MS_DEFAULT;
    h->buckets_off = l->off_b;
    h->txs_off = l->off_t;
    h->key_buckets_off = l->off_kb;
    h->keys_off = l->off_k;
    h->clients_off = l->off_c;
    if (getrandom(h->salt, sizeof h->salt, 0) != (ssize_t)sizeof h->salt) {
        snprintf(err, errlen, "getrandom: %s", strerror(errno));
        return -1;
    }
    if (mutex_init(&h->mu, err, errlen) != 0)
        return -1;
    int32_t *buckets = (int32_t *)(base + l->off_b);
    struct st_tx *txs = (struct st_tx *)(base + l->off_t);
    for (int32_t i = 0; i < l->nb; i++)
        buckets[i] = -1;
    for (int32_t i = 0; i < l->txn; i++)
        txs[i].next = i + 1 < l->txn ? i + 1 : -1;
    h->free_head = 0;
    int32_t *kb = (int32_t *)(base + l->off_kb);
    struct st_keyent *keys = (struct st_keyent *)(base + l->off_k);
    for (int32_t i = 0; i < l->knb; i++)
        kb[i] = -1;
    for (int32_t i = 0; i < l->keyn; i++)
        keys[i].next = i + 1 < l->keyn ? i + 1 : -1;
    h->key_free_head = 0;
    return 0;
}

struct state *state_new(const struct state_opts *opts, char *err, size_t errlen)
{
    struct layout l;
    layout_for(opts, &l);
    struct state *st = calloc(1, sizeof *st);
    uint8_t *base = calloc(1, l.size);
    if (st == NULL || base == NULL || region_init(base, &l, opts, err, errlen) != 0) {
        if (st != NULL && base == NULL)
            snprintf(err, errlen, "cannot allocate %zu bytes of state", l.size);
        free(st);
        free(base);
        return NULL;
    }
    attach(st, base);
    st->greedy = opts->greedy;
    st->users_fd = -1;
    st->layout = opts->layout > 0 ? opts->layout : ST_VERSION;
    return st;
}

/* Is the region at base (len bytes, from a file) one this build can use? */
static bool region_usable(const uint8_t *base, size_t len)
{
    const struct st_hdr *h = (const struct st_hdr *)base;
    struct layout l;
    return len >= sizeof *h && h->magic == ST_MAGIC && h->version == layout_stamp() && hdr_geometry_ok(h, len, &l);
}

int state_check_dir(const char *dir, bool create, char *err, size_t errlen)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        if (errno == ENOENT && create && mkdir(dir, 0700) == 0)
            return 0;
        if (errno == ENOENT && !create) {
            char parent[4096];
            util_copy(parent, sizeof parent, dir);
            char *slash = strrchr(parent, '/');
            if (slash != NULL)
                *(slash == parent ? slash + 1 : slash) = '\0';
            if (slash != NULL && access(parent, W_OK | X_OK) == 0)
                return 0; /* it will be created, 0700 */
        }
        snprintf(err, errlen, "state_dir %s: %s", dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(err, errlen, "state_dir %s is not a directory", dir);
        return -1;
    }
    if (sb.st_uid != geteuid() && sb.st_uid != 0) {
        snprintf(err, errlen, "state_dir %s belongs to another user (uid %u); it must be this user's",
                 dir, (unsigned)sb.st_uid);
        return -1;
    }
    if (sb.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(err, errlen, "state_dir %s can be written by other users (mode %03o); "
                 "chmod go-w it, or use a folder only this user can write", dir, (unsigned)(sb.st_mode & 0777));
        return -1;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(err, errlen, "state_dir %s: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* Create a fresh state file at `path` (via path.new and rename). */
static int create_file(const char *path, const struct layout *l, const struct state_opts *opts,
                       char *err, size_t errlen)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    unlink(tmp); /* left by a process that died while creating it */
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    uint8_t *base = MAP_FAILED;
    int rc = -1;
    if (ftruncate(fd, (off_t)l->size) != 0) {
        snprintf(err, errlen, "%s: cannot size it to %zu bytes: %s", tmp, l->size, strerror(errno));
        goto out;
    }
    base = mmap(NULL, l->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "%s: mmap: %s", tmp, strerror(errno));
        goto out;
    }
    if (region_init(base, l, opts, err, errlen) != 0)
        goto out;
    if (rename(tmp, path) != 0) {
        snprintf(err, errlen, "rename %s: %s", tmp, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (base != MAP_FAILED)
        munmap(base, l->size);
    close(fd);
    if (rc != 0)
        unlink(tmp);
    return rc;
}

/* What state_open() found, logged once it holds no lock. */
struct open_notes {
    bool replaced;          /* an incompatible or damaged file was replaced */
    bool other_size;        /* the file has another tx_slots than asked */
    int32_t keys_before;    /* more key slots asked for than the file had: how many it had (grown) */
    int32_t per_key_wanted; /* joining others, another per-key quota asked for: which (0: none) */
    int32_t per_key;        /* the region's quota */
    bool alone;             /* no other live process used the file */
    bool lock_was_held;     /* alone, yet its lock word said held */
    long leases;            /* alone: reads in flight of dead processes, released */
    struct st_notice n;     /* what the check found */
};

/* Nobody else uses the region (we hold kembali.users exclusively): forget
 * what only a live process could still hold (the lock, its reads in
 * flight) and check every table. What counts is whether a live process
 * uses the file, not the boot: a copy taken while a process held the lock
 * (power cut, VM snapshot, backup) has a lock word that no kernel will
 * ever release, so the mutex is made anew. */
static int region_reset(struct state *st, int64_t now, struct open_notes *on, char *err, size_t errlen)
{
    on->lock_was_held = mutex_word(&st->h->mu) != 0;
    if (mutex_init(&st->h->mu, err, errlen) != 0)
        return -1;
    for (int32_t i = 0; i < st->txn; i++) {
        if (st->txs[i].inflight_until != 0) {
            st->txs[i].inflight_until = 0;
            on->leases++;
        }
        /* nobody holds a request any more: the plan's holds and reservations go */
        st->txs[i].holders = 0;
        st->txs[i].resv_at = 0;
    }
    st_region_check(st, now, true);
    if (on->lock_was_held)
        st->h->stale_locks++;
    return 0;
}

/* Others use the region: it was checked whole when the first of them took
 * it over, and again after any crash under its lock (the only ways it can
 * be damaged), so only its header is checked here, under the lock, waiting
 * at most OPEN_LOCK_MS (it is never held for more than microseconds): an
 * open (a CGI request) must not hold every process up for a whole walk. */
#define OPEN_LOCK_MS 2000
static int region_check_locked(struct state *st, int64_t now, char *err, size_t errlen)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += OPEN_LOCK_MS / 1000;
    int rc = pthread_mutex_timedlock(&st->h->mu, &ts);
    if (rc != 0 && rc != EOWNERDEAD) {
        snprintf(err, errlen, "the state lock has been held for more than %d s by a live kembali process "
                 "(%s); stop every kembali process using this state_dir and start again",
                 OPEN_LOCK_MS / 1000, strerror(rc));
        return -1;
    }
    if (rc == EOWNERDEAD) {
        st->notice.owner_died = true;
        st->h->recoveries++;
    }
    st_region_check(st, now, rc == EOWNERDEAD);
    if (rc == EOWNERDEAD)
        pthread_mutex_consistent(&st->h->mu);
    pthread_mutex_unlock(&st->h->mu);
    return 0;
}

static void open_notes_log(const struct open_notes *on, int32_t slots, int32_t key_slots)
{
    struct log_line ll;
    if (on->replaced)
        log_msg(LOG_LV_WARN, "state", "the state file is damaged or from a build of another layout under the same name; replacing it");
    if (on->other_size) {
        log_begin(&ll, LOG_LV_WARN, "state");
        log_str(&ll, "msg", "the state file was made with another state_slots; "
                            "keeping its size (remove it while no kembali runs to change it)");
        log_int(&ll, "slots", slots);
        log_end(&ll);
    }
    if (on->per_key_wanted > 0) {
        log_begin(&ll, LOG_LV_WARN, "state");
        log_str(&ll, "msg", "other running kembali processes share this state file with another "
                            "state_slots_per_key; theirs applies (one table, one rule) until every process "
                            "has stopped and one starts again");
        log_int(&ll, "state_slots_per_key", on->per_key);
        log_int(&ll, "wanted", on->per_key_wanted);
        log_end(&ll);
    }
    if (on->keys_before > 0) {
        log_begin(&ll, LOG_LV_INFO, "state");
        log_str(&ll, "msg", "more keys are configured than the state file had key slots: grown, keeping what it holds");
        log_int(&ll, "key_slots", key_slots);
        log_int(&ll, "before", on->keys_before);
        log_end(&ll);
    }
    if (on->alone && (on->lock_was_held || on->leases > 0 || notice_any(&on->n))) {
        log_begin(&ll, LOG_LV_WARN, "state");
        log_str(&ll, "msg", on->lock_was_held
                                ? "no live process uses the state file, yet its lock is held (a copy taken while "
                                  "a process held it, or a crashed host): lock and reads in flight reset, tables checked"
                                : "no live process uses the state file: reads in flight of stopped processes "
                                  "released, tables checked");
        log_int(&ll, "lock_was_held", on->lock_was_held);
        log_int(&ll, "leases", on->leases);
        for (int i = 0; i < DMG_N; i++)
            if (on->n.dmg[i] > 0)
                log_int(&ll, dmg_names[i], on->n.dmg[i]);
        log_end(&ll);
    } else if (!on->alone && notice_any(&on->n)) {
        notice_log(&on->n, on->n.owner_died ? "a kembali process died holding the state lock; state checked "
                                              "and repaired"
                                            : "the state file was damaged; repaired");
    }
}

int state_layout(void)
{
    return ST_VERSION;
}

int state_layout_of(const struct state *st)
{
    return st->layout;
}

/* dir/kembali-vN.EXT, or the names of the releases before layouts were
 * named (layout 0): dir/kembali.EXT. -1 when it does not fit. */
static int layout_path(char *out, size_t cap, const char *dir, int layout, const char *ext)
{
    int n = layout > 0 ? snprintf(out, cap, "%s/kembali-v%d.%s", dir, layout, ext)
                       : snprintf(out, cap, "%s/kembali.%s", dir, ext);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* The layout a name in state_dir belongs to: N for kembali-vN.state,
 * kembali-vN.users or kembali-vN.state.new, 0 for kembali.state and
 * kembali.users (the releases before layouts were named), -1 for any other
 * name (kembali.lock is every layout's). */
static int layout_of_name(const char *name)
{
    if (strcmp(name, "kembali.state") == 0 || strcmp(name, "kembali.users") == 0 ||
        strcmp(name, "kembali.state.new") == 0)
        return 0;
    if (strncmp(name, "kembali-v", 9) != 0)
        return -1;
    char *end;
    errno = 0;
    long v = strtol(name + 9, &end, 10);
    if (errno != 0 || end == name + 9 || name[9] < '1' || name[9] > '9' || v <= 0 || v > 1000000 ||
        (strcmp(end, ".state") != 0 && strcmp(end, ".users") != 0 && strcmp(end, ".state.new") != 0))
        return -1;
    return (int)v;
}

#define OTHER_LAYOUTS_MAX 8

/* What the other layouts' files in state_dir are: the ones live processes
 * use (kept), the ones removed. */
struct other_layouts {
    int live[OTHER_LAYOUTS_MAX], nlive;
    int removed[OTHER_LAYOUTS_MAX], nremoved;
};

/* Under kembali.lock (every release since kembali.users takes it before
 * it opens, creates or replaces its file, so none is deciding meanwhile):
 * the files of layouts other than `mine`. A layout whose users file some
 * live process holds (shared, as this one will hold its own) is left
 * alone: that process keeps its cache and pace. The others' files are
 * removed: no live process maps them, and one that starts later makes
 * its own anew. */
static void other_layouts_sweep(const char *dir, int mine, struct other_layouts *ol)
{
    int seen[OTHER_LAYOUTS_MAX * 2], nseen = 0;
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && nseen < (int)(sizeof seen / sizeof seen[0])) {
        int v = layout_of_name(e->d_name);
        bool dup = v < 0 || v == mine;
        for (int i = 0; i < nseen && !dup; i++)
            dup = seen[i] == v;
        if (!dup)
            seen[nseen++] = v;
    }
    closedir(d);
    for (int i = 0; i < nseen; i++) {
        char users[4096], path[4096], tmp[4096];
        if (layout_path(users, sizeof users, dir, seen[i], "users") != 0 ||
            layout_path(path, sizeof path, dir, seen[i], "state") != 0 ||
            layout_path(tmp, sizeof tmp, dir, seen[i], "state.new") != 0)
            continue;
        int fd = open(users, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0) {
            if (ol->nlive < OTHER_LAYOUTS_MAX)
                ol->live[ol->nlive++] = seen[i];
            close(fd);
            continue;
        }
        /* no users file: no process of a release that has one maps it */
        unlink(path);
        unlink(tmp);
        unlink(users);
        if (fd >= 0)
            close(fd);
        if (ol->nremoved < OTHER_LAYOUTS_MAX)
            ol->removed[ol->nremoved++] = seen[i];
    }
}

static void other_layouts_log(const struct other_layouts *ol, int mine)
{
    char list[128];
    struct log_line ll;
    for (int pass = 0; pass < 2; pass++) {
        const int *v = pass == 0 ? ol->live : ol->removed;
        int n = pass == 0 ? ol->nlive : ol->nremoved;
        if (n == 0)
            continue;
        size_t off = 0;
        list[0] = '\0';
        for (int i = 0; i < n && off + 16 < sizeof list; i++)
            off += (size_t)snprintf(list + off, sizeof list - off, "%s%d", i ? "," : "", v[i]);
        log_begin(&ll, pass == 0 ? LOG_LV_WARN : LOG_LV_INFO, "state");
        log_str(&ll, "msg", pass == 0 ? "live kembali processes of another state layout use this state_dir: their "
                                        "state file is kept, this process uses its own, and the two paces and "
                                        "caches are separate until they stop"
                                      : "removed the state files of other layouts, which no live process used");
        log_int(&ll, "layout", mine);
        log_str(&ll, "other_layouts", list);
        log_end(&ll);
    }
}

struct state *state_open(const char *dir, const struct state_opts *opts, char *err, size_t errlen)
{
    char path[4096], lockpath[4096], userspath[4096];
    struct layout l;
    layout_for(opts, &l);
    if (state_check_dir(dir, true, err, errlen) != 0)
        return NULL;
    int mine = opts->layout > 0 ? opts->layout : ST_VERSION;
    /* a path cut short would name another file: refused instead */
    int ln = snprintf(lockpath, sizeof lockpath, "%s/kembali.lock", dir);
    if (layout_path(path, sizeof path, dir, mine, "state") != 0 ||
        layout_path(userspath, sizeof userspath, dir, mine, "users") != 0 || ln < 0 || (size_t)ln >= sizeof lockpath) {
        snprintf(err, errlen, "state_dir %.200s...: the path is too long", dir);
        return NULL;
    }

    /* One process at a time checks, creates, replaces or resets the file,
     * and decides under this lock whether it is alone (below): two
     * processes starting together are ordered by it. */
    int lk = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lk < 0 || flock(lk, LOCK_EX) != 0) {
        snprintf(err, errlen, "%s: %s", lockpath, strerror(errno));
        if (lk >= 0)
            close(lk);
        return NULL;
    }
    /* Every process that maps the file holds a shared flock of
     * kembali.users for as long as it does (the kernel drops it when the
     * process dies, however it dies). Getting it exclusively means that no
     * live process uses the file. */
    struct open_notes on;
    memset(&on, 0, sizeof on);
    int users = open(userspath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (users < 0) {
        snprintf(err, errlen, "%s: %s", userspath, strerror(errno));
        flock(lk, LOCK_UN);
        close(lk);
        return NULL;
    }
    on.alone = flock(users, LOCK_EX | LOCK_NB) == 0;
    struct other_layouts ol;
    memset(&ol, 0, sizeof ol);
    other_layouts_sweep(dir, mine, &ol);
    int64_t now = util_mono_ms();
    struct state *st = NULL;
    uint8_t *base = MAP_FAILED;
    size_t len = 0;
    for (int attempt = 0; attempt < 2 && st == NULL; attempt++) {
        int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0 && errno != ENOENT) {
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            break;
        }
        if (fd >= 0) {
            struct stat sb;
            if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077)) {
                snprintf(err, errlen, "%s must be a regular file of this user with mode 0600 "
                         "(remove it and restart)", path);
                close(fd);
                break;
            }
            len = (size_t)sb.st_size;
            base = len >= sizeof(struct st_hdr)
                       ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
            if (base != MAP_FAILED && region_usable(base, len)) {
                st = calloc(1, sizeof *st);
                if (st == NULL) {
                    snprintf(err, errlen, "out of memory");
                    munmap(base, len);
                    close(fd);
                    break;
                }
                attach(st, base);
                st->mapped = len;
                st->fd = fd; /* kept: a growth makes it longer and maps it anew */
                st->greedy = opts->greedy;
                st->users_fd = users;
                st->layout = mine;
                on.other_size = st->txn != l.txn;
                int rc = on.alone ? region_reset(st, now, &on, err, errlen)
                                  : region_check_locked(st, now, err, errlen);
                /* room for every key this process configures (under
                 * kembali.lock: no other opener reads the header meanwhile) */
                if (rc == 0 && l.keyn > st->keyn) {
                    on.keys_before = st->keyn;
                    st_lock(st, now);
                    rc = st_grow_keys(st, l.keyn, err, errlen);
                    st_unlock(st);
                }
                /* one quota per region: a restart (nobody else uses it) sets
                 * it; a process joining others keeps theirs (see state.h) */
                int32_t want = per_key_for(opts, st->txn);
                if (on.alone)
                    st->h->tx_per_key = want;
                else if (want != __atomic_load_n(&st->h->tx_per_key, __ATOMIC_RELAXED))
                    on.per_key_wanted = want;
                on.per_key = __atomic_load_n(&st->h->tx_per_key, __ATOMIC_RELAXED);
                on.n = st->notice;
                memset(&st->notice, 0, sizeof st->notice);
                if (rc != 0) {
                    st->users_fd = -1;
                    state_free(st);
                    st = NULL;
                }
                break;
            }
            if (base != MAP_FAILED)
                munmap(base, len);
            close(fd);
            base = MAP_FAILED;
            on.replaced = true;
        }
        if (attempt == 0 && create_file(path, &l, opts, err, errlen) != 0)
            break;
    }
    /* from now on a user like any other (a conversion: under kembali.lock,
     * no other process can be deciding whether it is alone meanwhile) */
    if (st != NULL && flock(users, LOCK_SH) != 0) {
        snprintf(err, errlen, "%s: %s", userspath, strerror(errno));
        st->users_fd = -1;
        state_free(st);
        st = NULL;
    }
    flock(lk, LOCK_UN);
    if (st == NULL) {
        close(lk);
        close(users);
    } else {
        st->lock_fd = lk; /* for state_grow_keys */
        open_notes_log(&on, st->txn, st->keyn);
        other_layouts_log(&ol, mine);
    }
    return st;
}

void state_free(struct state *st)
{
    if (st == NULL)
        return;
    if (st->mapped) {
        if (st->body != NULL)
            munmap(st->body, st->body_len);
        munmap(st->h, st->mapped); /* others may still use it: no destroy */
        if (st->fd >= 0)
            close(st->fd);
        if (st->lock_fd >= 0)
            close(st->lock_fd);
    } else {
        pthread_mutex_destroy(&st->h->mu);
        free(st->h);
    }
    if (st->users_fd >= 0)
        close(st->users_fd); /* no longer a user of the file */
    free(st);
}

void state_key_id(const struct state *st, const char *secret, struct state_key *out)
{
    uint8_t salt2[16];
    memcpy(salt2, st->h->salt, 16);
    salt2[0] ^= 0x5a;
    uint64_t a = siphash24(st->h->salt, secret, strlen(secret));
    uint64_t b = siphash24(salt2, secret, strlen(secret));
    memcpy(out->b, &a, 8);
    memcpy(out->b + 8, &b, 8);
}

