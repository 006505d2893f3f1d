/* test_state_shared.c - the state file that processes on one host share:
 * creation and permissions, sharing between mappings and processes, the
 * cross-process wake, version stamps, and recovery after a process died
 * holding the lock (a forked child that _exit()s mid-update). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "state.h"
#include "util.h"

#define TIMEOUT 5000

static char dir[200];
/* tx_per_key: these tests fill the table with one key's entries */
static const struct state_opts OPTS = {.tx_slots = 64, .tx_per_key = 64, .key_slots = 8, .read_timeout_ms = TIMEOUT};

static int setup(void **ctx)
{
    (void)ctx;
    snprintf(dir, sizeof dir, "/tmp/kembali-state-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **ctx)
{
    char cmd[300];
    (void)ctx;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static struct state *open_ok(void)
{
    char err[512] = "";
    struct state *st = state_open(dir, &OPTS, err, sizeof err);
    if (st == NULL)
        print_error("state_open: %s\n", err);
    assert_non_null(st);
    state_test_keys_accepted(st, true); /* rejected keys: test_state.c */
    return st;
}

static struct outcome status_outcome(enum tx_status s)
{
    struct outcome o;
    memset(&o, 0, sizeof o);
    o.kind = OUT_STATUS;
    o.status = s;
    o.retry_after_ms = -1;
    snprintf(o.status_word, sizeof o.status_word, "%s", tx_status_word(s));
    return o;
}

static void file_mode(const char *name, mode_t want)
{
    char path[400];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, want);
}

static void test_creates_0600_files(void **ctx)
{
    (void)ctx;
    struct state *st = open_ok();
    char name[64];
    snprintf(name, sizeof name, "kembali-v%d.state", state_layout());
    file_mode(name, 0600);
    file_mode("kembali.lock", 0600);
    state_free(st);
}

static void test_creates_missing_dir_0700(void **ctx)
{
    (void)ctx;
    char sub[300], err[512];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    struct state *st = state_open(sub, &OPTS, err, sizeof err);
    assert_non_null(st);
    struct stat sb;
    assert_int_equal(stat(sub, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0700);
    state_free(st);
}

static void test_two_mappings_share_everything(void **ctx)
{
    (void)ctx;
    struct pace_schedule s;
    pace_default(&s);
    struct state *a = open_ok(), *b = open_ok();
    struct state_key ka, kb;
    state_key_id(a, "sk_test_secret", &ka);
    state_key_id(b, "sk_test_secret", &kb);
    assert_memory_equal(ka.b, kb.b, 16); /* one salt: one key identity */

    struct state_ticket t;
    struct state_fact f;
    int64_t now = util_mono_ms();
    uint32_t gen = state_generation(b);
    assert_true(state_claim(a, &ka, "T1", &s, 120, TIMEOUT, now, &t, &f));
    assert_false(state_claim(b, &kb, "T1", &s, 120, TIMEOUT, now + 10, &t, &f));
    assert_true(f.in_flight); /* b sees a's read in flight */

    struct outcome oc = status_outcome(TXS_SUCCEEDED);
    struct state_report rep;
    state_finish(a, &t, "toko-a", &oc, now + 20, &rep);
    assert_int_not_equal(state_generation(b), gen);
    state_lookup(b, &kb, "T1", &s, 120, now + 30, &f);
    assert_true(f.final);
    assert_int_equal(f.status, TXS_SUCCEEDED);
    state_free(a);
    state_free(b);
}

static void test_client_reads_in_flight_across_processes(void **ctx)
{
    (void)ctx;
    struct pace_schedule s;
    pace_default(&s);
    struct state *a = open_ok(), *b = open_ok();
    struct state_key k;
    struct state_client ca, cb;
    state_key_id(a, "sk_test_secret", &k);
    state_client_id(a, &k, "203.0.113.7", &ca);
    state_client_id(b, &k, "203.0.113.7", &cb);
    assert_memory_equal(ca.b, cb.b, 16); /* one salt: one client */
    struct state_ticket t[6];
    struct state_fact f;
    int64_t now = util_mono_ms();
    /* a burst over two processes: 3 guesses in flight in a, 2 in b */
    for (int i = 0; i < 5; i++) {
        char id[8];
        snprintf(id, sizeof id, "G%d", i);
        assert_true(state_claim_client(i < 3 ? a : b, &k, id, &s, 120, TIMEOUT, i < 3 ? &ca : &cb, now, &t[i], &f));
    }
    assert_false(state_claim_client(b, &k, "G5", &s, 120, TIMEOUT, &cb, now + 1, &t[5], &f));
    assert_int_equal(f.wait, WAIT_CLIENT);
    assert_false(state_claim_client(a, &k, "G5", &s, 120, TIMEOUT, &ca, now + 1, &t[5], &f));
    /* one of a's answers 200 (a payment that exists): b may read */
    struct outcome oc = status_outcome(TXS_PENDING);
    struct state_report rep;
    state_finish(a, &t[0], "toko-a", &oc, now + 2, &rep);
    assert_true(state_claim_client(b, &k, "G5", &s, 120, TIMEOUT, &cb, now + 3, &t[5], &f));
    state_free(a);
    state_free(b);
}

static void test_wake_across_processes(void **ctx)
{
    (void)ctx;
    struct pace_schedule s;
    pace_default(&s);
    struct state *st = open_ok();
    struct state_key k;
    state_key_id(st, "sk", &k);
    int claimed[2], go[2];
    assert_int_equal(pipe(claimed), 0);
    assert_int_equal(pipe(go), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* another process claims a read, then reports it when told */
        char err[256], c = 0;
        struct state *o = state_open(dir, &OPTS, err, sizeof err);
        struct state_ticket t;
        struct state_fact f;
        struct state_report rep;
        struct outcome oc = status_outcome(TXS_PENDING);
        if (o == NULL || !state_claim(o, &k, "T2", &s, 120, TIMEOUT, util_mono_ms(), &t, &f))
            _exit(2);
        if (write(claimed[1], "c", 1) != 1 || read(go[0], &c, 1) != 1)
            _exit(3);
        state_finish(o, &t, "toko-a", &oc, util_mono_ms(), &rep);
        _exit(0);
    }
    char c = 0;
    assert_int_equal(read(claimed[0], &c, 1), 1);
    /* from here only the child's finish moves the generation */
    uint32_t gen = state_generation(st);
    assert_int_equal(write(go[1], "g", 1), 1);
    int64_t t0 = util_mono_ms();
    uint32_t now_gen = state_wait_change(st, gen, 60000);
    int64_t waited = util_mono_ms() - t0;
    int wst;
    waitpid(pid, &wst, 0);
    assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    assert_int_not_equal(now_gen, gen);
    /* woken by the finish, not by the 60 s timeout: a margin no busy
     * machine closes (the wake's latency is measured in make bench) */
    assert_true(waited < 30000);
    for (int i = 0; i < 2; i++) {
        close(claimed[i]);
        close(go[i]);
    }
    state_free(st);
}

static void test_refuses_dir_others_can_write(void **ctx)
{
    (void)ctx;
    char err[512] = "";
    assert_int_equal(chmod(dir, 0777), 0);
    assert_null(state_open(dir, &OPTS, err, sizeof err));
    assert_non_null(strstr(err, "other users"));
    assert_int_equal(chmod(dir, 0770), 0);
    assert_null(state_open(dir, &OPTS, err, sizeof err));
    assert_int_equal(chmod(dir, 0755), 0);
    struct state *st = open_ok();
    state_free(st);
}

/* A state_dir so long that its files' paths would be cut short: refused,
 * never a file of a shorter name opened instead. */
static void test_refuses_too_long_dir(void **ctx)
{
    (void)ctx;
    char deep[4096];
    size_t n = (size_t)snprintf(deep, sizeof deep, "%s", dir);
    while (n + 1 + 200 < 4085) { /* one more level of 200 characters */
        deep[n++] = '/';
        memset(deep + n, 'd', 200);
        n += 200;
        deep[n] = '\0';
        assert_int_equal(mkdir(deep, 0700), 0);
    }
    deep[n++] = '/';
    memset(deep + n, 'e', 4085 - n);
    deep[4085] = '\0';
    assert_int_equal(mkdir(deep, 0700), 0);
    char err[512] = "";
    assert_null(state_open(deep, &OPTS, err, sizeof err));
    assert_non_null(strstr(err, "too long"));
}

static void test_refuses_file_with_loose_mode(void **ctx)
{
    (void)ctx;
    char path[400], err[512] = "";
    struct state *st = open_ok();
    state_free(st);
    snprintf(path, sizeof path, "%s/kembali-v%d.state", dir, state_layout());
    assert_int_equal(chmod(path, 0644), 0);
    assert_null(state_open(dir, &OPTS, err, sizeof err));
    assert_non_null(strstr(err, "0600"));
}

static void test_replaces_incompatible_file(void **ctx)
{
    (void)ctx;
    char path[400];
    snprintf(path, sizeof path, "%s/kembali-v%d.state", dir, state_layout());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    char junk[4096];
    memset(junk, 0x5a, sizeof junk); /* an older or foreign file */
    assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    close(fd);
    struct state *st = open_ok();
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.tx_slots, OPTS.tx_slots);
    assert_int_equal(m.tx_used, 0);
    state_free(st);
}

static bool dir_has(const char *name)
{
    char path[400];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &sb) == 0;
}

static struct state *open_layout(int layout)
{
    char err[512] = "";
    struct state_opts o = OPTS;
    o.layout = layout;
    struct state *st = state_open(dir, &o, err, sizeof err);
    if (st == NULL)
        print_error("state_open: %s\n", err);
    assert_non_null(st);
    return st;
}

/* Versions side by side: a process of another layout still running keeps
 * its file, its cache and its pace; the new one uses its own; once the
 * old one has stopped, the next start removes the old file. */
static void test_other_layout_in_use_is_kept(void **ctx)
{
    (void)ctx;
    int mine = state_layout(), old = mine - 1;
    char oldname[64], myname[64];
    snprintf(oldname, sizeof oldname, "kembali-v%d.state", old);
    snprintf(myname, sizeof myname, "kembali-v%d.state", mine);
    struct pace_schedule s;
    pace_default(&s);
    struct state *a = open_layout(old);
    struct state_key ka, kb;
    state_key_id(a, "sk_test_secret", &ka);
    struct state_ticket t;
    struct state_fact f;
    int64_t now = util_mono_ms();
    assert_true(state_claim(a, &ka, "T1", &s, 120, TIMEOUT, now, &t, &f));
    struct outcome oc = status_outcome(TXS_SUCCEEDED);
    struct state_report rep;
    state_finish(a, &t, "toko-a", &oc, now + 20, &rep);
    assert_true(state_claim(a, &ka, "T2", &s, 120, TIMEOUT, now + 30, &t, &f)); /* a read in flight */

    struct state *b = open_ok();
    assert_true(dir_has(oldname));
    assert_true(dir_has(myname));
    state_key_id(b, "sk_test_secret", &kb);
    state_lookup(b, &kb, "T1", &s, 120, now + 40, &f);
    assert_false(f.final); /* its own file: not the old one's cache */
    /* the old one's file untouched: its cache, its read in flight */
    state_lookup(a, &ka, "T1", &s, 120, now + 40, &f);
    assert_true(f.final);
    assert_int_equal(f.status, TXS_SUCCEEDED);
    assert_false(state_claim(a, &ka, "T2", &s, 120, TIMEOUT, now + 50, &t, &f));
    assert_true(f.in_flight);
    /* a second process of the old layout still joins the old file */
    struct state *a2 = open_layout(old);
    state_key_id(a2, "sk_test_secret", &ka);
    state_lookup(a2, &ka, "T1", &s, 120, now + 60, &f);
    assert_true(f.final);
    state_free(a2);
    state_free(b);
    assert_true(dir_has(oldname));

    state_free(a); /* the old layout's last process stops */
    assert_true(dir_has(oldname));
    b = open_ok();
    assert_false(dir_has(oldname));
    snprintf(oldname, sizeof oldname, "kembali-v%d.users", old);
    assert_false(dir_has(oldname));
    assert_true(dir_has(myname));
    assert_true(dir_has("kembali.lock"));
    state_free(b);
}

/* The releases before layouts were named: kembali.state, its users held
 * by every process mapping it. */
static void test_unnamed_layout_in_use_is_kept(void **ctx)
{
    (void)ctx;
    char path[400];
    snprintf(path, sizeof path, "%s/kembali.state", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    char junk[4096];
    memset(junk, 0x5a, sizeof junk); /* what this build cannot read */
    assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    close(fd);
    snprintf(path, sizeof path, "%s/kembali.users", dir);
    int users = open(path, O_RDWR | O_CREAT, 0600);
    assert_true(users >= 0);
    assert_int_equal(flock(users, LOCK_SH), 0); /* a live process of that release */

    struct state *st = open_ok();
    assert_true(dir_has("kembali.state"));
    struct stat sb;
    snprintf(path, sizeof path, "%s/kembali.state", dir);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, (off_t)sizeof junk); /* not replaced, not changed */
    fd = open(path, O_RDONLY);
    char back[4096];
    assert_int_equal(read(fd, back, sizeof back), (ssize_t)sizeof back);
    close(fd);
    assert_memory_equal(back, junk, sizeof junk);
    state_free(st);

    close(users); /* it stops */
    st = open_ok();
    assert_false(dir_has("kembali.state"));
    assert_false(dir_has("kembali.users"));
    state_free(st);
}

/* A file of another layout that no process uses goes at once; names
 * that only look alike stay. */
static void test_unused_other_layouts_removed(void **ctx)
{
    (void)ctx;
    struct state *a = open_layout(state_layout() + 3);
    state_free(a);
    char path[400];
    const char *keep[] = {"kembali-v.state", "kembali-v07.state", "kembali-vx.users", "notes.txt"};
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, keep[i]);
        int fd = open(path, O_WRONLY | O_CREAT, 0600);
        assert_true(fd >= 0);
        close(fd);
    }
    char gone[64];
    snprintf(gone, sizeof gone, "kembali-v%d.state", state_layout() + 3);
    assert_true(dir_has(gone));
    struct state *b = open_ok();
    assert_false(dir_has(gone));
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        assert_true(dir_has(keep[i]));
    state_free(b);
}

