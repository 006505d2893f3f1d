/* state_redis_check.h - a blocking probe of the configured Redis, for
 * --check-config.
 *
 * Not the backend: state_redis.c speaks to Redis without ever blocking
 * (hiredis' async API on the event loop). This is one short-lived,
 * blocking connection, made and closed within the call, that tells an
 * operator whether the configured Redis answers and accepts the
 * configuration's password and database (with Sentinels: what each
 * Sentinel names, and whether that master says it is one). Redis being
 * down is not a configuration error (kembali runs without it,
 * docs/redis.md); a refused password or database is. */
#ifndef KEMBALI_STATE_REDIS_CHECK_H
#define KEMBALI_STATE_REDIS_CHECK_H

#include <stddef.h>
#include <stdio.h>

#include "config.h"

#define STATE_REDIS_CHECK_OK 0          /* reachable, AUTH and SELECT accepted, PING answered */
#define STATE_REDIS_CHECK_UNREACHABLE 1 /* cannot connect, no answer in time, not a Redis, or busy loading */
#define STATE_REDIS_CHECK_REFUSED 2     /* the password or the database refused */

/* Connect to the Redis `r` names (r->on must be true: TCP r->host:r->port
 * or the Unix socket r->path; with Sentinels the answer is UNREACHABLE:
 * use state_redis_sentinel_master, then state_redis_check_master), then AUTH r->password when there is one,
 * SELECT r->db when it is not 0, and PING; all of it within timeout_ms
 * (connect included; a host name's lookup is not bounded by it).
 *
 * Returns STATE_REDIS_CHECK_OK (0; why is ""), STATE_REDIS_CHECK_UNREACHABLE
 * (1: why says what failed, e.g. "cannot connect: Connection refused" or
 * "no answer to PING within 1000 ms"), or STATE_REDIS_CHECK_REFUSED (2: an
 * error reply to AUTH (WRONGPASS, ERR: no password configured), to SELECT
 * (a database out of range), or NOAUTH/DENIED (Redis wants a password the
 * configuration does not give); why says which command and quotes Redis's
 * reply). Transient error replies (LOADING, BUSY, MASTERDOWN, TRYAGAIN)
 * count as unreachable. why (capacity whylen) never holds the password: a
 * reply quoting it is not quoted. The address is not in why (the caller
 * names it: config_redis_address).
 *
 * Blocking; meant for the command line (--check-config). Thread-safe: a
 * SIGPIPE from a connection Redis closed is blocked in the calling thread
 * and discarded, the thread's signal mask restored. */
int state_redis_check(const struct config_redis *r, int timeout_ms, char *why, size_t whylen);

/* With Sentinels (r->sentinel): ask them in turn, each within timeout_ms
 * (AUTH with r->sentinel_password when there is one, then SENTINEL
 * get-master-addr-by-name r->master), for the master's address: the
 * first answer goes to ip (capacity iplen) and *port, and *which is the
 * index of the Sentinel that gave it (-1: none). With out (--check-config)
 * every Sentinel is asked and each gets a line on out ("kembali: redis
 * Sentinel H:P: master M is IP:PORT", or "kembali: warning: ..." /
 * "kembali: error: ..."); without, the first answer ends it.
 *
 * Returns STATE_REDIS_CHECK_OK (a master named, every Sentinel asked
 * answered), STATE_REDIS_CHECK_UNREACHABLE (one did not answer: why names
 * it; when none answered, nothing is named), or STATE_REDIS_CHECK_REFUSED
 * (a Sentinel refused the password, does not know the master, or names a
 * host name rather than an address). A master
 * may be named whatever the verdict (*which >= 0). Blocking; SIGPIPE as
 * state_redis_check. */
int state_redis_sentinel_master(const struct config_redis *r, int timeout_ms, char *ip, size_t iplen, int *port,
                                int *which, FILE *out, char *why, size_t whylen);

/* The probe of state_redis_check, of the Redis at ip:port (NULL: r's Unix
 * socket) with r's password and db; with role (capacity 16) also ROLE,
 * whose first word ("master", "slave") goes there. Same verdicts. */
int state_redis_check_master(const struct config_redis *r, const char *ip, int port, int timeout_ms, char *role,
                             char *why, size_t whylen);

#endif
