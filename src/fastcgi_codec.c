/* fastcgi_codec.c - see fastcgi_codec.h. */
#include <stdlib.h>
#include <string.h>

#include "fastcgi_codec.h"

_Static_assert(sizeof(FCGI_Header) == FCGI_HEADER_LEN, "FCGI_Header is 8 bytes");
_Static_assert(sizeof(FCGI_BeginRequestBody) == 8, "FCGI_BeginRequestBody is 8 bytes");
_Static_assert(sizeof(FCGI_EndRequestBody) == 8, "FCGI_EndRequestBody is 8 bytes");
_Static_assert(sizeof(FCGI_UnknownTypeBody) == 8, "FCGI_UnknownTypeBody is 8 bytes");

enum { PH_HEADER, PH_CONTENT, PH_PADDING };

/* What the current record's content is for. */
enum { M_SKIP, M_BEGIN, M_ABORT, M_PARAMS, M_STDIN, M_GET_VALUES, M_UNKNOWN };

/* The GET_VALUES scan: reading the name length, the value length, the name,
 * the value. */
enum { GV_NLEN, GV_VLEN, GV_NAME, GV_VALUE };

#define BUF_START 512
#define INDEX_SLOTS 64 /* a power of two, above FCGI_CODEC_INDEX_NAMES: a probe always ends */
/* The params' first allocation: a block of BUF_START (nginx's stock
 * fastcgi_params make about 450 bytes) and the index after it. */
#define PARAMS_START (BUF_START + INDEX_SLOTS * sizeof(uint16_t))
_Static_assert(INDEX_SLOTS > FCGI_CODEC_INDEX_NAMES && (INDEX_SLOTS & (INDEX_SLOTS - 1)) == 0,
               "the index has a free slot and a mask");
_Static_assert(FCGI_CODEC_PARAMS_MAX <= UINT16_MAX + 1, "a name's offset + 1 fits the index's uint16_t");
#define END_RECORD_LEN (FCGI_HEADER_LEN + sizeof(FCGI_EndRequestBody))
#define ANSWER_TAIL (FCGI_HEADER_LEN + END_RECORD_LEN) /* the empty STDOUT and END_REQUEST */
#define FULL_RECORD (FCGI_HEADER_LEN + FCGI_MAX_LENGTH + 1) /* 65535 bytes and one of padding */

static const struct {
    const char *name, *value;
} known_values[] = {
    {FCGI_MAX_CONNS, "10000"},
    {FCGI_MAX_REQS, "10000"},
    {FCGI_MPXS_CONNS, "0"},
};
#define N_KNOWN (sizeof known_values / sizeof known_values[0])

static size_t pad8(size_t n)
{
    return (8 - n % 8) % 8;
}

/* Write a record header at out (8 bytes). */
static void put_header(uint8_t *out, uint8_t type, uint16_t id, size_t clen, size_t padlen)
{
    FCGI_Header h = {
        .version = FCGI_VERSION_1,
        .type = type,
        .requestIdB1 = (unsigned char)(id >> 8),
        .requestIdB0 = (unsigned char)id,
        .contentLengthB1 = (unsigned char)(clen >> 8),
        .contentLengthB0 = (unsigned char)clen,
        .paddingLength = (unsigned char)padlen,
    };
    memcpy(out, &h, sizeof h);
}

static void put_end(uint8_t *out, uint16_t id, uint32_t app_status, uint8_t proto_status)
{
    FCGI_EndRequestBody b = {
        .appStatusB3 = (unsigned char)(app_status >> 24),
        .appStatusB2 = (unsigned char)(app_status >> 16),
        .appStatusB1 = (unsigned char)(app_status >> 8),
        .appStatusB0 = (unsigned char)app_status,
        .protocolStatus = proto_status,
    };
    put_header(out, FCGI_END_REQUEST, id, sizeof b, 0);
    memcpy(out + FCGI_HEADER_LEN, &b, sizeof b);
}