static void test_existing_file_keeps_its_size(void **ctx)
{
    (void)ctx;
    char err[512];
    struct state *a = open_ok();
    struct state_opts bigger = OPTS;
    bigger.tx_slots = 4096;
    bigger.key_slots = 500; /* more keys than it has slots: the key table grows (room for every key) */
    struct state *b = state_open(dir, &bigger, err, sizeof err);
    assert_non_null(b);
    struct state_metrics m;
    state_metrics(b, &m);
    assert_int_equal(m.tx_slots, OPTS.tx_slots); /* joined, not replaced under a */
    assert_int_equal(m.key_slots, 500);
    state_metrics(a, &m); /* a, which mapped it before, sees the grown table */
    assert_int_equal(m.key_slots, 500);
    assert_int_equal(m.tx_slots, OPTS.tx_slots);
    state_free(a);
    state_free(b);
}

/* Key i of the growth tests: its secret. */
static void growth_key(struct state *st, int i, struct state_key *k)
{
    char secret[32];
    snprintf(secret, sizeof secret, "sk_grow_%d", i);
    state_key_id(st, secret, k);
}

/* Read T<i> once with key i at `now` and finish it with `s` (401 for the
 * last key: a pause). true when the claim was granted. */
static bool growth_read(struct state *st, int i, enum tx_status s, bool unauthorized, int64_t now)
{
    struct pace_schedule sched;
    pace_default(&sched);
    struct state_key k;
    growth_key(st, i, &k);
    char id[16];
    snprintf(id, sizeof id, "T%d", i);
    struct state_ticket t;
    struct state_fact f;
    if (!state_claim(st, &k, id, &sched, 120, TIMEOUT, now, &t, &f))
        return false;
    struct outcome oc = status_outcome(s);
    if (unauthorized)
        oc.kind = OUT_UNAUTHORIZED;
    struct state_report rep;
    state_finish(st, &t, "toko", &oc, now + 1, &rep);
    return true;
}

