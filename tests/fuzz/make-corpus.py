#!/usr/bin/env python3
"""tests/fuzz/make-corpus.py - write the seed corpora of tests/fuzz/corpus/.

Small real examples for each fuzz target, in the input layout its
fuzz_<target>.c describes. Run from anywhere; rewrites the corpus folders
(the files are committed: run it again only when a layout changes)."""
import hashlib
import hmac
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- FastCGI: records as nginx sends them ----
BEGIN, ABORT, END, PARAMS, STDIN, STDOUT, STDERR, DATA, GET_VALUES = 1, 2, 3, 4, 5, 6, 7, 8, 9


def rec(t, rid, content=b"", pad=None):
    if pad is None:
        pad = (8 - len(content) % 8) % 8
    return struct.pack(">BBHHBB", 1, t, rid, len(content), pad, 0) + content + b"\0" * pad


def nv(name, value):
    def ln(n):
        return bytes([n]) if n < 128 else struct.pack(">I", n | 0x80000000)
    name, value = name.encode(), value.encode()
    return ln(len(name)) + ln(len(value)) + name + value


def nginx_params(query, method="GET", accept="text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
                 extra=()):
    p = [("QUERY_STRING", query), ("REQUEST_METHOD", method), ("CONTENT_TYPE", ""), ("CONTENT_LENGTH", ""),
         ("SCRIPT_NAME", "/kembali"), ("REQUEST_URI", "/kembali?" + query), ("DOCUMENT_URI", "/kembali"),
         ("DOCUMENT_ROOT", "/var/www/html"), ("SERVER_PROTOCOL", "HTTP/1.1"), ("REQUEST_SCHEME", "https"),
         ("GATEWAY_INTERFACE", "CGI/1.1"), ("SERVER_SOFTWARE", "nginx/1.22.1"), ("REMOTE_ADDR", "203.0.113.7"),
         ("REMOTE_PORT", "51234"), ("SERVER_ADDR", "192.0.2.1"), ("SERVER_PORT", "443"),
         ("SERVER_NAME", "toko-a.example"), ("REDIRECT_STATUS", "200"), ("HTTP_HOST", "toko-a.example"),
         ("HTTP_USER_AGENT", "Mozilla/5.0 (X11; Linux x86_64)"), ("HTTP_ACCEPT", accept)]
    p += list(extra)
    return b"".join(nv(k, v) for k, v in p)