static void free_request_buffers(struct fcgi_parser *p)
{
    free(p->params);
    p->params = NULL;
    p->params_len = p->params_cap = 0;
    p->params_ready = false;
    p->index = NULL;
    free(p->in);
    p->in = NULL;
    p->in_len = p->in_cap = 0;
}

void fcgi_parser_init(struct fcgi_parser *p)
{
    memset(p, 0, sizeof *p);
    p->phase = PH_HEADER;
}

void fcgi_parser_free(struct fcgi_parser *p)
{
    free_request_buffers(p);
}

/* Append n bytes to *buf (length *len, capacity *cap; first made `start`
 * bytes) unless that passes max. Returns 1 when appended, 0 when it would
 * pass max (nothing changed), -1 when out of memory. */
static int buf_add(uint8_t **buf, size_t *len, size_t *cap, size_t start, size_t max, const uint8_t *src,
                   size_t n)
{
    if (n > max - *len)
        return 0;
    if (n == 0)
        return 1;
    if (*len + n > *cap) {
        size_t c = *cap ? *cap : start;
        while (c < *len + n)
            c = c > max / 2 ? max : c * 2;
        uint8_t *q = realloc(*buf, c);
        if (!q)
            return -1;
        *buf = q;
        *cap = c;
    }
    memcpy(*buf + *len, src, n);
    *len += n;
    return 1;
}

/* Read a pair length at b[*r] (b has n bytes): 1 byte below 128, else 4 bytes
 * with the top bit set. False when it runs past n. */
static bool read_len(const uint8_t *b, size_t n, size_t *r, size_t *out)
{
    if (*r >= n)
        return false;
    if (b[*r] < 0x80) {
        *out = b[(*r)++];
        return true;
    }
    if (n - *r < 4)
        return false;
    *out = ((size_t)(b[*r] & 0x7f) << 24) | ((size_t)b[*r + 1] << 16) | ((size_t)b[*r + 2] << 8) | b[*r + 3];
    *r += 4;
    return true;
}

/* The index's first slot for the name s of n bytes: from its length and
 * three of its bytes, not a loop over it. (nginx's stock fastcgi_params
 * take 20 different slots, and the names kembali looks up that nginx does
 * not send fall on free ones.) */
static size_t name_slot(const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    if (n == 0)
        return 0;
    size_t h = n ^ ((size_t)u[n > 1 ? n - 2 : 0] << 1) ^ ((size_t)u[n / 2] << 2) ^ (size_t)u[n - 1] * 3;
    return h & (INDEX_SLOTS - 1);
}

/* The slot of t holding the name s (n bytes, no NUL) of the w bytes of
 * pairs at b, or the free slot where it goes. A stored name equals s when
 * its first n bytes do and a NUL follows them. (Compared here, not by
 * memcmp(): a call would cost more than the few short names compared.) */
static size_t index_find(const uint16_t *t, const char *b, size_t w, const char *s, size_t n)
{
    for (size_t i = name_slot(s, n);; i = (i + 1) & (INDEX_SLOTS - 1)) {
        if (t[i] == 0)
            return i;
        const char *o = b + t[i] - 1;
        if ((size_t)(o - b) + n >= w || o[n] != 0)
            continue;
        size_t j = 0;
        while (j < n && o[j] == s[j])
            j++;
        if (j == n)
            return i;
    }
}

/* Put the index t of the w bytes of pairs in p->params after them, in the
 * same buffer (grown for it when short). None (lookups scan) when the
 * table would take the buffer past FCGI_CODEC_PARAMS_MAX or memory runs
 * out: never an error. */
static void index_keep(struct fcgi_parser *p, size_t w, const uint16_t *t)
{
    size_t at = w + (w & 1), need = at + INDEX_SLOTS * sizeof *t;
    if (need > FCGI_CODEC_PARAMS_MAX)
        return;
    if (need > p->params_cap) {
        uint8_t *q = realloc(p->params, need);
        if (q == NULL)
            return;
        p->params = q;
        p->params_cap = need;
    }
    memcpy(p->params + at, t, INDEX_SLOTS * sizeof *t);
    p->index = (const uint16_t *)(const void *)(p->params + at);
}