/* Room for every key: a full key table (every key read within the minute:
 * none may be forgotten) grows in place, and every key keeps what it
 * holds: its budget ring, its pause, its transactions' statuses. */
static void test_key_table_grows_keeping_what_it_holds(void **ctx)
{
    (void)ctx;
    char err[512];
    struct state *st = open_ok();
    int64_t now = util_mono_ms();
    for (int i = 0; i < OPTS.key_slots; i++)
        assert_true(growth_read(st, i, TXS_SUCCEEDED, i == OPTS.key_slots - 1, now + i));
    /* full: a ninth key in use finds no slot */
    assert_false(growth_read(st, OPTS.key_slots, TXS_SUCCEEDED, false, now + 20));
    assert_int_equal(state_grow_keys(st, 40, err, sizeof err), 0);
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.key_slots, 40);
    assert_int_equal(m.key_used, OPTS.key_slots);
    struct pace_schedule sched;
    pace_default(&sched);
    for (int i = 0; i < OPTS.key_slots; i++) {
        struct state_key k;
        growth_key(st, i, &k);
        int reads;
        bool paused;
        state_key_usage(st, &k, now + 30, &reads, &paused);
        assert_int_equal(reads, 1);
        assert_int_equal(paused, i == OPTS.key_slots - 1);
        char id[16];
        snprintf(id, sizeof id, "T%d", i);
        struct state_fact f;
        state_lookup(st, &k, id, &sched, 120, now + 30, &f);
        if (i < OPTS.key_slots - 1) {
            assert_true(f.final);
            assert_int_equal(f.status, TXS_SUCCEEDED);
        }
    }
    for (int i = OPTS.key_slots; i < 40; i++)
        assert_true(growth_read(st, i, TXS_PENDING, false, now + 40 + i));
    state_metrics(st, &m);
    assert_int_equal(m.key_used, 40);
    assert_int_equal(state_grow_keys(st, 20, err, sizeof err), 0); /* never shrinks */
    state_metrics(st, &m);
    assert_int_equal(m.key_slots, 40);
    state_free(st);
    /* and a restart keeps it all */
    st = open_ok();
    state_metrics(st, &m);
    assert_int_equal(m.key_slots, 40);
    assert_int_equal(m.key_used, 40);
    state_free(st);
}

