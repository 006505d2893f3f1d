/* fdstore.c - see fdstore.h. */
#include "fdstore.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "dynbuf.h"
#include "handover.h"
#include "log.h"
#include "util.h"

#define FDSTORE_DESC_MAX (256u << 20) /* the description's ceiling: 10,000 records take about 1 MB */

bool fdstore_usable(void)
{
    const char *ns = getenv("NOTIFY_SOCKET"), *max = getenv("FDSTORE");
    return ns != NULL && *ns != '\0' && (max == NULL || atol(max) > 0);
}

void fdstore_notify(const char *what)
{
    sd_notify(0, what);
}

static bool listening(int fd)
{
    int v = 0;
    socklen_t len = sizeof v;
    return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) == 0 && v;
}

int fdstore_scan(struct fdstore_got *g)
{
    *g = (struct fdstore_got){.listen_fd = -1, .desc_fd = -1};
    char **names = NULL;
    int n = sd_listen_fds_with_names(1, &names); /* 1: LISTEN_* are cleared */
    if (n <= 0)
        return 0;
    size_t maxidx = 0;
    for (int i = 0; i < n; i++) {
        const char *nm = names != NULL && names[i] != NULL ? names[i] : "";
        if (strncmp(nm, FDSTORE_CONN_PREFIX, strlen(FDSTORE_CONN_PREFIX)) == 0) {
            size_t idx = strtoul(nm + strlen(FDSTORE_CONN_PREFIX), NULL, 10);
            if (idx + 1 > maxidx && idx < (1u << 24))
                maxidx = idx + 1;
        }
    }
    if (maxidx > 0) {
        g->conns = malloc(maxidx * sizeof *g->conns);
        if (g->conns == NULL) {
            for (int i = 0; names != NULL && i < n; i++)
                free(names[i]);
            free(names);
            return -1;
        }
        for (size_t i = 0; i < maxidx; i++)
            g->conns[i] = -1;
        g->nconns = maxidx;
    }
    for (int i = 0; i < n; i++) {
        int fd = SD_LISTEN_FDS_START + i;
        const char *nm = names != NULL && names[i] != NULL ? names[i] : "";
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        if (strcmp(nm, FDSTORE_DESC_NAME) == 0 && g->desc_fd < 0) {
            g->desc_fd = fd;
        } else if (strncmp(nm, FDSTORE_CONN_PREFIX, strlen(FDSTORE_CONN_PREFIX)) == 0) {
            size_t idx = strtoul(nm + strlen(FDSTORE_CONN_PREFIX), NULL, 10);
            if (idx < g->nconns && g->conns[idx] < 0)
                g->conns[idx] = fd;
            else
                close(fd);
        } else if (g->listen_fd < 0 && listening(fd)) {
            g->listen_fd = fd;
        } else {
            close(fd); /* not ours to use */
        }
    }
    for (int i = 0; names != NULL && i < n; i++)
        free(names[i]);
    free(names);
    return 0;
}

/* Forget a stored descriptor's name at systemd's. */
static void store_remove(const char *name)
{
    char msg[128];
    snprintf(msg, sizeof msg, "FDSTOREREMOVE=1\nFDNAME=%s", name);
    sd_notify(0, msg);
}