/* The value of `name` by the index (p->index set). */
static const char *index_get(const struct fcgi_parser *p, const char *name)
{
    const char *b = (const char *)p->params;
    size_t n = strlen(name), i = index_find(p->index, b, p->params_len, name, n);
    return p->index[i] != 0 ? b + p->index[i] - 1 + n + 1 : NULL;
}

/* Check the raw pairs in p->params and rebuild them in place as
 * name\0value\0 ... (never longer: each pair loses at least 2 length bytes
 * and gains 2 NULs), indexing the names as they go (a name sent again
 * takes its earlier slot: the last value counts); the index is kept for
 * 1 to FCGI_CODEC_INDEX_NAMES pairs (index_keep). Returns NULL, or why the
 * block is malformed. */
static const char *params_index(struct fcgi_parser *p)
{
    uint8_t *b = p->params;
    size_t n = p->params_len, r = 0, w = 0, k = 0;
    uint16_t t[INDEX_SLOTS] = {0};
    while (r < n) {
        size_t nl, vl;
        if (n - r >= 2 && b[r] < 0x80 && b[r + 1] < 0x80) { /* the usual short lengths, inline */
            nl = b[r];
            vl = b[r + 1];
            r += 2;
        } else if (!read_len(b, n, &r, &nl) || !read_len(b, n, &r, &vl)) {
            return "a PARAMS name-value length runs past the end of the params";
        }
        if (nl > n - r || vl > n - r - nl)
            return "a PARAMS name-value pair runs past the end of the params";
        const uint8_t *name = b + r, *value = b + r + nl;
        r += nl + vl;
        const uint8_t *nul = memchr(name, 0, nl + vl); /* name and value are adjacent: one search */
        if (nul != NULL && nul < value)
            continue;
        if (nul != NULL)
            vl = (size_t)(nul - value);
        size_t at = w;
        memmove(b + w, name, nl);
        w += nl;
        b[w++] = 0;
        memmove(b + w, value, vl);
        w += vl;
        b[w++] = 0;
        if (++k <= FCGI_CODEC_INDEX_NAMES)
            t[index_find(t, (const char *)b, w, (const char *)b + at, nl)] = (uint16_t)(at + 1);
    }
    p->params_len = w;
    p->params_ready = true;
    if (k > 0 && k <= FCGI_CODEC_INDEX_NAMES)
        index_keep(p, w, t);
    return NULL;
}

/* One content byte of a GET_VALUES record. A pair running past the record
 * is caught at its end (on_record): the scan is then not back at GV_NLEN. */
static void gv_byte(struct fcgi_parser *p, uint8_t c)
{
    if (p->gv.stage == GV_NLEN || p->gv.stage == GV_VLEN) {
        uint32_t v;
        if (p->gv.lb_have == 0 && c < 0x80) {
            v = c;
        } else {
            p->gv.lb[p->gv.lb_have++] = c;
            if (p->gv.lb_have < 4)
                return;
            v = ((uint32_t)(p->gv.lb[0] & 0x7f) << 24) | ((uint32_t)p->gv.lb[1] << 16) |
                ((uint32_t)p->gv.lb[2] << 8) | p->gv.lb[3];
            p->gv.lb_have = 0;
        }
        if (p->gv.stage == GV_NLEN) {
            p->gv.nlen = v;
            p->gv.stage = GV_VLEN;
            return;
        }
        p->gv.vlen = v;
        p->gv.nseen = p->gv.vseen = 0;
        p->gv.stage = p->gv.nlen ? GV_NAME : p->gv.vlen ? GV_VALUE : GV_NLEN;
        return;
    }
    if (p->gv.stage == GV_NAME) {
        if (p->gv.nseen < sizeof p->gv.name)
            p->gv.name[p->gv.nseen] = (char)c;
        if (++p->gv.nseen < p->gv.nlen)
            return;
        for (size_t i = 0; i < N_KNOWN; i++)
            if (p->gv.nlen == strlen(known_values[i].name) &&
                memcmp(p->gv.name, known_values[i].name, p->gv.nlen) == 0)
                p->gv.asked |= 1u << i;
        p->gv.stage = p->gv.vlen ? GV_VALUE : GV_NLEN;
        return;
    }
    if (++p->gv.vseen == p->gv.vlen)
        p->gv.stage = GV_NLEN;
}