/* A process that mapped the file before another grew it sees the grown
 * table at its next lock: the keys the grower made, and room for its own. */
static void test_other_process_sees_the_grown_table(void **ctx)
{
    (void)ctx;
    struct state *st = open_ok();
    int64_t now = util_mono_ms();
    for (int i = 0; i < OPTS.key_slots; i++)
        assert_true(growth_read(st, i, TXS_SUCCEEDED, false, now + i));
    int opened[2], grown[2];
    assert_int_equal(pipe(opened), 0);
    assert_int_equal(pipe(grown), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* mapped before the growth; uses the table after it */
        char err[256], c = 0;
        struct state *o = state_open(dir, &OPTS, err, sizeof err);
        if (o == NULL || growth_read(o, 100, TXS_PENDING, false, util_mono_ms()))
            _exit(2); /* full before the growth */
        if (write(opened[1], "o", 1) != 1 || read(grown[0], &c, 1) != 1)
            _exit(3);
        int64_t t = util_mono_ms();
        for (int i = 100; i < 120; i++)
            if (!growth_read(o, i, TXS_PENDING, false, t + i))
                _exit(4);
        struct state_metrics m;
        state_metrics(o, &m);
        if (m.key_slots != 64 || m.key_used != OPTS.key_slots + 20)
            _exit(5);
        struct state_key k;
        growth_key(o, 3, &k);
        int reads;
        bool paused;
        state_key_usage(o, &k, t, &reads, &paused);
        _exit(reads == 1 ? 0 : 6);
    }
    char c = 0, err[256];
    assert_int_equal(read(opened[0], &c, 1), 1);
    assert_int_equal(state_grow_keys(st, 64, err, sizeof err), 0);
    assert_int_equal(write(grown[1], "g", 1), 1);
    int wst;
    waitpid(pid, &wst, 0);
    assert_true(WIFEXITED(wst));
    assert_int_equal(WEXITSTATUS(wst), 0);
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.key_used, OPTS.key_slots + 20);
    for (int i = 0; i < 2; i++) {
        close(opened[i]);
        close(grown[i]);
    }
    state_free(st);
}

