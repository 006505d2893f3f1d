/* handover.c - see handover.h. */
#include "handover.h"

#include <stdio.h>
#include <string.h>

enum {
    F_KEEP = 1 << 0,
    F_JSON = 1 << 1,
    F_HEAD = 1 << 2,
    F_STREAM = 1 << 3,
    F_UNDECIDED = 1 << 4,
    F_WANTS_READ = 1 << 5,
};

enum { /* the snapshot's flags */
    S_HAS_TX = 1 << 0,
    S_RESERVED = 1 << 1, /* unused (0) */
    S_NOT_FOUND = 1 << 2,
};

/* The bytes of r in `format` (1 or 2); SIZE_MAX when it cannot be
 * encoded so (format 1 has no facts, no layout, no snapshot). */
static size_t size_as(const struct handover_rec *r, int format)
{
    const char *s[4] = {r->shop, r->id, r->addr, r->origin};
    size_t n = HANDOVER_FIXED;
    for (int i = 0; i < 4; i++) {
        size_t l = strnlen(s[i], HANDOVER_STR_MAX + 1);
        if (l > HANDOVER_STR_MAX)
            return SIZE_MAX;
        n += l;
    }
    if (r->out_len > HANDOVER_OUT_MAX)
        return SIZE_MAX;
    if (format == 1)
        return r->kind == HANDOVER_FACT ? SIZE_MAX : n - 3 + r->out_len;
    if (r->has_snap) {
        size_t l = strnlen(r->snap.status_word, sizeof r->snap.status_word);
        if (l > HANDOVER_STR_MAX || l >= sizeof r->snap.status_word)
            return SIZE_MAX;
        n += HANDOVER_SNAP_FIXED + l;
    }
    return n + r->out_len;
}

size_t handover_size(const struct handover_rec *r)
{
    return size_as(r, HANDOVER_FORMAT);
}

