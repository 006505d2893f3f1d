"""Ids nobody has paid for (docs/operations.md): a burst of guesses sent at once
from one address costs at most 5 reads, because reads still in flight for
that client count as if already answered 404; the charge and the block are
per key and client, so a prober blocked on one shop is not blocked on
another, and a buyer of that other shop behind the prober's address gets
its answer. An IPv6 prefix counts at its /64, /56 and /48, and reads that
end 404 take at most a quarter of a key's budget whatever the addresses.
With state_dir alone, and with two or three hosts on one real Redis (a
try during which a host left Redis, slower than 100 ms on a busy machine,
is made again: without_a_stall)."""

import random

import testenv
import kit
from testenv import assert_eq

PROBER = {"REMOTE_ADDR": "203.0.113.7"}
BURST = 25
LATENCY_MS = 300


def two_shops(k):
    return [testenv.make_shop("toko-a", k.key_path("a")), testenv.make_shop("toko-b", k.key_path("b"))]


def redis_hosts(tmpdir, n=3):
    redis = testenv.Redis(tmpdir)
    sb, ks = kit.start_hosts(tmpdir, n, redis, shops=two_shops, top={"redis": redis.unix_url()})
    for k in ks:
        k.wait_log(30, event="redis_joined")
    return redis, sb, ks


def burst(sb, ks, seed, prober=PROBER):
    """25 random ids sent at once from one address (prober) on toko-a
    (spread over the hosts ks); returns (reads at the sandbox, answers)."""
    rnd = random.Random(seed)
    ids = ["g%d-%06d" % (seed, rnd.randrange(10 ** 6)) for _ in range(BURST)]
    for t in ids:  # a 404 that takes Kasera 300 ms, as over a real network
        sb.put_tx(t, responses=[{"http": 404, "delay_ms": LATENCY_MS}] * 2)
    rs = kit.parallel([lambda i=i, t=t: ks[i % len(ks)].get("id=" + t, host="toko-a.test", extra=prober, timeout=30)
                       for i, t in enumerate(ids)])
    words = [r.header("kembali-status") for r in rs]
    reads = [r for r in sb.reads() if r["id"] in ids]
    print("# a burst of %d random ids at once from one address over %d process(es): %d reads; answers %r"
          % (BURST, len(ks), len(reads), {w: words.count(w) for w in set(words)}))
    return reads, words


def check_burst(sb, ks, seed=1):
    blocked = []

    def run(attempt):
        blocked[:] = [kit.log_count(ks, "client_blocked")]
        return burst(sb, ks, seed + 100 * attempt, {"REMOTE_ADDR": "203.0.113.%d" % (7 + attempt)})

    reads, words = kit.without_a_stall(ks, run)
    assert len(reads) <= 5, "a burst of guesses costs at most 5 reads: %d" % len(reads)
    assert_eq(words.count("not_found"), len(reads))
    assert_eq(words.count("not_found") + words.count("checking"), BURST)
    lines = testenv.wait_for(lambda: kit.log_count(ks, "client_blocked") - blocked[0], 30, msg="the block's log line")
    assert_eq(lines, 1, "one line when the block starts, over every process")


def check_per_shop(sb, ks):
    """The prober walks 5 ids on toko-a one after the other on the first
    process (blocked there after the 5th 404); on the last one (with Redis,
    another host, which learns of the block from Redis), a guess on toko-a
    costs no read; on toko-b, from the same address, a buyer's payment
    answers succeeded on each, and a guess is read."""
    for i in range(5):
        r = ks[0].get("id=walk%d&format=json" % i, host="toko-a.test", extra=PROBER, timeout=30)
        assert_eq(r.header("kembali-status"), "not_found")
    ks[0].wait_log(30, event="client_blocked")
    before = len(sb.reads())
    r = ks[-1].get("id=other-guess", host="toko-a.test", extra=PROBER, timeout=30)
    assert_eq(r.header("kembali-status"), "checking")
    assert_eq(len(sb.reads()), before, "blocked on toko-a: no read")
    for i, k in enumerate(ks[::-1]):
        sb.put_tx("paid-b%d" % i, "succeeded")
        r = k.get("id=paid-b%d" % i, host="toko-b.test", extra=PROBER, timeout=30)
        assert_eq(r.header("kembali-status"), "succeeded", "a buyer of toko-b behind the prober's address")
    r = ks[-1].get("id=guess-b&format=json", host="toko-b.test", extra=PROBER, timeout=30)
    assert_eq(r.header("kembali-status"), "not_found", "the prober's guess on toko-b is read: not blocked there")
    assert_eq(len(sb.reads("guess-b")), 1)
    assert_eq(sum(len(k.find_log(event="client_blocked")) for k in ks), 1, "one line for the one block")


