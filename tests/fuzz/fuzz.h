/* fuzz.h - what the libFuzzer targets of tests/fuzz share.
 *
 * Each fuzz_<target>.c defines LLVMFuzzerTestOneInput() over one parser of
 * outside bytes; ASan and UBSan (configure --enable-fuzzing) catch memory and
 * undefined behaviour, FUZZ_CHECK the parser's documented contract. Inputs
 * are split with the helpers below so that one byte string carries several
 * fields (a status, headers, a body) and libFuzzer's mutations reach each. */
#ifndef KEMBALI_FUZZ_H
#define KEMBALI_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A broken contract: say which, then crash so libFuzzer keeps the input. */
#define FUZZ_CHECK(cond)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: contract broken: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

/* A reader over the fuzz input. */
struct fuzz_in {
    const uint8_t *p;
    size_t left;
};

/* The next byte, 0 when the input is used up. */
static inline uint8_t fuzz_byte(struct fuzz_in *in)
{
    if (in->left == 0)
        return 0;
    in->left--;
    return *in->p++;
}

/* The next field: bytes up to (not including) the next `sep` byte, or the
 * rest. Returned as a malloc'd NUL-terminated copy (the field may hold NUL
 * bytes of its own: *len counts them); the caller frees it. Never NULL
 * (aborts on OOM: a fuzz harness, not the program). */
static inline char *fuzz_field(struct fuzz_in *in, uint8_t sep, size_t *len)
{
    const uint8_t *end = memchr(in->p, sep, in->left);
    size_t n = end ? (size_t)(end - in->p) : in->left;
    char *s = malloc(n + 1);
    if (s == NULL)
        abort();
    if (n > 0)
        memcpy(s, in->p, n);
    s[n] = '\0';
    in->p += n;
    in->left -= n;
    if (end) { /* skip the separator */
        in->p++;
        in->left--;
    }
    if (len)
        *len = n;
    return s;
}

/* xorshift32: split points and choices derived from input bytes. */
static inline uint32_t fuzz_rand(uint32_t *s)
{
    uint32_t x = *s ? *s : 0x9e3779b9u;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *s = x;
    return x;
}

#endif
