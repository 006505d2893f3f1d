"""The monitoring kit (contrib/monitoring/): the alerting rules pass
`promtool check rules` and their unit tests (`promtool test rules`), in
which every alert fires and stays quiet; every alert has a severity, a
summary and a runbook section of docs/runbook.md that exists (and every
section an alert); every metric named in the rules and the dashboard is
one that kembali serves through nginx, without Redis and with Redis behind
Sentinels; and a real Prometheus (Debian's) scraping kembali through nginx
with the kit's rules fires KembaliKeyRejected when the sandbox revokes the
shop's key, having been quiet while the key was good."""

import json
import os
import re
import shutil
import subprocess
import urllib.parse
import urllib.request

import yaml

import testenv
import kit
import test_sentinel
from testenv import assert_eq, assert_in

KIT = os.path.join(os.environ.get("top_srcdir", os.path.join(os.path.dirname(__file__), "..", "..")),
                   "contrib", "monitoring")
RULES = os.path.join(KIT, "kembali.rules.yml")
RULES_TEST = os.path.join(KIT, "kembali.rules.test.yml")
DASHBOARD = os.path.join(KIT, "kembali.dashboard.json")
RUNBOOK = os.path.join(KIT, "..", "..", "docs", "runbook.md")
# Prometheus's own series, not kembali's
PROMETHEUS_NAMES = {"up"}
# served only with Sentinels (and kembali_redis_master after the first join)
SENTINEL_NAMES = {"kembali_redis_master", "kembali_redis_master_changes_total", "kembali_redis_sentinel_asks_total",
                  "kembali_redis_sentinel_failures_total"}
_NAME = re.compile(r"\b(kembali_[a-z_]+|up)\b(?!\s*\()")


def rules():
    with open(RULES) as f:
        return [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]


def names_in(expr):
    return set(_NAME.findall(expr))


def rule_names():
    out = set()
    for r in rules():
        out |= names_in(r["expr"])
    return out


def dashboard_names():
    with open(DASHBOARD) as f:
        d = json.load(f)
    out = set()
    for p in d["panels"]:
        for t in p["targets"]:
            out |= names_in(t["expr"])
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            out |= names_in(v["definition"])
    return out


def test_promtool_checks_and_tests_the_rules():
    promtool = testenv.promtool_or_skip()
    p = subprocess.run([promtool, "check", "rules", RULES], capture_output=True, text=True, timeout=60)
    assert_eq(p.returncode, 0, p.stdout + p.stderr)
    assert_in("SUCCESS", p.stdout)
    p = subprocess.run([promtool, "test", "rules", os.path.basename(RULES_TEST)], cwd=KIT, capture_output=True,
                       text=True, timeout=120)
    assert_eq(p.returncode, 0, p.stdout + p.stderr)
    assert_in("SUCCESS", p.stdout)


def test_every_alert_is_tested_firing_and_quiet():
    with open(RULES_TEST) as f:
        t = yaml.safe_load(f)
    fired, quiet = set(), set()
    for case in t["tests"]:
        for a in case.get("alert_rule_test", []):
            (fired if a.get("exp_alerts") else quiet).add(a["alertname"])
    alerts = {r["alert"] for r in rules()}
    assert_eq(sorted(alerts - fired), [], "alerts never shown firing")
    assert_eq(sorted(alerts - quiet), [], "alerts never shown quiet")


def test_every_alert_has_severity_summary_and_runbook_section():
    with open(RUNBOOK) as f:
        sections = {h.strip().lower(): h.strip() for h in re.findall(r"^## (.+)$", f.read(), re.M)}
    alerts = set()
    for r in rules():
        name = r["alert"]
        alerts.add(name)
        assert_in(r["labels"].get("severity"), ("critical", "warning"), name)
        assert r["annotations"].get("summary"), name
        assert_eq(r["annotations"].get("runbook"), "docs/runbook.md#" + name.lower(), name)
        assert_in(name.lower(), sections, "%s: its section in docs/runbook.md" % name)
        # labels bounded: every aggregation by (job, instance), never by shop or id
        # (KembaliDown: `up`, one series per target)
        aggs = re.findall(r"\bby \(([^)]*)\)", r["expr"])
        assert_eq(set(aggs), set() if name == "KembaliDown" else {"job, instance"}, name)
    stray = [h for k, h in sections.items() if h.startswith("Kembali") and h not in alerts]
    assert_eq(stray, [], "runbook sections without an alert")


