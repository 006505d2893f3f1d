/* kembali.c - main: command line, start-up, signals, reload, shutdown.
 *
 * The main thread owns the process: it loads the configuration, opens (or
 * takes over) the FastCGI socket, drops privileges, and runs the event loop
 * (loop.c) with the front (front.c), the request handler (serve.c) and the
 * resolver on it. Signals are blocked and read from a signalfd on the same
 * loop, so no handler ever runs inside library code: SIGHUP reloads,
 * SIGTERM/SIGINT stop, SIGUSR2 upgrades in place (upgrade.h). Started with no FastCGI socket but a CGI
 * environment, it answers that one request and exits. */
#define NO_FCGI_DEFINES 1
#include <arpa/inet.h>
#include <errno.h>
#include <fcgiapp.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "app.h"
#include "config.h"
#include "fdstore.h"
#include "front.h"
#include "hostreg.h"
#include "log.h"
#include "loop.h"
#include "notify.h"
#include "sdjob.h"
#include "serve.h"
#include "state.h"
#include "state_redis.h"
#include "state_redis_check.h"
#include "upgrade.h"
#include "util.h"

#ifndef KEMBALI_CONFIG_DEFAULT
#define KEMBALI_CONFIG_DEFAULT "/usr/local/etc/kembali/kembali.json"
#endif
#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "dev"
#endif

#define STOP_FLUSH_MS 500 /* at SIGTERM: the most we wait for answers to be taken */
#define CHECK_REDIS_MS 1000 /* --check-config: the most we wait for the Redis */
#define SDJOB_ASK_MS 500 /* at SIGTERM under systemd: the most each question to systemd waits */
#define ERRBUF 8192
#define SOCKET_MODE_DEFAULT 0660 /* --socket-mode: the web server's group may connect, nobody else */
#define SOCKET_BACKLOG 1024

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: kembali [--config FILE] [--listen ADDRESS [--socket-mode MODE]\n"
            "               [--socket-group GROUP]] [--user NAME] [--log FILE]\n"
            "               [--check-config] [--version] [--help]\n"
            "       kembali [--config FILE] --notify SHOP ID STATUS\n"
            "\n"
            "The return page for Kasera Pay checkouts, as a FastCGI service. It reads\n"
            "the transaction's status server-side with the shop's secret key, on the\n"
            "schedule Kasera recommends, shared by every request for that transaction.\n"
            "\n"
            "  --config FILE    the JSON configuration (default $KEMBALI_CONFIG, or\n"
            "                   " KEMBALI_CONFIG_DEFAULT ")\n"
            "  --listen ADDRESS listen on HOST:PORT, :PORT or an absolute Unix socket\n"
            "                   path; without it, serve the FastCGI socket on file\n"
            "                   descriptor 0 (spawn-fcgi, mod_fcgid, lighttpd) or from\n"
            "                   systemd socket activation\n"
            "  --socket-mode MODE\n"
            "                   the mode of the Unix socket --listen makes, in octal\n"
            "                   (default 0660; as php-fpm's listen.mode)\n"
            "  --socket-group GROUP\n"
            "                   the group of that socket (as php-fpm's listen.group),\n"
            "                   e.g. the web server's, so it can connect\n"
            "  --user NAME      when started as root, switch to NAME (and its group)\n"
            "                   after opening the socket and reading the keys\n"
            "  --log FILE       append the log to FILE instead of standard error;\n"
            "                   reopened on SIGUSR1 and SIGHUP (logrotate)\n"
            "  --notify SHOP ID STATUS\n"
            "                   record that transaction ID of shop SHOP has STATUS\n"
            "                   (pending, succeeded, failed, canceled, expired), as the\n"
            "                   shop's webhook learnt it, in the state shared through\n"
            "                   state_dir (or redis); no read, no running kembali\n"
            "                   and no signature needed (the admin POST must carry\n"
            "                   Kembali-Signature); exit 0 silently, or 1 with a reason\n"
            "  --check-config   validate the configuration, key files and templates,\n"
            "                   print what is wrong (every bad file in shops_dir by\n"
            "                   name, and the shop it collided with) and who holds\n"
            "                   each host of shops_dir (state_dir/kembali.hosts),\n"
            "                   exit 0 if all is well, 1 if anything is wrong (a\n"
            "                   shop file a running kembali would skip included);\n"
            "                   with redis, try it for 1 s: no answer is a warning\n"
            "                   (kembali runs without it), a refused password or db\n"
            "                   an error; with Sentinels, each is asked for the\n"
            "                   master (1 s each), and the master's ROLE checked\n"
            "  --version        print the version\n"
            "  --help           print this help\n"
            "\n"
            "Signals: SIGTERM answers the requests in hand and exits 0; SIGHUP reloads\n"
            "the configuration (a broken one is refused and the old one kept; a bad\n"
            "file in shops_dir is skipped, keeping that shop's previous version) and\n"
            "reopens the --log file; SIGUSR1 reopens the --log file; SIGUSR2 starts the\n"
            "program file again and hands it the requests in hand (an upgrade in place;\n"
            "if the new process refuses to start, this one logs why and keeps serving).\n"
            "Logs: one key=value line per event on standard error (or --log FILE).\n"
            "FCGI_WEB_SERVER_ADDRS: on TCP, the only peers accepted (comma-separated).\n");
}

