"""What the kembali integration tests share: starting a sandbox and kembali
together with a short schedule, and reading the sandbox's read log."""

import os
import threading
import time

import testenv

KEY = testenv.DEFAULT_KEY
KEY2 = "sk_test_kembali_0000000000000002"
NOTIFY_SECRET = "whsec_kembali_test_notify_0000001"  # toko-a's notify secret (kit.start's shop)
FAST = [0, 1100, 1100, 1100]          # sum 3300 ms, held requests answered by 4800 ms
FAST_HOLD = sum(FAST) / 1000 + 1.5


def start(tmpdir, schedule=FAST, shops=None, sandbox_args=(), top=None):
    """A sandbox (keys KEY and KEY2) and one kembali with the shop "toko-a"
    (hosts toko-a.test, key KEY, notify secret NOTIFY_SECRET in
    k.key_path("notify-a")) unless `shops` (a function of the Kembali,
    returning the list) says otherwise. Returns (sandbox, kembali), started."""
    sb, ks = start_many(tmpdir, 1, schedule=schedule, shops=shops, sandbox_args=sandbox_args, top=top,
                        name="kembali")
    return sb, ks[0]


def pending_then(sb, id, n, final):
    """Script id so that its first n reads say pending and every later one
    `final`: counted in reads, not in time since the PUT, which a slow start
    (a sanitizer build on a busy machine) would shift."""
    pending = {"http": 200, "body": {"id": id, "status": "pending", "amount": 150000, "currency": "IDR"}}
    sb.put_tx(id, final, responses=[pending] * n)


def answered_in(k, id, n=1):
    """How long kembali held its requests for id (seconds, from its request
    log lines, in log order), once there are at least n: a measure that
    leaves out the test's own threads and connects, which a busy machine
    can slow by a second."""
    def lines():
        found = k.find_log(event="request", id=id)
        return found if len(found) >= n else None
    return [int(l["ms"]) / 1000 for l in testenv.wait_for(lines, 30, msg="%d request lines for %s" % (n, id))]


