/* test_hostreg.c - unit tests of src/hostreg.c: the host registry's text
 * and the decision of who holds which host (docs/tenants.md, "Who holds a host"). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "hostreg.h"

#define MAXF 8

/* One decision's inputs and outputs. */
struct run {
    struct hostreg held, out;
    const char *main[4];
    size_t nmain;
    struct hostreg_file f[MAXF];
    const char *hosts[MAXF][4];
    size_t nf;
    struct hostreg_clash clash[MAXF * 4];
    size_t nclash;
};

static void hold(struct run *r, const char *host, const char *shop)
{
    assert_int_equal(hostreg_put(&r->held, host, shop), 0);
}

/* A file of shops_dir (added in name order): NULL-ended host list. */
static struct hostreg_file *file(struct run *r, const char *shop, bool loads, ...)
{
    struct hostreg_file *f = &r->f[r->nf];
    va_list ap;
    va_start(ap, loads);
    int n = 0;
    for (const char *h; (h = va_arg(ap, const char *)) != NULL;)
        r->hosts[r->nf][n++] = h;
    va_end(ap);
    *f = (struct hostreg_file){shop, r->hosts[r->nf], n, loads, false, false};
    r->nf++;
    return f;
}

static void decide(struct run *r)
{
    assert_int_equal(hostreg_decide(&r->held, r->main, r->nmain, r->f, r->nf, &r->out, r->clash, &r->nclash), 0);
}

/* The holder of host after the decision ("" for nobody). */
static const char *holder(const struct run *r, const char *host)
{
    const char *s = hostreg_holder(&r->out, host);
    return s ? s : "";
}

/* The clash of file `shop` on host, or NULL. */
static const struct hostreg_clash *clash_of(const struct run *r, const char *shop, const char *host)
{
    for (size_t i = 0; i < r->nclash; i++)
        if (strcmp(r->f[r->clash[i].file].shop, shop) == 0 && strcmp(r->clash[i].host, host) == 0)
            return &r->clash[i];
    return NULL;
}

static void done(struct run *r)
{
    hostreg_free(&r->held);
    hostreg_free(&r->out);
}

static void test_free_host_goes_to_its_only_claimant(void **unused)
{
    (void)unused;
    struct run r = {0};
    struct hostreg_file *a = file(&r, "toko-a", true, "a.example", "www.a.example", NULL);
    decide(&r);
    assert_true(a->wins);
    assert_string_equal(holder(&r, "a.example"), "toko-a");
    assert_string_equal(holder(&r, "www.a.example"), "toko-a");
    assert_int_equal(r.out.n, 2);
    assert_int_equal(r.nclash, 0);
    done(&r);
}

static void test_two_claimants_of_a_free_host_get_nothing(void **unused)
{
    (void)unused;
    struct run r = {0};
    struct hostreg_file *a = file(&r, "00-evil", true, "b.test", "evil.test", NULL);
    struct hostreg_file *b = file(&r, "toko-b", true, "b.test", NULL);
    decide(&r);
    assert_false(a->wins);
    assert_false(b->wins);
    assert_string_equal(holder(&r, "b.test"), "");
    assert_string_equal(holder(&r, "evil.test"), "00-evil"); /* its own free host: it keeps it, not served */
    const struct hostreg_clash *k = clash_of(&r, "00-evil", "b.test");
    assert_non_null(k);
    assert_int_equal(k->kind, HOSTREG_BOTH);
    assert_string_equal(r.f[k->other].shop, "toko-b");
    k = clash_of(&r, "toko-b", "b.test");
    assert_non_null(k);
    assert_int_equal(k->kind, HOSTREG_BOTH);
    assert_string_equal(r.f[k->other].shop, "00-evil");
    assert_int_equal(r.nclash, 2);
    done(&r);
}

/* The restart case: the registry says toko-b held b.test; an intruder's
 * file (sorting first) lists it too. */
static void test_held_host_stays_whatever_the_names_sort_as(void **unused)
{
    (void)unused;
    struct run r = {0};
    hold(&r, "b.test", "toko-b");
    struct hostreg_file *x = file(&r, "00-intruder", true, "b.test", NULL);
    struct hostreg_file *b = file(&r, "toko-b", true, "b.test", NULL);
    decide(&r);
    assert_true(b->wins);
    assert_false(x->wins);
    assert_string_equal(holder(&r, "b.test"), "toko-b");
    const struct hostreg_clash *k = clash_of(&r, "00-intruder", "b.test");
    assert_int_equal(k->kind, HOSTREG_HELD);
    assert_string_equal(r.f[k->other].shop, "toko-b");
    assert_int_equal(r.nclash, 1);
    done(&r);
}

