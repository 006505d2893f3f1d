/* dynbuf.h - a growing byte buffer with a ceiling (after curl's dynbuf).
 *
 * Every buffer is given, when it is made, the most bytes it may ever hold.
 * A write appends all of its bytes or none: going over the ceiling
 * (DYNBUF_TOO_BIG) or running out of memory (DYNBUF_NO_MEMORY) frees what
 * the buffer held and fails it. A failed buffer stays failed: every later
 * write appends nothing and returns the same code, and dynbuf_error() tells
 * it, until dynbuf_free(). So output is never cut silently; it is whole, or
 * its writer is told (each write's result must be used) and has nothing to
 * send. The bytes held are always followed by a NUL that is not counted.
 *
 * Not thread-safe: one buffer, one writer. No file-scope state. */
#ifndef KEMBALI_DYNBUF_H
#define KEMBALI_DYNBUF_H

#include <stdarg.h>
#include <stddef.h>

enum dynbuf_rc {
    DYNBUF_OK = 0,
    DYNBUF_TOO_BIG = -1,    /* a write would have gone over the ceiling */
    DYNBUF_NO_MEMORY = -2,  /* the allocator said no */
    DYNBUF_BAD_FORMAT = -3, /* vsnprintf() refused the format or its arguments */
};

struct dynbuf {
    char *p;                /* NULL while nothing is held */
    size_t len, cap;
    size_t max;             /* the ceiling: len never exceeds it */
    size_t expect;          /* dynbuf_expect(): the size the next allocation is made for (0: none) */
    enum dynbuf_rc err;     /* DYNBUF_OK, or why the buffer failed */
};

#define DYNBUF_CHECKED __attribute__((warn_unused_result))

/* Make b empty with the ceiling `max` bytes (max >= 1). Allocates nothing;
 * this function can't fail. */
void dynbuf_init(struct dynbuf *b, size_t max);

/* A hint: b is expected to hold `total` bytes in all, so its next
 * allocation makes room for them at once (clamped to the ceiling) instead
 * of growing in steps. Changes no write's outcome: the ceiling and the
 * failures are as without it. Allocates nothing; this function can't
 * fail. */
void dynbuf_expect(struct dynbuf *b, size_t total);

/* Append the n bytes at s (n may be 0; s may be NULL when n is 0).
 * DYNBUF_OK, or b's failure (see the top of this file). */
enum dynbuf_rc dynbuf_add(struct dynbuf *b, const void *s, size_t n) DYNBUF_CHECKED;

/* Append the string s (without its NUL). As dynbuf_add(). */
enum dynbuf_rc dynbuf_adds(struct dynbuf *b, const char *s) DYNBUF_CHECKED;

/* Append the printf-formatted text, whatever its length (no stack array
 * in between: it fits under the ceiling whole, or the buffer fails). A
 * formatting error of vsnprintf() (EOVERFLOW, EILSEQ) fails the buffer
 * with DYNBUF_BAD_FORMAT. */
enum dynbuf_rc dynbuf_addf(struct dynbuf *b, const char *fmt, ...) DYNBUF_CHECKED __attribute__((format(printf, 2, 3)));
enum dynbuf_rc dynbuf_vaddf(struct dynbuf *b, const char *fmt, va_list ap) DYNBUF_CHECKED
    __attribute__((format(printf, 2, 0)));

/* The bytes held, NUL-terminated; "" when nothing is held (or b failed).
 * Valid until the next write or dynbuf_free(). This function can't fail. */
const char *dynbuf_ptr(const struct dynbuf *b);

/* How many bytes are held (0 for a failed buffer). This function can't fail. */
size_t dynbuf_len(const struct dynbuf *b);

/* DYNBUF_OK, or why b failed. This function can't fail. */
enum dynbuf_rc dynbuf_error(const struct dynbuf *b);

/* A few words for a code ("too big", ...), for log lines. This function
 * can't fail. */
const char *dynbuf_strerror(enum dynbuf_rc rc);

/* Free what b holds; b is then empty and usable again with the same
 * ceiling, its failure and its dynbuf_expect() hint forgotten. This
 * function can't fail. */
void dynbuf_free(struct dynbuf *b);

#endif
