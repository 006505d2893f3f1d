"""make bench, slow peers: 16 local peers that connect and stall after one
byte, or trickle a byte every 0.5 s, on the Unix socket and on TCP, while
cached answers are asked for one after another: their time at the client
(median, max), then how long SIGTERM takes to end the process."""

import os
import socket
import statistics
import time

import testenv
import kit


def _connect(addr):
    if isinstance(addr, str):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(addr)
        return s
    return socket.create_connection(addr)


def run_case(tmp, tcp):
    d = os.path.join(tmp, "slow-%s" % ("tcp" if tcp else "unix"))
    os.makedirs(d, exist_ok=True)
    sb = testenv.Sandbox(d, keys=(kit.KEY,))
    listen = "127.0.0.1:%d" % testenv.free_port() if tcp else "unix"
    k = testenv.Kembali(d, config=lambda k: testenv.make_config(sb, [testenv.make_shop("toko-a", k.key_path("a"))]),
                        keys={"a": kit.KEY}, listen=listen, name="slow").start()
    sb.put_tx("t1", "succeeded")
    k.get("id=t1")
    req = testenv.fcgi_request_bytes(testenv.cgi_params("id=t1"))
    stalled = [_connect(k.addr) for _ in range(8)]
    trickling = [[_connect(k.addr), 1] for _ in range(8)]
    for s in stalled:
        s.sendall(req[:1])
    for t in trickling:
        t[0].sendall(req[:1])
    took = []
    t_next = time.monotonic()
    for i in range(200):
        if time.monotonic() >= t_next:
            for t in trickling:
                if t[1] < len(req) - 1:
                    try:
                        t[0].sendall(req[t[1]:t[1] + 1])
                    except OSError:
                        pass
                    t[1] += 1
            t_next += 0.5
        r = k.get("id=t1", timeout=10)
        took.append(r.elapsed * 1000)
        time.sleep(0.01)
    t0 = time.monotonic()
    k.signal(15)
    rc = k.wait(10)
    stop_ms = (time.monotonic() - t0) * 1000
    for s in stalled + [t[0] for t in trickling]:
        s.close()
    sb.stop()
    return {"where": "TCP" if tcp else "Unix socket", "median": statistics.median(took), "max": max(took),
            "stop_ms": stop_ms, "rc": rc}


def run(tmp):
    return [run_case(tmp, False), run_case(tmp, True)]
