/* kembali.c - main: command line, start-up, signals, reload, shutdown.
 *
 * The main thread owns the process: it loads the configuration, opens (or
 * takes over) the FastCGI socket, drops privileges, starts the resolver and
 * the accept threads, and then waits for signals with sigwait(): SIGHUP
 * reloads, SIGTERM/SIGINT stop. Signals are blocked in every other thread,
 * so no handler ever runs inside library code. */
#define NO_FCGI_DEFINES 1
#include <errno.h>
#include <fcgiapp.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "app.h"
#include "config.h"
#include "front.h"
#include "log.h"
#include "notify.h"
#include "resolver.h"
#include "state.h"
#include "util.h"

#ifndef KEMBALI_CONFIG_DEFAULT
#define KEMBALI_CONFIG_DEFAULT "/usr/local/etc/kembali/kembali.json"
#endif
#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "dev"
#endif

#define ACCEPT_THREADS 4
#define ERRBUF 8192

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: kembali [--config FILE] [--listen ADDRESS] [--user NAME] [--log FILE]\n"
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
            "  --user NAME      when started as root, switch to NAME (and its group)\n"
            "                   after opening the socket and reading the keys\n"
            "  --log FILE       append the log to FILE instead of standard error;\n"
            "                   reopened on SIGUSR1 and SIGHUP (logrotate)\n"
            "  --notify SHOP ID STATUS\n"
            "                   record that transaction ID of shop SHOP has STATUS\n"
            "                   (pending, succeeded, failed, canceled, expired), as the\n"
            "                   shop's webhook learnt it, in the state shared through\n"
            "                   state_dir; no read, no running kembali needed; exit 0\n"
            "                   silently, or 1 with a reason\n"
            "  --check-config   validate the configuration, key files and templates,\n"
            "                   print what is wrong, exit 0 if usable, 1 if not\n"
            "  --version        print the version\n"
            "  --help           print this help\n"
            "\n"
            "Signals: SIGTERM answers the requests in hand and exits 0; SIGHUP reloads\n"
            "the configuration (a broken one is refused and the old one kept) and\n"
            "reopens the --log file; SIGUSR1 reopens the --log file.\n"
            "Logs: one key=value line per event on standard error (or --log FILE).\n"
            "FCGI_WEB_SERVER_ADDRS: on TCP, the only peers accepted (comma-separated).\n");
}

struct config *app_config(struct app *a)
{
    pthread_mutex_lock(&a->cfg_mu);
    struct config *c = config_ref(a->cfg);
    pthread_mutex_unlock(&a->cfg_mu);
    return c;
}

void app_set_config(struct app *a, struct config *c)
{
    pthread_mutex_lock(&a->cfg_mu);
    struct config *old = a->cfg;
    a->cfg = c;
    pthread_mutex_unlock(&a->cfg_mu);
    if (old)
        config_unref(old);
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

/* Accepted connections inherit these from the listening socket (Linux
 * clones the socket's options on accept): a web server that sends no
 * parameters cannot hold an accept thread for more than a few seconds,
 * and one that does not read its answer cannot block the resolver. */
static void set_io_timeouts(int fd)
{
    struct timeval rcv = {.tv_sec = 5}, snd = {.tv_sec = 2};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rcv, sizeof rcv) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &snd, sizeof snd) != 0)
        log_msg("warn", "start", "cannot set I/O timeouts on the listening socket");
}

static int is_listening_socket(int fd)
{
    int v = 0;
    socklen_t len = sizeof v;
    return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) == 0 && v;
}

