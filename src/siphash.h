/* siphash.h - SipHash-2-4 (Aumasson & Bernstein), a keyed hash: the state
 * file's key ids, its tables and clients (state.c), and Redis' (via
 * state_client_hash). Pure; no dependency. */
#ifndef KEMBALI_SIPHASH_H
#define KEMBALI_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

/* SipHash-2-4 of data[0..len) under the 16-byte key k (read little-endian,
 * as the reference implementation; its test vectors hold: test_siphash). */
uint64_t siphash24(const uint8_t k[16], const void *data, size_t len);

#endif
