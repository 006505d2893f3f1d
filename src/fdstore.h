/* fdstore.h - a restart under systemd that loses no buyer: its file-descriptor store.
 *
 * With systemd's notify socket (Type=notify, FileDescriptorStoreMax= in
 * the unit), a process that stops (SIGTERM: `systemctl restart`, a
 * package upgrade's) hands its connections to systemd instead of
 * answering its held requests: each connection as FDSTORE=1 with
 * FDNAME=kc-N, and one memfd, FDNAME=kembali-handover, holding every
 * connection's record (handover.h), framed with its N. systemd passes them
 * all to the next process (LISTEN_FDS, LISTEN_FDNAMES, after the sockets
 * of its .socket unit), which takes them back as if it had accepted them,
 * removes them from the store (FDSTOREREMOVE=1) and says READY=1.
 * libsystemd speaks the protocol (sd_pid_notify_with_fds,
 * sd_listen_fds_with_names). docs/handover.md has the whole exchange. */
#ifndef KEMBALI_FDSTORE_H
#define KEMBALI_FDSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "front.h"
#include "serve.h"

#define FDSTORE_DESC_NAME "kembali-handover"
#define FDSTORE_CONN_PREFIX "kc-"
#define FDSTORE_FACT UINT32_MAX /* the fd index of a record without a connection (HANDOVER_FACT) */

/* What systemd passed at start (LISTEN_FDS): the listening socket, the
 * stored description and connections. */
struct fdstore_got {
    int listen_fd;      /* the first listening socket, or -1 */
    int desc_fd;        /* the description's memfd, or -1 */
    int *conns;         /* conns[N]: the fd named kc-N, or -1 */
    size_t nconns;
};

/* Is there a store to hand over to: NOTIFY_SOCKET set and $FDSTORE (set
 * by systemd 254 and later) not 0? This function can't fail. */
bool fdstore_usable(void);

/* Read what systemd passed (LISTEN_PID must be ours) into *g and clear
 * LISTEN_* from the environment; descriptors it does not know are
 * closed. Without any, g->listen_fd and g->desc_fd are -1. Returns 0, or
 * -1 when out of memory. */
int fdstore_scan(struct fdstore_got *g);

/* Take back the connections of g's description (the front adopts each,
 * the handler its held request), tell systemd to forget them, close what
 * is left of g and log one line. Returns how many were taken. */
long fdstore_take(struct fdstore_got *g, struct front *f, struct serve *s);

/* Stopping with a store: hand every connection that can go (front_handover)
 * to systemd, with the description. Returns how many went (those are
 * gone from f; the rest are answered as at any stop), or -1 with a
 * reason in err when nothing could be stored (all still here). */
long fdstore_save(struct front *f, struct serve *s, char *err, size_t errlen);

/* Tell systemd something (READY=1, MAINPID=...): sd_notify, a no-op
 * without NOTIFY_SOCKET. Can't fail. */
void fdstore_notify(const char *what);

#endif
