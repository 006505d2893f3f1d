/* state_client.c - clients: the 404s charged to an address and its
 * reads in flight of ids nobody knew, its block, and the address's hash. */
#include "state_private.h"

#include <string.h>
#include <arpa/inet.h>

#include "rules.h"
#include "siphash.h"
#include "util.h"

/* ---- clients: 404s charged to an address ---- */

bool st_client_none(const struct state_client *c)
{
    static const struct state_client zero;
    return memcmp(c->b, zero.b, sizeof c->b) == 0;
}

int32_t st_client_home(const struct state *st, const uint8_t *id)
{
    uint32_t v;
    memcpy(&v, id + 4, sizeof v); /* a keyed hash already */
    return (int32_t)(v % (uint32_t)st->cln);
}

/* The id of c's tier t (0 the address, 1 its /56, 2 its /48), NULL when
 * c has none there (anything but IPv6, or no client). */
static const uint8_t *client_tier(const struct state_client *c, int t)
{
    static const uint8_t zero[16];
    const uint8_t *b = t == 0 ? c->b : c->wide[t - 1];
    return memcmp(b, zero, 16) == 0 ? NULL : b;
}

/* Forget the reads in flight whose lease ended (a process that died
 * mid-read, a finish that never came). */
static void client_fly_expire(struct st_client *c, int64_t now)
{
    int keep = 0;
    for (int i = 0; i < c->nfly; i++)
        if (c->fly_until[i] > now) {
            c->fly_what[keep] = c->fly_what[i];
            c->fly_until[keep] = c->fly_until[i];
            keep++;
        }
    c->nfly = (uint8_t)keep;
}

/* Is the entry worth keeping at `now`? A block, a 404 inside the window,
 * or a read in flight. */
static bool client_busy(const struct st_client *c, int64_t now)
{
    for (int i = 0; i < c->nfly; i++)
        if (c->fly_until[i] > now)
            return true;
    return c->blocked_until > now || (c->nhits > 0 && c->hit_at[c->nhits - 1] > now - STATE_CLIENT_WINDOW_MS);
}

/* Find the entry of id (of tier `tier`) among its ways; with `create`,
 * make one: a free way, else the least recently used idle one, else the
 * least recently used that is not blocked (its 404s forgotten: only a
 * flood of addresses in one set does that). NULL when every way holds a
 * blocked client (client_full). */
static struct st_client *client_get(struct state *st, const uint8_t *id, int tier, int64_t now, bool create)
{
    int32_t home = st_client_home(st, id), ways = st->cln < CLIENT_WAYS ? st->cln : CLIENT_WAYS;
    int32_t free_i = -1, idle = -1, open = -1;
    for (int32_t w = 0; w < ways; w++) {
        int32_t i = (home + w) % st->cln;
        struct st_client *c = &st->clients[i];
        if (c->used && memcmp(c->id, id, sizeof c->id) == 0)
            return c;
        if (!c->used) {
            if (free_i < 0)
                free_i = i;
        } else if (!client_busy(c, now)) {
            if (idle < 0 || c->last_used < st->clients[idle].last_used)
                idle = i;
        } else if (c->blocked_until <= now) {
            if (open < 0 || c->last_used < st->clients[open].last_used)
                open = i;
        }
    }
    if (!create)
        return NULL;
    int32_t i = free_i >= 0 ? free_i : idle >= 0 ? idle : open;
    if (i < 0) {
        st->h->client_full++;
        return NULL;
    }
    struct st_client *c = &st->clients[i];
    memset(c, 0, sizeof *c);
    c->used = 1;
    c->tier = (uint8_t)tier;
    memcpy(c->id, id, sizeof c->id);
    c->last_used = now;
    return c;
}

/* Forget the 404s that left the window, and (what != 0) an earlier 404 of
 * `what`. */
static void client_hits_expire(struct st_client *c, uint32_t what, int64_t now)
{
    int keep = 0;
    for (int i = 0; i < c->nhits; i++)
        if (c->hit_at[i] > now - STATE_CLIENT_WINDOW_MS && (what == 0 || c->hit_what[i] != what)) {
            c->hit_what[keep] = c->hit_what[i];
            c->hit_at[keep] = c->hit_at[i];
            keep++;
        }
    c->nhits = (uint8_t)keep;
}

/* May entry c (not blocked) count one more read at `now` (st_client_fly's
 * rule for one tier, rules_client_next)? false with *until as
 * st_client_fly says. */