/* The listening socket: --listen, systemd's LISTEN_FDS, or fd 0. */
static int open_listener(const char *listen_addr, char *err, size_t errlen)
{
    if (listen_addr != NULL) {
        if (listen_addr[0] != '/' && strchr(listen_addr, ':') == NULL) {
            snprintf(err, errlen, "--listen %s: give HOST:PORT, :PORT or an absolute socket path", listen_addr);
            return -1;
        }
        int fd = FCGX_OpenSocket(listen_addr, 1024);
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
        log_msg("warn", "start", "--user is ignored: not started as root");
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

static int check_config(const char *path)
{
    static char err[ERRBUF];
    struct config *c = config_load(path, err, sizeof err);
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
    fprintf(stdout, "%s: ok: %d shop%s, api_base %s\n", path, c->nshops, c->nshops == 1 ? "" : "s", c->api_base);
    for (int i = 0; i < c->nshops; i++)
        fprintf(stdout, "  shop %s: locale %s, %d host%s, read budget %d/min\n", c->shops[i].id,
                c->shops[i].locale, c->shops[i].nhosts, c->shops[i].nhosts == 1 ? "" : "s", c->shops[i].read_budget);
    config_unref(c);
    return 0;
}

static void reload(struct app *a, const char *path)
{
    static char err[ERRBUF];
    struct config *c = config_load(path, err, sizeof err);
    if (c == NULL) {
        struct log_line l;
        log_begin(&l, "error", "reload");
        log_str(&l, "msg", "the new configuration is refused; the old one keeps serving");
        log_str(&l, "errors", err);
        log_end(&l);
        return;
    }
    config_bind_state(c, a->state);
    struct config *old = app_config(a);
    if (c->state_slots != old->state_slots || c->read_timeout_ms != old->read_timeout_ms ||
        strcmp(c->state_dir, old->state_dir) != 0)
        log_msg("warn", "reload", "state_dir, state_slots and read_timeout_ms take effect at restart");
    config_unref(old);
    app_set_config(a, c);
    struct log_line l;
    log_begin(&l, "info", "reload");
    log_int(&l, "shops", c->nshops);
    log_end(&l);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'}, {"listen", required_argument, NULL, 'l'},
        {"user", required_argument, NULL, 'u'},   {"check-config", no_argument, NULL, 'C'},
        {"version", no_argument, NULL, 'V'},      {"help", no_argument, NULL, 'h'},
        {"log", required_argument, NULL, 'L'},    {"notify", no_argument, NULL, 'N'},
        {NULL, 0, NULL, 0},
    };
    const char *config_path = getenv("KEMBALI_CONFIG");
    const char *listen_addr = NULL, *user = NULL, *log_path = NULL;
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
    ensure_std_fds(listen_addr == NULL && !check_only);
    if (check_only)
        return check_config(config_path);
    if (notify)
        return notify_command(config_path, argv[optind], argv[optind + 1], argv[optind + 2], stderr);

    static char err[ERRBUF];
    if (log_path != NULL && log_open(log_path, err, sizeof err) != 0) {
        fprintf(stderr, "kembali: %s\n", err);
        return 1;
    }

    static struct app app;
    int rc = 1;
    pthread_mutex_init(&app.cfg_mu, NULL);
    app.listen_fd = -1;

    struct config *cfg = config_load(config_path, err, sizeof err);
    if (cfg == NULL) {
        fprintf(stderr, "kembali: the configuration is not usable:\n%s", err);
        goto out;
    }
    app.cfg = cfg; /* owned by app from here on */
    if (FCGX_Init() != 0) {
        fprintf(stderr, "kembali: FCGX_Init failed\n");
        goto out;
    }
    app.listen_fd = open_listener(listen_addr, err, sizeof err);
    if (app.listen_fd < 0) {
        fprintf(stderr, "kembali: %s\n", err);
        goto out;
    }
    set_io_timeouts(app.listen_fd);
    raise_fd_limit();
    if (user != NULL && drop_privileges(user, err, sizeof err) != 0) {
        fprintf(stderr, "kembali: %s\n", err);
        goto out;
    }
    /* after dropping privileges: the state file belongs to the serving user */
    struct state_opts so = {.tx_slots = cfg->state_slots, .read_timeout_ms = cfg->read_timeout_ms};
    app.state = state_open(cfg->state_dir, &so, err, sizeof err);
    if (app.state == NULL) {
        fprintf(stderr, "kembali: %s\n", err);
        goto out;
    }
    config_bind_state(cfg, app.state);

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    sigaddset(&sigs, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL); /* inherited by every thread */
    signal(SIGPIPE, SIG_IGN);

    app.resolver = resolver_new(&app, err, sizeof err);
    if (app.resolver == NULL) {
        fprintf(stderr, "kembali: %s\n", err);
        goto out;
    }
    if (resolver_start(app.resolver) != 0 || front_start(&app, ACCEPT_THREADS) != 0)
        goto out;

    struct log_line l;
    log_begin(&l, "info", "start");
    log_str(&l, "version", PACKAGE_VERSION);
    log_int(&l, "pid", getpid());
    log_int(&l, "shops", cfg->nshops);
    log_str(&l, "listen", listen_addr ? listen_addr : "inherited");
    log_str(&l, "api_base", cfg->api_base);
    log_end(&l);

    for (;;) {
        int sig = 0;
        if (sigwait(&sigs, &sig) != 0)
            continue;
        if (sig == SIGHUP || sig == SIGUSR1)
            log_reopen(log_path); /* a no-op without --log */
        if (sig == SIGHUP)
            reload(&app, config_path);
        if (sig == SIGHUP || sig == SIGUSR1)
            continue;
        break;
    }
    log_msg("info", "stop", "stopping: answering the requests in hand");
    rc = 0;
out:
    /* in reverse order of what was set up; each step copes with "not done" */
    front_stop(&app);
    if (app.resolver != NULL) {
        resolver_stop(app.resolver);
        resolver_free(app.resolver);
    }
    app_set_config(&app, NULL);
    state_free(app.state);
    if (rc == 0)
        log_msg("info", "stop", "stopped");
    return rc;
}