def parallel(fns, timeout=120):
    """Run the callables in threads; their results in order (the first error is raised)."""
    out = [None] * len(fns)
    errs = []

    def run(i, f):
        try:
            out[i] = f()
        except Exception as e:  # noqa: BLE001 - raised below
            errs.append(e)

    ts = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(fns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
    if errs:
        raise errs[0]
    return out


def read_times(sb, id):
    """Arrival times (s, relative to the first) of the reads of id."""
    return arrivals(sb.reads(id))


def arrivals(reads):
    """Arrival times (s, relative to the first) of the sandbox's `reads`."""
    return [round((r["t_ms"] - reads[0]["t_ms"]) / 1000, 3) for r in reads]


def min_gap(times):
    return min((b - a for a, b in zip(times, times[1:])), default=None)


# kembali spaces the *starts* of reads at least 1.1 s apart (1.5 s with the
# default schedule); the sandbox records *arrivals*, which a slow connect or a
# sanitizer build can delay by tens of milliseconds. Kasera's own window is
# 1 s from arrival: that is the bound arrivals must keep.
ARRIVAL_MIN_GAP = 1.0


def start_many(tmpdir, n, schedule=FAST, shops=None, sandbox_args=(), top=None, listen="unix", sb=None,
               name=None):
    """A sandbox and n kembali processes sharing one state_dir, each on its
    own Unix socket (listen="unix"), or all on one listening socket handed
    over as fd 0 as spawn-fcgi -F does (listen="shared"). Returns (sandbox, [kembali])."""
    return _start(tmpdir, n, schedule, shops, sandbox_args, lambda i: top, listen, sb,
                  lambda i: name or "k%d" % i)


def start_hosts(tmpdir, n, redis, schedule=FAST, shops=None, sandbox_args=(), top=None, sb=None, bin=None):
    """A sandbox and n kembali "hosts" sharing one Redis, as n machines would:
    each kembali (named h0, h1, ...) has its OWN state_dir (<tmpdir>/state-h0,
    ...) and a configuration with "redis": redis.url() (its TCP form; `redis`
    may also be a URL string) and, when that Redis has a password,
    "redis_password_file": redis.password_file(); then `top` (which may
    override either: "redis": redis.unix_url()). `bin`: another kembali
    binary. Returns (sandbox, [kembali]), started."""
    common = {}
    if isinstance(redis, str):
        common["redis"] = redis
    else:
        # not started yet (no port chosen): its socket's path is known
        common["redis"] = redis.url() if redis.port is not None else redis.unix_url()
        if redis.password is not None:
            common["redis_password_file"] = redis.password_file()

    def host_top(i):
        state = os.path.join(tmpdir, "state-h%d" % i)
        os.makedirs(state, mode=0o700, exist_ok=True)
        extra = dict(common, state_dir=state)
        extra.update(top or {})
        return extra

    return _start(tmpdir, n, schedule, shops, sandbox_args, host_top, "unix", sb, lambda i: "h%d" % i, bin)


def _start(tmpdir, n, schedule, shops, sandbox_args, top_for, listen, sb, name_for, bin=None):
    """start_many and start_hosts: process i gets top_for(i) and the name name_for(i)."""
    sb = sb or testenv.Sandbox(tmpdir, keys=(KEY, KEY2),
                               args=["--key", KEY, "--key", KEY2] + list(sandbox_args))

    def config_for(i):
        def config(k):
            s = shops(k) if shops else [testenv.make_shop("toko-a", k.key_path("a"),
                                                          notify_secret_file=k.key_path("notify-a"))]
            extra = dict(top_for(i) or {})
            if schedule is not None:
                extra["schedule_ms"] = schedule
            return testenv.make_config(sb, s, **extra)
        return config

    shared = testenv.unix_listen_socket(testenv.socket_path(tmpdir, "shared.sock")) if listen == "shared" else None
    ks = []
    for i in range(n):
        k = testenv.Kembali(tmpdir, config=config_for(i), keys={"a": KEY, "b": KEY2, "notify-a": NOTIFY_SECRET}, name=name_for(i),
                            listen=shared if shared is not None else listen, bin=bin)
        k.start()
        ks.append(k)
    if shared is not None:
        for k in ks:
            k.wait_log(30, event="start")
    return sb, ks


def sign(id, body, secret=NOTIFY_SECRET, t=None):
    """The Kembali-Signature header of a notify of id with `body` (bytes),
    as the shop's backend computes it: t=T,v1=HMAC-SHA256(secret, "T.ID.BODY")
    in lowercase hex; t defaults to now (Unix seconds)."""
    import hashlib
    import hmac
    t = str(int(time.time()) if t is None else t)
    mac = hmac.new(secret.encode(), t.encode() + b"." + id.encode() + b"." + body, hashlib.sha256).hexdigest()
    return "t=%s,v1=%s" % (t, mac)


def notify(k, id, body, secret=NOTIFY_SECRET, t=None, signature=None, admin=True, query=None, extra=None):
    """POST ?id=ID&format=notify to kembali k with `body` (a dict as JSON, or
    bytes), signed with `secret` at t (now) unless `signature` gives the
    header's value ("" or False: none is sent)."""
    import json
    params = {"KEMBALI_ADMIN": "1"} if admin else {}
    params["CONTENT_TYPE"] = "application/json"
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    sig = sign(id, data, secret, t) if signature is None else signature
    if sig:
        params["HTTP_KEMBALI_SIGNATURE"] = sig
    params.update(extra or {})
    q = query if query is not None else "id=%s&format=notify" % id
    return k.get(q, method="POST", extra=params, stdin=data)


def log_count(ks, event):
    """How many lines of `event` the hosts' logs hold, in all."""
    return sum(len(k.find_log(event=event)) for k in ks)


def without_a_stall(ks, run, tries=3):
    """run(attempt) until no host left Redis while it ran, and its result.
    A busy machine can hold Redis's answers past 100 ms: a host then
    leaves it (redis_left in its own log) and decides alone, on its own
    counts, until it rejoins, so that try says nothing of Redis's counts.
    Each try uses other addresses and ids (run's attempt); hosts without
    Redis never leave it: one try. Assert on what run returns, after it:
    an assertion inside run would fail the try instead of trying again."""
    for attempt in range(tries):
        left = log_count(ks, "redis_left")
        out = run(attempt)
        if log_count(ks, "redis_left") == left:
            return out
        print("# a host left Redis meanwhile (a busy machine): tried again")
        testenv.wait_for(lambda: log_count(ks, "redis_rejoined") >= log_count(ks, "redis_left"), 10,
                         msg="every host back on Redis")
    raise AssertionError("Redis was slower than 100 ms in each of %d tries" % tries)


def wait_key_pause(redis, secret, id, gone):
    """Return once the key's pause that the read of `id` set (a 401, the
    key's 429) is in `redis`, or gone() says a host left Redis, which then
    never hears of it. kembali sends a read's finish before it answers, but
    Redis keeps each connection's commands in order, not two connections':
    another host's claim, sent a moment after the answer, can run first when
    both wait for Redis together (a busy machine)."""
    keys = testenv.redis_script_keys("finish", "kembali:v%d:" % testenv.redis_schema(),
                                     testenv.redis_key_name(secret), id)
    key = [n for n in keys if n.endswith("}k")]
    assert len(key) == 1, "the key's hash among the finish's keys %r" % keys
    testenv.wait_for(lambda: redis.cmd("HGET", key[0], "p") or gone(), 10, msg="the key's pause in Redis")


def log_time(line):
    """A kembali log line's ts as seconds since the epoch (1 ms resolution)."""
    import datetime
    return datetime.datetime.strptime(line["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def get_after_send(k, query, **kw):
    """GET ``query`` from kembali ``k`` on a connection of its own; returns
    the response and the seconds from the moment the request was sent (the
    wall clock just after ``sendall`` returned) to kembali's log line for
    its answer. Unlike the response's own ``elapsed``, this counts neither
    the test's wait for a CPU before it sends nor its wait after the answer
    is in its socket, both of which a busy machine stretches to seconds.
    The request must be the only one for its id in ``k`` at that moment."""
    id = dict(p.split("=", 1) for p in query.split("&") if "=" in p)["id"]
    before = len(k.find_log(event="request", id=id))
    s = testenv.fcgi_send(k.addr, testenv.cgi_params(query, **kw))
    sent = time.time()
    try:
        r = testenv.fcgi_receive(s)
    finally:
        s.close()
    lines = testenv.wait_for(lambda: k.find_log(event="request", id=id)[before:], 30,
                             msg="the request line for %s" % id)
    return r, log_time(lines[0]) - sent


DEFAULT_SCHEDULE = [0, 1500, 2000, 3000, 5000, 8000, 13000]


def began(line):
    """When a log line's event began: its ts minus its ms (a read's start,
    a request's arrival), in seconds since the epoch."""
    return log_time(line) - int(line["ms"]) / 1000


def read_end(line):
    """When a read's end was recorded, from its log line: its start plus
    answered_ms (a busy machine may write the line itself later)."""
    if "answered_ms" in line:
        return began(line) + int(line["answered_ms"]) / 1000
    return log_time(line)


def _lines(logs):
    """Every log line of `logs` (Kembali objects and/or log texts), merged."""
    out = []
    for src in logs:
        out += testenv.parse_log(src) if isinstance(src, str) else src.log_lines()
    return out


def read_starts(logs, id):
    """Start times (s, relative to the first) of kembali's reads of id, from
    its read log lines (end time minus duration, 1 ms resolution). `logs`:
    Kembali objects and/or log texts (e.g. Apache's error log), merged."""
    starts = sorted(began(line) for line in _lines(logs)
                    if line.get("event") == "read" and line.get("id") == id)
    return [round(t - starts[0], 3) for t in starts] if starts else []


def read_ends(logs, id):
    """When each of kembali's reads of id ended (its answer was recorded:
    the line's answered_ms, else the line's own time), in read_starts'
    order and on its clock (s, relative to the first read's start). The
    floor and a Retry-After count from these."""
    reads = sorted((began(l), read_end(l)) for l in _lines(logs)
                   if l.get("event") == "read" and l.get("id") == id)
    return [round(e - reads[0][0], 3) for _, e in reads] if reads else []


def read_sends(logs, id):
    """When each of kembali's reads of id went out (s, relative to the first
    read's start): its start plus the log line's sent_ms (the connect), or
    its start when it never went out. The pace counts from these."""
    reads = sorted((began(l), int(l.get("sent_ms", 0)) / 1000)
                   for l in _lines(logs) if l.get("event") == "read" and l.get("id") == id)
    return [round(s - reads[0][0] + d, 3) for s, d in reads] if reads else []


def check_pace(sb, logs, id, want=None, min_start_gap=None, slack=0.35):
    """The pace of id's reads, as kembali started them and as the sandbox
    received them: starts match `want` (never early, at most `slack` late)
    or are at least `min_start_gap` apart; every read started was received;
    arrivals keep Kasera's 1 s window. Returns (starts, arrivals)."""
    starts, arrivals = read_starts(logs, id), read_times(sb, id)
    testenv.assert_eq(len(arrivals), len(starts), "reads started %r vs received %r" % (starts, arrivals))
    if want is not None:
        testenv.assert_eq(len(starts), len(want), "read count: started at %r" % starts)
        for s, w in zip(starts, want):
            # 3 ms for the millisecond rounding of the two timestamps of each start
            testenv.assert_between(s, w - 0.003, w + slack, "read starts %r vs %r" % (starts, want))
    if min_start_gap is not None and len(starts) > 1:
        assert min_gap(starts) >= min_start_gap - 0.003, "read starts too close: %r" % starts
    if len(arrivals) > 1:
        assert min_gap(arrivals) >= ARRIVAL_MIN_GAP, "arrivals inside Kasera's window: %r" % arrivals
    return starts, arrivals


def check_one_pace(sb, logs, id, schedule=FAST, slack=0.35):
    """Every request for id (a transaction that stays pending) was served by
    one pace: each wait between read starts is the schedule's next one (at
    most `slack` late), and the reads went on exactly until the latest
    request's deadline (its arrival plus the schedule's sum plus 1.5 s) and
    no further. Arrivals and starts come from kembali's logs, so the count
    is right however the requests were spread by a busy machine: requests
    that arrive together cost one request's reads, a late one extends the
    same pace. Returns (starts, the last deadline), both in seconds from the
    first read's start."""
    ms = DEFAULT_SCHEDULE if schedule is None else schedule
    waits = [w / 1000 for w in ms[1:]]
    hold = sum(ms) / 1000 + 1.5
    starts, _ = check_pace(sb, logs, id)
    assert starts, "no read of %s" % id
    sends = read_sends(logs, id)  # each wait runs from the previous read's send
    lines = _lines(logs)
    first = min(began(l) for l in lines if l.get("event") == "read" and l.get("id") == id)
    deadlines = [began(l) + hold - first for l in lines
                 if l.get("event") == "request" and l.get("id") == id]
    assert deadlines, "no request for %s in the log" % id
    last = max(deadlines)

    def wait(i):  # the wait after the read i; the last one repeats
        return waits[min(i, len(waits) - 1)]

    for i, (a, b) in enumerate(zip(sends, starts[1:])):
        testenv.assert_between(b - a, wait(i) - 0.003, wait(i) + slack,
                               "%s: wait %d between read sends %r and starts %r" % (id, i + 1, sends, starts))
    assert starts[-1] <= last + 0.003, "%s: a read after every deadline: %r, %.3f" % (id, starts, last)
    # no further read although one fits before the last deadline: by more
    # than `slack`, since a timer that fires late (a busy machine) rightly
    # starts no read for a request whose deadline has passed (tests/unit/
    # test_hold.c checks that rule to the millisecond)
    assert sends[-1] + wait(len(starts) - 1) > last - slack, \
        "%s: a further read could have started before the last deadline: %r, %.3f" % (id, sends, last)
    return starts, last


def wake_latencies(sb, a, b, n, prefix="w"):
    """n samples (ms) of cross-process wake latency: a asks for a fresh
    transaction whose read takes 0.4 s, b asks 0.15 s later and waits on
    a's read; from the end of the read (the reader's log) to the waiter's
    answer (its log). Asserts that only one read was made each time."""
    import time
    lat = []
    for i in range(n):
        t = "%s%d" % (prefix, i)
        sb.put_tx(t, "succeeded", responses=[{"delay_ms": 400}])

        def ask(k, delay):
            time.sleep(delay)
            return k.get("id=" + t).header("kembali-status")

        testenv.assert_eq(parallel([lambda: ask(a, 0), lambda: ask(b, 0.15)]), ["succeeded", "succeeded"])
        testenv.assert_eq(len(sb.reads(t)), 1, "one process waited for the other's read instead of reading")
        # a asks first; on a slow build b may still get there first: the
        # process that logged the read is the reader, the other the waiter
        reader, waiter = (a, b) if a.find_log(event="read", id=t) else (b, a)
        read_end = log_time(reader.wait_log(30, event="read", id=t))
        answered = log_time(waiter.wait_log(30, event="request", id=t))
        lat.append((answered - read_end) * 1000)
    return lat
