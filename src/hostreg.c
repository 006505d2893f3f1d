/* hostreg.c - the host registry's value and the decision of who holds
 * which host. Pure: no I/O, no clock. See hostreg.h. */
#include "hostreg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OWN_NONE (-1L)   /* nobody holds or claims the host */
#define OWN_MAIN (-2L)   /* a shop of the main configuration */
#define OWN_BOTH (-3L)   /* free, and claimed by two files or more */

void hostreg_free(struct hostreg *r)
{
    for (size_t i = 0; i < r->n; i++) {
        free(r->e[i].host);
        free(r->e[i].shop);
    }
    free(r->e);
    r->e = NULL;
    r->n = 0;
}

/* The index of host in r, or where it would go (*found false). */
static size_t find(const struct hostreg *r, const char *host, bool *found)
{
    size_t lo = 0, hi = r->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int d = strcmp(r->e[mid].host, host);
        if (d == 0) {
            *found = true;
            return mid;
        }
        if (d < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

const char *hostreg_holder(const struct hostreg *r, const char *host)
{
    bool found;
    size_t i = find(r, host, &found);
    return found ? r->e[i].shop : NULL;
}

int hostreg_put(struct hostreg *r, const char *host, const char *shop)
{
    bool found;
    size_t i = find(r, host, &found);
    char *s = strdup(shop);
    if (s == NULL)
        return -1;
    if (found) {
        free(r->e[i].shop);
        r->e[i].shop = s;
        return 0;
    }
    char *h = strdup(host);
    struct hostreg_entry *arr = h ? realloc(r->e, sizeof *arr * (r->n + 1)) : NULL;
    if (arr == NULL) {
        free(h);
        free(s);
        return -1;
    }
    r->e = arr;
    memmove(&arr[i + 1], &arr[i], sizeof *arr * (r->n - i));
    arr[i] = (struct hostreg_entry){h, s};
    r->n++;
    return 0;
}

bool hostreg_equal(const struct hostreg *a, const struct hostreg *b)
{
    if (a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->e[i].host, b->e[i].host) != 0 || strcmp(a->e[i].shop, b->e[i].shop) != 0)
            return false;
    return true;
}

/* A word of a registry line: printable ASCII without spaces, 1..253 bytes. */
static bool word_ok(const char *w, size_t n)
{
    if (n == 0 || n > 253)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)w[i] <= ' ' || (unsigned char)w[i] >= 0x7f)
            return false;
    return true;
}

int hostreg_parse(const char *buf, size_t len, struct hostreg *out, char *why, size_t whylen)
{
    size_t hl = strlen(HOSTREG_HEADER);
    if (len < hl + 1 || memcmp(buf, HOSTREG_HEADER, hl) != 0 || buf[hl] != '\n') {
        snprintf(why, whylen, "line 1: not a kembali host registry (its first line must be \"%s\")", HOSTREG_HEADER);
        return -1;
    }
    size_t at = hl + 1;
    for (int line = 2; at < len; line++) {
        const char *nl = memchr(buf + at, '\n', len - at);
        if (nl == NULL) {
            snprintf(why, whylen, "line %d: cut short (no end of line): a damaged file", line);
            goto fail;
        }
        const char *l = buf + at, *sp = memchr(l, ' ', (size_t)(nl - l));
        at = (size_t)(nl - buf) + 1;
        if (sp == NULL || !word_ok(l, (size_t)(sp - l)) || !word_ok(sp + 1, (size_t)(nl - sp - 1))) {
            snprintf(why, whylen, "line %d: not \"HOST SHOP\"", line);
            goto fail;
        }
        char host[254], shop[254];
        memcpy(host, l, (size_t)(sp - l));
        host[sp - l] = '\0';
        memcpy(shop, sp + 1, (size_t)(nl - sp - 1));
        shop[nl - sp - 1] = '\0';
        if (hostreg_holder(out, host) != NULL) {
            snprintf(why, whylen, "line %d: the host %s is held twice", line, host);
            goto fail;
        }
        if (hostreg_put(out, host, shop) != 0) {
            snprintf(why, whylen, "out of memory");
            goto fail;
        }
    }
    return 0;
fail:
    hostreg_free(out);
    return -1;
}