/* The GET_VALUES_RESULT for the names asked, as many as fit in ev->reply. */
static void gv_result(struct fcgi_parser *p, struct fcgi_event *ev)
{
    size_t clen = 0, room = sizeof ev->reply - FCGI_HEADER_LEN;
    uint8_t *c = ev->reply + FCGI_HEADER_LEN;
    for (size_t i = 0; i < N_KNOWN; i++) {
        if (!(p->gv.asked & (1u << i)))
            continue;
        size_t nl = strlen(known_values[i].name), vl = strlen(known_values[i].value);
        size_t need = 2 + nl + vl;
        if (need + pad8(clen + need) > room - clen)
            break;
        c[clen++] = (uint8_t)nl;
        c[clen++] = (uint8_t)vl;
        memcpy(c + clen, known_values[i].name, nl);
        clen += nl;
        memcpy(c + clen, known_values[i].value, vl);
        clen += vl;
    }
    size_t pad = pad8(clen);
    memset(c + clen, 0, pad);
    put_header(ev->reply, FCGI_GET_VALUES_RESULT, 0, clen, pad);
    ev->reply_len = FCGI_HEADER_LEN + clen + pad;
}

static enum fcgi_ev fail(struct fcgi_parser *p, struct fcgi_event *ev, const char *why)
{
    p->why = why;
    ev->type = FCGI_EV_ERROR;
    ev->id = p->id;
    ev->why = why;
    ev->reply_len = 0;
    return FCGI_EV_ERROR;
}

static enum fcgi_ev reply(struct fcgi_event *ev, uint16_t id)
{
    ev->type = FCGI_EV_REPLY;
    ev->id = id;
    return FCGI_EV_REPLY;
}

/* A whole header arrived: decide what its content is for. */
static enum fcgi_ev on_header(struct fcgi_parser *p, struct fcgi_event *ev)
{
    FCGI_Header h;
    memcpy(&h, p->hdr, sizeof h);
    p->type = h.type;
    p->id = (uint16_t)(h.requestIdB1 << 8 | h.requestIdB0);
    if (h.version != FCGI_VERSION_1)
        return fail(p, ev, "a record of a FastCGI version other than 1");
    p->clen = (size_t)h.contentLengthB1 << 8 | h.contentLengthB0;
    p->padlen = h.paddingLength;
    p->cseen = p->padseen = 0;
    bool live = p->live != 0 && p->id == p->live;

    if (p->id == FCGI_NULL_REQUEST_ID) {
        p->mode = p->type == FCGI_GET_VALUES ? M_GET_VALUES : M_UNKNOWN;
        memset(&p->gv, 0, sizeof p->gv);
        return FCGI_EV_NONE;
    }
    switch (p->type) {
    case FCGI_BEGIN_REQUEST:
        if (p->clen != sizeof p->begin)
            return fail(p, ev, "a BEGIN_REQUEST body that is not 8 bytes");
        if (live)
            return fail(p, ev, "a second BEGIN_REQUEST for the live request");
        p->mode = M_BEGIN;
        break;
    case FCGI_ABORT_REQUEST:
        p->mode = M_ABORT;
        break;
    case FCGI_PARAMS:
        if (live && p->params_done)
            return fail(p, ev, "PARAMS after the empty PARAMS record");
        p->mode = live ? M_PARAMS : M_SKIP;
        break;
    case FCGI_STDIN:
        if (live && !p->params_done)
            return fail(p, ev, "STDIN before the empty PARAMS record");
        if (live && p->stdin_done)
            return fail(p, ev, "STDIN after the empty STDIN record");
        p->mode = live ? M_STDIN : M_SKIP;
        break;
    case FCGI_DATA:
        p->mode = M_SKIP;
        break;
    case FCGI_END_REQUEST:
    case FCGI_STDOUT:
    case FCGI_STDERR:
    case FCGI_GET_VALUES_RESULT:
    case FCGI_UNKNOWN_TYPE:
        return fail(p, ev, "a record of a type only applications send");
    case FCGI_GET_VALUES:
        return fail(p, ev, "a GET_VALUES record with a request id");
    default:
        return fail(p, ev, "a record of a type FastCGI does not define");
    }
    return FCGI_EV_NONE;
}

