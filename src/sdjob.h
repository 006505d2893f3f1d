/* sdjob.h - what systemd is doing with this service: a restart or a stop.
 *
 * On SIGTERM under systemd, a restart (systemctl restart, a package
 * upgrade's) hands the requests in hand to the next process through the
 * file-descriptor store, but a stop must answer them: systemd closes what
 * the store holds once the unit is down, and a buyer would see its web
 * server's error page rather than "checking". SIGTERM says neither; the
 * job systemd is running on the unit does, and systemd tells it over the
 * system bus (libsystemd's sd-bus). */
#ifndef KEMBALI_SDJOB_H
#define KEMBALI_SDJOB_H

#include <stddef.h>

enum sdjob {
    SDJOB_UNKNOWN, /* the bus or systemd did not say (no bus, not a unit, an error, too slow) */
    SDJOB_NONE,    /* no job runs on the unit: the signal was sent by hand */
    SDJOB_STOP,    /* a stop (systemctl stop, a shutdown): nothing starts after */
    SDJOB_RESTART, /* a restart, try-restart or reload-or-restart that restarts */
};

/* The job systemd runs on this process's unit now, asked over the system
 * bus ($DBUS_SYSTEM_BUS_ADDRESS, else systemd's default): the unit by this
 * process's pid (GetUnitByPID), its Job property, that job's JobType.
 * Each call waits at most `timeout_ms` (three calls at most); any failure
 * is SDJOB_UNKNOWN, with what failed in err (NUL-terminated, errlen > 0).
 * Blocks: for the stop only. */
enum sdjob sdjob_current(int timeout_ms, char *err, size_t errlen);

/* "unknown", "none", "stop" or "restart", for the log. */
const char *sdjob_name(enum sdjob j);

#endif