/* Make sure descriptors 0-2 exist, so nothing we open lands on them. */
static void ensure_std_fds(bool need_fd0)
{
    for (int fd = need_fd0 ? 1 : 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
            int n = open("/dev/null", O_RDWR);
            if (n >= 0 && n != fd) {
                dup2(n, fd);
                close(n);
            }
        }
    }
}

static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static int is_listening_socket(int fd)
{
    int v = 0;
    socklen_t len = sizeof v;
    return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) == 0 && v;
}

/* What --listen makes of a Unix socket path: its mode and group. */
struct unix_perm {
    mode_t mode;
    gid_t gid; /* (gid_t)-1: the process's own */
};

/* --socket-mode MODE: octal digits, at most 0777. False when it is not. */
static bool parse_socket_mode(const char *s, mode_t *out)
{
    if (s == NULL || *s == '\0' || strlen(s) > 4 || strspn(s, "01234567") != strlen(s))
        return false;
    long v = strtol(s, NULL, 8);
    if (v > 0777)
        return false;
    *out = (mode_t)v;
    return true;
}

/* --socket-group GROUP: a group name (or a number) the system knows. */
static int parse_socket_group(const char *s, gid_t *out, char *err, size_t errlen)
{
    struct group *gr = getgrnam(s);
    if (gr == NULL && *s != '\0' && strspn(s, "0123456789") == strlen(s) && strlen(s) < 10)
        gr = getgrgid((gid_t)strtoul(s, NULL, 10));
    if (gr == NULL) {
        snprintf(err, errlen, "--socket-group %s: no such group", s);
        return -1;
    }
    *out = gr->gr_gid;
    return 0;
}

/* A listening Unix socket at path with perm's mode and group. A stale
 * socket there is replaced (anything else is not). The socket is bound with
 * no permission at all, then given its group and mode, and only then
 * listens: nobody can connect before it has them, and no moment is it
 * wider than asked. */
static int listen_unix(const char *path, const struct unix_perm *perm, char *err, size_t errlen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(err, errlen, "--listen %s: a Unix socket path has at most %zu bytes", path, sizeof sa.sun_path - 1);
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "--listen %s: socket: %s", path, strerror(errno));
        return -1;
    }
    mode_t old = umask(0777);
    int b = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    umask(old);
    errno = e;
    const char *step = NULL;
    /* by path, so never through a link: a socket swapped for a symbolic
     * link after bind (a folder others may write) is refused, not followed
     * to whatever file it names */
    if (b != 0)
        step = "cannot listen there";
    else if (lstat(path, &st) != 0)
        step = "the socket is gone after it was made";
    else if (!S_ISSOCK(st.st_mode))
        step = "the socket was replaced after it was made";
    else if (perm->gid != (gid_t)-1 && fchownat(AT_FDCWD, path, (uid_t)-1, perm->gid, AT_SYMLINK_NOFOLLOW) != 0)
        step = "--socket-group: cannot give the socket that group";
    else if (fchmodat(AT_FDCWD, path, perm->mode, AT_SYMLINK_NOFOLLOW) != 0)
        step = "--socket-mode: cannot set the socket's mode";
    else if (listen(fd, SOCKET_BACKLOG) != 0)
        step = "cannot listen there";
    if (step != NULL) {
        if (b == 0 && lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
            snprintf(err, errlen, "--listen %s: %s", path, step); /* not ours: left alone */
            close(fd);
            return -1;
        }
        snprintf(err, errlen, "--listen %s: %s (%s)", path, step, strerror(errno));
        if (b == 0)
            unlink(path);
        close(fd);
        return -1;
    }
    return fd;
}

/* The listening socket: --listen (a Unix socket path gets perm), systemd's
 * LISTEN_FDS, or fd 0. */
static int open_listener(const char *listen_addr, const struct unix_perm *perm, char *err, size_t errlen)
{
    if (listen_addr != NULL) {
        if (listen_addr[0] != '/' && strchr(listen_addr, ':') == NULL) {
            snprintf(err, errlen, "--listen %s: give HOST:PORT, :PORT or an absolute socket path", listen_addr);
            return -1;
        }
        if (listen_addr[0] == '/')
            return listen_unix(listen_addr, perm, err, errlen);
        int fd = FCGX_OpenSocket(listen_addr, SOCKET_BACKLOG);
        if (fd < 0)
            snprintf(err, errlen, "--listen %s: cannot listen there (%s)", listen_addr,
                     errno ? strerror(errno) : "bad address");
        else
            fcntl(fd, F_SETFD, FD_CLOEXEC);
        return fd;
    }
    const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
    if (pid != NULL && fds != NULL && atol(pid) == (long)getpid() && atoi(fds) >= 1) {
        if (is_listening_socket(3))
            return 3;
        snprintf(err, errlen, "LISTEN_FDS is set but descriptor 3 is not a listening socket");
        return -1;
    }
    if (is_listening_socket(0))
        return 0;
    snprintf(err, errlen, "no --listen given and standard input is not a listening socket "
                          "(start kembali with --listen, or from spawn-fcgi, mod_fcgid or systemd)");
    return -1;
}

