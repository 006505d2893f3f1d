/* hostreg.h - the host registry: which tenant (a file of shops_dir) holds
 * which host (docs/tenants.md, "Who holds a host": a host belongs to the shop that held
 * it first).
 *
 * The registry is the one place that says who holds a host. It lives in
 * state_dir as the small text file `kembali.hosts` (a header line, then one
 * "HOST SHOP" line per held host, sorted), replaced atomically (a temporary
 * file, fsync, rename, fsync of the folder), so a reader always sees a
 * whole version. Every process that decides (a start, a SIGHUP) takes an
 * exclusive flock on `kembali.hosts.lock` from reading the registry to
 * writing the new one, so each decision starts from the last one written
 * and no process's write drops another's fresh claims.
 *
 * hostreg.c holds the value and the pure decision (hostreg_decide);
 * hostreg_file.c the file and its lock. */
#ifndef KEMBALI_HOSTREG_H
#define KEMBALI_HOSTREG_H

#include <stdbool.h>
#include <stddef.h>

#define HOSTREG_FILE "kembali.hosts"
#define HOSTREG_LOCK "kembali.hosts.lock"
#define HOSTREG_HEADER "# kembali host registry 1: HOST SHOP, one held host a line"
#define HOSTREG_MAX_BYTES (16 * 1024 * 1024) /* a larger file is refused as damaged */
#define HOSTREG_LOCK_WAIT_MS 5000  /* the longest wait for another process's lock */
#define HOSTREG_LOCK_STEP_MS 10    /* how often it is tried meanwhile */

/* One held host. */
struct hostreg_entry {
    char *host;   /* normalised as the configuration keeps hosts */
    char *shop;   /* the tenant's NAME (shops_dir/NAME.json) */
};

/* A set of held hosts: sorted by host, each host once. {NULL, 0} is the
 * empty registry. */
struct hostreg {
    struct hostreg_entry *e;
    size_t n;
};

/* Free what r holds and make it empty. Can't fail. */
void hostreg_free(struct hostreg *r);

/* The shop holding `host` in r, or NULL. Can't fail. */
const char *hostreg_holder(const struct hostreg *r, const char *host);

/* Record that `shop` holds `host` in r (replacing any holder it had).
 * 0, or -1 when out of memory (r unchanged). */
int hostreg_put(struct hostreg *r, const char *host, const char *shop);

/* Do a and b hold the same hosts for the same shops? Can't fail. */
bool hostreg_equal(const struct hostreg *a, const struct hostreg *b);

/* Parse a registry file's bytes (buf, len) into *out (empty before). 0, or
 * -1 with the reason ("line N: ...") in why, out left empty; a file that
 * is not a registry (header, a line without two words, a host twice) is
 * refused rather than guessed at. Out of memory is a reason too. */
int hostreg_parse(const char *buf, size_t len, struct hostreg *out, char *why, size_t whylen);

/* The registry's file text (header and lines), malloc'd, its length in
 * *len; NULL when out of memory. */
char *hostreg_format(const struct hostreg *r, size_t *len);

/* ---- the decision (pure) ---- */

/* One file of shops_dir as the decision sees it. The caller fills the
 * first five fields; hostreg_decide fills `wins`. */
struct hostreg_file {
    const char *shop;            /* NAME; files sorted by it, each once */
    const char *const *hosts;    /* the hosts it lists: the version that loaded, else what the
                                  * broken file could be read to list (maybe none) */
    int nhosts;
    bool loads;                  /* its version loaded: its list decides what it keeps */
    bool refused;                /* refused for another reason (another shop's id, key or notify
                                  * secret): it does not serve, as if broken */
    bool wins;                   /* out: it serves this version (loads, not refused, every host it
                                  * lists is its own) */
};

/* Who got a host it lists (one per host a file lists but does not hold
 * after the decision). */
enum hostreg_clash_kind {
    HOSTREG_MAIN,                /* a shop of the main configuration lists it */
    HOSTREG_HELD,                /* another file holds it */
    HOSTREG_BOTH                 /* nobody held it and another file claims it too: neither gets it */
};

struct hostreg_clash {
    size_t file;                 /* index of the file that lists the host */
    const char *host;
    enum hostreg_clash_kind kind;
    long other;                  /* HELD, BOTH: the other file's index; MAIN: -1 */
};

/* Decide who holds each host (docs/tenants.md), given `held` (the
 * registry as last written, with what the previous configuration served
 * added for hosts it does not name), the hosts the main configuration's
 * shops list (main, nmain; theirs whatever anybody claims), and the files
 * now in shops_dir (f, nf, sorted by shop):
 *
 * - a file keeps a host it holds while the file exists, unless its
 *   version loads, wins and no longer lists the host (a broken, refused or
 *   colliding file never frees a host); a removed file's hosts are free;
 * - a free host listed by exactly one file (loaded or not) goes to it; by
 *   two or more, to none of them;
 * - a loaded file wins when it is not refused and holds every host it
 *   lists. A file that does not win keeps its hosts, which may make
 *   another file lose in turn: this is repeated until nothing changes.
 *
 * Writes the new registry into *out (empty before; only files' hosts, never
 * the main configuration's), each f[i].wins, and into clash (capacity: the
 * sum of f[i].nhosts) one entry per host a file lists and does not hold,
 * *nclash their number. 0, or -1 when out of memory (out empty). */
int hostreg_decide(const struct hostreg *held, const char *const *main, size_t nmain, struct hostreg_file *f,
                   size_t nf, struct hostreg *out, struct hostreg_clash *clash, size_t *nclash);

/* ---- hostreg_file.c: the registry in state_dir ---- */

/* Take the registry's lock (flock LOCK_EX on dir/kembali.hosts.lock, made
 * 0600 when missing; dir made 0700 when missing), waiting up to
 * HOSTREG_LOCK_WAIT_MS for another process that holds it (a process
 * stopped while holding it must not block every other one for good; the
 * caller's load then fails and the old configuration keeps serving).
 * Returns the lock's descriptor, or -1 with the reason in why. */
int hostreg_lock(const char *dir, char *why, size_t whylen);

/* Release the lock taken by hostreg_lock (closes fd; -1 is ignored). */
void hostreg_unlock(int fd);

/* Read dir/kembali.hosts into *out (empty before). A missing file or
 * folder is the empty registry. 0, or -1 with the reason in why (out
 * empty). */
int hostreg_load(const char *dir, struct hostreg *out, char *why, size_t whylen);

/* Replace dir/kembali.hosts with r atomically (kembali.hosts.new written,
 * fsync'd, renamed over it, the folder fsync'd). Call with the lock held.
 * 0, or -1 with the reason in why (the old file is left as it was). */
int hostreg_save(const char *dir, const struct hostreg *r, char *why, size_t whylen);

#endif
