/* state.c - see state.h.
 *
 * Layout of the region (all offsets from its start, no pointers inside):
 *   struct st_hdr | int32 buckets[nbuckets] | struct st_tx txs[tx_slots] | struct st_keyent keys[key_slots]
 * Transactions are kept in a chained hash table (bucket heads and `next`
 * are indexes; -1 ends a chain) keyed by SipHash(salt, key id || tx id).
 * When the table is full, an idle entry is evicted: like Redis' approximate
 * LRU, a sample of entries is examined and the least recently used idle one
 * goes. An entry is idle when no read of it is in flight, its episode is
 * over and no Retry-After or pause of its own is running; entries in use are
 * never evicted. */
#include "state.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "plan.h"
#include "util.h"

#define ST_MAGIC 0x696c61626d656bULL /* "kembali" */
#define ST_VERSION 3
#define ST_WAITING_MAX 512    /* transactions one key waits on at once, for the plan */
#define ST_ARRIVALS 64        /* the latest first holds of a key: its arrival rate */
#define ST_PLAN_RETRY_MS 250  /* a read withheld for fairness looks again after this */
#define EVICT_SAMPLE 64

struct st_tx {
    int32_t next;
    uint8_t used;
    uint8_t status;         /* enum tx_status of the last status read */
    uint8_t not_found;      /* known_until is a 404's memory */
    uint8_t unknown_seen;
    int32_t reads;          /* reads started in the current episode */
    struct state_key key;
    char id[STATE_ID_MAX + 1];
    char status_word[STATUS_WORD_MAX + 1];
    int64_t known_until;    /* cache of a final status, or 404 memory */
    int64_t last_start;     /* start of the last read */
    int64_t not_before;     /* Retry-After, stated reset, rejected episode */
    int64_t inflight_until; /* lease of the read in flight; 0 when none */
    uint64_t inflight_serial;
    int64_t last_used;
    /* the budget plan (plan.h) */
    int32_t holders;        /* held requests, over every process */
    int32_t early_reads;    /* reads of this episode other than last-chance ones */
    int64_t hold_until;     /* the latest deadline of a held request */
    int64_t resv_at;        /* its reserved last-chance read may start then; 0: none */
    int64_t episode_start;  /* the first read of this episode */
};

struct st_keyent {
    struct state_key key;
    uint8_t used;
    int64_t paused_until;
    int64_t last_used;
    int32_t ring_head, ring_n;          /* the last STATE_BUDGET_MAX read starts */
    int64_t ring[STATE_BUDGET_MAX];
    /* the budget plan: transactions waiting (indexes into txs, checked on
     * every use), and when the latest ones were first held */
    int32_t nwaiting;
    int32_t waiting[ST_WAITING_MAX];
    int32_t arr_head, arr_n;
    int64_t arrivals[ST_ARRIVALS];
};

struct st_hdr {
    uint64_t magic, version, size;
    pthread_mutex_t mu;
    uint8_t salt[16];
    uint32_t gen;             /* futex word: bumped when a read ends */
    uint32_t pad0;
    uint64_t serial;
    int32_t tx_slots, key_slots, nbuckets, free_head;
    int64_t read_timeout_ms;
    int64_t host_paused_until;
    char last_401_shop[STATE_SHOP_MAX + 1];
    long tx_used, evictions, full, recoveries;
    long last_chance_reads, withheld;
    size_t buckets_off, txs_off, keys_off;
};

struct state {
    bool greedy;              /* this process does not plan (state_opts.greedy) */
    size_t mapped;            /* length of a file mapping; 0 for state_new() memory */
    struct st_hdr *h;
    int32_t *buckets;
    struct st_tx *txs;
    struct st_keyent *keys;
};

/* ---- SipHash-2-4 (Aumasson & Bernstein), for key ids and hashing ---- */

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                          \
    do {                                                                  \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);        \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                            \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                            \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);        \
    } while (0)