static bool client_may_fly(struct st_client *c, int64_t now, int64_t *until)
{
    client_fly_expire(c, now);
    client_hits_expire(c, 0, now);
    int64_t first = 0; /* the first read in flight to end */
    for (int i = 0; i < c->nfly; i++)
        if (first == 0 || c->fly_until[i] < first)
            first = c->fly_until[i];
    *until = rules_client_next(c->nhits + c->nfly, first, STATE_CLIENT_404S_AT(c->tier), STATE_CLIENT_RECHECK_MS, now);
    return *until <= now;
}

bool st_client_fly(struct state *st, const struct state_client *id, uint32_t what, int64_t lease_until,
                       int64_t now, int64_t *until)
{
    struct st_client *e[STATE_CLIENT_TIERS] = {NULL};
    int64_t blocked[STATE_CLIENT_TIERS] = {0};
    for (int t = 0; t < STATE_CLIENT_TIERS; t++) {
        const uint8_t *b = client_tier(id, t);
        if (b == NULL || (e[t] = client_get(st, b, t, now, true)) == NULL)
            continue; /* none there, or no room: not counted */
        e[t]->last_used = now;
        blocked[t] = e[t]->blocked_until;
    }
    if ((*until = rules_client_blocked(blocked, STATE_CLIENT_TIERS, now)) > 0)
        return false;
    for (int t = 0; t < STATE_CLIENT_TIERS; t++)
        if (e[t] != NULL && !client_may_fly(e[t], now, until))
            return false;
    for (int t = 0; t < STATE_CLIENT_TIERS; t++) {
        struct st_client *c = e[t];
        if (c == NULL)
            continue;
        c->fly_what[c->nfly] = what;
        c->fly_until[c->nfly] = lease_until;
        c->nfly++;
    }
    return true;
}

bool st_client_land(struct state *st, const struct state_client *id, uint32_t what, int64_t now)
{
    bool was = false;
    for (int t = 0; t < STATE_CLIENT_TIERS; t++) {
        const uint8_t *b = client_tier(id, t);
        struct st_client *c = b != NULL ? client_get(st, b, t, now, false) : NULL;
        if (c == NULL)
            continue;
        for (int i = 0; i < c->nfly; i++)
            if (c->fly_what[i] == what) {
                c->nfly--;
                c->fly_what[i] = c->fly_what[c->nfly];
                c->fly_until[i] = c->fly_until[c->nfly];
                was = true;
                break;
            }
    }
    return was;
}

/* Charge a 404 for `what` to entry c at `now`; true when this starts its
 * block. */
static bool client_charge_one(struct state *st, struct st_client *c, uint32_t what, int64_t now)
{
    if (c->blocked_until > now)
        return false;
    int allowance = STATE_CLIENT_404S_AT(c->tier);
    c->last_used = now;
    client_hits_expire(c, what, now);
    int keep = c->nhits;
    if (keep >= allowance) /* cannot happen: a full window blocks */
        keep = allowance - 1;
    c->hit_what[keep] = what;
    c->hit_at[keep] = now;
    c->nhits = (uint8_t)(keep + 1);
    if (!rules_client_blocks(c->blocked_until, c->nhits, allowance, now))
        return false;
    c->blocked_until = now + STATE_CLIENT_BLOCK_MS;
    c->nhits = 0;
    st->h->client_blocks++;
    return true;
}

bool st_client_charge(struct state *st, const struct state_client *id, uint32_t what, int64_t now)
{
    bool started = false;
    for (int t = 0; t < STATE_CLIENT_TIERS; t++) {
        const uint8_t *b = client_tier(id, t);
        struct st_client *c = b != NULL ? client_get(st, b, t, now, true) : NULL;
        if (c != NULL && client_charge_one(st, c, what, now))
            started = true;
    }
    return started;
}

/* One id re-hashed with the key: another client of each key (its charge
 * and block are the key's). */
static void client_keyed(const struct state *st, const struct state_key *key, const uint8_t *id, uint8_t *out)
{
    uint8_t buf[32];
    memcpy(buf, id, 16);
    memcpy(buf + 16, key->b, 16);
    uint8_t salt2[16];
    memcpy(salt2, st->h->salt, 16);
    salt2[5] ^= 0xa5; /* neither the address's hash nor a key id's */
    uint64_t x = siphash24(salt2, buf, sizeof buf);
    salt2[6] ^= 0x3c;
    uint64_t y = siphash24(salt2, buf, sizeof buf);
    memcpy(out, &x, 8);
    memcpy(out + 8, &y, 8);
    static const uint8_t zero[16];
    if (memcmp(out, zero, 16) == 0)
        out[0] = 1; /* all zero means "none" */
}