char *hostreg_format(const struct hostreg *r, size_t *len)
{
    size_t n = strlen(HOSTREG_HEADER) + 2;
    for (size_t i = 0; i < r->n; i++)
        n += strlen(r->e[i].host) + strlen(r->e[i].shop) + 2;
    char *buf = malloc(n);
    if (buf == NULL)
        return NULL;
    size_t at = (size_t)snprintf(buf, n, "%s\n", HOSTREG_HEADER);
    for (size_t i = 0; i < r->n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s %s\n", r->e[i].host, r->e[i].shop);
    *len = at;
    return buf;
}

/* ---- the decision ---- */

/* One host a file lists. */
struct claim {
    const char *host;
    size_t file;
};

static int cmp_claim(const void *a, const void *b)
{
    const struct claim *x = a, *y = b;
    int d = strcmp(x->host, y->host);
    return d ? d : (x->file > y->file) - (x->file < y->file);
}

static int cmp_strp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

struct decide {
    const struct hostreg *held;
    const char **main;             /* sorted */
    size_t nmain;
    struct hostreg_file *f;
    size_t nf;
    struct claim *cl;              /* sorted, each (host, file) once */
    size_t ncl;
};

/* The file named shop, or -1. */
static long file_of(const struct decide *d, const char *shop)
{
    size_t lo = 0, hi = d->nf;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(d->f[mid].shop, shop);
        if (c == 0)
            return (long)mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* The range [*a, *b) of the claims on host. */
static void claims_on(const struct decide *d, const char *host, size_t *a, size_t *b)
{
    size_t lo = 0, hi = d->ncl;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(d->cl[mid].host, host) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *a = lo;
    while (lo < d->ncl && strcmp(d->cl[lo].host, host) == 0)
        lo++;
    *b = lo;
}

/* Who holds host now: a file's index, OWN_MAIN, OWN_BOTH (*other: two of
 * the claimants) or OWN_NONE. */
static long owner(const struct decide *d, const char *host, size_t other[2])
{
    if (d->nmain > 0 && bsearch(&host, d->main, d->nmain, sizeof *d->main, cmp_strp) != NULL)
        return OWN_MAIN;
    size_t a, b;
    claims_on(d, host, &a, &b);
    const char *h = hostreg_holder(d->held, host);
    long j = h != NULL ? file_of(d, h) : -1;
    if (j >= 0) {
        bool lists = false;
        for (size_t k = a; k < b && !lists; k++)
            lists = d->cl[k].file == (size_t)j;
        if (!d->f[j].wins || lists)
            return j; /* kept: only a winning version that no longer lists it frees it */
    }
    if (a == b)
        return OWN_NONE;
    if (b - a == 1)
        return (long)d->cl[a].file;
    other[0] = d->cl[a].file;
    other[1] = d->cl[a + 1].file;
    return OWN_BOTH;
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct hostreg_entry *)a)->host, ((const struct hostreg_entry *)b)->host);
}

