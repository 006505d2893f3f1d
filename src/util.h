/* util.h - clocks, jitter and small string helpers shared by every module.
 *
 * Times inside kembali are milliseconds on CLOCK_MONOTONIC (int64_t), which
 * is system-wide on Linux, so it means the same in every process on a host.
 * Wall-clock time is used only to parse HTTP dates and to stamp log lines. */
#ifndef KEMBALI_UTIL_H
#define KEMBALI_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Milliseconds on the monotonic clock. This function can't fail. */
static inline int64_t util_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Seconds since the epoch on the wall clock. This function can't fail. */
static inline int64_t util_wall_s(void)
{
    return (int64_t)time(NULL);
}

/* A random integer in [0, max] from a thread-safe generator seeded from the
 * kernel. Used for jitter, never for anything secret. */
int64_t util_jitter(int64_t max);

/* Copy src into dst (capacity cap, cap > 0), always NUL-terminated; returns
 * true when src fit without truncation. */
bool util_copy(char *dst, size_t cap, const char *src);

/* Case-insensitive search for needle in the first len bytes of hay. */
bool util_contains_ci(const char *hay, size_t len, const char *needle);

/* True when `path` is `dir` or lies inside it, compared as strings: both
 * absolute and already resolved (realpath), `dir` without a trailing slash
 * unless it is "/". "/a/bc" is not inside "/a/b". Pure; can't fail. */
bool util_path_inside(const char *path, const char *dir);

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