/* Content bytes of the current record. */
static enum fcgi_ev on_content(struct fcgi_parser *p, const uint8_t *b, size_t n, struct fcgi_event *ev)
{
    int r;
    switch (p->mode) {
    case M_BEGIN:
        memcpy(p->begin + p->cseen, b, n);
        break;
    case M_PARAMS:
        if (p->too_large || p->taken)
            break;
        r = buf_add(&p->params, &p->params_len, &p->params_cap, PARAMS_START, FCGI_CODEC_PARAMS_MAX, b, n);
        if (r < 0)
            return fail(p, ev, "out of memory");
        if (r == 0) {
            free_request_buffers(p);
            p->too_large = true;
        }
        break;
    case M_STDIN: {
        if (p->taken)
            break;
        size_t keep = FCGI_CODEC_STDIN_KEEP - p->in_len;
        if (n > keep)
            p->truncated = true;
        if (buf_add(&p->in, &p->in_len, &p->in_cap, BUF_START, FCGI_CODEC_STDIN_KEEP, b,
                    n < keep ? n : keep) < 0)
            return fail(p, ev, "out of memory");
        break;
    }
    case M_GET_VALUES:
        for (size_t i = 0; i < n; i++)
            gv_byte(p, b[i]);
        break;
    default:
        break;
    }
    p->cseen += n;
    return FCGI_EV_NONE;
}

/* The current record's content is complete. */
static enum fcgi_ev on_record(struct fcgi_parser *p, struct fcgi_event *ev)
{
    FCGI_BeginRequestBody begin;
    FCGI_UnknownTypeBody unknown = {.type = p->type};
    const char *why;

    switch (p->mode) {
    case M_BEGIN:
        memcpy(&begin, p->begin, sizeof begin);
        if (p->live) {
            put_end(ev->reply, p->id, 0, FCGI_CANT_MPX_CONN);
        } else if ((begin.roleB1 << 8 | begin.roleB0) != FCGI_RESPONDER) {
            put_end(ev->reply, p->id, 0, FCGI_UNKNOWN_ROLE);
        } else {
            free_request_buffers(p);
            p->live = p->id;
            p->keep_conn = (begin.flags & FCGI_KEEP_CONN) != 0;
            p->params_done = p->stdin_done = p->taken = p->too_large = p->truncated = false;
            return FCGI_EV_NONE;
        }
        ev->reply_len = END_RECORD_LEN;
        return reply(ev, p->id);
    case M_ABORT:
        if (p->id != p->live)
            return FCGI_EV_NONE;
        ev->type = FCGI_EV_ABORT;
        ev->id = p->id;
        return FCGI_EV_ABORT;
    case M_PARAMS:
        if (p->clen > 0)
            return FCGI_EV_NONE;
        p->params_done = true;
        if (!p->too_large && !p->taken && (why = params_index(p)) != NULL)
            return fail(p, ev, why);
        return FCGI_EV_NONE;
    case M_STDIN:
        if (p->clen > 0)
            return FCGI_EV_NONE;
        p->stdin_done = true;
        ev->type = FCGI_EV_REQUEST;
        ev->id = p->id;
        return FCGI_EV_REQUEST;
    case M_GET_VALUES:
        if (p->gv.stage != GV_NLEN || p->gv.lb_have != 0)
            return fail(p, ev, "a GET_VALUES name-value pair runs past the end of the record");
        gv_result(p, ev);
        return reply(ev, 0);
    case M_UNKNOWN:
        put_header(ev->reply, FCGI_UNKNOWN_TYPE, 0, sizeof unknown, 0);
        memcpy(ev->reply + FCGI_HEADER_LEN, &unknown, sizeof unknown);
        ev->reply_len = FCGI_HEADER_LEN + sizeof unknown;
        return reply(ev, 0);
    default:
        return FCGI_EV_NONE;
    }
}