def nginx_with_metrics(tmpdir, k):
    """nginx in front of k, with docs/monitoring.md's metrics location."""
    loc = ("location = /kembali-metrics { allow 127.0.0.1; deny all; include /etc/nginx/fastcgi_params; "
           "fastcgi_param KEMBALI_ADMIN 1; fastcgi_param QUERY_STRING format=metrics; fastcgi_pass unix:%s; }"
           % k.addr)
    return testenv.Nginx(tmpdir, k, server_extra=loc)


def scrape(ngx):
    status, headers, body = ngx.http_get("/kembali-metrics")
    assert_eq(status, 200, body[:500])
    return body.decode()


def served(text):
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def activity(k, sb):
    """A read (the shop's key in use: the per-shop series), a cached answer,
    a JSON answer."""
    sb.put_tx("paid", "succeeded")
    assert_eq(k.get("id=paid").header("kembali-status"), "succeeded")
    assert_eq(k.get("id=paid&format=json").header("kembali-status"), "succeeded")


def check_served(ngx, redis, sentinel):
    text = scrape(ngx)
    have = served(text)
    want = (rule_names() | dashboard_names()) - PROMETHEUS_NAMES
    if not redis:
        want = {n for n in want if not n.startswith("kembali_redis_")}
    elif not sentinel:
        want -= SENTINEL_NAMES
    missing = sorted(want - have)
    assert_eq(missing, [], "named in the rules or the dashboard, not served; the page:\n" + text)
    print("# %d names of the kit, all served" % len(want))


@testenv.timeout(120)
def test_every_metric_named_is_served_without_redis(tmpdir):
    sb, k = kit.start(tmpdir)
    with nginx_with_metrics(tmpdir, k) as ngx:
        activity(k, sb)
        check_served(ngx, redis=False, sentinel=False)


@testenv.timeout(180)
def test_every_metric_named_is_served_with_redis_and_sentinels(tmpdir):
    master, _replica = test_sentinel.pair(tmpdir)
    sen = testenv.Sentinel(tmpdir, master)
    sb, ks = test_sentinel.start_hosts(tmpdir, 1, [sen], master)
    k = ks[0]
    k.wait_log(30, event="redis_joined")
    with nginx_with_metrics(tmpdir, k) as ngx:
        activity(k, sb)
        check_served(ngx, redis=True, sentinel=True)


def prometheus_or_skip():
    exe = os.environ.get("PROMETHEUS") or shutil.which("prometheus") or "/usr/bin/prometheus"
    if os.path.exists(exe):
        return exe
    if os.environ.get("KEMBALI_REQUIRE_SERVERS") == "1":
        raise AssertionError("%s is missing and KEMBALI_REQUIRE_SERVERS=1" % exe)
    raise testenv.Skip("%s is not installed (Debian's prometheus package)" % exe)


