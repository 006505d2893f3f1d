/* upgrade.h - SIGUSR2: start the program file again and hand it the requests in hand.
 *
 * The old process (upgrade_start) starts its program file (the path it
 * was started as, so after a package upgrade the new version) with the
 * same arguments, its listening socket inherited and one end of a Unix
 * SOCK_SEQPACKET socket pair, named in the environment
 * (KEMBALI_UPGRADE_FD, KEMBALI_UPGRADE_LISTEN, KEMBALI_UPGRADE_FROM).
 * The new one loads its configuration and state, accepts on the socket
 * and says it is ready (or says why it refuses, and exits). Then the old
 * one stops accepting and starting reads, and hands over each connection
 * it can (front_handover) with its record (handover.h) in a batch; the new
 * one confirms the batch, the old one lets go of them and says so, and only
 * then does the new one touch any of them (so a confirmation that comes
 * too late leaves each connection with one process only). Connections whose request was still arriving
 * follow in later batches; the old process exits once it has nothing left
 * (its reads in flight ended and recorded) and within UPGRADE_EXIT_MS.
 * A new process that refuses, dies or does not answer in time is killed
 * and the old one keeps serving everything. docs/handover.md has the
 * whole exchange.
 *
 * The messages: new -> old 'R' (ready; u32 pid, u8 record format, u16
 * state layout, u8 flags: 1, it waits for 'C'), 'F' (refused; the
 * reason), 'A' (a batch confirmed; u32 count); old -> new 'H' (a record,
 * its connection attached with SCM_RIGHTS), 'K' (a cached final), 'E' (end
 * of a batch; u32 count, u8 1 when a 'C' follows its 'A'), 'C' (the
 * confirmed batch is the new one's). A release before sends and expects
 * neither the flag nor 'C': the new one then takes a batch at its 'A'. */
#ifndef KEMBALI_UPGRADE_H
#define KEMBALI_UPGRADE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "front.h"
#include "loop.h"
#include "serve.h"

#define UPGRADE_READY_MS 20000  /* the most a new process may take to be ready */
#define UPGRADE_ACK_MS 3000     /* ... and to confirm a batch */
#define UPGRADE_EXIT_MS 4500    /* the old process exits this long after the handover began, at the latest */

struct upgrade;

/* What the environment says when this process is a successor. */
struct upgrade_env {
    int chan;       /* the socket to the old process */
    int listen_fd;  /* the listening socket, inherited */
    long from;      /* the old process's pid */
};

/* Is this process started by upgrade_start()? Reads and removes the
 * KEMBALI_UPGRADE_* variables; true with *e filled when they are all
 * there and valid. This function can't fail. */
bool upgrade_env_take(struct upgrade_env *e);

/* A successor that cannot start says why to the old process (which logs
 * it and keeps serving). Can't fail (a gone old process is ignored). */
void upgrade_refuse(int chan, const char *why);

/* The upgrade machinery of this process, on loop l with front f and
 * handler s. `prog` is the program file to start (absolute), argv the
 * arguments to start it with (both outlive it). NULL when out of memory. */
struct upgrade *upgrade_new(struct loop *l, struct front *f, struct serve *s, const char *prog, char *const *argv,
                            int listen_fd);

/* SIGUSR2: start the successor. Returns 0 (what follows is logged), or -1
 * with a reason in err (nothing started; an upgrade already under way). */
int upgrade_start(struct upgrade *u, char *err, size_t errlen);

/* This process is the successor of e->from: say ready on e->chan and take
 * the batches that come on it (on the loop). Returns 0, or -1 with a
 * reason in err (the old process then keeps serving). */
int upgrade_successor(struct upgrade *u, const struct upgrade_env *e, char *err, size_t errlen);

/* After each loop turn of the old process: hand over what can go now
 * (requests that finished arriving). True once the old process is done:
 * everything handed over or answered, its reads ended, or its time is up.
 * False while no handover has happened. */
bool upgrade_tick(struct upgrade *u);

/* The successor's pid once a handover happened (else 0). */
pid_t upgrade_successor_pid(const struct upgrade *u);

/* Tests only (kembali-testing's KEMBALI_TEST_UPGRADE_LATE_ACK): take the
 * confirmation of every batch after the first as come too late, as a slow
 * successor's would; the successor must then touch none of it. This
 * function can't fail. */
void upgrade_test_late_ack(struct upgrade *u);

/* Stopping (SIGTERM): a successor still starting is killed. Free u. */
void upgrade_free(struct upgrade *u);

#endif