enum fcgi_ev fcgi_feed(struct fcgi_parser *p, const uint8_t *in, size_t len, size_t *used,
                       struct fcgi_event *ev)
{
    ev->type = FCGI_EV_NONE;
    ev->id = 0;
    ev->reply_len = 0;
    ev->why = NULL;
    *used = len;
    if (p->why)
        return fail(p, ev, p->why);

    size_t i = 0;
    while (i < len) {
        enum fcgi_ev e = FCGI_EV_NONE;
        if (p->phase == PH_HEADER) {
            p->hdr[p->hdr_have++] = in[i++];
            if (p->hdr_have < FCGI_HEADER_LEN)
                continue;
            p->hdr_have = 0;
            if ((e = on_header(p, ev)) != FCGI_EV_NONE)
                return e;
            p->phase = PH_CONTENT;
        } else if (p->phase == PH_CONTENT) {
            size_t n = p->clen - p->cseen;
            if (n > len - i)
                n = len - i;
            if ((e = on_content(p, in + i, n, ev)) != FCGI_EV_NONE)
                return e;
            i += n;
        } else {
            size_t n = p->padlen - p->padseen;
            if (n > len - i)
                n = len - i;
            p->padseen += n;
            i += n;
        }
        if (p->phase == PH_CONTENT && p->cseen == p->clen) {
            p->phase = PH_PADDING;
            e = on_record(p, ev);
        }
        if (p->phase == PH_PADDING && p->padseen == p->padlen)
            p->phase = PH_HEADER;
        if (e != FCGI_EV_NONE) {
            if (e != FCGI_EV_ERROR)
                *used = i;
            return e;
        }
    }
    return FCGI_EV_NONE;
}

const char *fcgi_param(const struct fcgi_parser *p, const char *name)
{
    if (!p->params_ready || !p->params)
        return NULL;
    if (p->index != NULL)
        return index_get(p, name);
    const char *s = (const char *)p->params, *end = s + p->params_len, *last = NULL;
    while (s < end) {
        const char *v = s + strlen(s) + 1;
        if (strcmp(s, name) == 0)
            last = v; /* a name sent again overrides: the last value counts */
        s = v + strlen(v) + 1;
    }
    return last;
}

void fcgi_params_get(const struct fcgi_parser *p, const char *const *names, size_t n, const char **values)
{
    size_t lens[FCGI_CODEC_GET_MAX];
    for (size_t i = 0; i < n; i++)
        values[i] = NULL;
    if (!p->params_ready || !p->params || n > FCGI_CODEC_GET_MAX)
        return;
    if (p->index != NULL) {
        for (size_t i = 0; i < n; i++)
            values[i] = index_get(p, names[i]);
        return;
    }
    for (size_t i = 0; i < n; i++)
        lens[i] = strlen(names[i]);
    /* to the end: a name sent again overrides, the last value counts */
    const char *s = (const char *)p->params, *end = s + p->params_len;
    while (s < end) {
        size_t nl = strlen(s);
        const char *v = s + nl + 1;
        for (size_t i = 0; i < n; i++)
            if (lens[i] == nl && memcmp(s, names[i], nl) == 0)
                values[i] = v;
        s = v + strlen(v) + 1;
    }
}

const uint8_t *fcgi_stdin(const struct fcgi_parser *p, size_t *len)
{
    *len = p->in_len;
    return p->in;
}

bool fcgi_stdin_truncated(const struct fcgi_parser *p)
{
    return p->truncated;
}

bool fcgi_params_too_large(const struct fcgi_parser *p)
{
    return p->too_large;
}

