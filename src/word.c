/* word.c - see word.h. */
#include "word.h"

static const char *const words[W_COUNT] = {
    "succeeded", "failed", "canceled", "expired", "checking", "not_found", "invalid", "unknown_shop",
};

const char *word_name(enum word w)
{
    return (unsigned)w < W_COUNT ? words[w] : "checking";
}

int word_http(enum word w)
{
    switch (w) {
    case W_NOT_FOUND:
    case W_UNKNOWN_SHOP:
        return 404;
    case W_INVALID:
        return 400;
    default:
        return 200;
    }
}
