"""The Redis store's hold, leave, claim and tell scripts, run as kembali
loads them (tests/unit/redis-scripts prints their text) on a real
redis-server, one call at a time: what they keep in Redis and what they
cost there (the commands a script runs count in INFO commandstats).

- the waiting set {K}w lives as long as the latest deadline of a
  transaction in it, a later hold of another host included;
- a host's leave stamped before a hold of the same host that reached Redis
  first (two processes, two connections) leaves the hold alone;
- the reservations {K}r are the waiting set's: a hold adds one, a leave, a
  cached final status and a passed deadline take it away;
- a read that ends late is recorded as the C records it;
- a claim the plan refuses in a flash sale, and a fresh hold, read no
  waiting transaction's fields, and the fair share reads only as many as
  it needs (one HMGET per waiting one made both cost
  ~11 us per waiting transaction: 5.8 ms at 512)."""


import testenv
from testenv import assert_eq

K = "test:{k}"
BUDGET = 120
WAITS = "0,1500,2000,3000,5000,8000,13000"
HOLD_MS = 34000
CAP = 512


def keys(name, tx, tiers=()):
    """The keys kembali passes script `name` for transaction tx and a
    client's tiers."""
    return testenv.redis_script_keys(name, "test:", "k", tx, tiers)


def scripts(c):
    sha = {}
    for name in ("claim", "finish", "tell", "held", "left", "seed"):
        sha[name] = c.cmd("SCRIPT", "LOAD", testenv.redis_script_text(name))
    return sha


def held(c, sha, tx, host, deadline_ms, stamp):
    ks = keys("held", tx)
    return c.cmd("EVALSHA", sha["held"], str(len(ks)), *ks, host, str(deadline_ms), tx, str(BUDGET),
                 "1", str(CAP), "64", str(stamp))


def left(c, sha, tx, host, stamp):
    ks = keys("left", tx)
    return c.cmd("EVALSHA", sha["left"], str(len(ks)), *ks, host, tx, str(stamp))


def tell(c, sha, tx, word, final=True):
    ks = keys("tell", tx)
    return c.cmd("EVALSHA", sha["tell"], str(len(ks)), *ks, word, "1" if final else "0",
                 "600000" if final else "0", WAITS, tx, "test:wake", "k")


LIMITS = "5,10,20"  # STATE_CLIENT_404S_AT: an address (an IPv6 /64), a /56, a /48
LEASE_MS = 10000