bool fcgi_keep_conn(const struct fcgi_parser *p)
{
    return p->live && p->keep_conn;
}

uint16_t fcgi_request_id(const struct fcgi_parser *p)
{
    return p->live;
}

size_t fcgi_parser_held(const struct fcgi_parser *p)
{
    return p->params_cap + p->in_cap;
}

bool fcgi_parser_mid_record(const struct fcgi_parser *p)
{
    return p->phase != PH_HEADER || p->hdr_have > 0;
}

void fcgi_request_taken(struct fcgi_parser *p)
{
    free_request_buffers(p);
    p->taken = true;
}

void fcgi_parser_resume(struct fcgi_parser *p, uint16_t id, bool keep_conn)
{
    p->live = id;
    p->keep_conn = keep_conn;
    p->params_done = p->stdin_done = p->taken = true;
}

void fcgi_request_done(struct fcgi_parser *p)
{
    free_request_buffers(p);
    p->live = 0;
    p->keep_conn = p->params_done = p->stdin_done = p->taken = p->too_large = p->truncated = false;
}

size_t fcgi_answer_size(size_t len)
{
    size_t full = len / FCGI_MAX_LENGTH, rest = len % FCGI_MAX_LENGTH;
    size_t last = rest ? FCGI_HEADER_LEN + rest + pad8(rest) : 0;
    if (full > (SIZE_MAX - ANSWER_TAIL - last) / FULL_RECORD)
        return SIZE_MAX;
    return full * FULL_RECORD + last + ANSWER_TAIL;
}

size_t fcgi_stdout_size(size_t len)
{
    size_t full = len / FCGI_MAX_LENGTH, rest = len % FCGI_MAX_LENGTH;
    size_t last = rest ? FCGI_HEADER_LEN + rest + pad8(rest) : 0;
    if (full > (SIZE_MAX - last) / FULL_RECORD)
        return SIZE_MAX;
    return full * FULL_RECORD + last;
}

size_t fcgi_encode_stdout(uint8_t *out, size_t cap, uint16_t id, const void *data, size_t len)
{
    size_t need = fcgi_stdout_size(len);
    if (need == SIZE_MAX || need > cap)
        return 0;
    const uint8_t *d = data;
    size_t w = 0;
    while (len > 0) {
        size_t n = len < FCGI_MAX_LENGTH ? len : FCGI_MAX_LENGTH, pad = pad8(n);
        put_header(out + w, FCGI_STDOUT, id, n, pad);
        memcpy(out + w + FCGI_HEADER_LEN, d, n);
        memset(out + w + FCGI_HEADER_LEN + n, 0, pad);
        w += FCGI_HEADER_LEN + n + pad;
        d += n;
        len -= n;
    }
    return w;
}

size_t fcgi_encode_answer(uint8_t *out, size_t cap, uint16_t id, const void *data, size_t len)
{
    size_t need = fcgi_answer_size(len);
    if (need == SIZE_MAX || need > cap)
        return 0;
    const uint8_t *d = data;
    size_t w = 0;
    while (len > 0) {
        size_t n = len < FCGI_MAX_LENGTH ? len : FCGI_MAX_LENGTH, pad = pad8(n);
        put_header(out + w, FCGI_STDOUT, id, n, pad);
        memcpy(out + w + FCGI_HEADER_LEN, d, n);
        memset(out + w + FCGI_HEADER_LEN + n, 0, pad);
        w += FCGI_HEADER_LEN + n + pad;
        d += n;
        len -= n;
    }
    put_header(out + w, FCGI_STDOUT, id, 0, 0);
    w += FCGI_HEADER_LEN;
    put_end(out + w, id, 0, FCGI_REQUEST_COMPLETE);
    return w + END_RECORD_LEN;
}

size_t fcgi_encode_end(uint8_t *out, size_t cap, uint16_t id, uint32_t app_status, uint8_t proto_status)
{
    if (cap < END_RECORD_LEN)
        return 0;
    put_end(out, id, app_status, proto_status);
    return END_RECORD_LEN;
}