static int drop_privileges(const char *user, char *err, size_t errlen)
{
    if (geteuid() != 0) {
        log_msg(LOG_LV_WARN, "start", "--user is ignored: not started as root");
        return 0;
    }
    struct passwd *pw = getpwnam(user);
    if (pw == NULL) {
        snprintf(err, errlen, "--user %s: no such user", user);
        return -1;
    }
    if (setgroups(1, &pw->pw_gid) != 0 || setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0) {
        snprintf(err, errlen, "--user %s: cannot switch: %s", user, strerror(errno));
        return -1;
    }
    if (setuid(0) == 0) {
        snprintf(err, errlen, "--user %s: root privileges could be regained; refusing to run", user);
        return -1;
    }
    return 0;
}

/* One error line per skipped shop file, and a warning when max_held was
 * capped by the descriptors; `when` is "start" or "reload". */
static void log_config_notes(const struct config *c, const char *when)
{
    for (int i = 0; i < c->nskipped; i++) {
        struct log_line l;
        log_begin(&l, LOG_LV_ERROR, "shop_file_skipped");
        log_str(&l, "file", c->skipped[i].file);
        log_str(&l, "at", when);
        log_str(&l, "kept", c->skipped[i].kept ? "previous" : "none");
        if (c->skipped[i].collides != NULL)
            log_str(&l, "collides_with", c->skipped[i].collides);
        log_str(&l, "errors", c->skipped[i].why);
        log_end(&l);
    }
    if (c->max_held_wanted > c->max_held) {
        struct log_line l;
        log_begin(&l, LOG_LV_WARN, "max_held");
        log_str(&l, "msg", "max_held is more than the open-files limit allows (RLIMIT_NOFILE); using less");
        log_int(&l, "wanted", c->max_held_wanted);
        log_int(&l, "max_held", c->max_held);
        log_end(&l);
    }
}

/* --check-config: who holds which host of shops_dir (the host registry
 * as a reload would leave it now), and the hosts nobody gets. */
static void print_hosts(const struct config *c)
{
    if (!c->held_known)
        return;
    fprintf(stdout, "  host registry %s/%s: %zu host%s held\n", c->state_dir, HOSTREG_FILE, c->held.n,
            c->held.n == 1 ? "" : "s");
    for (size_t i = 0; i < c->held.n; i++) {
        bool serves = false;
        for (int j = 0; j < c->nshops && !serves; j++)
            serves = c->shops[j].source != NULL && strcmp(c->shops[j].id, c->held.e[i].shop) == 0;
        fprintf(stdout, "  host %s: held by %s%s\n", c->held.e[i].host, c->held.e[i].shop,
                serves ? "" : " (its file is skipped: no shop serves the host until it loads)");
    }
    for (size_t i = 0; i < c->contested.n; i++)
        fprintf(stdout, "  host %s: held by nobody, claimed by %s: no shop serves it until one gives it up\n",
                c->contested.e[i].host, c->contested.e[i].shop);
}

static int check_config(const char *path)
{
    char err[ERRBUF];
    struct config *c = config_reload_hosts(path, NULL, CONFIG_HOSTS_READ, err, sizeof err);
    if (c == NULL) {
        fprintf(stdout, "%s: not usable:\n%s", path, err);
        return 1;
    }
    char why[512];
    if (state_check_dir(c->state_dir, false, why, sizeof why) != 0) {
        fprintf(stdout, "%s: not usable:\n%s: state_dir: %s\n", path, path, why);
        config_unref(c);
        return 1;
    }
    int rc = 0;
    if (c->redis.on) {
        /* unreachable: a warning (kembali runs on state_dir alone until it
         * answers); a refused password or db: the configuration is wrong */
        char addr[300], rwhy[600];
        config_redis_address(&c->redis, addr, sizeof addr);
        int rr;
        if (c->redis.sentinel) { /* each Sentinel, then the master the first answer names, and its ROLE */
            char ip[INET6_ADDRSTRLEN + 1], role[16] = "";
            int port = 0, which = -1;
            rr = state_redis_sentinel_master(&c->redis, CHECK_REDIS_MS, ip, sizeof ip, &port, &which, stdout, rwhy,
                                             sizeof rwhy);
            if (rr == STATE_REDIS_CHECK_REFUSED)
                rc = 1;
            if (which >= 0) {
                snprintf(addr, sizeof addr, "master %s at %s:%d", c->redis.master, ip, port);
                rr = state_redis_check_master(&c->redis, ip, port, CHECK_REDIS_MS, role, rwhy, sizeof rwhy);
                if (rr == STATE_REDIS_CHECK_OK && strcmp(role, "master") != 0) {
                    snprintf(rwhy, sizeof rwhy, "ROLE says %s, not master (a failover under way?)", role);
                    rr = STATE_REDIS_CHECK_UNREACHABLE;
                } else if (rr == STATE_REDIS_CHECK_OK) {
                    fprintf(stdout, "kembali: redis %s: ROLE master\n", addr);
                }
            } else if (rr == STATE_REDIS_CHECK_REFUSED) {
                rr = STATE_REDIS_CHECK_OK; /* each refusal is printed above */
            }
        } else {
            rr = state_redis_check(&c->redis, CHECK_REDIS_MS, rwhy, sizeof rwhy);
        }
        if (rr == STATE_REDIS_CHECK_UNREACHABLE) {
            fprintf(stdout, "kembali: warning: redis %s: %s\n", addr, rwhy);
        } else if (rr != STATE_REDIS_CHECK_OK) {
            fprintf(stdout, "kembali: error: redis %s: %s\n", addr, rwhy);
            rc = 1;
        }
    }
    if (c->nskipped > 0) {
        fprintf(stdout, "%s: %d shop file%s would be skipped:\n", path, c->nskipped, c->nskipped == 1 ? "" : "s");
        for (int i = 0; i < c->nskipped; i++)
            fprintf(stdout, "%s\n", c->skipped[i].why);
        rc = 1;
    }
    fprintf(stdout, "%s: %s: %d shop%s, api_base %s\n", path, rc ? "usable" : "ok", c->nshops,
            c->nshops == 1 ? "" : "s", c->api_base);
    for (int i = 0; i < c->nshops; i++)
        fprintf(stdout, "  shop %s: locale %s, %d host%s, read budget %d/min\n", c->shops[i].id,
                c->shops[i].locale, c->shops[i].nhosts, c->shops[i].nhosts == 1 ? "" : "s", c->shops[i].read_budget);
    print_hosts(c);
    fprintf(stdout, "  max_held %ld, max_held_per_shop %ld", c->max_held, c->max_held_per_shop);
    if (c->max_held_wanted > c->max_held)
        fprintf(stdout, " (max_held %ld asked: more than the open-files limit allows)", c->max_held_wanted);
    fputc('\n', stdout);
    config_unref(c);
    return rc;
}

