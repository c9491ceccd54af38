#!/usr/bin/env python3
"""How busy the waiting line keeps real llama.cpp slots: one open-loop run
through a frontend with the demo's line flags, read from the servers' own
slot logs.

Starts two llama-servers as `loadgate demo --engines llamacpp` does (4
slots, 1 thread each; plus `--log-timestamps --log-prefix`, so that each
slot's launch and release is logged with its time), a frontend in front of
them with the demo's static thresholds and a waiting line, and
`loadgate bench --rate R --seed S` (the demo's requests: 32-word prompts,
64 streamed tokens). Then, for each server, over the steady part of the run
(from --skip s after its first launch to 1 s before the arrivals end):

- the share of time 0-4 of its slots were busy, and their utilisation;
- the service time (a slot's launch to its release);
- the refill gaps: from a slot's release to the next launch on that server.

Offered above the pool's capacity, the line always holds a waiter, so the
idle slot time is what the line's refill costs (a scrape to see the slot
free, the dispatch, the launch at the server's next step). Everything
binds 127.0.0.1 on free ports and stops when the run ends.

    cargo build --release
    python3 scripts/llama-slot-use.py --rate 13.5 --seed 1

Needs `bash scripts/prepare-llama-server` once (as the demo does).
Python 3 standard library only.
"""

import argparse
import json
import os
import re
import secrets
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

MODEL = "small-random-llama"
SLOTS = 4
SERVERS = 2
REPO = Path(__file__).resolve().parent.parent
# A slot event in a llama-server log with --log-timestamps --log-prefix:
# `0.01.496.396 I slot      release: id  3 | task 8 | ...`.
SLOT_EVENT = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) I slot\s+(launch_slot_|release):\s+id\s+(\d+)")