static uint8_t *put_u(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static uint8_t *put_str(uint8_t *p, const char *s)
{
    size_t l = strlen(s);
    *p++ = (uint8_t)l;
    memcpy(p, s, l);
    return p + l;
}

size_t handover_encode(const struct handover_rec *r, uint8_t *out, size_t cap)
{
    return handover_encode_as(r, HANDOVER_FORMAT, out, cap);
}

size_t handover_encode_as(const struct handover_rec *r, int format, uint8_t *out, size_t cap)
{
    if (format != 1 && format != HANDOVER_FORMAT)
        return 0;
    size_t n = size_as(r, format);
    if (n == SIZE_MAX || n > cap)
        return 0;
    uint8_t *p = out;
    *p++ = (uint8_t)format;
    *p++ = r->kind;
    p = put_u(p, r->fcgi_id, 2);
    *p++ = (uint8_t)((r->keep_conn ? F_KEEP : 0) | (r->json ? F_JSON : 0) | (r->head ? F_HEAD : 0) |
                     (r->stream ? F_STREAM : 0) | (r->undecided ? F_UNDECIDED : 0) |
                     (r->wants_read ? F_WANTS_READ : 0));
    if (format >= 2)
        p = put_u(p, (uint64_t)(r->layout > 0 && r->layout <= UINT16_MAX ? r->layout : 0), 2);
    const int64_t t[6] = {r->idle_since, r->out_since, r->arrived, r->deadline, r->painted, r->last_sent};
    for (int i = 0; i < 6; i++)
        p = put_u(p, (uint64_t)t[i], 8);
    p = put_str(p, r->shop);
    p = put_str(p, r->id);
    p = put_str(p, r->addr);
    p = put_str(p, r->origin);
    p = put_u(p, r->out_len, 4);
    if (r->out_len > 0)
        memcpy(p, r->out, r->out_len);
    p += r->out_len;
    if (format == 1)
        return n;
    *p++ = r->has_snap ? 1 : 0;
    if (r->has_snap) {
        const struct state_snap *sn = &r->snap;
        *p++ = (uint8_t)sn->status;
        *p++ = (uint8_t)((sn->has_tx ? S_HAS_TX : 0) |
                         (sn->not_found ? S_NOT_FOUND : 0));
        p = put_u(p, (uint64_t)(uint32_t)sn->reads, 4);
        const int64_t st[7] = {sn->last_start,  sn->last_end,         sn->inflight_until,   sn->not_before,
                               sn->known_until, sn->key_paused_until, sn->host_paused_until};
        for (int i = 0; i < 7; i++)
            p = put_u(p, (uint64_t)st[i], 8);
        p = put_str(p, sn->status_word);
    }
    return n;
}

/* A reader over in[0..len): each take fails once past the end. */
struct rd {
    const uint8_t *p;
    size_t left;
    bool bad;
};

static const uint8_t *take(struct rd *d, size_t n)
{
    if (d->bad || n > d->left) {
        d->bad = true;
        return NULL;
    }
    const uint8_t *q = d->p;
    d->p += n;
    d->left -= n;
    return q;
}

static uint64_t get_u(struct rd *d, int bytes)
{
    const uint8_t *q = take(d, (size_t)bytes);
    uint64_t v = 0;
    for (int i = 0; q != NULL && i < bytes; i++)
        v |= (uint64_t)q[i] << (8 * i);
    return v;
}

/* A string into s (room for HANDOVER_STR_MAX + 1); false when it holds a NUL. */
static bool get_str(struct rd *d, char *s)
{
    size_t l = (size_t)get_u(d, 1);
    const uint8_t *q = take(d, l);
    if (q == NULL) {
        s[0] = '\0';
        return true; /* d->bad tells */
    }
    if (memchr(q, 0, l) != NULL)
        return false;
    memcpy(s, q, l);
    s[l] = '\0';
    return true;
}

int handover_decode(const uint8_t *in, size_t len, struct handover_rec *r, char *why, size_t whylen)
{
    struct rd d = {.p = in, .left = len};
    memset(r, 0, sizeof *r);
    unsigned format = (unsigned)get_u(&d, 1);
    if (!d.bad && format != 1 && format != HANDOVER_FORMAT) {
        snprintf(why, whylen, "a record of format %u (this version reads 1 to %d)", format, HANDOVER_FORMAT);
        return -1;
    }
    r->kind = (uint8_t)get_u(&d, 1);
    if (!d.bad && r->kind != HANDOVER_IDLE && r->kind != HANDOVER_HELD &&
        !(r->kind == HANDOVER_FACT && format >= 2)) {
        snprintf(why, whylen, "a record of unknown kind %u", r->kind);
        return -1;
    }
    r->fcgi_id = (uint16_t)get_u(&d, 2);
    unsigned f = (unsigned)get_u(&d, 1);
    r->keep_conn = f & F_KEEP;
    r->json = f & F_JSON;
    r->head = f & F_HEAD;
    r->stream = f & F_STREAM;
    r->undecided = f & F_UNDECIDED;
    r->wants_read = f & F_WANTS_READ;
    if (format >= 2)
        r->layout = (int)get_u(&d, 2);
    int64_t *t[6] = {&r->idle_since, &r->out_since, &r->arrived, &r->deadline, &r->painted, &r->last_sent};
    for (int i = 0; i < 6; i++)
        *t[i] = (int64_t)get_u(&d, 8);
    char *s[4] = {r->shop, r->id, r->addr, r->origin};
    for (int i = 0; i < 4; i++)
        if (!get_str(&d, s[i])) {
            snprintf(why, whylen, "a string of the record holds a NUL byte");
            return -1;
        }
    uint64_t ol = get_u(&d, 4);
    if (!d.bad && ol > HANDOVER_OUT_MAX) {
        snprintf(why, whylen, "%llu bytes to write: more than a connection holds", (unsigned long long)ol);
        return -1;
    }
    r->out = take(&d, (size_t)ol);
    r->out_len = r->out != NULL ? (size_t)ol : 0;
    if (r->out_len == 0)
        r->out = NULL;
    unsigned has = format >= 2 ? (unsigned)get_u(&d, 1) : 0;
    if (!d.bad && has > 1) {
        snprintf(why, whylen, "a snapshot marked %u", has);
        return -1;
    }
    if (has == 1) {
        struct state_snap *sn = &r->snap;
        r->has_snap = true;
        unsigned status = (unsigned)get_u(&d, 1);
        unsigned sf = (unsigned)get_u(&d, 1);
        if (!d.bad && status > TXS_UNKNOWN) {
            snprintf(why, whylen, "a snapshot of unknown status %u", status);
            return -1;
        }
        sn->status = (enum tx_status)status;
        sn->has_tx = sf & S_HAS_TX;
        sn->not_found = sf & S_NOT_FOUND;
        sn->reads = (int32_t)(uint32_t)get_u(&d, 4);
        int64_t *st[7] = {&sn->last_start,  &sn->last_end,         &sn->inflight_until,   &sn->not_before,
                          &sn->known_until, &sn->key_paused_until, &sn->host_paused_until};
        for (int i = 0; i < 7; i++)
            *st[i] = (int64_t)get_u(&d, 8);
        char word[HANDOVER_STR_MAX + 1];
        if (!get_str(&d, word) || strlen(word) >= sizeof sn->status_word) {
            snprintf(why, whylen, "a snapshot's status word holds a NUL byte or is too long");
            return -1;
        }
        memcpy(sn->status_word, word, strlen(word) + 1);
    }
    if (d.bad) {
        snprintf(why, whylen, "the record is cut short (%zu bytes)", len);
        return -1;
    }
    if (d.left != 0) {
        snprintf(why, whylen, "%zu bytes after the record", d.left);
        return -1;
    }
    return 0;
}

void handover_frame(uint8_t hdr[8], uint32_t index, uint32_t rec_len)
{
    put_u(put_u(hdr, index, 4), rec_len, 4);
}

int handover_next(const uint8_t *buf, size_t len, size_t *off, uint32_t *index, const uint8_t **rec,
                  size_t *rec_len)
{
    if (*off >= len)
        return 0;
    struct rd d = {.p = buf + *off, .left = len - *off};
    *index = (uint32_t)get_u(&d, 4);
    size_t l = (size_t)get_u(&d, 4);
    *rec = take(&d, l);
    if (d.bad)
        return -1;
    *rec_len = l;
    *off = len - d.left;
    return 1;
}