/* Did the Redis settings change (they take effect at restart)? */
static bool pw_differs(const char *a, const char *b)
{
    return (a == NULL) != (b == NULL) || (a != NULL && strcmp(a, b) != 0);
}

static bool redis_differs(const struct config_redis *a, const struct config_redis *b)
{
    char aa[CONFIG_REDIS_SENTINELS_MAX * 300], ba[sizeof aa];
    config_redis_address(a, aa, sizeof aa); /* host, port, path, db, the Sentinels and the master's name */
    config_redis_address(b, ba, sizeof ba);
    return a->on != b->on || strcmp(aa, ba) != 0 || pw_differs(a->password, b->password) ||
           pw_differs(a->sentinel_password, b->sentinel_password) || strcmp(a->prefix, b->prefix) != 0 ||
           a->hosts != b->hosts;
}

static void reload(struct app *a, const char *path)
{
    char err[ERRBUF];
    struct config *old = app_config(a);
    struct config *c = config_reload_hosts(path, old, CONFIG_HOSTS_KEEP, err, sizeof err);
    if (c == NULL) {
        config_unref(old);
        struct log_line l;
        log_begin(&l, LOG_LV_ERROR, "reload");
        log_str(&l, "msg", "the new configuration is refused; the old one keeps serving");
        log_str(&l, "errors", err);
        log_end(&l);
        return;
    }
    config_bind_state(c, a->state);
    state_auth_allowance(a->state, c->auth_failures_per_minute);
    log_config_notes(c, "reload");
    /* room for every key: the state file grows while the others use it */
    if (state_grow_keys(a->state, state_key_slots_for(c->nshops), err, sizeof err) != 0) {
        struct log_line l;
        log_begin(&l, LOG_LV_ERROR, "reload");
        log_str(&l, "msg", "the state file's key table cannot grow; idle keys make room as before");
        log_str(&l, "error", err);
        log_end(&l);
    }
    if (c->state_slots != old->state_slots || c->state_slots_per_key != old->state_slots_per_key ||
        c->read_timeout_ms != old->read_timeout_ms || strcmp(c->state_dir, old->state_dir) != 0)
        log_msg(LOG_LV_WARN, "reload", "state_dir, state_slots, state_slots_per_key and read_timeout_ms take effect at restart");
    if (redis_differs(&c->redis, &old->redis))
        log_msg(LOG_LV_WARN, "reload", "redis, redis_password_file, redis_sentinel_password_file, redis_prefix and "
                                  "redis_hosts take effect at restart");
    config_unref(old);
    app_set_config(a, c);
    struct log_line l;
    log_begin(&l, LOG_LV_INFO, "reload");
    log_int(&l, "shops", c->nshops);
    log_int(&l, "skipped", c->nskipped);
    log_end(&l);
}

/* After a start as root with --user, the host registry was only read (so
 * that root never writes a file the serving user then cannot replace);
 * now, as that user, write what the start decided, unless another process
 * wrote the registry meanwhile: then decide again from it (a reload). */