/* A broken file (nothing readable, not even its hosts) keeps what it held. */
static void test_broken_file_keeps_its_hosts(void **unused)
{
    (void)unused;
    struct run r = {0};
    hold(&r, "a.example", "toko-a");
    struct hostreg_file *a = file(&r, "toko-a", false, NULL);
    struct hostreg_file *e = file(&r, "zz-evil", true, "a.example", "evil.example", NULL);
    decide(&r);
    assert_false(a->wins);
    assert_false(e->wins);
    assert_string_equal(holder(&r, "a.example"), "toko-a");
    assert_int_equal(clash_of(&r, "zz-evil", "a.example")->kind, HOSTREG_HELD);
    done(&r);
}

/* The squatter case at a first start: the victim's key is refused (its
 * file does not load but lists its host), evil lists that host too:
 * nobody gets it; once the victim's file loads it is still contested
 * (neither held it), and evil never gets it. */
static void test_broken_file_claims_the_free_hosts_it_lists(void **unused)
{
    (void)unused;
    struct run r = {0};
    struct hostreg_file *a = file(&r, "toko-a", false, "a.example", NULL);
    struct hostreg_file *e = file(&r, "evil", true, "a.example", "evil.example", NULL);
    decide(&r);
    assert_false(a->wins);
    assert_false(e->wins);
    assert_string_equal(holder(&r, "a.example"), "");
    assert_int_equal(clash_of(&r, "evil", "a.example")->kind, HOSTREG_BOTH);
    done(&r);

    /* alone, the broken file holds the host: no newcomer may take it */
    struct run r2 = {0};
    file(&r2, "toko-a", false, "a.example", NULL);
    decide(&r2);
    assert_string_equal(holder(&r2, "a.example"), "toko-a");
    struct run r3 = {0};
    hold(&r3, "a.example", "toko-a");
    a = file(&r3, "evil", true, "a.example", NULL);
    e = file(&r3, "toko-a", true, "a.example", NULL); /* its key fixed */
    decide(&r3);
    assert_true(e->wins);
    assert_false(a->wins);
    assert_string_equal(holder(&r3, "a.example"), "toko-a");
    done(&r2);
    done(&r3);
}

static void test_release_by_removal_or_by_not_listing(void **unused)
{
    (void)unused;
    /* toko-b's file was removed: its hosts are free */
    struct run r = {0};
    hold(&r, "b.test", "toko-b");
    hold(&r, "gone.test", "toko-b");
    struct hostreg_file *c = file(&r, "toko-c", true, "b.test", NULL);
    decide(&r);
    assert_true(c->wins);
    assert_string_equal(holder(&r, "b.test"), "toko-c");
    assert_string_equal(holder(&r, "gone.test"), "");
    assert_int_equal(r.out.n, 1);
    done(&r);

    /* toko-b's version loads and no longer lists b.test: released, and
     * taken in the same decision */
    struct run r2 = {0};
    hold(&r2, "b.test", "toko-b");
    struct hostreg_file *b = file(&r2, "toko-b", true, "bb.test", NULL);
    c = file(&r2, "toko-c", true, "b.test", NULL);
    decide(&r2);
    assert_true(b->wins);
    assert_true(c->wins);
    assert_string_equal(holder(&r2, "b.test"), "toko-c");
    assert_string_equal(holder(&r2, "bb.test"), "toko-b");
    done(&r2);

    /* ... but a version that does not serve (refused: another's notify
     * secret) frees nothing */
    struct run r3 = {0};
    hold(&r3, "b.test", "toko-b");
    b = file(&r3, "toko-b", true, "bb.test", NULL);
    b->refused = true;
    c = file(&r3, "toko-c", true, "b.test", NULL);
    decide(&r3);
    assert_false(b->wins);
    assert_false(c->wins);
    assert_string_equal(holder(&r3, "b.test"), "toko-b");
    assert_string_equal(holder(&r3, "bb.test"), "toko-b");
    done(&r3);
}

/* A version that loses one host keeps every host it held, which can make
 * another file lose in turn. */
