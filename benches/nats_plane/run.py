#!/usr/bin/env python3
"""NATS event-plane throughput: the load reports one frontend applies from
NATS, against what a bare async-nats subscriber receives of the same
publishers in the same run (server/examples/nats_flood.rs).

Starts Debian's nats-server (scripts/prepare-nats-server) on a free
127.0.0.1 port, one `loadgate frontend --event-plane nats` (release build),
then the flood: --workers simulated workers registered with sealed
Registers, then sealed Loads round-robin as fast as two publishing
connections go, every 10th flipping its worker. The frontend's
`loadgate_frontend_event_loads_applied` is read at the flood's
`phase=measure` and `phase=done`; the ratio applied / bare received is the
figure (the issue's bound: >= 0.80).

    cargo build --release -p loadgate-server --bin loadgate --example nats_flood
    benches/nats_plane/run.py --workers 1000 --seconds 5 --rounds 3
"""
import argparse
import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "target", "release", "loadgate")
FLOOD = os.path.join(ROOT, "target", "release", "examples", "nats_flood")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(http):
    return urllib.request.urlopen(f"{http}/metrics", timeout=10).read().decode()


def applied(http):
    match = re.search(r"^loadgate_frontend_event_loads_applied(?:_total)? (\d+)", metrics(http), re.M)
    return int(match.group(1)) if match else 0


def flip_lag(http):
    """The flip lag histogram's cumulative buckets: [(le seconds, count)]."""
    rows = re.findall(r'^loadgate_frontend_event_flip_lag_seconds_bucket\{le="([^"]+)"\} (\d+)', metrics(http), re.M)
    return [(float("inf") if le == "+Inf" else float(le), int(n)) for le, n in rows]


def quantile(buckets, q):
    total = buckets[-1][1] if buckets else 0
    for le, n in buckets:
        if total and n >= q * total:
            return le, total
    return float("nan"), total


