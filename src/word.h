/* word.h - the status words of the interface ("succeeded" ... "unknown_shop")
 * that a request's answer ends with, and the HTTP status of each. Pure, no
 * dependency. */
#ifndef KEMBALI_WORD_H
#define KEMBALI_WORD_H

enum word {
    W_SUCCEEDED, W_FAILED, W_CANCELED, W_EXPIRED, W_CHECKING,
    W_NOT_FOUND, W_INVALID, W_UNKNOWN_SHOP, W_COUNT
};

/* The status word of the interface ("succeeded" ... "unknown_shop");
 * "checking" for a value out of range. Can't fail. */
const char *word_name(enum word w);
/* The HTTP status for a word (200, 404 or 400). Can't fail. */
int word_http(enum word w);

#endif