long fdstore_take(struct fdstore_got *g, struct front *f, struct serve *s)
{
    int64_t t0 = util_mono_ms();
    long taken = 0, held = 0, bad = 0;
    uint8_t *buf = NULL;
    size_t len = 0;
    struct stat st;
    if (g->desc_fd >= 0 && fstat(g->desc_fd, &st) == 0 && st.st_size > 0 && (uint64_t)st.st_size <= FDSTORE_DESC_MAX) {
        len = (size_t)st.st_size;
        buf = malloc(len);
        size_t got = 0;
        while (buf != NULL && got < len) {
            ssize_t r = pread(g->desc_fd, buf + got, len - got, (off_t)got);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        if (got < len)
            len = 0;
    }
    size_t off = 0;
    uint32_t idx;
    const uint8_t *rec;
    size_t rl;
    while (buf != NULL && handover_next(buf, len, &off, &idx, &rec, &rl) == 1) {
        struct handover_rec r;
        char why[128], err[128];
        if (idx == FDSTORE_FACT && handover_decode(rec, rl, &r, why, sizeof why) == 0 && r.kind == HANDOVER_FACT) {
            serve_take_fact(s, &r);
            continue;
        }
        if (idx >= g->nconns || g->conns[idx] < 0 || handover_decode(rec, rl, &r, why, sizeof why) != 0 ||
            r.kind == HANDOVER_FACT) {
            bad++;
            continue;
        }
        int fd = g->conns[idx];
        g->conns[idx] = -1;
        char name[32];
        snprintf(name, sizeof name, FDSTORE_CONN_PREFIX "%u", idx);
        store_remove(name);
        struct front_req *fr;
        if (front_adopt(f, fd, &r, &fr, err, sizeof err) != 0) {
            bad++;
            continue;
        }
        taken++;
        if (fr != NULL && serve_adopt(s, fr, &r) == 0)
            held++;
    }
    free(buf);
    for (size_t i = 0; i < g->nconns; i++) /* stored without a record: nobody can answer them */
        if (g->conns[i] >= 0) {
            char name[32];
            snprintf(name, sizeof name, FDSTORE_CONN_PREFIX "%zu", i);
            store_remove(name);
            close(g->conns[i]);
            bad++;
        }
    free(g->conns);
    g->conns = NULL;
    g->nconns = 0;
    if (g->desc_fd >= 0) {
        store_remove(FDSTORE_DESC_NAME);
        close(g->desc_fd);
        g->desc_fd = -1;
        struct log_line l;
        log_begin(&l, bad > 0 ? LOG_LV_WARN : LOG_LV_INFO, "handover");
        log_str(&l, "from", "systemd");
        log_int(&l, "connections", taken);
        log_int(&l, "held", held);
        if (bad > 0)
            log_int(&l, "failed", bad);
        log_int(&l, "ms", (long long)(util_mono_ms() - t0));
        log_end(&l);
    }
    return taken;
}

/* front_handover's emit: the connection to the store, its record to the
 * description. */
struct saving {
    struct dynbuf desc;
    uint32_t next;
    uint8_t rec[HANDOVER_REC_MAX + FRONT_HANDOVER_OUT_MAX];
};

/* serve_facts' emit: a record with no connection (FDSTORE_FACT). */
static int emit_fact(void *ctx, const struct handover_rec *rec)
{
    struct saving *sv = ctx;
    size_t n = handover_encode(rec, sv->rec, sizeof sv->rec);
    uint8_t hdr[8];
    handover_frame(hdr, FDSTORE_FACT, (uint32_t)n);
    if (n == 0 || dynbuf_add(&sv->desc, hdr, sizeof hdr) != DYNBUF_OK ||
        dynbuf_add(&sv->desc, sv->rec, n) != DYNBUF_OK)
        return -1;
    return 0;
}

static int emit_store(void *ctx, int fd, const struct handover_rec *rec)
{
    struct saving *sv = ctx;
    size_t n = handover_encode(rec, sv->rec, sizeof sv->rec);
    uint8_t hdr[8];
    handover_frame(hdr, sv->next, (uint32_t)n);
    if (n == 0 || dynbuf_add(&sv->desc, hdr, sizeof hdr) != DYNBUF_OK ||
        dynbuf_add(&sv->desc, sv->rec, n) != DYNBUF_OK)
        return -1;
    char msg[64];
    snprintf(msg, sizeof msg, "FDSTORE=1\nFDNAME=" FDSTORE_CONN_PREFIX "%u", sv->next);
    if (sd_pid_notify_with_fds(0, 0, msg, &fd, 1) <= 0)
        return -1;
    sv->next++;
    return 0;
}

/* A memfd (or, where it is not allowed, an unlinked temporary file)
 * holding n bytes of b. -1 on failure. */
static int desc_file(const void *b, size_t n)
{
    int fd = memfd_create(FDSTORE_DESC_NAME, MFD_CLOEXEC);
    if (fd < 0) {
        FILE *t = tmpfile();
        fd = t != NULL ? dup(fileno(t)) : -1;
        if (t != NULL)
            fclose(t);
    }
    if (fd < 0)
        return -1;
    const uint8_t *p = b;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            close(fd);
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return fd;
}

long fdstore_save(struct front *f, struct serve *s, char *err, size_t errlen)
{
    struct saving *sv = calloc(1, sizeof *sv);
    if (sv == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    dynbuf_init(&sv->desc, FDSTORE_DESC_MAX);
    front_pause_accepting(f);
    serve_handing(s, true);
    long n = front_handover(f, emit_store, sv);
    if (n > 0) /* the cached finals, for a successor of another layout (its own state file) */
        serve_facts(s, emit_fact, sv);
    int dfd = n > 0 ? desc_file(dynbuf_ptr(&sv->desc), dynbuf_len(&sv->desc)) : -1;
    if (n > 0 && (dfd < 0 || sd_pid_notify_with_fds(0, 0, "FDSTORE=1\nFDNAME=" FDSTORE_DESC_NAME, &dfd, 1) <= 0)) {
        /* the connections went without their description: the next process
         * cannot answer them, so they are ours to answer; forget them there */
        snprintf(err, errlen, "the description could not be stored");
        for (uint32_t i = 0; i < sv->next; i++) {
            char name[32];
            snprintf(name, sizeof name, FDSTORE_CONN_PREFIX "%u", i);
            store_remove(name);
        }
        front_handover_rollback(f);
        n = -1;
    } else if (n > 0) {
        front_handover_commit(f);
    } else if (n < 0) {
        snprintf(err, errlen, "systemd did not take a connection (is FileDescriptorStoreMax= set?)");
        for (uint32_t i = 0; i < sv->next; i++) {
            char name[32];
            snprintf(name, sizeof name, FDSTORE_CONN_PREFIX "%u", i);
            store_remove(name);
        }
    }
    if (dfd >= 0)
        close(dfd);
    dynbuf_free(&sv->desc);
    free(sv);
    return n;
}