def start_nats():
    port = free_port()
    nats = subprocess.Popen(["nats-server", "-a", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.02)
    return nats, f"nats://127.0.0.1:{port}"


def start_frontend(url, workers, env):
    fe = subprocess.Popen([BIN, "frontend", "--http-host", "127.0.0.1", "--http-port", "0", "--event-port", "0",
                           "--admin-port", "0", "--event-plane", "nats", "--nats-url", url,
                           "--max-workers", str(workers + 100), "--worker-health-check-ms", "0",
                           "--active-decode-blocks-threshold", "0.5", "--event-silence-ms", "60000",
                           "--event-idle-timeout-ms", "120000"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    line = fe.stdout.readline()
    return fe, "http://" + re.search(r"http=(\S+)", line).group(1)


def cpu_seconds(pid):
    """utime + stime of `pid` so far, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@contextlib.contextmanager
def fleet(args, env, frontends):
    """nats-server and `frontends` frontends on it, stopped on the way out:
    yields (nats-server's process, its URL, [(frontend process, http URL)])."""
    nats, url = start_nats()
    started = []
    try:
        for _ in range(frontends):
            started.append(start_frontend(url, args.workers, env))
        yield nats, url, started
    finally:
        for fe, _ in started:
            fe.terminate()
            fe.wait(timeout=10)
        nats.terminate()
        nats.wait(timeout=10)


def flood_command(args, url, rate, bare=True):
    return [FLOOD, "--nats-url", url, "--workers", str(args.workers), "--seconds", str(args.seconds),
            "--rate", str(rate)] + ([] if bare else ["--no-bare"])


def fleet_round(args, env):
    """`--frontends` frontends, loads at `--rate`: CPU and memory of each
    frontend, of nats-server and of the publishers (every worker's sealing
    and publishing, no bare subscriber) over the counted window."""
    with fleet(args, env, args.frontends) as (nats, url, frontends):
        flood = subprocess.Popen(flood_command(args, url, args.rate, bare=False), stdout=subprocess.PIPE, env=env,
                                 text=True)
        pids = [fe.pid for fe, _ in frontends] + [nats.pid, flood.pid]
        for out in flood.stdout:
            if out.startswith("phase=measure"):
                before = [cpu_seconds(p) for p in pids]
                applied_before = [applied(http) for _, http in frontends]
            elif out.startswith("phase=done"):
                after = [cpu_seconds(p) for p in pids]
                applied_after = [applied(http) for _, http in frontends]
                rss = [rss_mib(p) for p in pids]
        flood.wait()
        cpu = [(a - b) / args.seconds for a, b in zip(after, before)]
        applied_per_s = [(a - b) / args.seconds for a, b in zip(applied_after, applied_before)]
        return cpu, rss, applied_per_s


def lag_round(args, env):
    """`--frontends` frontends, loads at `--rate`: each frontend's flip lag."""
    with fleet(args, env, args.frontends) as (_, url, frontends):
        flood = subprocess.run(flood_command(args, url, args.rate), capture_output=True, env=env, text=True)
        result = json.loads(flood.stdout.split("result ", 1)[1])
        rows = []
        for _, http in frontends:
            buckets = flip_lag(http)
            rows.append((quantile(buckets, 0.5)[0], quantile(buckets, 0.99)[0], quantile(buckets, 0.99)[1]))
        return result, rows


def one_round(args, env):
    """One frontend, loads as fast as they go: applied per second against
    the bare subscriber's received."""
    with fleet(args, env, 1) as (_, url, frontends):
        http = frontends[0][1]
        flood = subprocess.Popen(flood_command(args, url, 0), stdout=subprocess.PIPE, env=env, text=True)
        result = None
        for out in flood.stdout:
            if out.startswith("phase=measure"):
                before = applied(http)
            elif out.startswith("phase=done"):
                after = applied(http)
            elif out.startswith("result "):
                result = json.loads(out[len("result "):])
        flood.wait()
        return (after - before) / args.seconds, result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=1000)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lag", action="store_true", help="the flip lag at --rate across --frontends instead")
    p.add_argument("--frontends", type=int, default=3)
    p.add_argument("--rate", type=int, default=10000)
    p.add_argument("--fleet", action="store_true",
                   help="CPU and memory of --frontends frontends and nats-server at --rate instead")
    args = p.parse_args()
    env = dict(os.environ)
    env.setdefault("LOADGATE_EVENT_SECRET", secrets.token_hex(24))
    env["RUST_LOG"] = "warn"
    if args.fleet:
        for r in range(1, args.rounds + 1):
            cpu, rss, applied_per_s = fleet_round(args, env)
            n = args.frontends
            print(f"round {r}: {args.frontends} frontends, {args.workers} workers, {args.rate:,} loads/s published")
            print("| process | CPU (% of a core) | RSS (MiB) | loads applied/s | CPU µs per applied load |")
            print("|---|---:|---:|---:|---:|")
            for i in range(n):
                per = cpu[i] / applied_per_s[i] * 1e6 if applied_per_s[i] else float("nan")
                print(f"| frontend {i + 1} | {cpu[i] * 100:.1f} | {rss[i]:.1f} | {applied_per_s[i]:,.0f} | {per:.2f} |")
            print(f"| nats-server | {cpu[n] * 100:.1f} | {rss[n]:.1f} | - | - |")
            print(f"| publishers (every worker's sealing and publishing) | {cpu[n + 1] * 100:.1f} | - | - | - |")
            print(f"| all frontends | {sum(cpu[:n]) * 100:.1f} | {sum(rss[:n]):.1f} | {sum(applied_per_s):,.0f} | - |",
                  flush=True)
        return
    if args.lag:
        print("| round | loads/s published | frontend | flips applied | p50 lag (ms, <=) | p99 lag (ms, <=) |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in range(1, args.rounds + 1):
            result, rows = lag_round(args, env)
            for i, (p50, p99, n) in enumerate(rows):
                print(f"| {r} | {result['published_per_s']:,.0f} | {i + 1} | {n:,} | {p50 * 1000:g} | {p99 * 1000:g} |",
                      flush=True)
        print(f"\n({args.workers} workers, {args.frontends} frontends, 1 ms resolution: the bucket bound)")
        return
    print(f"| round | published/s | bare subscriber received/s | frontend applied/s | frontend / bare |")
    print(f"|---:|---:|---:|---:|---:|")
    ratios = []
    for r in range(1, args.rounds + 1):
        frontend, result = one_round(args, env)
        bare = result["bare_received_per_s"]
        ratio = frontend / bare if bare else 0.0
        ratios.append(ratio)
        print(f"| {r} | {result['published_per_s']:,.0f} | {bare:,.0f} | {frontend:,.0f} | {ratio:.3f} |", flush=True)
    ratios.sort()
    print(f"\nmedian frontend / bare: {ratios[len(ratios) // 2]:.3f} ({args.workers} workers, {args.seconds} s per round)")


if __name__ == "__main__":
    sys.exit(main())