class Prometheus:
    """A throwaway Prometheus server scraping http://127.0.0.1:<port>/kembali-metrics
    every second as the job "kembali", evaluating `rules_file` every second."""

    def __init__(self, tmpdir, port, rules_file):
        exe = prometheus_or_skip()
        self.dir = os.path.join(tmpdir, "prometheus")
        os.makedirs(self.dir, exist_ok=True)
        conf = os.path.join(self.dir, "prometheus.yml")
        with open(conf, "w") as f:
            yaml.safe_dump({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [rules_file],
                "scrape_configs": [{"job_name": "kembali", "metrics_path": "/kembali-metrics",
                                    "static_configs": [{"targets": ["127.0.0.1:%d" % port]}]}],
            }, f)
        self.port = testenv.free_port()
        self.log = os.path.join(self.dir, "prometheus.log")
        with open(self.log, "ab") as log:
            self.proc = testenv.spawn([exe, "--config.file", conf, "--storage.tsdb.path", os.path.join(self.dir, "data"),
                                       "--web.listen-address", "127.0.0.1:%d" % self.port], tmpdir,
                                      stdout=log, stderr=subprocess.STDOUT)
        testenv.wait_for(self.ready, 60, interval=0.1, msg="Prometheus ready")

    def api(self, path, **params):
        url = "http://127.0.0.1:%d/api/v1/%s" % (self.port, path)
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)["data"]

    def ready(self):
        assert self.proc.poll() is None, "Prometheus exited:\n" + open(self.log).read()[-3000:]
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/-/ready" % self.port, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def value(self, query):
        res = self.api("query", query=query)["result"]
        return float(res[0]["value"][1]) if res else None

    def alerts(self, state=None):
        return [a for a in self.api("alerts")["alerts"] if state is None or a["state"] == state]

    def stop(self):
        testenv.kill_process(self.proc)


@testenv.timeout(180)
def test_prometheus_fires_key_rejected_when_the_key_is_revoked(tmpdir):
    sb, k = kit.start(tmpdir, schedule=kit.FAST)
    with nginx_with_metrics(tmpdir, k) as ngx:
        prom = Prometheus(tmpdir, ngx.port, RULES)
        try:
            activity(k, sb)  # a good key: reads answered
            # scraped at least twice since, the 401 count at 0 among the samples,
            # and the rules evaluated on them: nothing fires, nothing pending
            sel = 'kembali_api_reads_total{job="kembali", outcome="unauthorized"}'
            testenv.wait_for(lambda: prom.value('kembali_answers_total{status="succeeded"}') == 2.0, 60,
                             interval=0.2, msg="the good reads scraped")
            testenv.wait_for(lambda: (prom.value("count_over_time(%s[1m])" % sel) or 0) >= 3, 60,
                             interval=0.2, msg="three scrapes of the 401 count")
            assert_eq(prom.alerts(), [], "no alert while the key is good")
            assert_eq(prom.value(sel), 0.0)

            sb.remove_key(kit.KEY)  # revoked at Kasera
            sb.put_tx("after", "pending")
            assert_eq(k.get("id=after", timeout=30).header("kembali-status"), "checking")
            k.wait_log(30, event="key_rejected", shop="toko-a")

            def firing():
                got = [a for a in prom.alerts("firing") if a["labels"]["alertname"] == "KembaliKeyRejected"]
                return got or None
            got = testenv.wait_for(firing, 60, interval=0.2, msg="KembaliKeyRejected firing; alerts: %r" % (prom.alerts(),))
            assert_eq(len(got), 1)
            a = got[0]
            assert_eq((a["labels"]["severity"], a["labels"]["job"], a["labels"]["instance"]),
                      ("critical", "kembali", "127.0.0.1:%d" % ngx.port))
            assert_eq(a["annotations"]["runbook"], "docs/runbook.md#kembalikeyrejected")
            assert_in("401", a["annotations"]["description"])
            # the buyer's checking was counted with its reason, and the shop is listed paused
            m = testenv.parse_metrics(scrape(ngx))
            assert m['kembali_checking_answers_total{reason="key_paused"}'] >= 1, m
            assert_eq(m['kembali_shop_key_paused{shop="toko-a"}'], 1.0)
            # the only alerts: the key's (no other rule fires on this)
            others = sorted({x["labels"]["alertname"] for x in prom.alerts("firing")} - {"KembaliKeyRejected"})
            assert_eq(others, [])
        finally:
            prom.stop()


if __name__ == "__main__":
    testenv.run(globals())