static void test_a_loser_keeps_its_hosts_in_turn(void **unused)
{
    (void)unused;
    struct run r = {0};
    hold(&r, "a1.test", "toko-a");
    hold(&r, "a3.test", "toko-a");
    hold(&r, "c.test", "toko-c");
    /* toko-a drops a3 but now wants toko-c's host: it loses, so a3 stays its own */
    struct hostreg_file *a = file(&r, "toko-a", true, "a1.test", "c.test", NULL);
    struct hostreg_file *b = file(&r, "toko-b", true, "a3.test", NULL);
    struct hostreg_file *c = file(&r, "toko-c", true, "c.test", NULL);
    decide(&r);
    assert_false(a->wins);
    assert_false(b->wins);
    assert_true(c->wins);
    assert_string_equal(holder(&r, "a3.test"), "toko-a");
    assert_string_equal(holder(&r, "a1.test"), "toko-a");
    assert_int_equal(clash_of(&r, "toko-b", "a3.test")->kind, HOSTREG_HELD);
    assert_int_equal(clash_of(&r, "toko-a", "c.test")->kind, HOSTREG_HELD);
    done(&r);
}

static void test_main_configuration_hosts_are_never_held(void **unused)
{
    (void)unused;
    struct run r = {0};
    hold(&r, "main.test", "toko-a");
    r.main[r.nmain++] = "main.test";
    struct hostreg_file *a = file(&r, "toko-a", true, "main.test", "a.test", NULL);
    decide(&r);
    assert_false(a->wins);
    assert_string_equal(holder(&r, "main.test"), "");
    assert_string_equal(holder(&r, "a.test"), "toko-a");
    const struct hostreg_clash *k = clash_of(&r, "toko-a", "main.test");
    assert_int_equal(k->kind, HOSTREG_MAIN);
    assert_int_equal(k->other, -1);
    done(&r);
}

static void test_host_listed_twice_is_one_claim(void **unused)
{
    (void)unused;
    struct run r = {0};
    struct hostreg_file *a = file(&r, "toko-a", true, "a.test", "a.test", NULL);
    decide(&r);
    assert_true(a->wins);
    assert_string_equal(holder(&r, "a.test"), "toko-a");
    done(&r);
}

static void test_text_round_trip(void **unused)
{
    (void)unused;
    struct hostreg r = {0}, back = {0};
    assert_int_equal(hostreg_put(&r, "b.test", "toko-b"), 0);
    assert_int_equal(hostreg_put(&r, "a.test", "toko-a"), 0);
    assert_int_equal(hostreg_put(&r, "[2001:db8::1]", "toko-6"), 0);
    assert_int_equal(hostreg_put(&r, "a.test", "toko-x"), 0); /* replaced */
    assert_int_equal(r.n, 3);
    size_t len;
    char *txt = hostreg_format(&r, &len);
    assert_non_null(txt);
    assert_string_equal(txt, HOSTREG_HEADER "\n[2001:db8::1] toko-6\na.test toko-x\nb.test toko-b\n");
    char why[300];
    assert_int_equal(hostreg_parse(txt, len, &back, why, sizeof why), 0);
    assert_true(hostreg_equal(&r, &back));
    free(txt);
    hostreg_free(&back);
    struct hostreg empty = {0};
    txt = hostreg_format(&empty, &len);
    assert_int_equal(hostreg_parse(txt, len, &back, why, sizeof why), 0);
    assert_int_equal(back.n, 0);
    assert_false(hostreg_equal(&r, &back));
    free(txt);
    hostreg_free(&r);
}

static void test_damaged_text_refused(void **unused)
{
    (void)unused;
    const char *bad[] = {
        "", "a.test toko-a\n", HOSTREG_HEADER, HOSTREG_HEADER "\na.test toko-a",
        HOSTREG_HEADER "\na.test\n", HOSTREG_HEADER "\na.test toko-a extra\n",
        HOSTREG_HEADER "\na.test toko-a\na.test toko-b\n", HOSTREG_HEADER "\n toko-a\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct hostreg r = {0};
        char why[300] = "";
        assert_int_equal(hostreg_parse(bad[i], strlen(bad[i]), &r, why, sizeof why), -1);
        assert_int_equal(r.n, 0);
        assert_non_null(strstr(why, "line "));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_free_host_goes_to_its_only_claimant),
        cmocka_unit_test(test_two_claimants_of_a_free_host_get_nothing),
        cmocka_unit_test(test_held_host_stays_whatever_the_names_sort_as),
        cmocka_unit_test(test_broken_file_keeps_its_hosts),
        cmocka_unit_test(test_broken_file_claims_the_free_hosts_it_lists),
        cmocka_unit_test(test_release_by_removal_or_by_not_listing),
        cmocka_unit_test(test_a_loser_keeps_its_hosts_in_turn),
        cmocka_unit_test(test_main_configuration_hosts_are_never_held),
        cmocka_unit_test(test_host_listed_twice_is_one_claim),
        cmocka_unit_test(test_text_round_trip),
        cmocka_unit_test(test_damaged_text_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
