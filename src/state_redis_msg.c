/* state_redis_msg.c - see state_redis_msg.h. */
#include "state_redis_msg.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ids.h"
#include "util.h"

#define MSG_LETTER(kind, name, letter) {kind, name, letter},
static const struct {
    enum state_redis_msg_kind kind;
    const char *name, *letter;
} letters[] = {STATE_REDIS_MSG_LETTERS(MSG_LETTER)};
#undef MSG_LETTER
#define N_LETTERS (sizeof letters / sizeof letters[0])

#define WORD(e, name, word) {name, word},
static const struct {
    const char *name, *word;
} words[SRW_N] = {STATE_REDIS_WORDS(WORD)};
#undef WORD

enum state_redis_word state_redis_word_of(const char *w, size_t len)
{
    for (int i = 0; i < SRW_N; i++)
        if (strlen(words[i].word) == len && memcmp(words[i].word, w, len) == 0)
            return (enum state_redis_word)i;
    return SRW_N;
}

/* "local A, B = 'x', 'y'\n" for n names and values (name(i), value(i))
 * at buf + *at; false when it does not fit. */
static bool lua_locals(char *buf, size_t len, size_t *at, size_t n, const char *(*name)(size_t),
                       const char *(*value)(size_t))
{
    for (size_t i = 0; i < 2 * n + 1; i++) {
        int k;
        if (i < n)
            k = snprintf(buf + *at, len - *at, "%s%s", i == 0 ? "local " : ", ", name(i));
        else if (i < 2 * n)
            k = snprintf(buf + *at, len - *at, "%s'%s'", i == n ? " = " : ", ", value(i - n));
        else
            k = snprintf(buf + *at, len - *at, "\n");
        if (k < 0 || (size_t)k >= len - *at)
            return false;
        *at += (size_t)k;
    }
    return true;
}

static const char *letter_name(size_t i)
{
    return letters[i].name;
}

static const char *letter_value(size_t i)
{
    return letters[i].letter;
}

static const char *word_name(size_t i)
{
    return words[i].name;
}

static const char *word_value(size_t i)
{
    return words[i].word;
}

int state_redis_msg_lua(char *buf, size_t len)
{
    size_t at = 0;
    if (len > 0)
        buf[0] = '\0';
    if (!lua_locals(buf, len, &at, N_LETTERS, letter_name, letter_value) ||
        !lua_locals(buf, len, &at, SRW_N, word_name, word_value))
        return -1;
    return (int)at;
}

bool state_redis_msg_parse(const char *s, size_t len, struct state_redis_msg *m)
{
    char buf[256];
    if (len >= sizeof buf || memchr(s, '\0', len) != NULL)
        return false;
    memcpy(buf, s, len);
    buf[len] = '\0';
    /* fields separated by one space each: 4, or 5 with a word */
    char *f[6];
    int n = 0;
    for (char *p = buf; n < 6;) {
        f[n++] = p;
        char *sp = strchr(p, ' ');
        if (sp == NULL)
            break;
        *sp = '\0';
        p = sp + 1;
    }
    if (n < 2 || n > 5 || strlen(f[0]) != 1)
        return false;
    memset(m, 0, sizeof *m);
    size_t which = 0;
    while (which < N_LETTERS && letters[which].letter[0] != f[0][0])
        which++;
    if (which == N_LETTERS)
        return false;
    m->kind = letters[which].kind;
    uint8_t k[16];
    if (m->kind == STATE_REDIS_MSG_SEED) { /* a key's count found gone: send ours (budget.h) */
        if (n != 2 || !ids_unhex(f[1], strlen(f[1]), k, 16))
            return false;
        m->kind = STATE_REDIS_MSG_SEED;
        util_copy(m->key.hex, sizeof m->key.hex, f[1]);
        return true;
    }
    if (m->kind == STATE_REDIS_MSG_READ) { /* a read granted: its name, 16 hex digits ':' its time */
        if (n != 3)
            return false; /* before f[2] is looked at: it is set only with 3 fields */
        size_t nl = strlen(f[2]);
        if (!ids_unhex(f[1], strlen(f[1]), k, 16) || nl < 18 || nl > 16 + 1 + 20 || f[2][16] != ':' ||
            !ids_unhex(f[2], 16, k, 8) || strspn(f[2] + 17, "0123456789") != nl - 17)
            return false;
        m->kind = STATE_REDIS_MSG_READ;
        util_copy(m->key.hex, sizeof m->key.hex, f[1]);
        util_copy(m->id, sizeof m->id, f[2]);
        return true;
    }
    if (n < 4)
        return false;
    bool worded = m->kind == STATE_REDIS_MSG_FINAL || m->kind == STATE_REDIS_MSG_STATUS;
    if (n != (worded ? 5 : 4))
        return false;
    if (!ids_unhex(f[1], strlen(f[1]), k, 16))
        return false;
    util_copy(m->key.hex, sizeof m->key.hex, f[1]);
    if (m->kind == STATE_REDIS_MSG_BLOCK ? !ids_unhex(f[2], strlen(f[2]), k, 16) : !ids_valid_id(f[2]))
        return false;
    util_copy(m->id, sizeof m->id, f[2]);
    size_t nd = strlen(f[3]);
    if (nd == 0 || nd > 9 || strspn(f[3], "0123456789") != nd)
        return false;
    m->ms = strtoll(f[3], NULL, 10);
    if (m->ms > STATE_REDIS_MSG_MAX_MS)
        return false;
    if (worded) {
        if (!ids_valid_word(f[4], strlen(f[4])))
            return false;
        util_copy(m->word, sizeof m->word, f[4]);
    }
    return true;
}

const char *state_redis_master_addr(const char *ip, size_t iplen, const char *port, size_t portlen, char *out,
                                    int *port_out)
{
    char a[STATE_REDIS_ADDR_MAX], p[8];
    struct in6_addr a6;
    if (iplen == 0 || iplen >= sizeof a || memchr(ip, '\0', iplen) != NULL)
        return "the Sentinel's answer is not an address";
    memcpy(a, ip, iplen);
    a[iplen] = '\0';
    if (inet_pton(AF_INET, a, &a6) != 1 && inet_pton(AF_INET6, a, &a6) != 1)
        return "the Sentinel names a host name, not an address (kembali takes addresses)";
    if (portlen == 0 || portlen >= sizeof p || strspn(port, "0123456789") < portlen)
        return "the Sentinel's answer has no valid port";
    memcpy(p, port, portlen);
    p[portlen] = '\0';
    long n = strtol(p, NULL, 10);
    if (n < 1 || n > 65535)
        return "the Sentinel's answer has no valid port";
    memcpy(out, a, iplen + 1);
    *port_out = (int)n;
    return NULL;
}

void state_redis_order_move(int *order, int n, int pos, bool front)
{
    if (pos < 0 || pos >= n)
        return;
    int moved = order[pos];
    if (front) {
        for (int k = pos; k > 0; k--)
            order[k] = order[k - 1];
        order[0] = moved;
    } else {
        for (int k = pos; k + 1 < n; k++)
            order[k] = order[k + 1];
        order[n - 1] = moved;
    }
}