def claim(c, sha, tx, budget=BUDGET, lost=False, member=None, tiers=(), quarter=None, plan=True):
    """The claim of a read of tx; `tiers`: the client's names (its address,
    then an IPv6 address's /56 and /48; none: no client); `quarter`: the
    404 quarter's cap (rules_not_found_cap: budget / 4)."""
    ks = keys("claim", tx, tiers)
    return c.cmd("EVALSHA", sha["claim"], str(len(ks)), *ks, WAITS, str(budget), str(LEASE_MS),
                 "1" if tiers else "0", tx, "1" if plan else "0", str(CAP), LIMITS, "600000", "250",
                 str(HOLD_MS), "7", member or "h1:" + tx, "test:wake", "k", "1" if lost else "0", "2000",
                 str(quarter if quarter is not None else max(budget // 4, 1)))


def finish(c, sha, tx, serial, word="", final=False, not_found=False, tiers=()):
    """A read's outcome (the 404 charged to the client when nothing was
    known of tx); returns 1 when it started a block."""
    ks = keys("finish", tx, tiers)
    return c.cmd("EVALSHA", sha["finish"], str(len(ks)), *ks, str(serial), "0", word, "1" if final else "0",
                 "600000", "1" if not_found else "0", "600000", "1" if not_found and tiers else "0", "0", "0",
                 WAITS, tx, "test:wake", "k", ",".join(tiers) or "-", LIMITS, "600000", "600000")


def seed(c, sha, reads, grace=2000):
    """A host's reads (name, ms ago) sent to the key's count."""
    ks = keys("seed", "")
    return c.cmd("EVALSHA", sha["seed"], str(len(ks)), *ks, str(grace),
                 *[x for name, ago in reads for x in (name, str(ago))])


def counted(c):
    return c.cmd("ZCOUNT", K + "b", "-inf", "(+inf")


def calls(c, command):
    for line in c.cmd("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_%s:" % command):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def now_ms(c):
    t = c.cmd("TIME")
    return int(t[0]) * 1000 + int(t[1]) // 1000


@testenv.timeout(60)
def test_a_later_hold_keeps_the_waiting_set_while_it_waits(tmpdir):
    redis = testenv.Redis(tmpdir)
    with redis.client() as c:
        sha = scripts(c)
        held(c, sha, "A", "h1", 5000, 1)
        assert c.cmd("PTTL", K + "w") <= 6000
        held(c, sha, "A", "h2", 100000, 2)  # another host, a later deadline
        hu = int(c.cmd("HGET", K + "t:A", "hu"))
        assert_eq(int(float(c.cmd("ZSCORE", K + "w", "A"))), hu)
        assert c.cmd("PTTL", K + "w") > 90000, "w expires at %d ms, A waits 100 s" % c.cmd("PTTL", K + "w")
        assert c.cmd("PTTL", K + "r") > 90000, "r expires at %d ms, A waits 100 s" % c.cmd("PTTL", K + "r")


@testenv.timeout(60)
def test_a_leave_stamped_before_a_hold_that_came_first_leaves_it_held(tmpdir):
    redis = testenv.Redis(tmpdir)
    with redis.client() as c:
        sha = scripts(c)
        held(c, sha, "A", "h1", 30000, 10)  # process 1 holds
        # process 1 lets it go (stamp 20), then process 2 holds it (30),
        # and process 2's hold reaches Redis first
        held(c, sha, "A", "h1", 30000, 30)
        left(c, sha, "A", "h1", 20)
        assert_eq(c.cmd("HGET", K + "o:A", "h1"), "30")
        assert_eq(c.cmd("HGET", K + "t:A", "ho"), "1")
        assert c.cmd("ZSCORE", K + "w", "A") is not None
        assert c.cmd("ZSCORE", K + "r", "A") is not None
        # an older hold coming late does not lower the stamp
        held(c, sha, "A", "h1", 30000, 25)
        assert_eq(c.cmd("HGET", K + "o:A", "h1"), "30")
        # process 2 lets it go: gone
        left(c, sha, "A", "h1", 40)
        assert_eq(c.cmd("HGET", K + "o:A", "h1"), None)
        assert_eq(c.cmd("HGET", K + "t:A", "ho"), "0")
        assert_eq(c.cmd("ZSCORE", K + "w", "A"), None)
        assert_eq(c.cmd("ZSCORE", K + "r", "A"), None)


@testenv.timeout(60)
def test_the_reservations_are_the_waiting_sets(tmpdir):
    redis = testenv.Redis(tmpdir)
    with redis.client() as c:
        sha = scripts(c)
        for tx in ("A", "B", "C"):
            assert held(c, sha, tx, "h1", 30000, 1) > 0  # reserved
        got = c.cmd("ZRANGE", K + "r", "0", "-1", "WITHSCORES")
        assert_eq(got[0::2], ["A", "B", "C"])
        assert_eq([int(float(x)) for x in got[1::2]], [int(c.cmd("HGET", K + "t:" + t, "rv")) for t in "ABC"])
        left(c, sha, "B", "h1", 2)  # nobody holds B
        assert_eq(c.cmd("ZRANGE", K + "r", "0", "-1"), ["A", "C"])
        tell(c, sha, "A", "succeeded")  # answered from the cache from now on
        assert_eq(c.cmd("ZRANGE", K + "r", "0", "-1"), ["C"])
        assert_eq(c.cmd("ZRANGE", K + "w", "0", "-1"), ["C"])
        # C's deadline passed (its host died): the next hold drops it from both
        c.cmd("ZADD", K + "w", str(now_ms(c) - 1), "C")
        held(c, sha, "D", "h1", 30000, 3)
        assert_eq(c.cmd("ZRANGE", K + "w", "0", "-1"), ["D"])
        assert_eq(c.cmd("ZRANGE", K + "r", "0", "-1"), ["D"])


@testenv.timeout(120)
def test_a_refused_claim_and_a_fresh_hold_read_no_waiting_transaction(tmpdir):
    redis = testenv.Redis(tmpdir)
    with redis.client() as c:
        sha = scripts(c)
        for i in range(CAP):
            held(c, sha, "w%d" % i, "h1", HOLD_MS, i + 1)
        now = now_ms(c)
        for j in range(BUDGET - 1):  # the reads of the last 60 s, one short of the budget
            c.cmd("ZADD", K + "b", str(now - 50000 + j * 400), "r%d" % j)
        for j in range(64):  # a rush: the headroom takes the budget
            c.cmd("ZADD", K + "a", str(now - j), "x%d" % j)
        c.cmd("CONFIG", "RESETSTAT")
        r = claim(c, sha, "w0")
        assert_eq((r[0], r[2]), ("wait", "plan"))
        assert calls(c, "hmget") <= 2, "a refused claim made %d HMGETs" % calls(c, "hmget")
        c.cmd("CONFIG", "RESETSTAT")
        held(c, sha, "new", "h1", HOLD_MS, 100000)
        assert calls(c, "hmget") <= 2, "a fresh hold made %d HMGETs" % calls(c, "hmget")


@testenv.timeout(60)
def test_a_read_is_counted_once_however_often_it_is_sent(tmpdir):
    """budget.h: a read granted by Redis is named as its host names it, so
    the host sending it again (every join) adds nothing and starts no
    grace; reads Redis lacked (made while it was away) are added, those
    older than the span are not, and nothing is granted during the grace."""
    redis = testenv.Redis(tmpdir)
    with redis.client() as c:
        sha = scripts(c)
        assert_eq(claim(c, sha, "A", member="h1:100")[0], "go")
        assert_eq(seed(c, sha, [("h1:100", 5)]), 0)
        assert_eq(c.cmd("PTTL", K + "g"), -2)
        assert_eq(seed(c, sha, [("h2:7", 300), ("h2:8", 200), ("h2:1", 61000)]), 2)
        assert_eq(counted(c), 3)
        assert_eq(seed(c, sha, [("h2:7", 300), ("h2:8", 200)]), 0)  # a second join: nothing new
        r = claim(c, sha, "B")
        assert_eq((r[0], r[2]), ("wait", "seed"))
        assert 0 < r[1] <= 2000, r
        # the mark ('~', +inf) is never a read: a budget of 4 takes one more
        # (the 404 quarter, whose 1 A fills, set aside)
        c.cmd("DEL", K + "g")
        assert_eq(claim(c, sha, "C", budget=4, quarter=4)[0], "go")
        assert_eq(counted(c), 4)
        r = claim(c, sha, "D", budget=4, quarter=4)
        assert_eq((r[0], r[2]), ("wait", "budget"))


@testenv.timeout(60)
def test_a_count_found_gone_asks_every_host_and_waits_when_it_was_lost(tmpdir):
    """A key's count gone (a restart, a flush, an eviction) is announced on
    the channel ('S K': every host sends its reads); when the host asking
    had read with the key lately (lost, not forgotten) nothing is granted
    for the grace, else the read goes at once (a key nobody used for an
    hour)."""
    redis = testenv.Redis(tmpdir)
    with redis.client() as c, redis.client() as sub:
        sha = scripts(c)
        sub.cmd("SUBSCRIBE", "test:wake")
        assert_eq(claim(c, sha, "A")[0], "go")
        assert_eq(sub.reply(timeout=5), ["message", "test:wake", "S k"])  # the first count of the key
        assert_eq(sub.reply(timeout=5), ["message", "test:wake", "R k h1:A"])  # every host counts the read
        c.cmd("FLUSHALL")
        sha = scripts(c)
        r = claim(c, sha, "B", lost=True)
        assert_eq((r[0], r[2]), ("wait", "seed"))
        assert_eq(sub.reply(timeout=5), ["message", "test:wake", "S k"])
        c.cmd("FLUSHALL")
        sha = scripts(c)
        assert_eq(claim(c, sha, "C", lost=False)[0], "go")
        assert_eq(sub.reply(timeout=5), ["message", "test:wake", "S k"])
        assert_eq(sub.reply(timeout=5), ["message", "test:wake", "R k h1:C"])


def fair_share_case(c, sha, others):
    """A claim of A (an early read already made) with `others` waiting
    transactions that may read now and have had none, the spans leaving
    room for 3 early reads and no plenty: A may read while they fit."""
    c.cmd("FLUSHALL")
    budget = 10
    for tx in ["A"] + ["W%d" % i for i in range(others)]:
        ks = keys("held", tx)
        c.cmd("EVALSHA", sha["held"], str(len(ks)), *ks, "h1", str(HOLD_MS), tx, str(budget), "0",
              str(CAP), "64", "1")  # '0': no reservation
    c.cmd("DEL", K + "a")  # no rush: no headroom
    now = now_ms(c)
    for j in range(budget - 3):  # room for 3
        c.cmd("ZADD", K + "b", str(now - 50000 + j * 1000), "r%d" % j)
    c.cmd("HSET", K + "t:A", "n", "1", "ls", str(now - 5000), "er", "1")
    c.cmd("CONFIG", "RESETSTAT")
    r = claim(c, sha, "A", budget=budget, member="h1:A")
    return r, calls(c, "hmget")


@testenv.timeout(60)
def test_the_fair_share_counts_the_others_only_as_far_as_it_needs(tmpdir):
    # eligible = A + 2 others fits the room of 3: A reads; A + 3 others
    # does not, and one of them has had no read: A waits its turn, decided
    # from the first others read (the rest are not read)
    redis = testenv.Redis(tmpdir)
    with redis.client() as c:
        sha = scripts(c)
        r, _ = fair_share_case(c, sha, 2)
        assert_eq((r[0], r[2]), ("go", "early"))
        for others in (3, 40):
            r, hmgets = fair_share_case(c, sha, others)
            assert_eq((r[0], r[2]), ("wait", "plan"))
            assert hmgets <= 2 + 3 + 1, "%d HMGETs with %d others" % (hmgets, others)


def p64(i):
    return "%032x" % (0x6400 + i)


P56, P48 = "%032x" % 0x56, "%032x" % 0x48


@testenv.timeout(60)
def test_an_ipv6_prefix_counts_at_its_56_and_48(tmpdir):
    """docs/operations.md, "Ids nobody has paid for": a request is a client at
    its /64, its /56 and its /48, each with its allowance (5, 10, 20 404s
    with the reads in flight). Reads in flight from ten /64s of one /56
    fill the /56's 10: an eleventh /64 waits ('client'); their 404s,
    charged at each tier, block the /56 (one message, its name), and a
    /64 of it never seen before is blocked; another /56 of the /48 still
    reads, until the /48's 20."""
    redis = testenv.Redis(tmpdir)
    with redis.client() as c, redis.client() as sub:
        sha = scripts(c)
        sub.cmd("SUBSCRIBE", "test:wake")
        serial = {}
        for i in range(10):  # one read in flight each, under one /56
            r = claim(c, sha, "g%d" % i, tiers=(p64(i), P56, P48), quarter=100)
            assert_eq(r[0], "go")
            serial["g%d" % i] = r[1]
        r = claim(c, sha, "g10", tiers=(p64(10), P56, P48), quarter=100)
        assert_eq((r[0], r[2]), ("wait", "client"), "the /56's reads in flight are its 10")
        assert_eq(c.cmd("ZCARD", K + "f:" + P48), 10)
        started = [finish(c, sha, tx, serial[tx], not_found=True, tiers=(p64(int(tx[1:])), P56, P48))
                   for tx in sorted(serial, key=lambda t: int(t[1:]))]
        assert_eq(started, [0] * 9 + [1], "the 10th 404 starts the /56's block")
        assert_eq(c.cmd("PTTL", K + "x:" + p64(0)), -2, "a /64 with one 404 is not blocked")
        assert c.cmd("PTTL", K + "x:" + P56) > 0
        assert_eq(c.cmd("ZCARD", K + "c:" + P48), 10)
        assert_eq(c.cmd("ZCARD", K + "f:" + P48), 0, "no longer in flight at any tier")
        c.cmd("PUBLISH", "test:wake", "end")
        msgs = []
        while True:
            m = sub.reply(timeout=5)[2]
            if m == "end":
                break
            if m.startswith("B "):
                msgs.append(m)
        assert_eq(msgs, ["B k %s 600000" % P56])
        r = claim(c, sha, "g11", tiers=(p64(11), P56, P48), quarter=100)
        assert_eq(r[0], "blocked", "a new /64 of a blocked /56")
        other56 = "%032x" % 0x5601
        for i in range(10):  # the /48 has room for 10 more
            assert_eq(claim(c, sha, "h%d" % i, tiers=(p64(100 + i), other56, P48), quarter=100)[0], "go")
        r = claim(c, sha, "h10", tiers=(p64(110), "%032x" % 0x5602, P48), quarter=100)
        assert_eq((r[0], r[2]), ("wait", "client"), "the /48's 20")
        # an IPv4 address (one tier) is counted at its own 5 alone
        for i in range(5):
            assert_eq(claim(c, sha, "v%d" % i, tiers=(p64(200),), quarter=100)[0], "go")
        assert_eq(claim(c, sha, "v5", tiers=(p64(200),), quarter=100)[2], "client")
        # a /64 at its 5 in flight, of the blocked /56: blocked (every
        # tier's block first, as the C's st_client_fly), until the block ends
        for i in range(5):
            assert_eq(claim(c, sha, "y%d" % i, tiers=(p64(300), "%032x" % 0x5603, P48 + "0"), quarter=100)[0], "go")
        r = claim(c, sha, "y5", tiers=(p64(300), P56, P48), quarter=100)
        assert_eq(r[0], "blocked", "blocked at its /56, whatever its /64's count")
        assert 599000 < r[1] <= 600000, r


@testenv.timeout(60)
def test_the_404_quarter(tmpdir):
    """Reads of ids never answered take at most the quarter (3 here) while
    under way or once ended 404, every host's: a fourth waits ('budget')
    until one frees up; a read that found a status leaves the quarter at
    once, one that ended 404 stays for the span (the wait says when it
    ends); an id answered before is not counted; a read under way past its
    lease counts no more; a held request's last-chance read goes."""
    redis = testenv.Redis(tmpdir)
    with redis.client() as c:
        sha = scripts(c)
        ser = {}
        for tx in ("A", "B", "C"):
            r = claim(c, sha, tx, quarter=3, plan=False)
            assert_eq(r[0], "go")
            ser[tx] = r[1]
        assert_eq(c.cmd("ZCARD", K + "n"), 3)
        r = claim(c, sha, "D", quarter=3, plan=False)
        assert_eq((r[0], r[2]), ("wait", "budget"), "the quarter is spent")
        assert 0 < r[1] <= 250, "reads under way may end otherwise: look again soon (%d ms)" % r[1]
        finish(c, sha, "A", ser["A"], word="pending")  # found: no longer counted
        r = claim(c, sha, "D", quarter=3, plan=False)
        assert_eq(r[0], "go")
        for tx in ("B", "C"):
            finish(c, sha, tx, ser[tx], not_found=True)
        finish(c, sha, "D", r[1], not_found=True)
        assert_eq(sorted(c.cmd("ZRANGE", K + "n", "0", "-1")), ["h1:B", "h1:C", "h1:D"])
        r = claim(c, sha, "E", quarter=3, plan=False)
        assert_eq((r[0], r[2]), ("wait", "budget"))
        assert 59000 < r[1] <= 60001, "the oldest 404 leaves the span in ~60 s: %d ms" % r[1]
        # an id answered before is not a probe
        c.cmd("HSET", K + "t:P", "s", "pending")
        assert_eq(claim(c, sha, "P", quarter=3, plan=False)[0], "go")
        # a held request within PLAN_LEAD (1500 ms) of its deadline: its last-chance read
        c.cmd("HSET", K + "t:L", "ho", "1", "hu", str(now_ms(c) + 1000))
        r = claim(c, sha, "L", quarter=3, plan=False)
        assert_eq(r[0], "go", "a held request's last-chance read")
        finish(c, sha, "L", r[1], word="succeeded", final=True)
        # held, its deadline farther: waits until its last chance at most
        c.cmd("HSET", K + "t:M", "ho", "1", "hu", str(now_ms(c) + 5000))
        r = claim(c, sha, "M", quarter=3, plan=False)
        assert_eq((r[0], r[2]), ("wait", "budget"))
        assert 3000 < r[1] <= 3500, "until its last chance: %d ms" % r[1]
        # reads under way whose lease ended (their process died) count no more
        c.cmd("DEL", K + "n")
        now = now_ms(c)
        for i in range(3):
            c.cmd("ZADD", K + "n", str(now - LEASE_MS - 1000), "p:h9:%d" % i)
        assert_eq(claim(c, sha, "N", quarter=3, plan=False)[0], "go")
        assert_eq(c.cmd("ZRANGE", K + "n", "0", "-1"), ["p:h1:N"])


def overrun(c, tx):
    """The read of tx under way outlived its lease (its process stalled),
    and the transaction's pace and floor let another read start."""
    c.cmd("HSET", K + "t:" + tx, "lu", "1", "ls", "1", "le", "1")


@testenv.timeout(60)
def test_a_late_read_records_what_the_c_records(tmpdir):
    """A read that ends after its lease (or after another read started) is
    recorded as the C's finish records it (rules_read_records): its pending
    or unknown word only where no newer read's outcome or told status is
    recorded, its final status only forward, a newer outcome stays, and its
    404 where nothing is known."""
    redis = testenv.Redis(tmpdir)
    with redis.client() as c:
        sha = scripts(c)
        one = claim(c, sha, "A", plan=False)
        assert_eq(one[0], "go")
        overrun(c, "A")
        two = claim(c, sha, "A", plan=False)
        assert_eq(two[0], "go")
        finish(c, sha, "A", two[1], word="pending")  # the current read's
        finish(c, sha, "A", one[1], word="settling")  # older than what is recorded
        assert_eq(c.cmd("HGET", K + "t:A", "s"), "pending", "a newer outcome stays")
        overrun(c, "A")
        three = claim(c, sha, "A", plan=False)
        assert_eq(three[0], "go")
        overrun(c, "A")
        finish(c, sha, "A", three[1], word="settling")  # late, but nothing newer is recorded
        assert_eq(c.cmd("HGET", K + "t:A", "s"), "settling", "a late read fills what nothing newer says")
        tell(c, sha, "A", "pending", final=False)
        finish(c, sha, "A", three[1], word="settling")
        assert_eq(c.cmd("HGET", K + "t:A", "s"), "pending", "a told status is newer than every read before it")
        finish(c, sha, "A", one[1], word="succeeded", final=True)
        assert_eq(c.cmd("HGET", K + "t:A", "s"), "succeeded", "a late final status moves what is known forward")
        finish(c, sha, "A", two[1], word="failed", final=True)
        assert_eq(c.cmd("HGET", K + "t:A", "s"), "succeeded", "never sideways")
        # a late 404 of an id nobody knows is remembered
        late = claim(c, sha, "B", plan=False)
        assert_eq(late[0], "go")
        overrun(c, "B")
        finish(c, sha, "B", late[1], not_found=True)
        assert int(c.cmd("HGET", K + "t:B", "nf") or 0) > now_ms(c), "a late 404 where nothing is known"


def monitor_args(line):
    """A MONITOR line's command, as its words (Redis writes each quoted,
    with backslash escapes)."""
    words, i = [], line.index("] ") + 2
    while i < len(line):
        if line[i] != '"':
            i += 1
            continue
        i += 1
        w = bytearray()
        while line[i] != '"':
            if line[i] == "\\":
                i += 1
                if line[i] == "x":
                    w.append(int(line[i + 1:i + 3], 16))
                    i += 3
                    continue
                w += {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b"}.get(line[i], line[i].encode())
            else:
                w += line[i].encode()
            i += 1
        words.append(w.decode("utf-8", "surrogateescape"))
        i += 1
    return words


@testenv.timeout(120)
def test_every_script_touches_only_the_keys_it_is_passed(tmpdir):
    """Redis's scripting contract (and a Cluster's slots): a script names
    every key it reads or writes in KEYS. Every command the scripts run
    (MONITOR logs them) is asked for its keys (COMMAND GETKEYS), which must
    be among the ones its EVALSHA passed: holds, a claim that walks the
    waiting transactions, a client's claim and finish, a tell, a leave and
    a seed."""
    redis = testenv.Redis(tmpdir)
    with redis.client() as c, redis.client() as m:
        sha = scripts(c)
        m.cmd("MONITOR")
        fair_share_case(c, sha, 3)  # holds, and a claim that walks the others
        tiers = (p64(1), p64(2), p64(3))
        r = claim(c, sha, "U", tiers=tiers)
        assert_eq(r[0], "go")
        finish(c, sha, "U", r[1], not_found=True, tiers=tiers)
        tell(c, sha, "W0", "succeeded")
        left(c, sha, "W1", "h1", 2)
        seed(c, sha, [("h2:1", 1000)])
        c.cmd("ECHO", "monitored-end")
        passed, checked, wrong, scripts_seen = None, 0, [], set()
        while True:
            line = m.reply(timeout=5)
            args = monitor_args(line)
            if args[:2] == ["ECHO", "monitored-end"]:
                break
            if "[0 lua]" not in line:
                if args and args[0].upper() == "EVALSHA":
                    passed = set(args[3:3 + int(args[2])])
                    scripts_seen.add(args[1])
                continue
            try:
                touched = c.cmd("COMMAND", "GETKEYS", *args)
            except testenv.RedisError:
                continue  # no key (TIME, PUBLISH)
            checked += 1
            for k in touched:
                if k not in passed:
                    wrong.append("%s touches %s, not passed" % (args[0], k))
        assert_eq(sorted(set(wrong)), [])
        assert_eq(scripts_seen, set(sha.values()))
        assert checked > 50, "only %d commands checked" % checked


if __name__ == "__main__":
    testenv.run(globals())