static void registry_commit(struct app *a, const char *path)
{
    const struct config *c = a->cfg;
    if (!c->held_known)
        return;
    char why[600];
    struct hostreg now = {NULL, 0};
    int fd = hostreg_lock(c->state_dir, why, sizeof why);
    int rc = fd < 0 ? -1 : hostreg_load(c->state_dir, &now, why, sizeof why);
    bool same = rc == 0 && hostreg_equal(&now, &c->held_read);
    if (same && !hostreg_equal(&now, &c->held))
        rc = hostreg_save(c->state_dir, &c->held, why, sizeof why);
    hostreg_free(&now);
    hostreg_unlock(fd);
    if (rc != 0) {
        struct log_line l;
        log_begin(&l, LOG_LV_ERROR, "host_registry");
        log_str(&l, "msg", "the host registry could not be written; the next reload tries again");
        log_str(&l, "errors", why);
        log_end(&l);
    } else if (!same) {
        reload(a, path);
    }
}

/* The program file to start again on SIGUSR2: the path it was started as
 * (not /proc/self/exe, which after a package upgrade is the old, deleted
 * file), made absolute now, while the working folder is the one it was
 * started in. False when it cannot be found. */
static bool self_program(const char *argv0, char *out, size_t cap)
{
    if (argv0 == NULL || *argv0 == '\0')
        return false;
    if (strchr(argv0, '/') != NULL) {
        if (argv0[0] == '/')
            return snprintf(out, cap, "%s", argv0) < (int)cap;
        char cwd[PATH_MAX];
        return getcwd(cwd, sizeof cwd) != NULL && snprintf(out, cap, "%s/%s", cwd, argv0) < (int)cap;
    }
    const char *path = getenv("PATH");
    for (const char *p = path ? path : "/usr/local/bin:/usr/bin:/bin"; *p;) {
        size_t n = strcspn(p, ":");
        if (n > 0 && snprintf(out, cap, "%.*s/%s", (int)n, p, argv0) < (int)cap && access(out, X_OK) == 0 &&
            out[0] == '/')
            return true;
        p += n + (p[n] == ':');
    }
    return false;
}

struct signal_ctx {
    struct app *app;
    struct upgrade *up;
    struct front *front;
    const char *config_path;
    const char *log_path;       /* --log, or NULL */
    struct serve *serve;
    int fd;
    bool stop;
};

/* Under systemd, is a next process coming to take what the store holds?
 * Asked of systemd (sdjob.h) at SIGTERM: a restart, or not known (no bus:
 * store, as a restart needs); a stop, or a SIGTERM sent by hand, has no
 * successor, and what the store held would be closed unanswered. */
static bool successor_expected(void)
{
    char err[256];
    enum sdjob j = sdjob_current(SDJOB_ASK_MS, err, sizeof err);
    struct log_line ll;
    log_begin(&ll, LOG_LV_INFO, "stop");
    log_str(&ll, "systemd_job", sdjob_name(j));
    if (err[0] != '\0')
        log_str(&ll, "why", err);
    log_str(&ll, "msg", j == SDJOB_STOP || j == SDJOB_NONE ? "no next process: answering the requests in hand here"
                                                            : "a next process is coming: storing the requests in hand");
    log_end(&ll);
    return j != SDJOB_STOP && j != SDJOB_NONE;
}

/* The signalfd: SIGHUP reopens the log and reloads, SIGUSR1 reopens the
 * log (logrotate), SIGUSR2 starts an upgrade, SIGTERM and SIGINT stop the
 * loop. */
static void on_signal(struct loop *l, struct loop_io *io, uint32_t events)
{
    struct signal_ctx *sc = io->data;
    struct signalfd_siginfo si;
    (void)events;
    while (read(sc->fd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGHUP || si.ssi_signo == SIGUSR1)
            log_reopen(sc->log_path); /* a no-op without --log */
        if (si.ssi_signo == SIGHUP) {
            reload(sc->app, sc->config_path);
        } else if (si.ssi_signo == SIGUSR2) {
            char err[512];
            if (sc->up == NULL)
                log_msg(LOG_LV_ERROR, "upgrade", "SIGUSR2: the program file kembali was started as is not known; "
                                            "no upgrade");
            else if (upgrade_start(sc->up, err, sizeof err) != 0)
                log_msg(LOG_LV_ERROR, "upgrade", err);
        } else if (si.ssi_signo != SIGUSR1) {
            /* at once, before anything else of this turn: no read starts
             * from here on, and every request in hand is answered, or,
             * under systemd with its fd store, handed to the next process */
            sc->stop = true;
            char err[256];
            long n = si.ssi_signo == SIGTERM && fdstore_usable() && successor_expected()
                         ? fdstore_save(sc->front, sc->serve, err, sizeof err)
                         : 0;
            if (n != 0) {
                struct log_line ll;
                log_begin(&ll, n > 0 ? LOG_LV_INFO : LOG_LV_ERROR, "stop");
                if (n > 0)
                    log_int(&ll, "stored", n);
                log_str(&ll, "msg", n > 0 ? "the connections in hand went to systemd's file-descriptor store, "
                                            "for the next process"
                                          : "nothing could go to systemd's file-descriptor store; answering here");
                if (n < 0)
                    log_str(&ll, "errors", err);
                log_end(&ll);
            }
            serve_stop(sc->serve);
            loop_stop(l);
        }
    }
}