def test_a_burst_of_guesses_costs_at_most_five_reads(tmpdir):
    sb, k = kit.start(tmpdir, shops=two_shops)
    check_burst(sb, [k])
    m = k.metrics()
    assert_eq(m["kembali_clients_blocked"], 1)
    assert m["kembali_probe_answers_total"] >= BURST - 5


def test_a_burst_over_processes_sharing_state_dir(tmpdir):
    sb, ks = kit.start_many(tmpdir, 3, shops=two_shops)
    check_burst(sb, ks)


def test_a_block_is_per_shop(tmpdir):
    sb, k = kit.start(tmpdir, shops=two_shops)
    check_per_shop(sb, [k])
    m = k.metrics()
    assert_eq(m["kembali_clients_blocked"], 1, "one (shop, client) blocked")


def test_buyers_behind_one_address_are_not_held_back(tmpdir):
    """Ten buyers behind one address (an office) come back at once for ten
    payments that exist: their reads (each 300 ms at Kasera) answer 200,
    which releases their count; every one is answered succeeded."""
    sb, k = kit.start(tmpdir, shops=two_shops)
    office = {"REMOTE_ADDR": "192.0.2.50"}
    for i in range(10):
        sb.put_tx("office%d" % i, "succeeded", responses=[{"delay_ms": LATENCY_MS}])
    rs = kit.parallel([lambda i=i: k.get("id=office%d" % i, host="toko-a.test", extra=office, timeout=30)
                       for i in range(10)])
    assert_eq([r.header("kembali-status") for r in rs], ["succeeded"] * 10)
    assert_eq(len(k.find_log(event="client_blocked")), 0)


BUDGET = 60


def budget_shop(k):
    return [testenv.make_shop("toko-a", k.key_path("a"), read_budget_per_minute=BUDGET)]


def spread(sb, ks, addrs, per, seed):
    """`per` random ids (JSON, answered at once) from each address of
    addrs, all sent at once over the processes ks on toko-a (the sandbox
    answers 404 for ids it does not hold); returns the reads they cost."""
    rnd = random.Random(seed)
    asks = [(a, "s%d-%08d" % (seed, rnd.randrange(10 ** 8))) for a in addrs for _ in range(per)]
    rs = kit.parallel([lambda i=i, a=a, t=t: ks[i % len(ks)].get("id=%s&format=json" % t, host="toko-a.test",
                                                                  extra={"REMOTE_ADDR": a}, timeout=30)
                       for i, (a, t) in enumerate(asks)])
    ids = set(t for _, t in asks)
    reads = [r for r in sb.reads() if r["id"] in ids]
    words = [r.header("kembali-status") for r in rs]
    print("# %d random ids from %d addresses over %d process(es), budget %d: %d reads; answers %r"
          % (len(asks), len(addrs), len(ks), BUDGET, len(reads), {w: words.count(w) for w in set(words)}))
    assert_eq(words.count("not_found") + words.count("checking"), len(asks))
    return len(reads)


def paid_buyer_succeeds(sb, k, addr="192.0.2.99", id="paid-after"):
    """A buyer back (HTML, held) for a payment kembali has never seen."""
    sb.put_tx(id, "succeeded")
    r = k.get("id=" + id, host="toko-a.test", extra={"REMOTE_ADDR": addr}, timeout=30)
    assert_eq(r.header("kembali-status"), "succeeded", "a paid buyer after the probe")
    assert len(sb.reads(id)) >= 1


def test_an_ipv6_60_cannot_spend_the_budget(tmpdir):
    """96 random ids from the 16 /64s of one /60: the /56's 10 404s, not
    16 x 5 (the whole budget of 60); a paid buyer then gets succeeded."""
    sb, k = kit.start(tmpdir, shops=budget_shop)
    addrs = ["2001:db8:77:ab%x0::%x" % (i, i + 1) for i in range(16)]
    reads = spread(sb, [k], addrs, 6, seed=60)
    assert reads <= 10, "one /56 spends at most its 10: %d" % reads
    paid_buyer_succeeds(sb, k)