uint64_t state_siphash(const uint8_t k[16], const void *data, size_t len)
{
    const uint8_t *in = data;
    uint64_t k0 = le64(k), k1 = le64(k + 8);
    uint64_t v0 = 0x736f6d6570736575ULL ^ k0, v1 = 0x646f72616e646f6dULL ^ k1;
    uint64_t v2 = 0x6c7967656e657261ULL ^ k0, v3 = 0x7465646279746573ULL ^ k1;
    uint64_t b = (uint64_t)len << 56;
    const uint8_t *end = in + len - (len % 8);
    for (; in != end; in += 8) {
        uint64_t m = le64(in);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    for (int i = (int)(len & 7) - 1; i >= 0; i--)
        b |= (uint64_t)in[i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* ---- locking ---- */

static bool valid_id(const char *id)
{
    size_t n = strnlen(id, STATE_ID_MAX + 1);
    if (n == 0 || n > STATE_ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

static uint32_t tx_bucket(struct state *st, const struct state_key *key, const char *id);

/* After a holder died mid-update: rebuild everything derived (hash chains,
 * free list, counters) from the entries themselves, dropping any entry or
 * budget ring that does not read as whole. Leases of the dead process's
 * reads stay and expire on their own. O(slots); runs only after a crash. */
static void st_rebuild(struct state *st)
{
    struct st_hdr *h = st->h;
    for (int32_t i = 0; i < h->nbuckets; i++)
        st->buckets[i] = -1;
    h->free_head = -1;
    h->tx_used = 0;
    for (int32_t i = h->tx_slots - 1; i >= 0; i--) {
        struct st_tx *e = &st->txs[i];
        if (e->used == 1 && valid_id(e->id) && e->status <= TXS_UNKNOWN &&
            strnlen(e->status_word, sizeof e->status_word) < sizeof e->status_word) {
            uint32_t b = tx_bucket(st, &e->key, e->id);
            e->next = st->buckets[b];
            st->buckets[b] = i;
            h->tx_used++;
        } else {
            memset(e, 0, sizeof *e);
            e->next = h->free_head;
            h->free_head = i;
        }
    }
    for (int32_t i = 0; i < h->key_slots; i++) {
        struct st_keyent *k = &st->keys[i];
        if (k->used > 1 || k->ring_head < 0 || k->ring_head >= STATE_BUDGET_MAX || k->ring_n < 0 ||
            k->ring_n > STATE_BUDGET_MAX)
            memset(k, 0, sizeof *k);
        if (k->nwaiting < 0 || k->nwaiting > ST_WAITING_MAX)
            k->nwaiting = 0; /* every entry is checked when used; a bad count is all that can hurt */
        if (k->arr_head < 0 || k->arr_head >= ST_ARRIVALS || k->arr_n < 0 || k->arr_n > ST_ARRIVALS)
            k->arr_head = k->arr_n = 0;
    }
    h->last_401_shop[sizeof h->last_401_shop - 1] = '\0';
    h->recoveries++;
}

static void st_lock(struct state *st)
{
    int rc = pthread_mutex_lock(&st->h->mu);
    if (rc == EOWNERDEAD) {
        /* A process died holding the lock (SIGKILL at any moment). */
        st_rebuild(st);
        pthread_mutex_consistent(&st->h->mu);
        log_msg("warn", "state", "a kembali process died holding the state lock; state checked and rebuilt");
    }
}

static void st_unlock(struct state *st)
{
    pthread_mutex_unlock(&st->h->mu);
}

/* ---- waiting for reads of other processes ---- */

static long futex(uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

static void st_bump(struct state *st)
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

#ifdef KEMBALI_TESTING
void state_test_die_holding_lock(struct state *st, void (*damage)(void *base))
{
    pthread_mutex_lock(&st->h->mu);
    if (damage != NULL)
        damage(st->h);
    _exit(0);
}
#endif

/* ---- creation ---- */

/* The region's geometry for the given options. */
struct layout {
    int32_t txn, keyn, nb;
    size_t off_b, off_t, off_k, size;
};

static void layout_for(const struct state_opts *opts, struct layout *l)
{
    l->txn = opts->tx_slots > 0 ? opts->tx_slots : 16384;
    l->keyn = opts->key_slots > 0 ? opts->key_slots : 256;
    l->nb = 1;
    while (l->nb < l->txn && l->nb < (1 << 28))
        l->nb <<= 1;
    l->off_b = (sizeof(struct st_hdr) + 63) & ~(size_t)63;
    l->off_t = (l->off_b + (size_t)l->nb * sizeof(int32_t) + 63) & ~(size_t)63;
    l->off_k = (l->off_t + (size_t)l->txn * sizeof(struct st_tx) + 63) & ~(size_t)63;
    l->size = l->off_k + (size_t)l->keyn * sizeof(struct st_keyent);
}

/* A fingerprint of this build's data layout: a region written by a build
 * with other structure sizes must not be read. */
static uint64_t layout_stamp(void)
{
    return ((uint64_t)ST_VERSION << 48) ^ ((uint64_t)sizeof(struct st_hdr) << 32) ^
           ((uint64_t)sizeof(struct st_tx) << 16) ^ (uint64_t)sizeof(struct st_keyent) ^
           ((uint64_t)sizeof(pthread_mutex_t) << 40);
}

/* Point st at a region laid out as the header says. */
static void attach(struct state *st, uint8_t *base)
{
    st->h = (struct st_hdr *)base;
    st->buckets = (int32_t *)(base + st->h->buckets_off);
    st->txs = (struct st_tx *)(base + st->h->txs_off);
    st->keys = (struct st_keyent *)(base + st->h->keys_off);
}

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
    h->read_timeout_ms = opts->read_timeout_ms > 0 ? opts->read_timeout_ms : 5000;
    h->buckets_off = l->off_b;
    h->txs_off = l->off_t;
    h->keys_off = l->off_k;
    if (getrandom(h->salt, sizeof h->salt, 0) != (ssize_t)sizeof h->salt) {
        snprintf(err, errlen, "getrandom: %s", strerror(errno));
        return -1;
    }
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    int rc = pthread_mutex_init(&h->mu, &a);
    pthread_mutexattr_destroy(&a);
    if (rc != 0) {
        snprintf(err, errlen, "pthread_mutex_init: %s", strerror(rc));
        return -1;
    }
    int32_t *buckets = (int32_t *)(base + l->off_b);
    struct st_tx *txs = (struct st_tx *)(base + l->off_t);
    for (int32_t i = 0; i < l->nb; i++)
        buckets[i] = -1;
    for (int32_t i = 0; i < l->txn; i++)
        txs[i].next = i + 1 < l->txn ? i + 1 : -1;
    h->free_head = 0;
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
    return st;
}

/* Is the region at base (len bytes, from a file) one this build can use? */
static bool region_usable(const uint8_t *base, size_t len)
{
    const struct st_hdr *h = (const struct st_hdr *)base;
    if (len < sizeof *h || h->magic != ST_MAGIC || h->version != layout_stamp() || h->size != len)
        return false;
    if (h->tx_slots < 1 || h->key_slots < 1 || h->nbuckets < 1 || (h->nbuckets & (h->nbuckets - 1)) != 0)
        return false;
    return h->buckets_off + (size_t)h->nbuckets * sizeof(int32_t) <= h->txs_off &&
           h->txs_off + (size_t)h->tx_slots * sizeof(struct st_tx) <= h->keys_off &&
           h->keys_off + (size_t)h->key_slots * sizeof(struct st_keyent) <= len;
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

struct state *state_open(const char *dir, const struct state_opts *opts, char *err, size_t errlen)
{
    char path[4096], lockpath[4096];
    struct layout l;
    layout_for(opts, &l);
    if (state_check_dir(dir, true, err, errlen) != 0)
        return NULL;
    snprintf(path, sizeof path, "%s/kembali.state", dir);
    snprintf(lockpath, sizeof lockpath, "%s/kembali.lock", dir);

    /* One process at a time checks, creates or replaces the file. */
    int lk = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lk < 0 || flock(lk, LOCK_EX) != 0) {
        snprintf(err, errlen, "%s: %s", lockpath, strerror(errno));
        if (lk >= 0)
            close(lk);
        return NULL;
    }
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
            close(fd);
            if (base != MAP_FAILED && region_usable(base, len)) {
                st = calloc(1, sizeof *st);
                if (st == NULL) {
                    snprintf(err, errlen, "out of memory");
                    break;
                }
                attach(st, base);
                st->mapped = len;
                st->greedy = opts->greedy;
                if ((int32_t)st->h->tx_slots != l.txn) {
                    struct log_line ll;
                    log_begin(&ll, "warn", "state");
                    log_str(&ll, "msg", "the state file was made with another state_slots; "
                                        "keeping its size (remove it while no kembali runs to change it)");
                    log_int(&ll, "slots", st->h->tx_slots);
                    log_end(&ll);
                }
                break;
            }
            if (base != MAP_FAILED)
                munmap(base, len);
            base = MAP_FAILED;
            log_msg("warn", "state", "the state file is from an incompatible version or damaged; replacing it");
        }
        if (attempt == 0 && create_file(path, &l, opts, err, errlen) != 0)
            break;
    }
    flock(lk, LOCK_UN);
    close(lk);
    return st;
}

void state_free(struct state *st)
{
    if (st == NULL)
        return;
    if (st->mapped) {
        munmap(st->h, st->mapped); /* others may still use it: no destroy */
    } else {
        pthread_mutex_destroy(&st->h->mu);
        free(st->h);
    }
    free(st);
}

void state_key_id(const struct state *st, const char *secret, struct state_key *out)
{
    uint8_t salt2[16];
    memcpy(salt2, st->h->salt, 16);
    salt2[0] ^= 0x5a;
    uint64_t a = state_siphash(st->h->salt, secret, strlen(secret));
    uint64_t b = state_siphash(salt2, secret, strlen(secret));
    memcpy(out->b, &a, 8);
    memcpy(out->b + 8, &b, 8);
}

/* ---- tables (callers hold the lock) ---- */

static uint32_t tx_bucket(struct state *st, const struct state_key *key, const char *id)
{
    uint8_t buf[16 + STATE_ID_MAX];
    size_t n = strnlen(id, STATE_ID_MAX);
    memcpy(buf, key->b, 16);
    memcpy(buf + 16, id, n);
    return (uint32_t)(state_siphash(st->h->salt, buf, 16 + n) & (uint64_t)(st->h->nbuckets - 1));
}

static struct st_tx *tx_find(struct state *st, const struct state_key *key, const char *id)
{
    for (int32_t i = st->buckets[tx_bucket(st, key, id)]; i >= 0 && i < st->h->tx_slots; i = st->txs[i].next) {
        struct st_tx *e = &st->txs[i];
        if (e->used && memcmp(e->key.b, key->b, 16) == 0 && strcmp(e->id, id) == 0)
            return e;
    }
    return NULL;
}

static bool tx_idle(const struct st_tx *e, int64_t now)
{
    return e->inflight_until <= now && now - e->last_start > PACE_EPISODE_MS && e->not_before <= now &&
           !(e->holders > 0 && e->hold_until > now);
}

static void tx_unlink(struct state *st, int32_t idx)
{
    struct st_tx *e = &st->txs[idx];
    int32_t *pp = &st->buckets[tx_bucket(st, &e->key, e->id)];
    while (*pp >= 0 && *pp != idx)
        pp = &st->txs[*pp].next;
    if (*pp == idx)
        *pp = e->next;
}

/* Find or create the entry of (key, id); NULL when the table is full of
 * entries in use. */
static struct st_tx *tx_get(struct state *st, const struct state_key *key, const char *id, int64_t now)
{
    struct st_tx *e = tx_find(st, key, id);
    if (e != NULL)
        return e;
    int32_t idx = st->h->free_head;
    if (idx >= 0) {
        st->h->free_head = st->txs[idx].next;
        st->h->tx_used++;
    } else {
        int32_t n = st->h->tx_slots, best = -1;
        int32_t start = (int32_t)util_jitter(n - 1);
        for (int32_t k = 0; k < EVICT_SAMPLE && k < n; k++) {
            int32_t i = (start + k * 97) % n; /* a spread-out sample */
            if (tx_idle(&st->txs[i], now) && (best < 0 || st->txs[i].last_used < st->txs[best].last_used))
                best = i;
        }
        if (best < 0) { /* the sample found nothing: look everywhere once */
            for (int32_t i = 0; i < n; i++)
                if (tx_idle(&st->txs[i], now) && (best < 0 || st->txs[i].last_used < st->txs[best].last_used))
                    best = i;
        }
        if (best < 0) {
            st->h->full++;
            return NULL;
        }
        tx_unlink(st, best);
        st->h->evictions++;
        idx = best;
    }
    e = &st->txs[idx];
    memset(e, 0, sizeof *e);
    e->used = 1;
    e->key = *key;
    util_copy(e->id, sizeof e->id, id);
    uint32_t b = tx_bucket(st, key, id);
    e->next = st->buckets[b];
    st->buckets[b] = idx;
    return e;
}

/* Find or create the key entry; NULL when every slot holds a key in use. */
static struct st_keyent *key_get(struct state *st, const struct state_key *key, int64_t now, bool create)
{
    struct st_keyent *free_slot = NULL, *idle = NULL;
    for (int32_t i = 0; i < st->h->key_slots; i++) {
        struct st_keyent *k = &st->keys[i];
        if (k->used && memcmp(k->key.b, key->b, 16) == 0)
            return k;
        if (!k->used && free_slot == NULL)
            free_slot = k;
        else if (k->used && k->paused_until <= now && now - k->last_used > PACE_EPISODE_MS &&
                 (idle == NULL || k->last_used < idle->last_used))
            idle = k;
    }
    if (!create)
        return NULL;
    struct st_keyent *k = free_slot ? free_slot : idle;
    if (k != NULL) {
        memset(k, 0, sizeof *k);
        k->used = 1;
        k->key = *key;
    }
    return k;
}

/* When may the key read again under `budget` reads per any 60 s span? */
static int64_t budget_next(const struct st_keyent *k, int budget, int64_t now)
{
    if (k == NULL || budget <= 0)
        return now;
    if (budget > STATE_BUDGET_MAX)
        budget = STATE_BUDGET_MAX;
    /* ring entries from newest backwards; the budget-th newest decides */
    if (k->ring_n < budget)
        return now;
    int32_t idx = (k->ring_head - budget + STATE_BUDGET_MAX * 2) % STATE_BUDGET_MAX;
    int64_t t = k->ring[idx] + 60000 + 1;
    return t > now ? t : now;
}

static void budget_push(struct st_keyent *k, int64_t now)
{
    k->ring[k->ring_head] = now;
    k->ring_head = (k->ring_head + 1) % STATE_BUDGET_MAX;
    if (k->ring_n < STATE_BUDGET_MAX)
        k->ring_n++;
}

/* ---- the budget plan (plan.h): who waits, what is reserved ---- */

/* Entry idx of the key's waiting set still waits at `now`. */
static struct st_tx *waiting_tx(struct state *st, const struct st_keyent *k, int32_t idx, int64_t now)
{
    if (idx < 0 || idx >= st->h->tx_slots)
        return NULL;
    struct st_tx *e = &st->txs[idx];
    if (e->used != 1 || memcmp(e->key.b, k->key.b, 16) != 0 || e->holders <= 0 || e->hold_until <= now)
        return NULL;
    if (e->known_until > now && (e->not_found || tx_status_final((enum tx_status)e->status)))
        return NULL; /* answered from the cache from now on */
    return e;
}

static void waiting_add(struct state *st, struct st_keyent *k, int32_t idx, int64_t now)
{
    int32_t w = 0;
    for (int32_t i = 0; i < k->nwaiting && i < ST_WAITING_MAX; i++) {
        if (k->waiting[i] == idx)
            return;
        if (waiting_tx(st, k, k->waiting[i], now) != NULL)
            k->waiting[w++] = k->waiting[i]; /* drop the stale ones on the way */
    }
    k->nwaiting = w;
    if (w < ST_WAITING_MAX)
        k->waiting[k->nwaiting++] = idx;
}

/* The pace alone (and its own windows) let e read now. */
static bool tx_may_read_now(const struct st_tx *e, const struct pace_schedule *sched, int64_t now)
{
    return e->inflight_until <= now && e->not_before <= now && pace_next_read(sched, e->reads, e->last_start, now) <= now;
}

/* The times the key's budget spans hold (reads of the last 60 s and the
 * reservations of waiting transactions, an overdue one at `now`), sorted,
 * into ev (capacity STATE_BUDGET_MAX + ST_WAITING_MAX). Returns how many. */
static int plan_events(struct state *st, const struct st_keyent *k, int64_t now, int64_t *ev)
{
    int n = 0;
    for (int32_t i = k->ring_n - 1; i >= 0; i--) { /* oldest first */
        int64_t t = k->ring[(k->ring_head - 1 - i + STATE_BUDGET_MAX * 2) % STATE_BUDGET_MAX];
        if (t > now - PLAN_BUDGET_SPAN_MS)
            ev[n++] = t;
    }
    int reads = n;
    for (int32_t i = 0; i < k->nwaiting && i < ST_WAITING_MAX; i++) {
        const struct st_tx *e = waiting_tx(st, k, k->waiting[i], now);
        if (e == NULL || e->resv_at == 0)
            continue;
        int64_t t = e->resv_at > now ? e->resv_at : now;
        int at = n++; /* insertion sort of the reservations: few, and reads are sorted */
        while (at > reads && ev[at - 1] > t) {
            ev[at] = ev[at - 1];
            at--;
        }
        ev[at] = t;
    }
    /* merge: reads are older than any reservation unless a reservation is overdue (at now) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && ev[j] < ev[j - 1]; j--) {
            int64_t x = ev[j];
            ev[j] = ev[j - 1];
            ev[j - 1] = x;
        }
    return n;
}

/* Reads e's schedule still wants from `now` to its latest deadline (one,
 * for a transaction not held: the read asked for). */
static int tx_demand(const struct st_tx *e, const struct pace_schedule *sched, int64_t now)
{
    if (e == NULL || e->holders <= 0 || e->hold_until <= now)
        return 1;
    int reads = pace_in_episode(e->reads, e->last_start, now) ? e->reads : 0;
    int64_t t = reads > 0 ? pace_next_read(sched, reads, e->last_start, now) : now;
    if (t < now)
        t = now;
    int n = 0;
    while (t <= e->hold_until && n < 64) {
        n++;
        int step = reads + n < sched->n ? reads + n : sched->n - 1;
        t += sched->wait_ms[step] > PACE_MIN_WAIT_MS ? sched->wait_ms[step] : PACE_MIN_WAIT_MS;
    }
    return n;
}

/* The plan's view of key k for transaction self (NULL: not tracked yet). */
static void plan_gather(struct state *st, const struct st_keyent *k, const struct st_tx *self,
                        const struct pace_schedule *sched, int budget, int64_t now, struct plan_key *pk,
                        int64_t *arrivals_change, int64_t *ev, int *nev)
{
    memset(pk, 0, sizeof *pk);
    pk->budget = budget > STATE_BUDGET_MAX ? STATE_BUDGET_MAX : budget;
    pk->hold_ms = pace_hold_ms(sched);
    pk->eligible = 1; /* the one asking */
    int64_t *oldest_arrival = arrivals_change;
    *oldest_arrival = INT64_MAX;
    for (int32_t i = 0; i < k->arr_n; i++) {
        int64_t t = k->arrivals[(k->arr_head - 1 - i + ST_ARRIVALS * 2) % ST_ARRIVALS];
        if (t <= now - PLAN_RATE_LONG_MS)
            break;
        /* when the oldest arrival that counts leaves its span, the headroom shrinks */
        int64_t leaves = t + PLAN_RATE_LONG_MS + 1;
        pk->arrivals_long++;
        if (t > now - PLAN_RATE_MS) {
            pk->arrivals++;
            leaves = t + PLAN_RATE_MS + 1;
        }
        if (leaves < *oldest_arrival)
            *oldest_arrival = leaves;
    }
    pk->demand = tx_demand(self, sched, now);
    for (int32_t i = 0; i < k->nwaiting && i < ST_WAITING_MAX; i++) {
        const struct st_tx *e = waiting_tx(st, k, k->waiting[i], now);
        if (e == NULL || e == self)
            continue;
        if (e->inflight_until <= now)
            pk->demand += tx_demand(e, sched, now);
        if (tx_may_read_now(e, sched, now)) {
            pk->eligible++;
            if (e->early_reads == 0)
                pk->starved = true;
        }
    }
    *nev = plan_events(st, k, now, ev);
    for (int i = 0; i < *nev && ev[i] <= now; i++)
        pk->recent += ev[i] > now - PLAN_BUDGET_SPAN_MS; /* reads (and overdue reservations) */
    pk->busiest = plan_busiest(ev, *nev, now, INT64_MIN);
    pk->busiest_late = plan_busiest(ev, *nev, now, now - plan_late_span(pk));
}

/* The plan's verdict on a read of e now (the pace allowing one); on
 * PLAN_NO, *retry is when it may change. */
static enum plan_read plan_verdict(struct state *st, const struct st_tx *e, const struct st_keyent *k,
                                   const struct pace_schedule *sched, int budget, int64_t now, int64_t *retry)
{
    struct plan_key pk;
    int64_t oldest, ev[STATE_BUDGET_MAX + ST_WAITING_MAX];
    int nev;
    plan_gather(st, k, e, sched, budget, now, &pk, &oldest, ev, &nev);
    struct plan_tx pt = {0};
    if (e != NULL && waiting_tx(st, k, (int32_t)(e - st->txs), now) != NULL) {
        pt.reserved = e->resv_at != 0;
        pt.resv_at = e->resv_at;
    }
    int reads = e != NULL && pace_in_episode(e->reads, e->last_start, now) ? e->reads : 0;
    if (reads > 0)
        pt.early_reads = e->early_reads;
    pt.next_gap = pace_next_read(sched, reads + 1, now, now + 1) - now; /* the wait after this read */
    if (reads > 0) { /* where the schedule would have put its last read */
        int64_t due = e->episode_start;
        for (int i = 1; i < reads; i++)
            due += sched->wait_ms[i < sched->n ? i : sched->n - 1];
        pt.drifted = e->last_start > due + PLAN_DRIFT_MS;
    }
    enum plan_read r = plan_may_read(&pk, &pt, now);
    if (r != PLAN_NO)
        return r;
    /* what can change it: a read leaving the spans, the rush ending, its
     * own reservation's time, or another's turn */
    int64_t t = now + ST_PLAN_RETRY_MS;
    if (nev > 0 && ev[0] + PLAN_BUDGET_SPAN_MS + 1 < t)
        t = ev[0] + PLAN_BUDGET_SPAN_MS + 1;
    if (pt.reserved && pt.resv_at < t)
        t = pt.resv_at;
    if (oldest < t)
        t = oldest; /* the rush may have thinned by then */
    *retry = t > now ? t : now + 1;
    return PLAN_NO;
}

/* May e (waiting) reserve a last-chance read at `at`? */
static bool plan_reserve_at(struct state *st, const struct st_tx *e, const struct st_keyent *k,
                            const struct pace_schedule *sched, int budget, int64_t at, int64_t now)
{
    struct plan_key pk;
    int64_t oldest, ev[STATE_BUDGET_MAX + ST_WAITING_MAX];
    int nev;
    plan_gather(st, k, e, sched, budget, now, &pk, &oldest, ev, &nev);
    return plan_may_reserve(&pk, plan_busiest(ev, nev, at, INT64_MIN));
}

static void raise_to(int64_t *next, enum state_wait *why, int64_t t, enum state_wait reason)
{
    if (t > *next) {
        *next = t;
        *why = reason;
    }
}

/* The fact about e (NULL: untracked) of key k (NULL: unused) at `now`;
 * *kind (may be NULL) says what a read started now would be. */
static void compute(struct state *st, struct st_tx *e, struct st_keyent *k, const struct pace_schedule *sched,
                    int budget, int64_t now, struct state_fact *f, enum plan_read *kind)
{
    if (kind != NULL)
        *kind = PLAN_EARLY;
    memset(f, 0, sizeof *f);
    f->status = TXS_NONE;
    util_copy(f->status_word, sizeof f->status_word, "unknown");
    f->next_read = now;
    if (e != NULL) {
        f->status = (enum tx_status)e->status;
        if (e->status != TXS_NONE)
            util_copy(f->status_word, sizeof f->status_word, e->status_word);
        if (e->known_until > now) {
            f->known_until = e->known_until;
            if (e->not_found)
                f->not_found = true;
            else if (tx_status_final((enum tx_status)e->status))
                f->final = true;
        }
        if (e->inflight_until > now) {
            f->in_flight = true;
            f->in_flight_until = e->inflight_until;
        }
        raise_to(&f->next_read, &f->wait, pace_next_read(sched, e->reads, e->last_start, now), WAIT_PACE);
        raise_to(&f->next_read, &f->wait, e->not_before, WAIT_RETRY);
    }
    if (k != NULL) {
        raise_to(&f->next_read, &f->wait, k->paused_until, WAIT_KEY_PAUSE);
        raise_to(&f->next_read, &f->wait, budget_next(k, budget, now), WAIT_BUDGET);
    }
    raise_to(&f->next_read, &f->wait, st->h->host_paused_until, WAIT_HOST_PAUSE);
    if (f->not_found)
        raise_to(&f->next_read, &f->wait, f->known_until, WAIT_RETRY);
    /* everything else allows a read now: does the budget's plan? */
    if (!st->greedy && k != NULL && !f->final && !f->not_found && !f->in_flight && f->next_read <= now) {
        int64_t retry;
        enum plan_read r = plan_verdict(st, e, k, sched, budget, now, &retry);
        if (r == PLAN_NO)
            raise_to(&f->next_read, &f->wait, retry, WAIT_BUDGET);
        if (kind != NULL)
            *kind = r;
    }
}

void state_lookup(struct state *st, const struct state_key *key, const char *id,
                  const struct pace_schedule *sched, int budget, int64_t now, struct state_fact *out)
{
    st_lock(st);
    compute(st, tx_find(st, key, id), key_get(st, key, now, false), sched, budget, now, out, NULL);
    st_unlock(st);
}

bool state_claim(struct state *st, const struct state_key *key, const char *id,
                 const struct pace_schedule *sched, int budget, int64_t now,
                 struct state_ticket *ticket, struct state_fact *out)
{
    bool claimed = false;
    if (strlen(id) > STATE_ID_MAX) { /* callers validate ids; never track a longer one */
        memset(out, 0, sizeof *out);
        out->wait = WAIT_FULL;
        out->next_read = now + 1000;
        return false;
    }
    st_lock(st);
    struct st_tx *e = tx_find(st, key, id);
    struct st_keyent *k = key_get(st, key, now, false);
    enum plan_read kind;
    compute(st, e, k, sched, budget, now, out, &kind);
    if (out->final || out->not_found || out->in_flight || out->next_read > now)
        goto done;
    if (e == NULL)
        e = tx_get(st, key, id, now);
    if (k == NULL)
        k = key_get(st, key, now, true);
    if (e == NULL || k == NULL) {
        out->wait = WAIT_FULL;
        out->next_read = now + 1000;
        goto done;
    }
    if (!pace_in_episode(e->reads, e->last_start, now))
        e->reads = e->early_reads = 0;
    if (e->reads == 0)
        e->episode_start = now;
    e->reads++;
    if (kind == PLAN_LAST_CHANCE) {
        st->h->last_chance_reads++;
        e->resv_at = 0;
    } else {
        e->early_reads++;
    }
    e->last_start = now;
    e->last_used = now;
    e->inflight_until = now + st->h->read_timeout_ms + 1000;
    e->inflight_serial = ++st->h->serial;
    k->last_used = now;
    budget_push(k, now);
    /* requests held later than the one a last-chance read was for keep a
     * chance too (counted after this read) */
    if (kind == PLAN_LAST_CHANCE && e->holders > 0 && e->hold_until - PLAN_LEAD_MS >= now + PACE_MIN_WAIT_MS &&
        plan_reserve_at(st, e, k, sched, budget, e->hold_until - PLAN_LEAD_MS, now))
        e->resv_at = e->hold_until - PLAN_LEAD_MS;
    ticket->key = *key;
    util_copy(ticket->id, sizeof ticket->id, id);
    ticket->serial = e->inflight_serial;
    ticket->started = now;
    ticket->sent = 0;
    out->in_flight = true;
    out->in_flight_until = e->inflight_until;
    claimed = true;
done:
    st_unlock(st);
    return claimed;
}

static void pause_until(int64_t *until, int64_t t)
{
    if (t > *until)
        *until = t;
}

/* A final status that is answered without reading (its cache runs). */
static bool final_cached(const struct st_tx *e, int64_t now)
{
    return !e->not_found && e->known_until > now && tx_status_final((enum tx_status)e->status);
}

/* May status s replace what e records? What is known never moves
 * backwards (see state_tell in state.h): from a final status only to the
 * same one (its cache restarts) or, from expired, to another final one. A
 * read's answer is Kasera's word at the time: once the final status's
 * cache has run out, it replaces it; a told one never replaces a final
 * status, cached or not. */
static bool status_may_replace(const struct st_tx *e, enum tx_status s, bool told, int64_t now)
{
    enum tx_status cur = (enum tx_status)e->status;
    if (!tx_status_final(cur) || (!told && !final_cached(e, now)))
        return true;
    if (s == cur)
        return true;
    if (!tx_status_final(s))
        return false;
    return cur == TXS_EXPIRED;
}

/* Record status s (as Kasera wrote it: word) as the last known one, with
 * its cache; forgets a remembered 404. */
static void status_record(struct st_tx *e, enum tx_status s, const char *word, int64_t now)
{
    e->status = (uint8_t)s;
    util_copy(e->status_word, sizeof e->status_word, word);
    e->not_found = 0;
    if (s == TXS_EXPIRED)
        e->known_until = now + STATE_TTL_EXPIRED_MS;
    else if (tx_status_final(s))
        e->known_until = now + STATE_TTL_FINAL_MS;
    else
        e->known_until = 0;
}

void state_finish(struct state *st, const struct state_ticket *t, const char *shop_id,
                  const struct outcome *oc, int64_t now, struct state_report *report)
{
    memset(report, 0, sizeof *report);
    st_lock(st);
    struct st_tx *e = tx_find(st, &t->key, t->id);
    struct st_keyent *k = key_get(st, &t->key, now, true);
    if (e != NULL) {
        if (e->inflight_serial == t->serial) {
            e->inflight_until = 0;
            /* Kasera's window runs from the request's arrival, which a
             * new connection (TCP, TLS) delays after the claim: the pace
             * counts from when the request went out */
            if (t->sent > e->last_start && t->sent <= now)
                e->last_start = t->sent;
        }
        e->last_used = now;
    }
    switch (oc->kind) {
    case OUT_STATUS:
        if (e == NULL)
            break;
        if (status_may_replace(e, oc->status, false, now))
            status_record(e, oc->status, oc->status_word, now);
        if (oc->status == TXS_UNKNOWN && !e->unknown_seen) {
            e->unknown_seen = 1;
            report->first_unknown = true;
        }
        break;
    case OUT_NOT_FOUND:
        /* a late 404 cannot hide a cached final status */
        if (e != NULL && !final_cached(e, now)) {
            e->not_found = 1;
            e->known_until = now + STATE_TTL_NOT_FOUND_MS;
        }
        break;
    case OUT_TX_LIMITED:
        if (e != NULL)
            pause_until(&e->not_before, now + (oc->retry_after_ms > 0 ? oc->retry_after_ms : 1000));
        break;
    case OUT_KEY_LIMITED:
        if (k != NULL) {
            report->key_paused = k->paused_until <= now;
            pause_until(&k->paused_until, now + STATE_KEY_PAUSE_MS + util_jitter(STATE_KEY_PAUSE_MS / 10));
        }
        break;
    case OUT_UNAUTHORIZED:
        if (k != NULL) {
            report->key_paused = k->paused_until <= now;
            pause_until(&k->paused_until, now + STATE_UNAUTH_PAUSE_MS);
        }
        util_copy(st->h->last_401_shop, sizeof st->h->last_401_shop, shop_id);
        break;
    case OUT_AUTH_BLOCKED: {
        int64_t wait = STATE_HOST_PAUSE_MS + util_jitter(STATE_HOST_PAUSE_MS / 10);
        if (oc->retry_after_ms > wait)
            wait = oc->retry_after_ms;
        report->host_paused = st->h->host_paused_until <= now;
        pause_until(&st->h->host_paused_until, now + wait);
        break;
    }
    case OUT_REJECTED:
        if (e != NULL) /* no further read until the episode ends */
            pause_until(&e->not_before, e->last_start + PACE_EPISODE_MS + 1);
        break;
    case OUT_NO_ANSWER:
        break;
    }
    /* A stated exhausted window: honoured for what it describes. */
    if (oc->rl.scope == RL_TX && e != NULL)
        pause_until(&e->not_before, now + oc->rl.reset_ms);
    else if (oc->rl.scope == RL_KEY && k != NULL)
        pause_until(&k->paused_until, now + oc->rl.reset_ms);
    util_copy(report->last_401_shop, sizeof report->last_401_shop, st->h->last_401_shop);
    st_unlock(st);
    st_bump(st); /* wake waiters in every process */
}

enum state_told state_tell(struct state *st, const struct state_key *key, const char *id,
                           enum tx_status status, const char *word, int64_t now)
{
    if (!valid_id(id) || status == TXS_NONE || status == TXS_UNKNOWN || word == NULL ||
        strlen(word) > STATUS_WORD_MAX)
        return STATE_TOLD_BAD;
    enum state_told done = STATE_TOLD_RECORDED;
    st_lock(st);
    struct st_tx *e = tx_get(st, key, id, now);
    if (e == NULL) {
        done = STATE_TOLD_FULL;
    } else {
        e->last_used = now;
        if (status_may_replace(e, status, true, now)) {
            status_record(e, status, word, now);
        } else {
            done = STATE_TOLD_KEPT;
            if (e->not_found) { /* the shop knows it: no 404 stands (a kept status is final) */
                e->not_found = 0;
                e->known_until = 0;
            }
        }
    }
    st_unlock(st);
    if (done == STATE_TOLD_RECORDED)
        st_bump(st); /* wake the requests held for it in every process */
    return done;
}

bool state_hold(struct state *st, const struct state_key *key, const char *id,
                const struct pace_schedule *sched, int budget, int64_t deadline, int64_t now)
{
    if (strlen(id) > STATE_ID_MAX)
        return false;
    st_lock(st);
    struct st_tx *e = tx_get(st, key, id, now);
    struct st_keyent *k = e != NULL ? key_get(st, key, now, true) : NULL;
    if (e != NULL && k != NULL) {
        e->last_used = k->last_used = now;
        bool fresh = e->holders <= 0 || e->hold_until <= now;
        if (fresh) {
            e->holders = 0;
            e->resv_at = 0;
            e->hold_until = 0;
        }
        e->holders++;
        if (deadline > e->hold_until)
            e->hold_until = deadline;
        if (fresh && waiting_tx(st, k, (int32_t)(e - st->txs), now) != NULL) {
            waiting_add(st, k, (int32_t)(e - st->txs), now);
            k->arrivals[k->arr_head] = now;
            k->arr_head = (k->arr_head + 1) % ST_ARRIVALS;
            if (k->arr_n < ST_ARRIVALS)
                k->arr_n++;
            if (!st->greedy && deadline - PLAN_LEAD_MS > now &&
                plan_reserve_at(st, e, k, sched, budget, deadline - PLAN_LEAD_MS, now))
                e->resv_at = deadline - PLAN_LEAD_MS;
        }
    }
    st_unlock(st);
    return e != NULL && k != NULL;
}

void state_unhold(struct state *st, const struct state_key *key, const char *id, int64_t now)
{
    (void)now;
    st_lock(st);
    struct st_tx *e = tx_find(st, key, id);
    if (e != NULL && e->holders > 0 && --e->holders == 0)
        e->resv_at = 0; /* nobody left to use it */
    st_unlock(st);
}

void state_metrics(struct state *st, struct state_metrics *out)
{
    st_lock(st);
    out->tx_used = st->h->tx_used;
    out->tx_slots = st->h->tx_slots;
    out->evictions = st->h->evictions;
    out->full = st->h->full;
    out->recoveries = st->h->recoveries;
    out->last_chance_reads = st->h->last_chance_reads;
    out->reserved = 0;
    int64_t now = util_mono_ms();
    for (int32_t i = 0; i < st->h->key_slots; i++) {
        const struct st_keyent *k = &st->keys[i];
        for (int32_t j = 0; k->used && j < k->nwaiting && j < ST_WAITING_MAX; j++) {
            const struct st_tx *e = waiting_tx(st, k, k->waiting[j], now);
            out->reserved += e != NULL && e->resv_at != 0;
        }
    }
    st_unlock(st);
}