#ifdef KEMBALI_TESTING
/* tests/kembali-testing only: two versions side by side from one build
 * (tests/integration/test_versions.py). KEMBALI_TEST_LAYOUT names the
 * state file by another layout version; KEMBALI_TEST_REDIS_SCHEMA names
 * the Redis keys and channel by another schema version. */
static void testing_versions(struct config *c, struct state_opts *so)
{
    const char *v = getenv("KEMBALI_TEST_LAYOUT");
    if (v != NULL)
        so->layout = atoi(v);
    v = getenv("KEMBALI_TEST_REDIS_SCHEMA");
    if (v != NULL)
        c->redis.schema = atoi(v);
}
#endif

#ifdef KEMBALI_TESTING
/* tests/kembali-testing only: KEMBALI_TEST_BUSY_MS=N makes each request's
 * handling run N ms longer, as in a busy process: whatever it asked Redis
 * goes out a turn of the loop that long after it was asked
 * (tests/integration/test_redis_faults.py). The serve handler, wrapped. */
struct testing_busy {
    struct front_handler inner;
    struct timespec pause;
};

static void busy_request(void *ctx, struct front_req *r)
{
    struct testing_busy *b = ctx;
    b->inner.on_request(b->inner.ctx, r);
    nanosleep(&b->pause, NULL);
}

static void busy_gone(void *ctx, struct front_req *r, void *user)
{
    struct testing_busy *b = ctx;
    b->inner.on_gone(b->inner.ctx, r, user);
}

static int busy_save(void *ctx, struct front_req *r, void *user, struct handover_rec *rec)
{
    struct testing_busy *b = ctx;
    return b->inner.save(b->inner.ctx, r, user, rec);
}

static void busy_restore(void *ctx, struct front_req *r, void *user)
{
    struct testing_busy *b = ctx;
    b->inner.restore(b->inner.ctx, r, user);
}

static void busy_release(void *ctx, struct front_req *r, void *user)
{
    struct testing_busy *b = ctx;
    b->inner.release(b->inner.ctx, r, user);
}

