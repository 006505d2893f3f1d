/* ids.h - the shapes of the names kembali takes from outside: transaction
 * ids, status words and hex digits. Pure, no dependency: any module may
 * check a name without linking the configuration or the state. */
#ifndef KEMBALI_IDS_H
#define KEMBALI_IDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IDS_ID_MAX 64    /* characters of a transaction id (or a shop's id) */
#define IDS_WORD_MAX 32  /* characters of a status word */

/* True when id is 1..IDS_ID_MAX characters of A-Z a-z 0-9 _ - (NUL-
 * terminated; at most IDS_ID_MAX + 1 bytes are read). NULL: false. */
bool ids_valid_id(const char *id);

/* A status word as kembali keeps them: [a-z0-9_]{1,IDS_WORD_MAX}, n bytes
 * (not NUL-terminated). */
bool ids_valid_word(const char *w, size_t n);

/* n bytes as 2n lowercase hex digits and a NUL (out holds 2n + 1). */
void ids_hex(const uint8_t *b, size_t n, char *out);

/* 2n lowercase hex digits (exactly len == 2n) into n bytes; false otherwise. */
bool ids_unhex(const char *s, size_t len, uint8_t *out, size_t n);

#endif