/* The per-key quota is the file's: a process joining others keeps theirs
 * (one table, one rule); the first to open it alone sets its own, and
 * its default follows the file's size, not the process's state_slots. */
static void test_per_key_quota_is_the_files(void **ctx)
{
    (void)ctx;
    char err[512];
    struct state_metrics m;
    struct state_opts four = OPTS, sixteen = OPTS, dflt = OPTS;
    four.tx_per_key = 4;
    sixteen.tx_per_key = 16;
    dflt.tx_per_key = 0;
    dflt.tx_slots = 4096; /* the file keeps its 64 */
    struct state *a = state_open(dir, &four, err, sizeof err);
    assert_non_null(a);
    struct state *b = state_open(dir, &sixteen, err, sizeof err);
    assert_non_null(b);
    state_metrics(b, &m);
    assert_int_equal(m.tx_per_key, 4);
    state_free(a);
    state_free(b);
    struct state *c = state_open(dir, &sixteen, err, sizeof err);
    assert_non_null(c);
    state_metrics(c, &m);
    assert_int_equal(m.tx_per_key, 16);
    state_free(c);
    struct state *d = state_open(dir, &dflt, err, sizeof err);
    assert_non_null(d);
    state_metrics(d, &m);
    assert_int_equal(m.tx_slots, OPTS.tx_slots);
    assert_int_equal(m.tx_per_key, OPTS.tx_slots / 4);
    state_free(d);
}

/* What a process killed mid-update could leave: a chain pointing at a
 * garbage index, and a free slot marked used. */
static void damage(struct state *st)
{
    state_test_damage(st, STATE_TEST_CHAIN_OOB);
    state_test_damage(st, STATE_TEST_USED_FLAG);
}

static void test_dead_lock_holder_is_recovered(void **ctx)
{
    (void)ctx;
    struct pace_schedule s;
    pace_default(&s);
    struct state *st = open_ok();
    struct state_key k;
    state_key_id(st, "sk", &k);
    struct state_ticket t;
    struct state_fact f;
    struct state_report rep;
    int64_t now = util_mono_ms();
    /* a cached final status that must survive the recovery */
    assert_true(state_claim(st, &k, "KEEP", &s, 120, TIMEOUT, now, &t, &f));
    struct outcome oc = status_outcome(TXS_FAILED);
    state_finish(st, &t, "toko-a", &oc, now, &rep);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char err[256];
        struct state *c = state_open(dir, &OPTS, err, sizeof err);
        if (c == NULL)
            _exit(2);
        state_test_die_holding_lock(c, damage);
    }
    int wst;
    waitpid(pid, &wst, 0);
    assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);

    /* the next locker recovers instead of hanging, and the facts are intact */
    state_lookup(st, &k, "KEEP", &s, 120, now + 10, &f);
    assert_true(f.final);
    assert_int_equal(f.status, TXS_FAILED);
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.recoveries, 1);
    /* and it keeps working: new transactions can be claimed and finished */
    for (int i = 0; i < 40; i++) {
        char id[16];
        snprintf(id, sizeof id, "N%d", i);
        assert_true(state_claim(st, &k, id, &s, 300, TIMEOUT, now + 20 + i, &t, &f));
        oc = status_outcome(TXS_PENDING);
        state_finish(st, &t, "toko-a", &oc, now + 21 + i, &rep);
    }
    state_lookup(st, &k, "KEEP", &s, 300, now + 100, &f);
    assert_true(f.final);
    state_free(st);
}

/* ---- a state file nobody uses, or a copy taken under the lock ---- */

/* Wait for child `pid` at most ms; a child still running then is killed
 * and the test fails (a hang must fail the test, not stall it). */