/* The entries for `out`: each host owned by a file, once. */
static int collect(const struct decide *d, struct hostreg *out)
{
    size_t cap = d->held->n + d->ncl, n = 0;
    struct hostreg_entry *e = calloc(cap ? cap : 1, sizeof *e);
    if (e == NULL)
        return -1;
    size_t other[2];
    for (size_t i = 0; i < cap; i++) {
        const char *host;
        if (i < d->held->n)
            host = d->held->e[i].host;
        else if (i == d->held->n || strcmp(d->cl[i - d->held->n].host, d->cl[i - d->held->n - 1].host) != 0)
            host = d->cl[i - d->held->n].host;
        else
            continue; /* the same host's next claim */
        long own = owner(d, host, other);
        if (own < 0)
            continue;
        e[n].host = (char *)host; /* borrowed until copied below */
        e[n].shop = (char *)d->f[own].shop;
        n++;
    }
    qsort(e, n, sizeof *e, cmp_entry);
    size_t m = 0; /* a held host that is claimed too comes twice, with one owner */
    for (size_t i = 0; i < n; i++)
        if (m == 0 || strcmp(e[m - 1].host, e[i].host) != 0)
            e[m++] = e[i];
    bool ok = true;
    for (size_t i = 0; i < m; i++) {
        char *h = ok ? strdup(e[i].host) : NULL, *s = ok ? strdup(e[i].shop) : NULL;
        ok = ok && h != NULL && s != NULL;
        e[i].host = h;
        e[i].shop = s;
    }
    out->e = e;
    out->n = m;
    if (!ok) {
        for (size_t i = 0; i < m; i++) { /* the ones not copied are NULL */
            free(e[i].host);
            free(e[i].shop);
        }
        free(e);
        out->e = NULL;
        out->n = 0;
        return -1;
    }
    return 0;
}

int hostreg_decide(const struct hostreg *held, const char *const *main, size_t nmain, struct hostreg_file *f,
                   size_t nf, struct hostreg *out, struct hostreg_clash *clash, size_t *nclash)
{
    struct decide d = {.held = held, .f = f, .nf = nf, .nmain = nmain};
    size_t ncl = 0;
    for (size_t i = 0; i < nf; i++)
        ncl += (size_t)f[i].nhosts;
    d.main = malloc(sizeof *d.main * (nmain ? nmain : 1));
    d.cl = malloc(sizeof *d.cl * (ncl ? ncl : 1));
    out->e = NULL;
    out->n = 0;
    *nclash = 0;
    if (d.main == NULL || d.cl == NULL) {
        free(d.main);
        free(d.cl);
        return -1;
    }
    for (size_t i = 0; i < nmain; i++)
        d.main[i] = main[i];
    qsort(d.main, nmain, sizeof *d.main, cmp_strp);
    for (size_t i = 0; i < nf; i++)
        for (int h = 0; h < f[i].nhosts; h++)
            d.cl[d.ncl++] = (struct claim){f[i].hosts[h], i};
    qsort(d.cl, d.ncl, sizeof *d.cl, cmp_claim);
    size_t u = 0; /* a file listing a host twice claims it once */
    for (size_t i = 0; i < d.ncl; i++)
        if (u == 0 || cmp_claim(&d.cl[u - 1], &d.cl[i]) != 0)
            d.cl[u++] = d.cl[i];
    d.ncl = u;

    /* the greatest set of winners: start with every loaded file, drop one
     * that does not hold every host it lists (its holds then stay, which
     * may make another lose), until nothing changes */
    for (size_t i = 0; i < nf; i++)
        f[i].wins = f[i].loads && !f[i].refused;
    size_t other[2];
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t i = 0; i < nf; i++)
            for (int h = 0; f[i].wins && h < f[i].nhosts; h++)
                if (owner(&d, f[i].hosts[h], other) != (long)i) {
                    f[i].wins = false;
                    changed = true;
                }
    }
    for (size_t k = 0; k < d.ncl; k++) {
        long own = owner(&d, d.cl[k].host, other);
        if (own == (long)d.cl[k].file)
            continue;
        struct hostreg_clash *c = &clash[(*nclash)++];
        c->file = d.cl[k].file;
        c->host = d.cl[k].host;
        c->kind = own == OWN_MAIN ? HOSTREG_MAIN : own == OWN_BOTH ? HOSTREG_BOTH : HOSTREG_HELD;
        c->other = own == OWN_MAIN ? -1 : own >= 0 ? own : (long)(other[0] == c->file ? other[1] : other[0]);
    }
    int rc = collect(&d, out);
    free(d.main);
    free(d.cl);
    return rc;
}