static struct front_handler testing_busy(struct front_handler h, struct testing_busy *b)
{
    const char *v = getenv("KEMBALI_TEST_BUSY_MS");
    int ms = v != NULL ? atoi(v) : 0;
    if (ms <= 0)
        return h;
    *b = (struct testing_busy){.inner = h, .pause = {ms / 1000, (long)(ms % 1000) * 1000000L}};
    return (struct front_handler){.on_request = busy_request, .on_gone = busy_gone,
                                  .save = h.save ? busy_save : NULL, .restore = h.restore ? busy_restore : NULL,
                                  .release = h.release ? busy_release : NULL, .ctx = b};
}
#endif

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'}, {"listen", required_argument, NULL, 'l'},
        {"user", required_argument, NULL, 'u'},   {"check-config", no_argument, NULL, 'C'},
        {"version", no_argument, NULL, 'V'},      {"help", no_argument, NULL, 'h'},
        {"log", required_argument, NULL, 'L'},    {"notify", no_argument, NULL, 'N'},
        {"socket-mode", required_argument, NULL, 'M'}, {"socket-group", required_argument, NULL, 'G'},
        {NULL, 0, NULL, 0},
    };
    /* before anything reads a key: no core dump, no ptrace by the same
     * user, no /proc/PID/mem (after --user the kernel keeps it so) */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    const char *config_path = getenv("KEMBALI_CONFIG");
    const char *listen_addr = NULL, *user = NULL, *log_path = NULL, *socket_mode = NULL, *socket_group = NULL;
    bool check_only = false, notify = false;
    int o;
    while ((o = getopt_long(argc, argv, "c:l:u:CVh", opts, NULL)) != -1) {
        switch (o) {
        case 'c': config_path = optarg; break;
        case 'l': listen_addr = optarg; break;
        case 'u': user = optarg; break;
        case 'C': check_only = true; break;
        case 'L': log_path = optarg; break;
        case 'N': notify = true; break;
        case 'M': socket_mode = optarg; break;
        case 'G': socket_group = optarg; break;
        case 'V': printf("kembali %s\n", PACKAGE_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (notify && argc - optind != 3) {
        fprintf(stderr, "kembali: --notify needs SHOP ID STATUS\n");
        usage(stderr);
        return 2;
    }
    if (!notify && optind < argc) {
        fprintf(stderr, "kembali: unexpected argument: %s\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (config_path == NULL || *config_path == '\0')
        config_path = KEMBALI_CONFIG_DEFAULT;
    /* started by an older process's SIGUSR2 (upgrade.h): its socket, its requests */
    struct upgrade_env upe = {.chan = -1, .listen_fd = -1};
    bool upgraded = !check_only && !notify && upgrade_env_take(&upe);
    char prog[PATH_MAX];
    bool have_prog = self_program(argv[0], prog, sizeof prog);
    struct unix_perm perm = {.mode = SOCKET_MODE_DEFAULT, .gid = (gid_t)-1};
    if ((socket_mode != NULL || socket_group != NULL) && (listen_addr == NULL || listen_addr[0] != '/')) {
        fprintf(stderr, "kembali: %s applies only to the Unix socket --listen makes (--listen /PATH); "
                        "a socket handed over or a TCP address has no file mode or group\n",
                socket_mode != NULL ? "--socket-mode" : "--socket-group");
        return 1;
    }
    if (socket_mode != NULL && !parse_socket_mode(socket_mode, &perm.mode)) {
        fprintf(stderr, "kembali: --socket-mode %s: give an octal mode from 0 to 0777, such as 0660\n", socket_mode);
        return 1;
    }
    char gerr[256];
    if (socket_group != NULL && parse_socket_group(socket_group, &perm.gid, gerr, sizeof gerr) != 0) {
        fprintf(stderr, "kembali: %s\n", gerr);
        return 1;
    }
    ensure_std_fds(listen_addr == NULL && !check_only);
    raise_fd_limit(); /* before loading: max_held's cap follows the limit */
    if (check_only)
        return check_config(config_path);
    if (notify)
        return notify_command(config_path, argv[optind], argv[optind + 1], argv[optind + 2], stderr);

    char err[ERRBUF];
    if (log_path != NULL && log_open(log_path, err, sizeof err) != 0) {
        fprintf(stderr, "kembali: %s\n", err);
        if (upgraded)
            upgrade_refuse(upe.chan, err);
        return 1;
    }
    struct app app;
    memset(&app, 0, sizeof app);
    int rc = 1, sfd = -1;
    pthread_mutex_init(&app.cfg_mu, NULL);
    app.listen_fd = -1;
    struct loop *loop = NULL;
    struct serve *serve = NULL;
    struct front *front = NULL;
    struct loop_io sig_io;
    struct upgrade *up = NULL;
    struct fdstore_got fsg = {.listen_fd = -1, .desc_fd = -1};
    bool cgi = false, handed = false;

    /* the host registry belongs to the serving user: root only reads it */
    bool as_root = geteuid() == 0 && user != NULL;
    struct config *cfg = config_reload_hosts(config_path, NULL, as_root ? CONFIG_HOSTS_READ : CONFIG_HOSTS_KEEP,
                                             err, sizeof err);
    if (cfg == NULL) {
        fprintf(stderr, "kembali: the configuration is not usable:\n%s", err);
        if (upgraded) {
            char why[ERRBUF + 64];
            snprintf(why, sizeof why, "the configuration is not usable: %s", err);
            upgrade_refuse(upe.chan, why);
        }
        goto out;
    }
    app.cfg = cfg; /* owned by app from here on */
    /* CGI: no socket of any kind, and a CGI server's environment */
    /* systemd's sockets and its store (a restart's connections), if any */
    if (!upgraded && fdstore_scan(&fsg) != 0) {
        fprintf(stderr, "kembali: out of memory\n");
        goto out;
    }
    cgi = !upgraded && listen_addr == NULL && fsg.listen_fd < 0 && getenv("LISTEN_FDS") == NULL &&
          !is_listening_socket(0) && getenv("GATEWAY_INTERFACE") != NULL && FCGX_IsCGI();
    if (upgraded) {
        app.listen_fd = upe.listen_fd; /* the old process's socket: never made again */
    } else if (listen_addr == NULL && fsg.listen_fd >= 0) {
        app.listen_fd = fsg.listen_fd;
    } else if (!cgi) {
        app.listen_fd = open_listener(listen_addr, &perm, err, sizeof err);
        if (app.listen_fd < 0) {
            fprintf(stderr, "kembali: %s\n", err);
            goto out;
        }
    }
    if (user != NULL && !(upgraded && geteuid() != 0) && drop_privileges(user, err, sizeof err) != 0) {
        fprintf(stderr, "kembali: %s\n", err);
        goto out;
    }
    /* after dropping privileges: the state file belongs to the serving user */
    /* key slots: twice the shops (an upper bound of the distinct keys), room for reloads */
    struct state_opts so = {.tx_slots = cfg->state_slots, .tx_per_key = cfg->state_slots_per_key,
                            .key_slots = state_key_slots_for(cfg->nshops),
                            .read_timeout_ms = cfg->read_timeout_ms, .greedy = !cfg->read_planning};
#ifdef KEMBALI_TESTING
    testing_versions(cfg, &so);
#endif
    app.state = state_open(cfg->state_dir, &so, err, sizeof err);
    if (app.state == NULL) {
        fprintf(stderr, "kembali: %s\n", err);
        if (upgraded)
            upgrade_refuse(upe.chan, err);
        goto out;
    }
    config_bind_state(cfg, app.state);
    if (as_root) {
        registry_commit(&app, config_path);
        cfg = app.cfg; /* a reload may have replaced it */
    }
    state_auth_allowance(app.state, cfg->auth_failures_per_minute);

    /* blocked before any thread starts, so every thread inherits it; read
     * from a signalfd on the loop */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    sigaddset(&sigs, SIGUSR1);
    sigaddset(&sigs, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    sfd = signalfd(-1, &sigs, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0) {
        fprintf(stderr, "kembali: signalfd: %s\n", strerror(errno));
        goto out;
    }

    loop = loop_new(err, sizeof err);
    if (loop == NULL || (serve = serve_new(&app, loop, err, sizeof err)) == NULL) {
        fprintf(stderr, "kembali: %s\n", err);
        if (upgraded)
            upgrade_refuse(upe.chan, err);
        goto out;
    }
    /* A CGI process has one request and no time to join Redis after it:
     * its claim waits for the join (the join's own limit, 1 s), so that it
     * is decided with every host's rather than alone */
    for (int64_t until = util_mono_ms() + STATE_REDIS_JOIN_MS, left;
         cgi && state_redis_joining(app.redis) && (left = until - util_mono_ms()) > 0;)
        if (loop_turn(loop, (int)left) != 0)
            goto out;
    struct front_handler h = serve_handler(serve);
#ifdef KEMBALI_TESTING
    struct testing_busy busy;
    h = testing_busy(h, &busy);
#endif
    front = cgi ? front_new_cgi(loop, &h, err, sizeof err) : front_new(loop, app.listen_fd, &h, err, sizeof err);
    if (front == NULL) {
        fprintf(stderr, "kembali: %s\n", err);
        goto out;
    }
    serve_attach(serve, front);
    if (!cgi && have_prog)
        up = upgrade_new(loop, front, serve, prog, argv, app.listen_fd);
#ifdef KEMBALI_TESTING
    if (up != NULL && getenv("KEMBALI_TEST_UPGRADE_LATE_ACK") != NULL)
        upgrade_test_late_ack(up);
#endif
    struct signal_ctx sc = {.app = &app, .config_path = config_path, .log_path = log_path, .fd = sfd,
                            .serve = serve, .up = up, .front = front};
    loop_io_init(&sig_io, sfd, on_signal, &sc);
    sig_io.first = true;
    if (loop_io_set(loop, &sig_io, EPOLLIN) != 0) {
        fprintf(stderr, "kembali: epoll: %s\n", strerror(errno));
        goto out;
    }

    if (upgraded) {
        /* accepting from the next turn on: the old process stops once told */
        if (up == NULL || upgrade_successor(up, &upe, err, sizeof err) != 0)
            log_msg(LOG_LV_WARN, "upgrade", up == NULL ? "out of memory" : err);
        upe.chan = -1; /* the upgrade's now */
    }
    if (!cgi) {
        struct log_line l;
        log_begin(&l, LOG_LV_INFO, "start");
        log_str(&l, "version", PACKAGE_VERSION);
        log_int(&l, "pid", getpid());
        log_int(&l, "shops", cfg->nshops);
        log_str(&l, "listen", listen_addr && !upgraded ? listen_addr : "inherited");
        log_str(&l, "api_base", cfg->api_base);
        if (upgraded)
            log_int(&l, "upgraded_from", upe.from);
        log_end(&l);
    }
    log_config_notes(cfg, "start");
    if (fsg.desc_fd >= 0 || fsg.nconns > 0)
        fdstore_take(&fsg, front, serve); /* a restart's requests in hand, from systemd's store */
    if (!upgraded && !cgi)
        fdstore_notify("READY=1"); /* a successor of SIGUSR2 is made the main process by the old one */
    for (;;) {
        if (sc.stop || (cgi && front_done(front)))
            break;
        if (upgrade_tick(up)) {
            handed = true;
            break;
        }
        /* while handing over, look every 50 ms at what is left */
        if (loop_turn(loop, upgrade_successor_pid(up) != 0 ? 50 : -1) != 0)
            goto out;
    }
    if (handed) {
        struct log_line l;
        log_begin(&l, LOG_LV_INFO, "stop");
        log_str(&l, "msg", "stopping: the new process serves");
        log_int(&l, "upgraded_to", upgrade_successor_pid(up));
        log_end(&l);
    } else if (!cgi) {
        log_msg(LOG_LV_INFO, "stop", "stopping: answering the requests in hand");
    }
    rc = 0;
out:
    /* in reverse order of what was set up; each step copes with "not done" */
    upgrade_free(up); /* a new process still starting is killed */
    if (upgraded && upe.chan >= 0)
        close(upe.chan); /* never got as far as saying ready: the old one keeps serving */
    if (front != NULL) {
        serve_stop(serve);
        serve_handing(serve, false); /* requests kept for a successor are answered here (stopping: at once) */ /* every held request answered; no read starts from here on */
        front_stop_accepting(front); /* requests already arrived are answered at once */
        /* let the answers go out, but no peer may keep us from exiting */
        int64_t until = util_mono_ms() + STOP_FLUSH_MS;
        for (int64_t left; !front_done(front) && (left = until - util_mono_ms()) > 0;)
            loop_turn(loop, (int)left);
        front_free(front);
    }
    serve_free(serve);
    if (sfd >= 0) {
        if (loop != NULL)
            loop_io_set(loop, &sig_io, 0);
        close(sfd);
    }
    loop_free(loop);
    app_set_config(&app, NULL);
    state_free(app.state);
    if (rc == 0 && !cgi)
        log_msg(LOG_LV_INFO, "stop", "stopped");
    return rc;
}