static int wait_child(pid_t pid, int ms)
{
    int wst = 0;
    for (int waited = 0; waited < ms; waited += 10) {
        pid_t r = waitpid(pid, &wst, WNOHANG);
        if (r == pid)
            return WIFEXITED(wst) ? WEXITSTATUS(wst) : 100 + (WIFSIGNALED(wst) ? WTERMSIG(wst) : 0);
        usleep(10 * 1000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &wst, 0);
    fail_msg("child %d still running after %d ms: it hangs", (int)pid, ms);
    return -1;
}

static void claim_finish(struct state *st, const struct state_key *k, const char *id, enum tx_status s,
                         int64_t now)
{
    struct pace_schedule sc;
    pace_default(&sc);
    struct state_ticket t;
    struct state_fact f;
    struct state_report rep;
    assert_true(state_claim(st, k, id, &sc, 300, TIMEOUT, now, &t, &f));
    struct outcome oc = status_outcome(s);
    state_finish(st, &t, "toko-a", &oc, now + 1, &rep);
}

static char copy_dir[300];

/* Copy dir/kembali.state into copy_dir while the lock is held: what a
 * backup, a VM snapshot or a power cut leaves. */
static void copy_under_lock(struct state *st)
{
    (void)st;
    char cmd[800];
    snprintf(cmd, sizeof cmd, "cp -p '%s/kembali-v%d.state' '%s/'", dir, state_layout(), copy_dir);
    if (system(cmd) != 0)
        _exit(3);
}

static void test_copy_taken_under_lock_never_hangs(void **ctx)
{
    (void)ctx;
    struct pace_schedule s;
    pace_default(&s);
    snprintf(copy_dir, sizeof copy_dir, "%s/restored", dir);
    assert_int_equal(mkdir(copy_dir, 0700), 0);
    struct state *st = open_ok();
    struct state_key k;
    state_key_id(st, "sk", &k);
    int64_t now = util_mono_ms();
    claim_finish(st, &k, "KEEP", TXS_SUCCEEDED, now);
    struct state_ticket t;
    struct state_fact f;
    assert_true(state_claim(st, &k, "INFLIGHT", &s, 300, TIMEOUT, now, &t, &f));

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char err[256];
        struct state *c = state_open(dir, &OPTS, err, sizeof err);
        if (c == NULL)
            _exit(2);
        state_test_die_holding_lock(c, copy_under_lock);
    }
    assert_int_equal(wait_child(pid, 5000), 0);

    /* a fresh process opens the copy: nobody lives that uses it */
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char err[256];
        struct state *c = state_open(copy_dir, &OPTS, err, sizeof err);
        if (c == NULL)
            _exit(2);
        struct state_key ck;
        state_key_id(c, "sk", &ck); /* the copy's salt: the same key identity */
        if (memcmp(ck.b, k.b, 16) != 0)
            _exit(3);
        int64_t n = util_mono_ms();
        state_lookup(c, &ck, "KEEP", &s, 300, n, &f);
        if (!f.final || f.status != TXS_SUCCEEDED)
            _exit(4); /* the facts are kept */
        state_lookup(c, &ck, "INFLIGHT", &s, 300, n, &f);
        if (f.in_flight)
            _exit(5); /* a dead process's read is not waited for */
        struct state_ticket ct;
        if (!state_claim(c, &ck, "NEW", &s, 300, TIMEOUT, n, &ct, &f))
            _exit(6);
        struct state_metrics m;
        state_metrics(c, &m);
        if (m.stale_locks != 1)
            _exit(7);
        _exit(0);
    }
    assert_int_equal(wait_child(pid, 5000), 0);
    /* the original, with its live user, goes on */
    state_lookup(st, &k, "KEEP", &s, 300, now + 10, &f);
    assert_true(f.final);
    state_free(st);
}

static void test_a_live_user_keeps_its_reads(void **ctx)
{
    (void)ctx;
    struct pace_schedule s;
    pace_default(&s);
    struct state *st = open_ok();
    struct state_key k;
    state_key_id(st, "sk", &k);
    struct state_ticket t;
    struct state_fact f;
    assert_true(state_claim(st, &k, "T", &s, 300, TIMEOUT, util_mono_ms(), &t, &f));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* another process joins: it is not alone, nothing is reset */
        char err[256];
        struct state *c = state_open(dir, &OPTS, err, sizeof err);
        if (c == NULL)
            _exit(2);
        state_lookup(c, &k, "T", &s, 300, util_mono_ms(), &f);
        _exit(f.in_flight ? 0 : 3);
    }
    assert_int_equal(wait_child(pid, 5000), 0);
    state_free(st);
}

static void test_last_user_gone_releases_leases(void **ctx)
{
    (void)ctx;
    struct pace_schedule s;
    pace_default(&s);
    struct state *st = open_ok();
    struct state_key k;
    state_key_id(st, "sk", &k);
    int64_t now = util_mono_ms();
    claim_finish(st, &k, "KEEP", TXS_FAILED, now);
    struct state_ticket t;
    struct state_fact f;
    assert_true(state_claim(st, &k, "T", &s, 300, TIMEOUT, now, &t, &f));
    state_free(st); /* the last user stops (its read dies with it) */
    st = open_ok();
    state_lookup(st, &k, "T", &s, 300, now + 10, &f);
    assert_false(f.in_flight);
    assert_true(f.next_read >= now + 1500); /* the pace stays */
    state_lookup(st, &k, "KEEP", &s, 300, now + 10, &f);
    assert_true(f.final);
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.stale_locks, 0);
    assert_int_equal(m.repairs, 0);
    state_free(st);
}

