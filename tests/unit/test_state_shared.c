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
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "state.h"
#include "util.h"

#define TIMEOUT 5000

static char dir[256];
static const struct state_opts OPTS = {.tx_slots = 64, .key_slots = 8, .read_timeout_ms = TIMEOUT};

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
    file_mode("kembali.state", 0600);
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
    assert_true(state_claim(a, &ka, "T1", &s, 120, now, &t, &f));
    assert_false(state_claim(b, &kb, "T1", &s, 120, now + 10, &t, &f));
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

static void test_wake_across_processes(void **ctx)
{
    (void)ctx;
    struct pace_schedule s;
    pace_default(&s);
    struct state *st = open_ok();
    struct state_key k;
    state_key_id(st, "sk", &k);
    uint32_t gen = state_generation(st);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* another process makes a read and reports it */
        char err[256];
        struct state *c = state_open(dir, &OPTS, err, sizeof err);
        struct state_ticket t;
        struct state_fact f;
        struct state_report rep;
        struct outcome oc = status_outcome(TXS_PENDING);
        if (c == NULL || !state_claim(c, &k, "T2", &s, 120, util_mono_ms(), &t, &f))
            _exit(2);
        usleep(200 * 1000);
        state_finish(c, &t, "toko-a", &oc, util_mono_ms(), &rep);
        _exit(0);
    }
    int64_t t0 = util_mono_ms();
    uint32_t now_gen = state_wait_change(st, gen, 5000);
    int64_t waited = util_mono_ms() - t0;
    int wst;
    waitpid(pid, &wst, 0);
    assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    assert_int_not_equal(now_gen, gen);
    assert_in_range(waited, 150, 1000); /* woken by the child's finish, not by the 5 s timeout */
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

static void test_refuses_file_with_loose_mode(void **ctx)
{
    (void)ctx;
    char path[400], err[512] = "";
    struct state *st = open_ok();
    state_free(st);
    snprintf(path, sizeof path, "%s/kembali.state", dir);
    assert_int_equal(chmod(path, 0644), 0);
    assert_null(state_open(dir, &OPTS, err, sizeof err));
    assert_non_null(strstr(err, "0600"));
}

static void test_replaces_incompatible_file(void **ctx)
{
    (void)ctx;
    char path[400];
    snprintf(path, sizeof path, "%s/kembali.state", dir);
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

static void test_existing_file_keeps_its_size(void **ctx)
{
    (void)ctx;
    char err[512];
    struct state *a = open_ok();
    struct state_opts bigger = OPTS;
    bigger.tx_slots = 4096;
    struct state *b = state_open(dir, &bigger, err, sizeof err);
    assert_non_null(b);
    struct state_metrics m;
    state_metrics(b, &m);
    assert_int_equal(m.tx_slots, OPTS.tx_slots); /* joined, not replaced under a */
    state_free(a);
    state_free(b);
}

/* What a process killed mid-update could leave: a chain pointing at a
 * garbage index, and a slot marked used with a torn id. */
static void damage(void *base)
{
    /* the layout is private to state.c; scribble where tables live */
    uint8_t *p = base;
    memset(p + 4096, 0xff, 64);
    memset(p + 8192, 0x41, 32);
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
    assert_true(state_claim(st, &k, "KEEP", &s, 120, now, &t, &f));
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
        assert_true(state_claim(st, &k, id, &s, 300, now + 20 + i, &t, &f));
        oc = status_outcome(TXS_PENDING);
        state_finish(st, &t, "toko-a", &oc, now + 21 + i, &rep);
    }
    state_lookup(st, &k, "KEEP", &s, 300, now + 100, &f);
    assert_true(f.final);
    state_free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_creates_0600_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_creates_missing_dir_0700, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_mappings_share_everything, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wake_across_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_dir_others_can_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_file_with_loose_mode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replaces_incompatible_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_existing_file_keeps_its_size, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_lock_holder_is_recovered, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
