"""kembali benchmarks: print the figures the core issue asks for.

    python3 tests/bench/bench.py [--held 2000,10000] [--duration 5] [--long] [--keep]
                                 [--only throughput,held,sequential,twenty,wake]
    make bench BENCH_ARGS='--held 2000 --duration 10'   (from a build directory)

Starts the Kasera sandbox and kembali (default settings, default schedule),
then measures:
  - throughput (tests/bench/throughput.py): the cached final page through
    nginx with kept upstream connections, loaded by wrk, for kembali, a
    minimal FastCGI responder (the yardstick), nginx's static file and
    PHP-FPM: requests/s and backend CPU per request, each as a ratio to the
    yardstick measured in the same run;
  - held requests (tests/bench/held.py): for each N, N concurrent requests
    over shops x pending transactions x tabs, each held up to 34 s: peak
    RSS, open descriptors, the spread of answer times, reads per transaction;
  - reads for 20 concurrent requests on a fresh pending transaction;
  - connections opened for 10 sequential reads;
  - cross-process wake latency: two processes on one state_dir, one waiting
    on the other's read (20 samples);
  - several hosts (tests/bench/hosts.py): three hosts on one Redis against
    three processes on one state_dir: cross-host wake latency, Redis round
    trips and CPU per cached answer and per held request, reads for 30 tabs;
  - the streamed page (tests/bench/streamed.py): --buyers concurrent
    browsers behind nginx on transactions that succeed at random times,
    streamed and as single answers: first byte, read to end of page, reads
    per transaction, RSS per request;
  - an upgrade in place (tests/bench/upgrade.py): SIGUSR2 with --upgrade N
    held requests (1,000 and 10,000): the handover's time and the gap, the
    longest a new request waited meanwhile;
  - with --long: reads made when a JSON answer is polled every 0.5 s for 60 s.
Figures, not pass/fail: the tests assert behaviour, this prints numbers.
A part that cannot run here (no wrk, nginx or php-fpm) says "skipped: why"."""

import argparse
import os
import resource
import shutil
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
import testenv  # noqa: E402
import kit  # noqa: E402
import held  # noqa: E402
import wide  # noqa: E402
import hosts  # noqa: E402
import flash  # noqa: E402
import hostplan  # noqa: E402
import slowpeers  # noqa: E402
import streamed  # noqa: E402
import throughput  # noqa: E402
import upgrade  # noqa: E402