static void test_processes_starting_together_share_one_file(void **ctx)
{
    (void)ctx;
    enum { N = 6 };
    int go[2], res[2], rel[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(res), 0);
    assert_int_equal(pipe(rel), 0);
    pid_t pids[N];
    for (int i = 0; i < N; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            char c, err[256];
            close(go[1]);
            close(res[0]);
            close(rel[1]);
            if (read(go[0], &c, 1) < 0) /* EOF: everybody starts at once */
                _exit(2);
            struct pace_schedule s;
            pace_default(&s);
            struct state *st = state_open(dir, &OPTS, err, sizeof err);
            char r = 'E';
            if (st != NULL) {
                struct state_key k;
                struct state_ticket t;
                struct state_fact f;
                state_key_id(st, "sk", &k);
                r = state_claim(st, &k, "T", &s, 300, TIMEOUT, util_mono_ms(), &t, &f) ? 'C' : 'W';
            }
            if (write(res[1], &r, 1) != 1)
                _exit(2);
            while (read(rel[0], &c, 1) > 0) /* stay a user until everybody has claimed */
                ;
            _exit(0);
        }
    }
    close(go[0]);
    close(res[1]);
    close(rel[0]);
    close(go[1]);
    int claimed = 0, waited = 0;
    for (int i = 0; i < N; i++) {
        char r;
        assert_int_equal(read(res[0], &r, 1), 1);
        assert_true(r == 'C' || r == 'W');
        claimed += r == 'C';
        waited += r == 'W';
    }
    close(rel[1]);
    for (int i = 0; i < N; i++)
        assert_int_equal(wait_child(pids[i], 5000), 0);
    close(res[0]);
    assert_int_equal(claimed, 1); /* one file, one salt, one pace */
    assert_int_equal(waited, N - 1);
}

static void test_file_from_another_boot(void **ctx)
{
    (void)ctx;
    /* a file written under another boot's monotonic clock (10 days ahead
     * of ours): no time in it may hold anything up for longer than its
     * longest span from now */
    struct pace_schedule s;
    pace_default(&s);
    struct state *st = open_ok();
    struct state_key k;
    state_key_id(st, "sk", &k);
    int64_t then = util_mono_ms() + 10 * 86400 * 1000LL;
    claim_finish(st, &k, "PAID", TXS_SUCCEEDED, then);
    struct state_ticket t;
    struct state_fact f;
    struct state_report rep;
    assert_true(state_claim(st, &k, "GONE", &s, 300, TIMEOUT, then, &t, &f));
    struct outcome nf = {.kind = OUT_NOT_FOUND, .retry_after_ms = -1};
    state_finish(st, &t, "toko-a", &nf, then + 1, &rep);
    assert_true(state_claim(st, &k, "LIMITED", &s, 300, TIMEOUT, then, &t, &f));
    struct outcome kl = {.kind = OUT_KEY_LIMITED, .retry_after_ms = -1};
    state_finish(st, &t, "toko-a", &kl, then + 1, &rep);
    state_free(st);

    st = open_ok(); /* alone: reset and checked against our clock */
    int64_t now = util_mono_ms();
    state_lookup(st, &k, "PAID", &s, 300, now, &f);
    assert_true(f.final); /* a final status stays final ... */
    assert_true(f.known_until <= now + STATE_TTL_FINAL_MS + 10000);
    state_lookup(st, &k, "GONE", &s, 300, now, &f);
    assert_true(f.not_found);
    assert_true(f.known_until <= now + STATE_TTL_NOT_FOUND_MS + 10000); /* ... a 404 for 30 s at most */
    state_lookup(st, &k, "NEW", &s, 300, now, &f);
    assert_true(f.next_read <= now + 3600 * 1000LL + 10000); /* the key's pause: bounded */
    struct state_key k2;
    state_key_id(st, "sk2", &k2);
    state_lookup(st, &k2, "NEW", &s, 300, now, &f);
    assert_true(f.next_read <= now); /* another key reads at once */
    state_lookup(st, &k2, "PAID", &s, 300, now, &f);
    struct state_metrics m;
    state_metrics(st, &m);
    assert_true(m.repairs >= 1);
    state_free(st);
}

/* ---- every kind of damage, after a crash and at open ---- */

static enum state_test_damage the_damage;

static void damage_one(struct state *st)
{
    state_test_damage(st, the_damage);
}

/* Damage that targets the first entry in use (KEEP) may drop it. */
static bool drops_keep(enum state_test_damage d)
{
    return d == STATE_TEST_ID_NUL || d == STATE_TEST_WORD_NUL || d == STATE_TEST_STATUS || d == STATE_TEST_TIMES ||
           d == STATE_TEST_REMOTE_WAIT;
}

/* The state after damage `d` was repaired: no hang, no access out of
 * bounds, what survived reads as before, and it keeps working. */