def test_an_ipv6_48_cannot_spend_the_budget(tmpdir):
    """96 random ids from 96 /56s of one /48 (a free tunnel's): at most
    the /48's 20, and the quarter's 15 first; a paid buyer is still read
    (its last-chance read) and gets succeeded."""
    sb, k = kit.start(tmpdir, shops=budget_shop)
    addrs = ["2001:db8:48:%x00::1" % i for i in range(96)]
    reads = spread(sb, [k], addrs, 1, seed=48)
    assert reads <= BUDGET // 4, "a /48 spends at most the 404 quarter: %d" % reads
    paid_buyer_succeeds(sb, k)


def test_the_404_quarter_holds_against_many_addresses(tmpdir):
    """64 IPv4 addresses, 2 guesses each (every one under its own 5): the
    reads that end 404 take at most a quarter of the budget; a paid
    buyer's first return (an id never seen) is answered at its
    last-chance read."""
    sb, k = kit.start(tmpdir, shops=budget_shop)
    addrs = ["198.51.100.%d" % (i + 1) for i in range(64)]
    reads = spread(sb, [k], addrs, 2, seed=4)
    assert reads <= BUDGET // 4, "404s take at most a quarter of the budget: %d" % reads
    paid_buyer_succeeds(sb, k)


def test_the_404_quarter_over_processes_sharing_state_dir(tmpdir):
    sb, ks = kit.start_many(tmpdir, 3, shops=budget_shop)
    addrs = ["198.51.100.%d" % (i + 1) for i in range(64)]
    reads = spread(sb, ks, addrs, 2, seed=5)
    assert reads <= BUDGET // 4, "404s take at most a quarter of the budget: %d" % reads


def redis_budget_hosts(tmpdir, n=2):
    redis = testenv.Redis(tmpdir)
    sb, ks = kit.start_hosts(tmpdir, n, redis, shops=budget_shop, top={"redis": redis.unix_url()})
    for k in ks:
        k.wait_log(30, event="redis_joined")
    return redis, sb, ks


@testenv.timeout(180)
def test_redis_an_ipv6_60_cannot_spend_the_budget(tmpdir):
    """The /60's 96 ids spread over two hosts on one Redis: the /56's 10
    404s are every host's (Redis counts them); a paid buyer gets
    succeeded."""
    redis, sb, ks = redis_budget_hosts(tmpdir)
    reads = kit.without_a_stall(ks, lambda a: spread(sb, ks, ["2001:db8:%x:ab%x0::%x" % (0x77 + a, i, i + 1)
                                                              for i in range(16)], 6, seed=61 + 100 * a))
    assert reads <= 10, "one /56 spends at most its 10 over every host: %d" % reads
    paid_buyer_succeeds(sb, ks[-1])


@testenv.timeout(180)
def test_redis_an_ipv6_48_cannot_spend_the_budget(tmpdir):
    """96 /56s of one /48 over two hosts on one Redis: at most the 404
    quarter's 15 (the /48's 20 after it); a paid buyer gets succeeded."""
    redis, sb, ks = redis_budget_hosts(tmpdir)
    reads = kit.without_a_stall(ks, lambda a: spread(sb, ks, ["2001:db8:%x:%x00::1" % (0x48 + a, i)
                                                              for i in range(96)], 1, seed=49 + 100 * a))
    assert reads <= BUDGET // 4, "a /48 spends at most the 404 quarter, every host's: %d" % reads
    paid_buyer_succeeds(sb, ks[-1])


@testenv.timeout(180)
def test_redis_the_404_quarter_holds_against_many_addresses(tmpdir):
    """64 IPv4 addresses, 2 guesses each, over two hosts on one Redis: the
    reads that end 404 take at most a quarter of the budget, every host's
    together; a paid buyer is answered at its last-chance read."""
    redis, sb, ks = redis_budget_hosts(tmpdir)
    reads = kit.without_a_stall(ks, lambda a: spread(sb, ks, ["198.51.%d.%d" % (100 + a, i + 1)
                                                              for i in range(64)], 2, seed=6 + 100 * a))
    assert reads <= BUDGET // 4, "404s take at most a quarter of the budget, every host's: %d" % reads
    paid_buyer_succeeds(sb, ks[-1])


@testenv.timeout(180)
def test_redis_a_burst_over_three_hosts_costs_at_most_five_reads(tmpdir):
    redis, sb, ks = redis_hosts(tmpdir)
    check_burst(sb, ks, seed=2)


@testenv.timeout(180)
def test_redis_a_block_is_per_shop(tmpdir):
    redis, sb, ks = redis_hosts(tmpdir)
    check_per_shop(sb, ks)


if __name__ == "__main__":
    testenv.run(globals())