def request(rid, query, keep=False, method="GET", body=b"", split_params=1, extra=(), accept=None):
    kw = {"method": method, "extra": extra}
    if accept is not None:
        kw["accept"] = accept
    pb = nginx_params(query, **kw)
    out = rec(BEGIN, rid, struct.pack(">HB5x", 1, 1 if keep else 0))
    step = max(1, len(pb) // split_params)
    for i in range(0, len(pb), step):
        out += rec(PARAMS, rid, pb[i:i + step])
    out += rec(PARAMS, rid)
    if body:
        out += rec(STDIN, rid, body)
    out += rec(STDIN, rid)
    return out


def codec(name, stream, seed=0x12345678, flags=0, repeat=0, mult=0):
    put("fastcgi_codec", name, struct.pack("<IBBH", seed, flags, repeat, mult) + stream)


codec("get", request(1, "id=T1"))
codec("get-split-1byte", request(1, "id=T1&format=json"), flags=0x01)
codec("get-keep-conn", request(1, "id=T1", keep=True) + request(1, "id=T2", keep=True), flags=0x02)
codec("keep-conn-taken", request(1, "id=T1", keep=True) + request(2, "id=T2", keep=True), flags=0x04 | 0x03)
codec("json-accept", request(1, "id=tx_9", accept="application/json"), flags=0x22, mult=3)
codec("notify-post", request(1, "id=T1&format=notify", method="POST", body=b'{"status": "succeeded"}',
                              extra=[("KEMBALI_ADMIN", "1"), ("KEMBALI_SHOP", "toko-a"),
                                     ("CONTENT_TYPE", "application/json")]), flags=0x02)
codec("params-in-pieces", request(7, "id=T1", split_params=5), flags=0x03)
codec("get-values", rec(GET_VALUES, 0, nv("FCGI_MAX_CONNS", "") + nv("FCGI_MAX_REQS", "") +
                        nv("FCGI_MPXS_CONNS", "")))
codec("get-values-then-request", rec(GET_VALUES, 0, nv("FCGI_MPXS_CONNS", "")) + request(1, "id=T1"), flags=0x01)
codec("unknown-type", rec(11, 0, b"x" * 8) + request(1, "id=T1"))
codec("abort", rec(BEGIN, 1, struct.pack(">HB5x", 1, 0)) + rec(PARAMS, 1, nginx_params("id=T1")) + rec(ABORT, 1),
      flags=0x08)
codec("abort-after-request", request(1, "id=T1", keep=True) + rec(ABORT, 1) + request(2, "id=T3"), flags=0x0c)
codec("cant-mpx", rec(BEGIN, 1, struct.pack(">HB5x", 1, 1)) + rec(BEGIN, 2, struct.pack(">HB5x", 1, 1)) +
      rec(PARAMS, 1, nginx_params("id=T1")) + rec(PARAMS, 1) + rec(STDIN, 1))
codec("unknown-role", rec(BEGIN, 1, struct.pack(">HB5x", 2, 0)) + request(2, "id=T1"))
codec("big-stdin-amplified", rec(BEGIN, 1, struct.pack(">HB5x", 1, 1)) + rec(PARAMS, 1, nginx_params("id=T1")) +
      rec(PARAMS, 1) + rec(STDIN, 1, b"a" * 4000), flags=0x10, repeat=5)
codec("big-params-amplified", rec(BEGIN, 1, struct.pack(">HB5x", 1, 0)) + rec(PARAMS, 1, nv("HTTP_COOKIE", "c" * 3000)),
      flags=0x10 | 0x01, repeat=30)
codec("long-name", request(1, "id=T1", extra=[("HTTP_X_" + "L" * 200, "v" * 300)]), flags=0x02)
codec("bad-version", b"\x02\x01\x00\x01\x00\x08\x00\x00" + b"\0" * 8)
codec("stdout-from-peer", rec(STDOUT, 1, b"x"))
codec("encode-large", request(1, "id=T1"), flags=0x20, mult=7)

# ---- query strings (1 byte capacity choice, then query, id_param, host, shop separated by NUL) ----
HOSTS = [("toko-a.example", ""), ("TOKO-A.example.:8443", ""), ("[2001:db8::1]:443", ""), ("192.0.2.7", ""),
         ("other.example", ""), ("toko-b.example", "toko-a"), ("", "c"), ("toko-a.example", "nope"), ("[::1", ""),
         ("toko-b.example" + "." * 300, "")]
for i, (q, ip) in enumerate([
        ("id=T1", ""), ("id=T1&format=json", ""), ("status=succeeded&id=tx_1-2&format=json", "order"),
        ("id=a;b", ""), ("id=%41%42%43&id=T2", ""), ("order=ORD-77&id=x", "order"), ("id=a+b%20c%00d", ""),
        ("id=" + "A" * 64, ""), ("id=" + "A" * 65, ""), ("format=metrics", ""), ("id", ""), ("id=%zz%4", ""),
        ("&&id=&id=2", ""), ("id=%E2%82%AC", "")]):
    host, shop = HOSTS[i % len(HOSTS)]
    put("query", "q%02d" % i, bytes([i * 3 % 9]) + "\0".join([q, ip, host, shop]).encode())

# ---- Accept ----
for i, a in enumerate([
        "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8",
        "application/json", "application/json;q=0", "application/json; q=0.0", "text/html, application/json;q=0.9",
        "application/json;q=0.9, text/html", "*/*", "APPLICATION/JSON", "application/problem+json",
        "text/html;q=0.5, application/json;q=0.5", "application/json;charset=utf-8;q=1"]):
    put("accept", "a%02d" % i, a)

# ---- API answers: status line, headers, empty line, body ----
TXH = "RateLimit-Limit: 1\r\nRateLimit-Remaining: 0\r\nRateLimit-Reset: 1\r\n"
for i, (st, hdr, body) in enumerate([
        (200, TXH + "Content-Type: application/json\r\n",
         '{"id":"T1","status":"succeeded","amount":150000,"currency":"IDR","method":"qris"}'),
        (200, TXH, '{"id":"T2","status":"pending","amount":25000}'),
        (200, TXH, '{"id":"T3","status":"failed"}'),
        (200, TXH, '{"id":"T4","status":"canceled"}'),
        (200, TXH, '{"id":"T5","status":"expired"}'),
        (200, TXH, '{"id":"T6","status":"refunded"}'),
        (200, TXH, '{"id":"T7"}'),
        (200, TXH, "<html>502 Bad Gateway</html>"),
        (404, "", '{"error":{"code":"not_found","message":"transaction not found","request_id":"req_9f2c"}}'),
        (401, "", '{"error":{"code":"unauthorized","message":"invalid API key","request_id":"req_1a2b"}}'),
        (429, "Retry-After: 1\r\n" + TXH,
         '{"error":{"code":"rate_limited","message":"at most one read per second per transaction; use webhooks '
         'for status updates","request_id":"req_77"}}'),
        (429, "", '{"error":{"code":"rate_limited","message":"rate limit exceeded: 300 requests per minute",'
                  '"request_id":"req_78"}}'),
        (429, "", '{"error":{"code":"rate_limited","message":"too many failed authentication attempts from this '
                  'IP address","request_id":"req_79"}}'),
        (429, "", '{"error":{"code":"unverified_count_cap","message":"unverified accounts may create at most 50 '
                  'transactions","request_id":"req_80"}}'),
        (429, "", '{"error":{"code":"unverified_amount_cap","message":"amount cap","request_id":"req_81"}}'),
        (422, "", '{"error":{"code":"amount_too_small","message":"minimum Rp 1.000","request_id":"req_82"}}'),
        (500, "", '{"error":{"code":"internal_error","message":"internal error","request_id":"req_83"}}'),
        (503, "Retry-After: Wed, 21 Oct 2026 07:28:00 GMT\r\n", ""),
        (0, "", ""),
        (429, 'RateLimit-Policy: "tx";q=1;w=1, "key";q=300;w=60\r\nRateLimit: "tx";r=0;t=1\r\nRetry-After: 1\r\n',
         '{"error":{"code":"rate_limited","message":"slow down"}}'),
        (200, 'RateLimit-Policy: "default";q=300;w=60\r\nRateLimit: "default";r=0;t=35\r\n',
         '{"id":"T8","status":"succeeded"}')]):
    put("classify", "c%02d" % i, "%d\n%s\r\n%s" % (st, hdr, body))

# ---- Retry-After ----
for i, v in enumerate(["1", "0", "120", "3600", "86400", " 5 ", "Wed, 21 Oct 2026 07:28:00 GMT",
                       "Wednesday, 21-Oct-26 07:28:00 GMT", "Wed Oct 21 07:28:00 2026", "Thu, 01 Jan 1970 00:00:00 GMT",
                       "-1", "1.5", "99999999999999999999", "Fri, 31 Dec 9999 23:59:59 GMT"]):
    put("retry_after", "r%02d" % i, v)

# ---- messages on the Redis wake channel ----
K = "0123456789abcdef0123456789abcdef"
for i, v in enumerate(["F %s tx_1 3600000 succeeded" % K, "P %s T-2 1500 pending" % K, "W %s t3 0" % K,
                       "N %s t4 30000" % K, "B %s %s 600000" % (K, K[::-1]), "F %s t 86400000 expired" % K,
                       "P %s t5 1100 processing_3ds" % K, "W %s t3  0" % K, "S %s" % K, "R %s" % K]):
    put("redis_msg", "m%02d" % i, v)

# ---- RateLimit headers: limit, remaining, reset, RateLimit, RateLimit-Policy ----
A = "\x01"
for i, f in enumerate([
        ("1", "0", "1", A, A), ("1", "1", "1", A, A), ("300", "0", "60", A, A),
        (A, A, A, '"tx";r=0;t=1', '"tx";q=1;w=1'), (A, A, A, '"default";r=0;t=35', '"default";q=300;w=60'),
        (A, A, A, '"default";r=842;t=35', '"default";q=1000;w=60'),
        (A, A, A, '"a";r=0;t=5, "b";r=0;t=50', '"a";q=1;w=1, "b";q=300;w=60'), (A, A, A, '"x";r=0;t=9', A),
        ("1", "0", "1", '"k";r=0;t=60', '"k";q=300;w=60'), (" 1 ", " 0 ", " 2 ", A, A)]):
    put("ratelimit", "l%02d" % i, "\n".join(f))

# ---- configuration (and shop files after 0xFF bytes) ----
# docs/configuration.md's example
DOC_CFG = """{
  "api_base": "https://pay.kasera.id",
  "state_dir": "/var/lib/kembali",
  "templates_dir": "/usr/local/share/kembali/templates",
  "shops": [
    {
      "id": "toko-a",
      "name": "Toko A",
      "hosts": ["toko-a.example"],
      "secret_key_file": "/etc/kembali/keys/toko-a",
      "shop_url": "https://toko-a.example/",
      "locale": "id",
      "read_budget_per_minute": 120
    }
  ]
}
"""
SHOP_B = ('{"id": "toko-b", "name": "Toko B", "hosts": ["toko-b.example", "[2001:db8::1]"], '
          '"secret_key_file": "/etc/kembali/keys/toko-b", "locale": "en", "cors_origins": ["https://toko-b.example"], '
          '"id_param": "order", "templates_dir": "/srv/toko-b/templates"}')
put("config", "readme", DOC_CFG)
put("config", "two-shops", '{"api_base": "http://127.0.0.1:8081", "templates_dir": "/t", "shops": [%s, %s]}' % (
    '{"id": "a", "secret_key_env": "KEMBALI_KEY_A", "hosts": ["a.example."]}', SHOP_B))
put("config", "shops-dir", b'{"templates_dir": "/t", "shops_dir": "/etc/kembali/shops.d"}\xff' + SHOP_B.encode() +
    b'\xff{"id": "c", "secret_key_file": "/k/c", "read_budget_per_minute": 60}')
put("config", "tenants", b'{"templates_dir": "/usr/local/share/kembali/templates", "keys_dir": "/srv/keys", '
    b'"shops_dir": "/etc/kembali/tenants", '
    b'"shops": [{"id": "m", "secret_key_env": "SHOP_KEY", "hosts": ["m.example"]}]}'
    b'\xff{"hosts": ["a.example", "b.example"]}\xff{"id": "s1", "name": "Toko S1", "hosts": ["b.example"]}'
    b'\xff{"hosts": ["c.example", "m.example"]}\xff{"id": "s3", "hosts": ["d.example"]}')
put("config", "tuning", '{"templates_dir": "/t", "schedule_ms": [0, 1100, 1100, 1200], "read_timeout_ms": 800, '
    '"state_slots": 64, "shops": [{"id": "t", "secret_key_file": "/k"}]}')
put("config", "bad-schedule", '{"templates_dir": "/t", "schedule_ms": [0, 500], "shops": [{"id": "t", '
    '"secret_key_file": "/k"}]}')
put("config", "unknown-key", '{"templates_dir": "/t", "shop": [], "shops": [{"id": "t", "secret_key_file": "/k", '
    '"locale": "fr", "colour": 1}]}')
put("config", "plain-http", '{"api_base": "http://pay.kasera.id", "shops": []}')
put("config", "dup-host", '{"shops": [{"id": "a", "secret_key_file": "/k", "hosts": ["x.example"]}, '
    '{"id": "a", "secret_key_file": "/k", "hosts": ["X.example"]}]}')
put("config", "broken-json", '{"shops": [{"id": "a",}]')
put("config", "redis-tcp", '{"templates_dir": "/t", "redis": "redis://[::1]:6379/2", "redis_password_file": "/k/pw", '
    '"redis_prefix": "shop-1:", "redis_hosts": 3, "shops": [{"id": "t", "secret_key_file": "/k"}]}')
put("config", "redis-unix", '{"templates_dir": "/t", "redis": "unix:///run/redis/redis-server.sock?db=1", '
    '"shops": [{"id": "t", "secret_key_file": "/k"}]}')
put("config", "redis-bad", '{"templates_dir": "/t", "redis": "redis://:pw@host", "redis_prefix": "a b", '
    '"redis_hosts": 0, "shops": [{"id": "t", "secret_key_file": "/k"}]}')

# ---- templates: the real pages ----
WORDS = ["succeeded", "failed", "canceled", "expired", "checking", "not_found", "invalid", "unknown_shop"]
for li, loc in enumerate(["id", "en"]):
    for w, word in enumerate(WORDS):
        with open(os.path.join(TOP, "templates", loc, word + ".html"), "rb") as f:
            page = f.read()
        sel = w | (0x08 if loc == "en" else 0)
        vals = [b"T1", b"Toko A", b"https://toko-a.example/", b"/kembali?id=T1"]
        if w == 1:
            vals = [b"<script>", b"Toko \"A\" & 'B'", b"javascript:alert(1)", b"/k?id=T1&x=<y>"]
        put("templates", "%s-%s" % (loc, word), bytes([sel]) + page + b"\xff" + b"\xff".join(vals))
put("templates", "minimal", b"\x04<html data-status=\"{{status}}\">{{id}}{{shop_name}}</html>\xffT1\xffShop")

# ---- notify bodies ----
for i, b in enumerate(['{"status": "succeeded"}', '{"status": "expired"}', '{"status": "pending"}',
                       '{"status": "failed", "event": "payment.failed", "id": "T1"}', '{"status": "refunded"}',
                       '{"status": 1}', '{}', '[]', '"succeeded"', '{"status": "succeeded", "status": "failed"}',
                       '{"status": "succ\\u0065eded"}', '']):
    put("notify", "n%02d" % i, b)
# signed: a Kembali-Signature header, a NUL, the body (the HMAC as the shop computes it)
_body = b'{"status": "succeeded"}'
_mac = hmac.new(b"whsec-fuzz", b"1764000000.T1." + _body, hashlib.sha256).hexdigest()
for i, h in enumerate(["t=1764000000,v1=" + _mac, " t=1764000000 , v1=" + _mac + " ,v0=x",
                       "t=1764000000,v1=" + _mac.upper(), "t=1763999699,v1=" + _mac, "v1=" + _mac,
                       "t=1764000000", "t=1764000000,v1=" + _mac + ",t=1", "t=-5,v1=" + _mac, "t=1,v1=ab", ","]):
    put("notify", "s%02d" % i, h.encode() + b"\0" + _body)
