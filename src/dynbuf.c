/* dynbuf.c - see dynbuf.h. */
#include "dynbuf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DYNBUF_FIRST 256 /* the first allocation, unless the ceiling is lower */

void dynbuf_init(struct dynbuf *b, size_t max)
{
    memset(b, 0, sizeof *b);
    b->max = max;
}

void dynbuf_expect(struct dynbuf *b, size_t total)
{
    b->expect = total < SIZE_MAX ? total + 1 : SIZE_MAX; /* and the NUL */
}

/* Fail b with rc: what it held is freed. Returns rc. */
static enum dynbuf_rc fail(struct dynbuf *b, enum dynbuf_rc rc)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->err = rc;
    return rc;
}

/* Room for n more bytes and the NUL, within the ceiling. */
static enum dynbuf_rc reserve(struct dynbuf *b, size_t n)
{
    if (b->err != DYNBUF_OK)
        return b->err;
    if (n > b->max - b->len) /* len <= max always */
        return fail(b, DYNBUF_TOO_BIG);
    size_t need = b->len + n + 1; /* <= max + 1: no overflow unless max == SIZE_MAX */
    if (need == 0)
        return fail(b, DYNBUF_TOO_BIG);
    if (need <= b->cap)
        return DYNBUF_OK;
    size_t cap = b->cap ? b->cap : DYNBUF_FIRST;
    if (cap < b->expect)
        cap = b->expect;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
    if (cap > b->max + 1 && b->max < SIZE_MAX)
        cap = b->max + 1;
    char *p = realloc(b->p, cap);
    if (p == NULL)
        return fail(b, DYNBUF_NO_MEMORY);
    b->p = p;
    b->cap = cap;
    return DYNBUF_OK;
}

enum dynbuf_rc dynbuf_add(struct dynbuf *b, const void *s, size_t n)
{
    if (n == 0)
        return b->err;
    if (n < b->cap - b->len) {
        /* the usual case, room for it and the NUL: under the ceiling too
         * (cap <= max + 1), and a failed buffer has no room (cap == 0) */
        memcpy(b->p + b->len, s, n);
        b->len += n;
        b->p[b->len] = '\0';
        return DYNBUF_OK;
    }
    enum dynbuf_rc rc = reserve(b, n);
    if (rc != DYNBUF_OK)
        return rc;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return DYNBUF_OK;
}

enum dynbuf_rc dynbuf_adds(struct dynbuf *b, const char *s)
{
    return dynbuf_add(b, s, strlen(s));
}

enum dynbuf_rc dynbuf_vaddf(struct dynbuf *b, const char *fmt, va_list ap)
{
    if (b->err != DYNBUF_OK)
        return b->err;
    va_list again;
    va_copy(again, ap);
    /* first into what is free already; when that is short, the exact size */
    size_t room = b->cap > b->len ? b->cap - b->len : 0;
    int n = vsnprintf(room ? b->p + b->len : NULL, room, fmt, ap);
    enum dynbuf_rc rc = DYNBUF_OK;
    if (n < 0) {
        rc = fail(b, DYNBUF_BAD_FORMAT);
    } else if ((size_t)n < room) {
        rc = reserve(b, (size_t)n); /* the ceiling may still be below what fitted */
        if (rc == DYNBUF_OK)
            b->len += (size_t)n;
    } else {
        rc = reserve(b, (size_t)n);
        if (rc == DYNBUF_OK) {
            int m = vsnprintf(b->p + b->len, b->cap - b->len, fmt, again);
            if (m != n)
                rc = fail(b, DYNBUF_BAD_FORMAT);
            else
                b->len += (size_t)n;
        }
    }
    va_end(again);
    if (rc == DYNBUF_OK && b->p != NULL)
        b->p[b->len] = '\0';
    return rc;
}

enum dynbuf_rc dynbuf_addf(struct dynbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    enum dynbuf_rc rc = dynbuf_vaddf(b, fmt, ap);
    va_end(ap);
    return rc;
}

const char *dynbuf_ptr(const struct dynbuf *b)
{
    return b->p != NULL ? b->p : "";
}

size_t dynbuf_len(const struct dynbuf *b)
{
    return b->len;
}

enum dynbuf_rc dynbuf_error(const struct dynbuf *b)
{
    return b->err;
}

const char *dynbuf_strerror(enum dynbuf_rc rc)
{
    switch (rc) {
    case DYNBUF_OK: return "ok";
    case DYNBUF_TOO_BIG: return "too big";
    case DYNBUF_NO_MEMORY: return "out of memory";
    case DYNBUF_BAD_FORMAT: return "bad format";
    }
    return "unknown";
}

void dynbuf_free(struct dynbuf *b)
{
    free(b->p);
    size_t max = b->max;
    dynbuf_init(b, max);
}
