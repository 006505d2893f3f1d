/* state_redis_msg.h - what kembali processes publish to each other on
 * Redis, read back: pure, no I/O (see state_redis.h).
 *
 * The scripts publish one line per outcome on the wake channel:
 *   F KEY ID MS WORD   a final status WORD, cached MS more
 *   P KEY ID MS WORD   a status that is not final; the next read in MS
 *   W KEY ID MS        a read ended without a status; the next read in MS
 *   N KEY ID MS        a 404, remembered MS more
 *   B KEY CLIENT MS    CLIENT blocked for MS
 *   S KEY              KEY's count of reads was found gone: every host
 *                      sends its own (budget.h)
 *   R KEY NAME         a read with KEY granted, NAME its name in the
 *                      count (budget_member: 16 hex digits, ':', digits)
 * KEY and CLIENT are 32 lowercase hex digits, ID a transaction id as
 * ids_valid_id() takes, WORD [a-z0-9_]{1,32}, MS 0 to 86400000. Anybody
 * who can reach the Redis can publish: everything else is refused. */
#ifndef KEMBALI_STATE_REDIS_MSG_H
#define KEMBALI_STATE_REDIS_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "classify.h"
#include "ids.h"
#include "state.h"

#define STATE_REDIS_MSG_MAX_MS (24LL * 3600 * 1000)

/* A key's or a client's identity in Redis: 32 hex digits. */
struct state_redis_id {
    char hex[33];
};

/* What another process published. */
enum state_redis_msg_kind {
    STATE_REDIS_MSG_FINAL,     /* a final status, cached for ms */
    STATE_REDIS_MSG_STATUS,    /* a status that is not final (word); next read in ms */
    STATE_REDIS_MSG_NEXT,      /* a read ended without a status; next read in ms */
    STATE_REDIS_MSG_NOT_FOUND, /* a 404, remembered for ms */
    STATE_REDIS_MSG_BLOCK,     /* client (in id) blocked for ms */
    STATE_REDIS_MSG_SEED,      /* the key's count was found gone: send this host's reads (key only) */
    STATE_REDIS_MSG_READ,      /* a read granted, named in id (budget_member) */
};

struct state_redis_msg {
    enum state_redis_msg_kind kind;
    struct state_redis_id key;
    char id[STATE_ID_MAX + 1];          /* the transaction; BLOCK: the client's hex; READ: the read's name */
    char word[STATUS_WORD_MAX + 1];     /* FINAL, STATUS */
    int64_t ms;
};

/* Each kind's letter (a string of one character), a line's first field
 * (the form above): the scripts publish with these, by the names
 * state_redis_msg_lua() gives them, and state_redis_msg_parse() reads
 * them. */
#define STATE_REDIS_MSG_LETTERS(X)                                                                                   \
    X(STATE_REDIS_MSG_FINAL, "MSG_FINAL", "F")                                                                       \
    X(STATE_REDIS_MSG_STATUS, "MSG_STATUS", "P")                                                                     \
    X(STATE_REDIS_MSG_NEXT, "MSG_NEXT", "W")                                                                         \
    X(STATE_REDIS_MSG_NOT_FOUND, "MSG_NOT_FOUND", "N")                                                               \
    X(STATE_REDIS_MSG_BLOCK, "MSG_BLOCK", "B")                                                                       \
    X(STATE_REDIS_MSG_SEED, "MSG_SEED", "S")                                                                         \
    X(STATE_REDIS_MSG_READ, "MSG_READ", "R")

/* The words of a claim's answer (the claim script's, read back by
 * state_redis.c): its verdict, then why it waits, or which read it grants
 * (an early one or a last-chance one: for tests and benches). The scripts know each by
 * the name beside it (state_redis_msg_lua). */
#define STATE_REDIS_WORDS(X)                                                                                         \
    X(SRW_GO, "W_GO", "go")                                                                                          \
    X(SRW_FINAL, "W_FINAL", "final")                                                                                 \
    X(SRW_NOT_FOUND, "W_NOT_FOUND", "nf")                                                                            \
    X(SRW_BUSY, "W_BUSY", "busy")                                                                                    \
    X(SRW_BLOCKED, "W_BLOCKED", "blocked")                                                                           \
    X(SRW_WAIT, "W_WAIT", "wait")                                                                                    \
    X(SRW_PACE, "W_PACE", "pace")                                                                                    \
    X(SRW_RETRY, "W_RETRY", "retry")                                                                                 \
    X(SRW_KEY, "W_KEY", "key")                                                                                       \
    X(SRW_BUDGET, "W_BUDGET", "budget")                                                                              \
    X(SRW_PLAN, "W_PLAN", "plan")                                                                                    \
    X(SRW_SEED, "W_SEED", "seed")                                                                                    \
    X(SRW_CLIENT, "W_CLIENT", "client")                                                                              \
    X(SRW_EARLY, "W_EARLY", "early")                                                                                 \
    X(SRW_LAST, "W_LAST", "last")

#define STATE_REDIS_WORD_ENUM(e, name, word) e,
enum state_redis_word { STATE_REDIS_WORDS(STATE_REDIS_WORD_ENUM) SRW_N };
#undef STATE_REDIS_WORD_ENUM

/* Which word of a claim's answer w (len bytes) is; SRW_N for none. Can't
 * fail. */
enum state_redis_word state_redis_word_of(const char *w, size_t len);

/* Write "local MSG_FINAL, ... = 'F', ...\n" (STATE_REDIS_MSG_LETTERS) and
 * the same of the claim's words (STATE_REDIS_WORDS) into buf, for the
 * scripts; its length, or -1 when buf is too small. Can't fail otherwise. */
int state_redis_msg_lua(char *buf, size_t len);
#define STATE_REDIS_MSG_LUA_MAX 1024 /* holds it (test_state_redis_msg) */

/* Read one published line (len bytes, not NUL-terminated) into *m.
 * false, and *m unspecified, for anything but the forms above. This
 * function can't fail otherwise. */
bool state_redis_msg_parse(const char *s, size_t len, struct state_redis_msg *m);

#define STATE_REDIS_ADDR_MAX 46 /* INET6_ADDRSTRLEN: an address as text, its NUL included */

/* A Sentinel's answer to SENTINEL get-master-addr-by-name, its two
 * strings: ip (iplen bytes) must be an IPv4 or IPv6 address (kembali never
 * resolves a name on its loop), port (portlen bytes) 1 to 65535 in decimal.
 * NULL with the address in out (STATE_REDIS_ADDR_MAX bytes) and *port_out,
 * else the reason, in words, and nothing written. Can't fail otherwise. */
const char *state_redis_master_addr(const char *ip, size_t iplen, const char *port, size_t portlen, char *out,
                                    int *port_out);

/* The order Sentinels are asked in (order[0..n-1], a permutation): the one
 * at position pos goes to the front (front: it answered) or to the back (it
 * named a server that is not a master); the others keep their order. pos
 * out of 0..n-1: nothing changes. Can't fail. */
void state_redis_order_move(int *order, int n, int pos, bool front);

#endif