void state_client_id(const struct state *st, const struct state_key *key, const char *addr,
                     struct state_client *out)
{
    struct state_client a;
    state_client_hash(st->h->salt, addr, &a);
    memset(out, 0, sizeof *out);
    client_keyed(st, key, a.b, out->b);
    for (int t = 1; t < STATE_CLIENT_TIERS; t++)
        if (client_tier(&a, t) != NULL)
            client_keyed(st, key, a.wide[t - 1], out->wide[t - 1]);
}

/* The 16-byte hash of buf[0..n) under salt (never all zero). */
static void client_hash_buf(const uint8_t salt[16], const uint8_t *buf, size_t n, uint8_t *out)
{
    uint8_t salt2[16];
    memcpy(salt2, salt, 16);
    salt2[1] ^= 0xc1; /* not the key ids' hash */
    salt2[2] ^= 0x1e;
    uint64_t x = siphash24(salt2, buf, n);
    salt2[3] ^= 0x77;
    uint64_t y = siphash24(salt2, buf, n);
    memcpy(out, &x, 8);
    memcpy(out + 8, &y, 8);
    static const uint8_t zero[16];
    if (memcmp(out, zero, 16) == 0)
        out[0] = 1; /* all zero means "none" */
}

void state_client_hash(const uint8_t salt[16], const char *addr, struct state_client *out)
{
    /* the address as a client: IPv4 whole; IPv6 by its /64 (one site or
     * household, whose interface ids it chooses freely), and by its /56
     * and /48 (a site's or a tunnel's prefix: many /64s); an IPv4-mapped
     * IPv6 as its IPv4; anything else as written */
    uint8_t buf[1 + 64];
    size_t n;
    char a[64];
    memset(out, 0, sizeof *out);
    util_copy(a, sizeof a, addr != NULL ? addr : "");
    char *zone = strchr(a, '%');
    if (zone != NULL)
        *zone = '\0';
    struct in_addr v4;
    struct in6_addr v6;
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (inet_pton(AF_INET, a, &v4) == 1) {
        buf[0] = 4;
        memcpy(buf + 1, &v4, 4);
        n = 5;
    } else if (inet_pton(AF_INET6, a, &v6) == 1 && memcmp(v6.s6_addr, mapped, 12) == 0) {
        buf[0] = 4;
        memcpy(buf + 1, v6.s6_addr + 12, 4);
        n = 5;
    } else if (inet_pton(AF_INET6, a, &v6) == 1) {
        buf[0] = 6;
        memcpy(buf + 1, v6.s6_addr, 8);
        n = 9;
        /* the /56 and the /48: tagged apart from the /64 and each other */
        static const uint8_t tag[STATE_CLIENT_TIERS - 1] = {56, 48};
        for (int t = 0; t < STATE_CLIENT_TIERS - 1; t++) {
            uint8_t p[1 + 7];
            size_t len = (size_t)tag[t] / 8;
            p[0] = tag[t];
            memcpy(p + 1, v6.s6_addr, len);
            client_hash_buf(salt, p, 1 + len, out->wide[t]);
        }
    } else {
        buf[0] = 0;
        n = strlen(a);
        memcpy(buf + 1, a, n);
        n++;
    }
    client_hash_buf(salt, buf, n, out->b);
}

bool state_client_blocked(struct state *st, const struct state_client *c, int64_t now)
{
    if (st_client_none(c))
        return false;
    bool blocked = false;
    st_lock(st, now);
    for (int t = 0; t < STATE_CLIENT_TIERS && !blocked; t++) {
        const uint8_t *b = client_tier(c, t);
        const struct st_client *e = b != NULL ? client_get(st, b, t, now, false) : NULL;
        blocked = e != NULL && e->blocked_until > now;
    }
    st_unlock(st);
    return blocked;
}

void state_client_block(struct state *st, const struct state_client *client, int64_t until, int64_t now)
{
    if (st_client_none(client))
        return;
    if (until > now + STATE_CLIENT_BLOCK_MS)
        until = now + STATE_CLIENT_BLOCK_MS;
    if (until <= now)
        return;
    st_lock(st, now);
    struct st_client *c = client_get(st, client->b, 0, now, true); /* NULL: counted as client_full */
    if (c != NULL) {
        c->last_used = now;
        if (c->blocked_until <= now) { /* a block starts, as st_client_charge's */
            c->nhits = 0;
            st->h->client_blocks++;
        }
        st_pause_until(&c->blocked_until, until);
    }
    st_unlock(st);
}