PARTS = ("throughput", "held", "sequential", "twenty", "wake", "flash", "hostplan", "slowpeers", "hosts", "streamed", "wide", "upgrade")


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def twenty(k, sb):
    """Returns its line rather than printing it: it runs beside the held cases."""
    sb.put_tx("twenty-1", "pending")
    ts = [threading.Thread(target=lambda: k.get("id=twenty-1", timeout=60)) for _ in range(20)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    times = kit.read_times(sb, "twenty-1")
    return "20 concurrent requests: %d reads at %r; smallest gap %.3f s" % (len(times), times, kit.min_gap(times))


def sequential(k, sb):
    def v1():  # connections to /v1/* only (the control API opens its own)
        st = sb.stats()
        return st.get("v1_connections", st.get("connections", 0))
    before = v1()
    for i in range(10):
        sb.put_tx("seq-%d" % i, "succeeded")
    for i in range(10):
        k.get("id=seq-%d&format=json" % i)
    after = v1()
    m = k.metrics()
    print("10 sequential reads: %d new connection(s) seen by the sandbox (kembali counted %d in all)"
          % (after - before, int(m.get("kembali_api_connections_total", 0))))


def polling(k, sb):
    sb.put_tx("poll-1", "pending")
    end = time.monotonic() + 60
    n = 0
    while time.monotonic() < end:
        k.get("id=poll-1&format=json")
        n += 1
        time.sleep(0.5)
    times = kit.read_times(sb, "poll-1")
    print("JSON polled every 0.5 s for 60 s: %d answers, %d reads at %r" % (n, len(times), times))


def wake(tmp):
    """Two processes on one state_dir: from the end of one's read to the
    other's answer, which waited on it."""
    import statistics
    os.makedirs(os.path.join(tmp, "wake"))
    sb, (a, b) = kit.start_many(os.path.join(tmp, "wake"), 2)
    try:
        lat = sorted(kit.wake_latencies(sb, a, b, 20))
        print("wake latency across processes, read end to the waiter's answer (20 samples, 1 ms log "
              "resolution): median %.0f ms, max %.0f ms" % (statistics.median(lat), max(lat)))
    finally:
        for p in (a, b, sb):
            p.stop()


def table(headers, rows):
    """Prints rows (lists of str) under headers, columns aligned; a row of
    one cell (a skipped backend's reason) runs across the columns."""
    widths = [max([len(h)] + [len(r[i]) for r in rows if len(r) > 1]) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    print("  " + line(headers))
    for r in rows:
        print("  " + (line(r) if len(r) > 1 else r[0]))


def ratio(x, base):
    return "%.2fx" % (x / base) if x is not None and base else "-"


def print_throughput(rows, opts):
    print("Cached final page through nginx (upstream keepalive 32, fastcgi_keep_conn on, one worker), "
          "wrk -t%d -c%d, %d s per backend and round after %d s of warm-up, best of %d rounds:"
          % (opts.threads, opts.connections, opts.duration, opts.warmup, opts.rounds))
    base = next((r for r in rows if r["backend"].startswith("yardstick") and "skipped" not in r), None)
    out = []
    for r in rows:
        if "skipped" in r:
            out.append(["%s: skipped: %s" % (r["backend"], r["skipped"])])
            continue
        cpu = "%.1f" % r["cpu_us"] if r["cpu_us"] is not None else "-"
        out.append([r["backend"], "%.0f" % r["rps"], ratio(r["rps"], base and base["rps"]), cpu,
                    ratio(r["cpu_us"], base and base["cpu_us"]),
                    "%d / %d" % (r["errors"], r["upstream_errors"]),
                    " ".join("%.0f" % x for x in r["rps_rounds"]), r["note"]])
    table(["backend", "req/s", "vs yardstick", "CPU us/req", "vs yardstick", "errors wrk / nginx",
           "req/s per round", ""], out)
    by = {r["backend"].split()[0]: r for r in rows if "skipped" not in r}
    k, y, php = by.get("kembali"), by.get("yardstick"), by.get("PHP-FPM")

    def now(a, b, key):
        return ratio(a[key], b[key]) if a and b and a[key] and b[key] else "not measured"
    print("  targets: kembali CPU/req <= 1.5x yardstick (now %s); req/s >= 0.9x yardstick (now %s); "
          "req/s >= 2x PHP-FPM (now %s)" % (now(k, y, "cpu_us"), now(k, y, "rps"), now(k, php, "rps")))
    print("  (CPU: utime+stime of the backend's processes from /proc, over the measured requests; "
          "nginx errors: [error] lines in its log, e.g. a kept connection found closed and retried)")


def print_held(cases):
    print("Held requests (default schedule: each pending request held ~34 s; fresh kembali per case):")
    out = []
    for c in cases:
        t, rp = held.spread(c["took"]), held.spread(c["reads_per_tx"])
        out.append(["%d" % c["n"], c["shape"], "%.1f s" % c["sent_s"], "%d" % c["held_peak"], "%d" % c["fds_peak"],
                    "%.1f" % (c["hwm_kb"] / 1024), "%.1f" % c["kb_per_req"],
                    "%.1f / %.1f / %.1f" % t if t else "-", "%d / %g / %d" % rp if rp else "-",
                    " ".join("%s=%d" % kv for kv in sorted(c["words"].items()))])
    table(["N", "shops x tx x tabs", "sent in", "held peak", "fds peak", "VmHWM MB", "KB/held",
           "answer s min/med/max", "reads/tx min/med/max", "answers"], out)
    print("  (held peak: kembali's gauge; fds: /proc/PID/fd at the peak; KB/held: (VmHWM - RSS before) / N; "
          "reads counted at the sandbox, one schedule is 7)")


def print_slowpeers(cases):
    print("Slow peers: 8 stalled after one byte and 8 trickling a byte every 0.5 s, while 200 cached answers "
          "are asked for one after another:")
    table(["where", "cached answer ms median", "max", "SIGTERM to exit ms"],
          [[c["where"], "%.2f" % c["median"], "%.2f" % c["max"], "%.0f (exit %s)" % (c["stop_ms"], c["rc"])]
           for c in cases])
    print("  targets: a cached answer within 10 ms; SIGTERM ends the process within 1 s")


def print_flash(cases, one):
    print("Flash sale: one shop, budget 120 reads a minute, buyers over 10 s, each payment succeeding 1 to 25 s "
          "after its buyer came back; the seed's greedy order (read_planning false) against the plan:")
    rows = []
    for c in sorted(cases, key=lambda c: (c["n"], c["procs"], c["planning"])):
        rows.append(["%d" % c["n"], "%d" % c["procs"], "planned" if c["planning"] else "greedy",
                     "%d" % c["saw"], "%d" % c["checking"], "%d" % (c["other"] + c["lost"]), "%d" % c["reads"],
                     "%d" % c["busiest"], "%.1f" % c["median"] if c["median"] is not None else "-",
                     "%.1f" % c["p90"] if c["p90"] is not None else "-"])
    table(["buyers", "procs", "order", "saw succeeded", "checking", "other", "reads", "most in 60 s",
           "delay s median", "delay s p90"], rows)
    print("  targets: 40 and 80 buyers: >= 95% see succeeded; 150: >= 110; 20 and one at a time: as greedy")
    print("  one buyer at a time, reads at: %s (the seed: 0, 1.5, 3.5, 6.5, 11.5, 19.5, 32.5)" % (one,))


def print_hosts(rows):
    print("Several hosts: 3 kembali with their own state_dir on one Redis (Unix socket) against 3 processes "
          "on one state_dir:")
    out = []
    for r in rows:
        if "skipped" in r:
            out.append(["%s: skipped: %s" % (r["name"], r["skipped"])])
            continue
        out.append([r["name"], "%.1f / %.1f" % r["wake"] if r["wake"] else "-", "%.2f" % r["cached_rt"],
                    "%.0f" % r["cached_cpu_us"], "%.2f" % r["held_rt"], "%.0f" % r["held_cpu_us"],
                    "%d, %.2f s" % (r["reads"], r["gap"])])
    table(["setup", "wake ms median / p99", "round trips / cached", "CPU us / cached", "round trips / held",
           "CPU us / held", "30 tabs: reads, min gap"], out)
    base = rows[0]
    for r in rows[1:]:
        if "skipped" not in r and base.get("cached_cpu_us"):
            print("  Redis against one host: CPU per cached answer %s, per held request %s; target: wake < 50 ms, "
                  "one schedule (7 reads) for the 30 tabs" % (ratio(r["cached_cpu_us"], base["cached_cpu_us"]),
                                                              ratio(r["held_cpu_us"], base["held_cpu_us"])))
    print("  (CPU: utime+stime of the three kembali processes from /proc; round trips: kembali's own counter; "
          "the test client's own time is not in it)")


def wide_part(tmp, a):
    cases = [(int(n), 100, 1) for n in a.wide.split(",") if n]
    if not a.no_deep:
        cases.append((10000, 20, 25))
    rows = [("yardstick", wide.yardstick_case(tmp))]
    for n, shops, tabs in cases:
        for label, bin in ((("before", a.before),) if a.before else ()) + (("now", None),):
            name = "%s %d%s" % (label, n, " deep" if tabs > 1 else "")
            rows.append((name, wide.run_case(tmp, n, shops, tabs, bin=bin, label="-" + label)))
    wide.print_table(rows, table)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--held", default="2000,10000", help="comma-separated numbers of held requests")
    ap.add_argument("--shops", type=int, default=20, help="held: shops (one key each)")
    ap.add_argument("--tabs", type=int, default=25, help="held: tabs per transaction")
    ap.add_argument("--duration", type=int, default=4, help="throughput: seconds of load per backend and round")
    ap.add_argument("--warmup", type=int, default=1, help="throughput: seconds of warm-up per backend (0: none)")
    ap.add_argument("--rounds", type=int, default=3, help="throughput: rounds over the backends (best one shown)")
    ap.add_argument("--threads", type=int, default=2, help="throughput: wrk threads")
    ap.add_argument("--connections", type=int, default=32, help="throughput: wrk connections")
    ap.add_argument("--only", default=",".join(PARTS), help="comma-separated parts: " + ", ".join(PARTS))
    ap.add_argument("--buyers", type=int, default=1000, help="streamed: concurrent buyers (each its own transaction)")
    ap.add_argument("--wide", default="1000,3000,10000",
                    help="wide: comma-separated numbers of held requests, each its own transaction")
    ap.add_argument("--no-deep", action="store_true", help="wide: leave out 10,000 held over 400 transactions")
    ap.add_argument("--before", default=None, help="wide: also run every case with this kembali binary")
    ap.add_argument("--upgrade", default="1000,10000", help="upgrade: comma-separated numbers of held requests")
    ap.add_argument("--long", action="store_true", help="also poll a JSON answer for 60 s")
    ap.add_argument("--keep", action="store_true", help="keep the folder of logs and configurations")
    a = ap.parse_args()
    parts = set(a.only.split(","))
    if parts - set(PARTS):
        ap.error("unknown part(s): %s" % ", ".join(sorted(parts - set(PARTS))))
    raise_nofile()
    tmp = tempfile.mkdtemp(prefix="kembali-bench-")
    sb, k = kit.start(tmp, schedule=None)
    t0 = time.monotonic()
    try:
        print("kembali %s, pid %d, RSS at start %.1f MB" % (testenv.kembali_bin(), k.proc.pid, k.rss_kb() / 1024))
        if "sequential" in parts:
            sequential(k, sb)
        if "throughput" in parts:
            print_throughput(throughput.run(tmp, k, sb, a), a)
        # twenty waits 34 s on the main kembali, beside the held cases (their own kembali each)
        got = {}
        tw = threading.Thread(target=lambda: got.setdefault("line", twenty(k, sb)))
        if "twenty" in parts:
            tw.start()
        if "held" in parts:
            print_held([held.run_case(tmp, int(n), a.shops, a.tabs) for n in a.held.split(",") if n])
        if "twenty" in parts:
            tw.join()
            print(got.get("line", "20 concurrent requests: failed (see above)"))
        if "wake" in parts:
            wake(tmp)
        if "slowpeers" in parts:
            print_slowpeers(slowpeers.run(tmp))
        if "flash" in parts:
            print_flash(*flash.run(tmp))
        if "hosts" in parts:
            print_hosts(hosts.run(tmp))
        if "hostplan" in parts:
            hostplan.print_table(hostplan.run(tmp), table)
        if "streamed" in parts:
            streamed.print_table([streamed.run_case(tmp, a.buyers, mode, shops=max(1, a.buyers // 20))
                                  for mode in (True, False)])
        if "wide" in parts:
            wide_part(tmp, a)
        if "upgrade" in parts:
            upgrade.print_table([upgrade.run_case(tmp, int(n)) for n in a.upgrade.split(",") if n], table)
        if a.long:
            polling(k, sb)
        print("bench took %.0f s" % (time.monotonic() - t0) + ("; files in %s" % tmp if a.keep else ""))
    finally:
        k.stop()
        sb.stop()
    if not a.keep:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
