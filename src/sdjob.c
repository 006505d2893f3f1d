/* sdjob.c - see sdjob.h. */
#include "sdjob.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#define SDJOB_DEST "org.freedesktop.systemd1"

/* A job type as systemd names it (its job_type_to_string): a stop, or
 * one of the kinds that start the unit again once it is down. */
static enum sdjob classify(const char *type)
{
    if (strcmp(type, "stop") == 0)
        return SDJOB_STOP;
    if (strcmp(type, "restart") == 0 || strcmp(type, "try-restart") == 0 || strcmp(type, "reload-or-restart") == 0)
        return SDJOB_RESTART;
    return SDJOB_UNKNOWN; /* start, verify-active, reload, ...: not a stop we know */
}

static enum sdjob failed(char *err, size_t errlen, const char *what, int r, const sd_bus_error *e)
{
    snprintf(err, errlen, "%s: %s", what,
             e != NULL && sd_bus_error_is_set(e) && e->message != NULL ? e->message : strerror(r < 0 ? -r : r));
    return SDJOB_UNKNOWN;
}

enum sdjob sdjob_current(int timeout_ms, char *err, size_t errlen)
{
    sd_bus *bus = NULL;
    sd_bus_message *reply = NULL;
    sd_bus_error e = SD_BUS_ERROR_NULL;
    char *unit = NULL, *jtype = NULL;
    enum sdjob out = SDJOB_UNKNOWN;
    err[0] = '\0';
    int r = sd_bus_open_system(&bus);
    if (r < 0) {
        failed(err, errlen, "the system bus", r, NULL);
        goto done;
    }
    sd_bus_set_method_call_timeout(bus, (uint64_t)(timeout_ms > 0 ? timeout_ms : 1) * 1000);
    r = sd_bus_call_method(bus, SDJOB_DEST, "/org/freedesktop/systemd1", SDJOB_DEST ".Manager", "GetUnitByPID", &e,
                           &reply, "u", (uint32_t)getpid());
    const char *path = NULL;
    if (r < 0 || sd_bus_message_read(reply, "o", &path) < 0 || path == NULL) {
        failed(err, errlen, "GetUnitByPID", r, &e);
        goto done;
    }
    unit = strdup(path);
    sd_bus_message_unref(reply);
    reply = NULL;
    if (unit == NULL) {
        failed(err, errlen, "GetUnitByPID", -ENOMEM, NULL);
        goto done;
    }
    r = sd_bus_get_property(bus, SDJOB_DEST, unit, SDJOB_DEST ".Unit", "Job", &e, &reply, "(uo)");
    uint32_t id = 0;
    const char *jpath = NULL;
    if (r < 0 || sd_bus_message_read(reply, "(uo)", &id, &jpath) < 0) {
        failed(err, errlen, "the unit's Job", r, &e);
        goto done;
    }
    if (id == 0) {
        out = SDJOB_NONE;
        goto done;
    }
    r = sd_bus_get_property_string(bus, SDJOB_DEST, jpath, SDJOB_DEST ".Job", "JobType", &e, &jtype);
    if (r < 0 || jtype == NULL) {
        failed(err, errlen, "the job's JobType", r, &e);
        goto done;
    }
    out = classify(jtype);
    if (out == SDJOB_UNKNOWN)
        snprintf(err, errlen, "job type %s", jtype);
done:
    free(jtype);
    free(unit);
    sd_bus_message_unref(reply);
    sd_bus_error_free(&e);
    sd_bus_flush_close_unref(bus);
    return out;
}

const char *sdjob_name(enum sdjob j)
{
    switch (j) {
    case SDJOB_NONE:
        return "none";
    case SDJOB_STOP:
        return "stop";
    case SDJOB_RESTART:
        return "restart";
    case SDJOB_UNKNOWN:
        break;
    }
    return "unknown";
}