static void check_repaired(struct state *st, const struct state_key *k, enum state_test_damage d, bool replaced,
                           int64_t now)
{
    struct pace_schedule s;
    pace_default(&s);
    struct state_fact f;
    struct state_metrics m;
    state_lookup(st, k, "KEEP", &s, 300, now, &f);
    if (drops_keep(d) || replaced)
        assert_int_equal(f.status, TXS_NONE);
    else
        assert_true(f.final);
    /* another host's marks read from the damage: bounded by their spans */
    assert_true(f.in_flight_until <= now + STATE_LEASE_MAX_MS + 1000 + 10000);
    if (d == STATE_TEST_REMOTE_TIMES)
        assert_true(f.next_read <= now + STATE_DEFER_MAX_MS + 10000);
    state_metrics(st, &m);
    assert_true(m.repairs >= 1 || replaced);
    assert_true(m.tx_used >= 0 && m.tx_used <= OPTS.tx_slots);
    struct state_key k2;
    state_key_id(st, "sk_other", &k2);
    bool paused = d == STATE_TEST_TIMES; /* a host pause read from the damage: bounded */
    for (int i = 0; i < 70; i++) { /* more than the table holds: eviction walks too */
        char id[16];
        snprintf(id, sizeof id, "N%d", i);
        struct state_ticket t;
        int64_t at = now + 100000 + i * 70000; /* each one's episode over before the next */
        if (state_claim(st, &k2, id, &s, 300, TIMEOUT, at, &t, &f)) {
            struct outcome oc = status_outcome(TXS_PENDING);
            struct state_report rep;
            state_finish(st, &t, "toko-a", &oc, at + 1, &rep);
        } else {
            assert_true(paused);
            assert_true(f.next_read <= now + 2 * 3600 * 1000LL); /* never for ever */
        }
    }
}

static void populate(struct state *st, struct state_key *k, int64_t now)
{
    struct pace_schedule s;
    pace_default(&s);
    state_key_id(st, "sk", k);
    claim_finish(st, k, "KEEP", TXS_SUCCEEDED, now);
    claim_finish(st, k, "P", TXS_PENDING, now + 2);
    struct state_ticket t;
    struct state_fact f;
    assert_true(state_claim(st, k, "INFLIGHT", &s, 300, TIMEOUT, now + 4, &t, &f));
}

static void test_each_damage_after_a_crash(void **ctx)
{
    (void)ctx;
    char base[sizeof dir - 8];
    memcpy(base, dir, sizeof base - 1); /* mkdtemp: well within */
    base[sizeof base - 1] = 0;
    for (int d = 0; d < STATE_TEST_DAMAGE_N; d++) {
        snprintf(dir, sizeof dir, "%s/c%d", base, d);
        assert_int_equal(mkdir(dir, 0700), 0);
        struct state *st = open_ok();
        struct state_key k;
        int64_t now = util_mono_ms();
        populate(st, &k, now);
        the_damage = (enum state_test_damage)d;
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            char err[256];
            struct state *c = state_open(dir, &OPTS, err, sizeof err);
            if (c == NULL)
                _exit(2);
            state_test_die_holding_lock(c, damage_one);
        }
        assert_int_equal(wait_child(pid, 5000), 0);
        print_message("damage %d after a crash\n", d);
        check_repaired(st, &k, (enum state_test_damage)d, false, now + 10);
        struct state_metrics m;
        state_metrics(st, &m);
        assert_int_equal(m.recoveries, 1);
        state_free(st);
    }
    snprintf(dir, sizeof dir, "%.*s", (int)sizeof base - 1, base);
}

static void test_each_damage_at_open(void **ctx)
{
    (void)ctx;
    char base[sizeof dir - 8];
    memcpy(base, dir, sizeof base - 1); /* mkdtemp: well within */
    base[sizeof base - 1] = 0;
    for (int d = 0; d < STATE_TEST_DAMAGE_N; d++) {
        snprintf(dir, sizeof dir, "%s/o%d", base, d);
        assert_int_equal(mkdir(dir, 0700), 0);
        struct state *st = open_ok();
        struct state_key k;
        int64_t now = util_mono_ms();
        populate(st, &k, now);
        state_test_damage(st, (enum state_test_damage)d); /* its only user: no lock needed */
        state_free(st);
        print_message("damage %d at open\n", d);
        pid_t pid = fork(); /* in a child, so that a hang fails the test */
        assert_true(pid >= 0);
        if (pid == 0) {
            st = open_ok();
            /* a scribbled geometry cannot be trusted to find the tables:
             * that file is replaced */
            check_repaired(st, &k, (enum state_test_damage)d, d == STATE_TEST_HEADER, now + 10);
            state_free(st);
            _exit(0);
        }
        assert_int_equal(wait_child(pid, 10000), 0);
    }
    snprintf(dir, sizeof dir, "%.*s", (int)sizeof base - 1, base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_creates_0600_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_creates_missing_dir_0700, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_mappings_share_everything, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_reads_in_flight_across_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wake_across_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_dir_others_can_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_too_long_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_file_with_loose_mode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replaces_incompatible_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_layout_in_use_is_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unnamed_layout_in_use_is_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unused_other_layouts_removed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_existing_file_keeps_its_size, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_table_grows_keeping_what_it_holds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_process_sees_the_grown_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_per_key_quota_is_the_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_lock_holder_is_recovered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_taken_under_lock_never_hangs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_live_user_keeps_its_reads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_last_user_gone_releases_leases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_processes_starting_together_share_one_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_from_another_boot, setup, teardown),
        cmocka_unit_test_setup_teardown(test_each_damage_after_a_crash, setup, teardown),
        cmocka_unit_test_setup_teardown(test_each_damage_at_open, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
