/* util.c - see util.h. */
#include "util.h"

#include <ctype.h>
#include <string.h>
#include <sys/random.h>

static _Thread_local uint64_t rng_state;

/* xorshift64*, seeded once per thread from getrandom(). */
static uint64_t rng_next(void)
{
    if (rng_state == 0) {
        if (getrandom(&rng_state, sizeof rng_state, 0) != sizeof rng_state)
            rng_state = (uint64_t)util_mono_ms() ^ (uint64_t)(uintptr_t)&rng_state;
        rng_state |= 1;
    }
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

int64_t util_jitter(int64_t max)
{
    if (max <= 0)
        return 0;
    return (int64_t)(rng_next() % (uint64_t)(max + 1));
}

bool util_copy(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    bool fit = n < cap;
    if (!fit)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return fit;
}

bool util_contains_ci(const char *hay, size_t len, const char *needle)
{
    size_t nl = strlen(needle);
    if (nl == 0)
        return true;
    for (size_t i = 0; i + nl <= len; i++) {
        size_t j = 0;
        while (j < nl && tolower((unsigned char)hay[i + j]) == tolower((unsigned char)needle[j]))
            j++;
        if (j == nl)
            return true;
    }
    return false;
}

bool util_path_inside(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    if (path[0] != '/' || dir[0] != '/')
        return false;
    if (n == 1)
        return true; /* everything is inside "/" */
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}