def engines_dir():
    if os.environ.get("LOADGATE_ENGINES"):
        return Path(os.environ["LOADGATE_ENGINES"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(cache) / "loadgate-engines"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, check, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"llama-slot-use: {what} not ready within {seconds} s")


def get(url):
    with urllib.request.urlopen(url, timeout=2) as r:
        return r.read().decode()


def run(args, work):
    engines = engines_dir() / "llama-cpp"
    server_bin = engines / "current" / "bin" / "llama-server"
    model = engines / "models" / f"{MODEL}.gguf"
    loadgate = REPO / "target" / "release" / "loadgate"
    for path, fix in [(server_bin, "bash scripts/prepare-llama-server"), (model, "bash scripts/prepare-llama-server"),
                      (loadgate, "cargo build --release")]:
        if not path.exists():
            sys.exit(f"llama-slot-use: {path} is missing: run `{fix}` first")
    env = dict(os.environ, LD_LIBRARY_PATH=str(server_bin.parent))
    children = []
    try:
        ports = [free_port() for _ in range(SERVERS)]
        for port in ports:
            log = open(work / f"llama-{port}.log", "w")
            children.append(subprocess.Popen(
                [str(server_bin), "-m", str(model), "--alias", MODEL, "--host", "127.0.0.1", "--port", str(port),
                 "--parallel", str(SLOTS), "--ctx-size", "2048", "--threads", "1", "--metrics", "--no-webui",
                 "--cache-ram", "256", "--threads-http", "512", "--log-timestamps", "--log-prefix"],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        for port in ports:
            wait_until(f"llama-server on port {port}", lambda p=port: "ok" in get(f"http://127.0.0.1:{p}/health"), 120)
        clean = {k: v for k, v in os.environ.items()
                 if not k.startswith(("DYN_", "LOADGATE_FRONTEND_", "LOADGATE_BENCH_", "RUST_LOG"))}
        clean.update(RUST_LOG="warn", LOADGATE_EVENT_SECRET=secrets.token_hex(24))
        frontend = [str(loadgate), "frontend", "--http-host", "127.0.0.1", "--http-port", "0", "--event-host",
                    "127.0.0.1", "--event-port", "0", "--disable-admin-api", "--router-mode", "round-robin",
                    "--engine-scrape-interval-ms", str(args.scrape_interval_ms), "--engine-scrape-on-end",
                    "--active-decode-blocks-threshold", "0.85", "--active-waiting-requests-threshold", "0",
                    "--active-prefill-tokens-threshold", "0", "--router-queue-timeout-ms", str(args.timeout_ms)]
        for port in ports:
            frontend += ["--engine", f"llamacpp=http://127.0.0.1:{port},model={MODEL}"]
        front = subprocess.Popen(frontend + args.frontend_flag, env=clean, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
        children.append(front)
        # Its first line says where it listens; a frontend that hangs silent is not waited for.
        ready, _, _ = select.select([front.stdout], [], [], 30)
        listening = front.stdout.readline() if ready else ""
        match = re.search(r"http=(\S+)", listening)
        if not match:
            sys.exit(f"llama-slot-use: the frontend did not start: {listening!r}")
        http = match.group(1)
        wait_until("the frontend's engines",
                   lambda: json.loads(get(f"http://{http}/health")).get("live_workers") == SERVERS, 70)
        bench = subprocess.run(
            [str(loadgate), "bench", "--url", f"http://{http}", "--model", MODEL, "--rate", str(args.rate),
             "--duration", str(args.duration), "--prompt-tokens", "32", "--output-tokens", "64", "--stream",
             "--seed", str(args.seed), "--drain-timeout", "30", "--json", "--quiet"],
            env=clean, capture_output=True, text=True, timeout=args.duration + 60)
        if bench.returncode != 0:
            sys.exit(f"llama-slot-use: bench failed: {bench.stderr.strip()}")
        return json.loads(bench.stdout), [work / f"llama-{port}.log" for port in ports]
    finally:
        for child in reversed(children):
            child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()


def slot_events(log):
    """(seconds since the server started, 'l' or 'r', slot) of each launch and release."""
    events = []
    for line in open(log, errors="replace"):
        m = SLOT_EVENT.match(line)
        if m:
            minutes, seconds, ms, us = (int(m.group(i)) for i in range(1, 5))
            events.append((minutes * 60 + seconds + ms / 1e3 + us / 1e6, m.group(5)[0], int(m.group(6))))
    # A release and a launch at the same instant: the release first.
    events.sort(key=lambda e: (e[0], e[1] != "r"))
    return events


def quantile(sorted_values, q):
    return sorted_values[int(q * (len(sorted_values) - 1))] if sorted_values else float("nan")


def slot_use(events, skip, until):
    """Busy-slot time shares, service times and refill gaps between skip and until s after the first launch."""
    if not events:
        return None
    lo, hi = events[0][0] + skip, events[0][0] + until
    time_at = [0.0] * (SLOTS + 1)
    busy, last, released, started = 0, None, [], {}
    services, gaps = [], []
    for at, kind, slot in events:
        if last is not None:
            a, b = max(last, lo), min(at, hi)
            if b > a:
                time_at[busy] += b - a
        last = at
        if kind == "l":
            busy += 1
            started[slot] = at
            if released:
                freed = released.pop(0)
                if lo <= freed <= hi:
                    gaps.append(at - freed)
        else:
            busy -= 1
            released.append(at)
            launched = started.pop(slot, None)
            if launched is not None and lo <= launched and at <= hi:
                services.append(at - launched)
    total = sum(time_at) or float("nan")
    return {
        "shares": [t / total for t in time_at],
        "utilisation": sum(i * t for i, t in enumerate(time_at)) / SLOTS / total,
        "services": sorted(services),
        "gaps": sorted(gaps),
    }


def self_test():
    """The log parser and the slot accounting on a known log."""
    lines = [f"0.00.000.{i:03d} I slot launch_slot_: id  {i} | task {i} | processing task, is_child = 0" for i in range(4)]
    lines += [
        "0.01.000.000 I slot      release: id  0 | task 0 | stop processing: n_tokens = 192, truncated = 0",
        "0.01.010.000 I slot launch_slot_: id  0 | task 9 | processing task, is_child = 0",
        "0.02.000.000 I slot get_availabl: id  1 | task -1 | selected slot by LRU, t_last = -1",
        "0.02.000.000 I slot      release: id  1 | task 1 | stop processing: n_tokens = 192, truncated = 0",
        "0.02.030.000 I slot launch_slot_: id  1 | task 10 | processing task, is_child = 0",
        "1.00.000.000 I slot      release: id  2 | task 2 | stop processing: n_tokens = 192, truncated = 0",
    ]
    with tempfile.NamedTemporaryFile("w", suffix=".log") as log:
        log.write("\n".join(lines) + "\n")
        log.flush()
        events = slot_events(log.name)
    assert len(events) == 9 and events[-1][0] == 60.0, events
    use = slot_use(events, 0.0, 10.0)
    assert [round(g, 6) for g in use["gaps"]] == [0.01, 0.03], use["gaps"]
    assert [round(s, 3) for s in use["services"]] == [1.0, 2.0], use["services"]
    assert abs(use["shares"][3] - 0.004) < 1e-6 and abs(use["utilisation"] - 0.999) < 1e-6, use
    print("llama-slot-use self-test: ok")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, required=True, help="arrivals per second")
    p.add_argument("--seed", type=int, default=1, help="the arrival sample (loadgate bench --seed)")
    p.add_argument("--duration", type=int, default=20, help="seconds of arrivals")
    p.add_argument("--timeout-ms", type=int, default=985, help="--router-queue-timeout-ms (the demo's runs: 984-987)")
    p.add_argument("--scrape-interval-ms", type=int, default=50, help="--engine-scrape-interval-ms (the demo's: 50)")
    p.add_argument("--skip", type=float, default=2.0, help="seconds after a server's first launch left out")
    p.add_argument("--frontend-flag", action="append", default=[], help="one more frontend argument (repeatable)")
    p.add_argument("--keep", help="keep the servers' logs in this directory")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="llama-slot-use-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        report, logs = run(args, work)
        print(f"rate {args.rate} req/s, seed {args.seed}: sent {report['sent']}, ok {report['ok']}, "
              f"refused {report['rejected']} ({report['rejected_pct']:.1f} %)")
        gaps, utilisations = [], []
        for n, log in enumerate(logs):
            use = slot_use(slot_events(log), args.skip, args.duration - 1)
            if use is None:
                print(f"server {n}: no slot events in {log}")
                continue
            utilisations.append(use["utilisation"])
            gaps += use["gaps"]
            shares = " ".join(f"{i}:{100 * s:.1f}%" for i, s in enumerate(use["shares"]))
            s, g = use["services"], use["gaps"]
            print(f"server {n}: slots busy {shares}; utilisation {use['utilisation']:.3f}; "
                  f"service p50 {quantile(s, 0.5):.3f} s (n {len(s)}); refill gap p50 {1e3 * quantile(g, 0.5):.1f}, "
                  f"mean {1e3 * statistics.fmean(g) if g else float('nan'):.1f}, p90 {1e3 * quantile(g, 0.9):.1f} ms")
        if utilisations:
            gaps.sort()
            print(f"both: utilisation {statistics.fmean(utilisations):.3f}; refill gap p50 "
                  f"{1e3 * quantile(gaps, 0.5):.1f}, mean {1e3 * statistics.fmean(gaps) if gaps else float('nan'):.1f} ms")


def exit_on_signal(signum, _frame):
    """SIGTERM or SIGHUP end the script as an exception does: the `finally`
    of `run` stops the servers and the frontend (by default Python dies at
    once, and its children outlive it)."""
    sys.exit(128 + signum)


if __name__ == "__main__":
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, exit_on_signal)
    main()
