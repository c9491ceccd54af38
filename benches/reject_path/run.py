#!/usr/bin/env python3
"""Reject-path throughput: the frontend's 529s against a bare axum handler.

One load generator (server/examples/hammer.rs: closed loop, HTTP/1.1
keep-alive, C connections, one fixed small chat-completion request in
flight on each) drives every target in turn, in rounds (a b c a b c ...):

  a  bare:   server/examples/fixed_529.rs, a bare axum handler answering the
             frontend's overload reply (529, Retry-After: 1, same JSON body);
  b  before: `loadgate frontend` built from the "before" commit;
  c  after:  `loadgate frontend` built from the current tree.

b and c are made to reject every request the same way: one simulated
`loadgate worker` on the event plane, the frontend started with
`--active-decode-blocks-threshold 0.0` (busy when active/total blocks is
strictly above 0) and one streaming request (max_tokens 16000, one token every
500 ms) held open through the frontend, so the worker always reports one
active block and every further request is the frontend's own 529. A probe
checks that before measuring; every counted response is checked against the
probe's status, body and Retry-After (a round with any other answer is marked
invalid).

Flags that exist only in newer binaries (--http-host, --admin-port) are
passed only when the binary's `frontend --help` lists them; a binary that
knows --event-secret-file gets LOADGATE_EVENT_SECRET (random, 48 chars) for
its frontend and worker. Every other DYN_*/LOADGATE_*/RUST_LOG variable is
removed from the children's environment.

Pinning (default on a 2-core machine): every target server on CPU 0, the
load generator, the simulated worker and this script on CPU 1. The server
and the client therefore never compete for a core, and a pinned tokio
runtime runs one worker thread. The server's CPU time during each counted
window is read from /proc, so each round also gives server CPU per response
(a figure that does not depend on whether the client kept the server busy).

A fleet (--before-fleet / --after-fleet N, default 1): N - 1 more simulated
workers of the same model, registered by this script over the event plane
(today's wire format, with the handshake when a secret is set) and each
reporting one busy load once, so that the frontend sheds with N busy
workers. With a fleet, both frontends get the same --max-event-connections,
--max-workers (N + 64), --event-idle-timeout-ms and --event-silence-ms
(10 minutes: one report keeps a simulated worker busy for the whole run).
Passing the same binary as --before-bin and --after-bin with two fleets
measures what the fleet's size costs a 529.

Standard library only. Prints per-round figures, medians, ratios, a
markdown table for docs/benchmarks.md and the command that reproduces it.
"""

import argparse
import hashlib
import hmac
import json
import os
import queue
import re
import secrets
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time

REQUEST_BODY = (
    '{"model":"bench","messages":[{"role":"user","content":"Say hello."}],'
    '"max_tokens":16,"stream":false}'
)
HOLD_BODY = (
    '{"model":"bench","messages":[{"role":"user","content":"Hold this worker busy."}],'
    '"max_tokens":16000,"stream":true}'
)
TARGETS = {
    "a": "bare axum 529",
    "b": "frontend before",
    "c": "frontend after",
}
CLK_TCK = os.sysconf("SC_CLK_TCK")
CHILDREN = []


def log(msg):
    print(f"[reject_path {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def clean_env(extra=None):
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("DYN_") or k.startswith("LOADGATE_") or k == "RUST_LOG")
    }
    env.update(extra or {})
    return env


def pinned(cpus, argv):
    if cpus and shutil.which("taskset"):
        return ["taskset", "-c", cpus] + argv
    return argv


class Child:
    """A process we started: stdout lines queued, stderr to a log file."""

    def __init__(self, name, argv, env, log_dir):
        self.name = name
        self.argv = argv
        self.stderr = open(os.path.join(log_dir, f"{name}.stderr.log"), "w")
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=self.stderr, text=True, bufsize=1
        )
        CHILDREN.append(self)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_line(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{self.name}: no line matching {pattern!r} within {timeout} s")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"{self.name} exited (rc={self.proc.wait()}); see {self.stderr.name}")
            m = re.search(pattern, line)
            if m:
                return m

    def cpu_seconds(self):
        return cpu_seconds(self.proc.pid)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.stderr.close()


def cpu_seconds(pid):
    """utime + stime of every thread of process `pid` (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def stop_all():
    while CHILDREN:
        CHILDREN.pop().stop()


def http_request(addr, body, timeout=5.0):
    """One POST /v1/chat/completions; returns (status, headers dict, body bytes)."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request_bytes(addr, body))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError("connection closed before the head")
            data += chunk
        head, rest = data.split(b"\r\n\r\n", 1)
        status, headers = parse_head(head)
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        return status, headers, rest[:length]


def request_bytes(addr, body):
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    ).encode()


def parse_head(head):
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


class Hold:
    """A streaming request kept open through a frontend, read in a thread."""

    def __init__(self, addr, timeout):
        host, port = addr.rsplit(":", 1)
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(request_bytes(addr, HOLD_BODY))
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            if b"\r\n\r\n" in data:
                status, _ = parse_head(data.split(b"\r\n\r\n", 1)[0])
                if status == 200:
                    # The first token means the prompt is prefilled: the worker
                    # holds a block and reports it.
                    while b"data:" not in data.split(b"\r\n\r\n", 1)[1]:
                        chunk = s.recv(65536)
                        if not chunk:
                            raise RuntimeError("holding stream closed before its first token")
                        data += chunk
                    self.sock = s
                    self.bytes = len(data)
                    self.open = True
                    s.settimeout(None)
                    threading.Thread(target=self._read, daemon=True).start()
                    return
                last = status
            s.close()
            time.sleep(0.05)  # the worker has not registered yet (503)
        raise RuntimeError(f"holding stream never got 200 within {timeout} s (last status {last})")

    def _read(self):
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                self.bytes += len(chunk)
        except OSError:
            pass
        self.open = False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


WIRE_MAGIC = 0xB2
KIND_REGISTER, KIND_LOAD, KIND_CHALLENGE, KIND_PROOF, KIND_WELCOME = 1, 2, 4, 5, 6
FLEET_IDS = 1 << 40  # the simulated fleet's worker ids start here
FLEET_HOLD_MS = "600000"


def frame(kind, payload):
    return bytes([WIRE_MAGIC, kind]) + len(payload).to_bytes(2, "big") + payload


def read_frame(sock):
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            raise ConnectionError("event connection closed")
        head += chunk
    length = int.from_bytes(head[2:4], "big")
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            raise ConnectionError("event connection closed")
        body += chunk
    return head[1], body


def register_fleet(events, count, secret, timeout=120.0):
    """Opens `count` event connections, each registering one worker of model
    `bench` and reporting it busy (all of 100 KV blocks), and returns the
    sockets (held open for the run). Connects in batches, so the listen
    backlog is never flooded."""
    host, port = events.rsplit(":", 1)
    socks = []
    deadline = time.monotonic() + timeout
    for i in range(count):
        if time.monotonic() > deadline:
            raise RuntimeError(f"fleet: only {i} of {count} workers registered in {timeout:.0f} s")
        worker = FLEET_IDS + i
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if secret:
            kind, nonce = read_frame(sock)
            if kind != KIND_CHALLENGE:
                raise RuntimeError(f"fleet: expected a Challenge, got kind {kind}")
            mine = os.urandom(32)
            mac = hmac.new(secret.encode(), b"loadgate-event-proof-v1" + nonce + mine, hashlib.sha256).digest()
            sock.sendall(frame(KIND_PROOF, mine + mac))
            kind, _ = read_frame(sock)
            if kind != KIND_WELCOME:
                raise RuntimeError(f"fleet: expected a Welcome, got kind {kind}")
        model, addr = b"bench", b"127.0.0.1:9"
        register = (worker.to_bytes(8, "big") + (1).to_bytes(8, "big") + (1).to_bytes(4, "big")
                    + len(model).to_bytes(2, "big") + model + len(addr).to_bytes(2, "big") + addr)
        load = (worker.to_bytes(8, "big") + (1).to_bytes(8, "big") + (0).to_bytes(4, "big") + (1).to_bytes(8, "big")
                + (100).to_bytes(4, "big") + (100).to_bytes(4, "big") + bytes(4) + (2048).to_bytes(4, "big") + bytes(4))
        sock.sendall(frame(KIND_REGISTER, register) + frame(KIND_LOAD, load))
        socks.append(sock)
        if i % 200 == 199:
            time.sleep(0.02)
    return socks


def frontend_flags(binary):
    out = subprocess.run(
        [binary, "frontend", "--help"], capture_output=True, text=True, timeout=30, env=clean_env()
    ).stdout
    return {flag for flag in ("--http-host", "--admin-port", "--event-secret-file") if flag in out}


def start_bare(args, log_dir):
    exe = os.path.join(args.examples_dir, "fixed_529")
    child = Child("a_fixed_529", pinned(args.server_cpus, [exe, "--http-port", "0"]), clean_env(), log_dir)
    addr = child.wait_line(r"listening http=(\S+)", 30).group(1)
    return {"server": child, "addr": addr, "hold": None, "setup": "fixed_529 --http-port 0"}


def start_frontend(key, binary, args, log_dir):
    flags = frontend_flags(binary)
    extra = {}
    if "--event-secret-file" in flags:
        extra["LOADGATE_EVENT_SECRET"] = secrets.token_hex(24)
    env = clean_env(extra)
    fe_argv = [binary, "frontend", "--http-port", "0", "--event-port", "0",
               "--active-decode-blocks-threshold", "0.0"]
    fleet = args.before_fleet if key == "b" else args.after_fleet
    if max(args.before_fleet, args.after_fleet) > 1:
        room = str(max(args.before_fleet, args.after_fleet) + 64)
        fe_argv += ["--max-event-connections", room, "--max-workers", room,
                    "--event-idle-timeout-ms", FLEET_HOLD_MS, "--event-silence-ms", FLEET_HOLD_MS]
    if "--http-host" in flags:
        fe_argv += ["--http-host", "127.0.0.1"]
    if "--admin-port" in flags:
        fe_argv += ["--admin-port", "0"]
    fe = Child(f"{key}_frontend", pinned(args.server_cpus, fe_argv), env, log_dir)
    m = fe.wait_line(r"listening http=(\S+) events=(\S+)", 30)
    addr, events = m.group(1), m.group(2)
    wk_argv = [binary, "worker", "--model", "bench", "--frontend", events, "--decode-step-ms", "500"]
    worker = Child(f"{key}_worker", pinned(args.client_cpus, wk_argv), env, log_dir)
    worker_addr = worker.wait_line(r"listening http=(\S+)", 30).group(1)
    hold = Hold(addr, 20)
    started = time.monotonic()
    fleet_socks = register_fleet(events, fleet - 1, extra.get("LOADGATE_EVENT_SECRET")) if fleet > 1 else []
    if fleet > 1:
        log(f"target {key}: {fleet - 1} more busy workers registered in {time.monotonic() - started:.1f} s")
    # Informational: does the worker refuse a request without the frontend's
    # proof (401 once the worker checks proofs; 200 before)?
    try:
        direct = http_request(worker_addr, REQUEST_BODY.replace('"max_tokens":16', '"max_tokens":1'), timeout=3)[0]
    except OSError as e:
        direct = f"error: {e}"
    setup = " ".join(shlex.quote(a) for a in fe_argv[1:])
    if extra:
        setup = "LOADGATE_EVENT_SECRET=<48 random chars> " + setup
    log(f"target {key}: {binary}: flags {sorted(flags)}, secret {'set' if extra else 'none'}, "
        f"a request straight to its worker without proof got {direct}")
    if fleet > 1:
        setup += f"  + {fleet - 1} simulated busy workers (run.py --{'before' if key == 'b' else 'after'}-fleet {fleet})"
    return {"server": fe, "worker": worker, "addr": addr, "hold": hold, "setup": setup,
            "flags": sorted(flags), "secret": bool(extra), "direct_to_worker": direct, "fleet": fleet_socks}


def probe(target, timeout=30.0):
    """Waits until the target answers a plain request with 529; returns (headers, body)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            status, headers, body = http_request(target["addr"], REQUEST_BODY, timeout=10.0)
        except socket.timeout:
            # Served by the worker before it reported its held block.
            last = "timeout"
            continue
        if status == 529:
            return headers, body
        last = (status, body[:200])
        time.sleep(0.05)
    raise RuntimeError(f"{target['addr']}: no 529 within {timeout} s (last {last})")


def run_hammer(args, target, expect_body, log_dir, tag):
    exe = os.path.join(args.examples_dir, "hammer")
    argv = pinned(args.client_cpus, [
        exe, "--addr", target["addr"], "--connections", str(args.connections),
        "--seconds", str(args.seconds), "--warmup-seconds", str(args.warmup_seconds),
        "--threads", str(args.client_threads), "--body", REQUEST_BODY,
        # No header check: since issue 10 the frontend computes Retry-After.
        "--expect-status", "529", "--expect-body", expect_body.decode(),
    ])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env())
    cpu = {}
    result = None
    lines = []
    for line in proc.stdout:
        line = line.rstrip("\n")
        lines.append(line)
        if line == "phase=measure":
            cpu["start"] = (time.monotonic(), target["server"].cpu_seconds(), cpu_seconds(proc.pid))
        elif line == "phase=done":
            cpu["end"] = (time.monotonic(), target["server"].cpu_seconds(), cpu_seconds(proc.pid))
        elif line.startswith("result "):
            result = json.loads(line[len("result "):])
    err = proc.stderr.read()
    rc = proc.wait(timeout=30)
    with open(os.path.join(log_dir, f"hammer_{tag}.log"), "w") as f:
        f.write(shlex.join(argv) + "\n" + "\n".join(lines) + "\n" + err)
    if rc != 0 or result is None:
        raise RuntimeError(f"hammer failed (rc={rc}): {err.strip()[-500:]}")
    if "start" in cpu and "end" in cpu:
        wall = cpu["end"][0] - cpu["start"][0]
        used = cpu["end"][1] - cpu["start"][1]
        result["server_cpu_pct"] = 100.0 * used / wall if wall > 0 else None
        result["client_cpu_pct"] = 100.0 * (cpu["end"][2] - cpu["start"][2]) / wall if wall > 0 else None
        result["server_us_per_response"] = 1e6 * used / result["responses"] if result["responses"] else None
    result["valid"] = (result["responses"] > 0 and result["matched"] == result["responses"]
                       and result["errors"] == 0)
    return result


def cpu_set(cpus):
    """A taskset-style list ("1", "0,2", "2-3") as a set of CPU numbers."""
    out = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec):
    return "–" if x is None else format(x, spec)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    target_dir = os.environ.get("CARGO_TARGET_DIR", os.path.join(repo, "target"))
    two_cores = (os.cpu_count() or 1) >= 2
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before-bin", help="`loadgate` built from the before commit (target b)")
    p.add_argument("--after-bin", default=os.path.join(target_dir, "release", "loadgate"),
                   help="`loadgate` built from this tree (target c); default: $CARGO_TARGET_DIR/release/loadgate")
    p.add_argument("--examples-dir", default=os.path.join(target_dir, "release", "examples"),
                   help="where fixed_529 and hammer are (cargo build --release -p loadgate-server --examples)")
    p.add_argument("--before-label", default="before", help="name of the before build in the table (e.g. a commit)")
    p.add_argument("--after-label", default="after", help="name of the after build in the table")
    p.add_argument("--targets", default="abc", help="which targets, in round order (default abc)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=5.0, help="counted seconds per target per round")
    p.add_argument("--warmup-seconds", type=float, default=1.0, help="uncounted seconds before each")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--client-threads", type=int, default=1)
    p.add_argument("--server-cpus", default="0" if two_cores else "", help="taskset list for the servers ('' = no pinning)")
    p.add_argument("--client-cpus", default="1" if two_cores else "", help="taskset list for the client and the worker")
    p.add_argument("--log-dir", help="raw logs (default: /tmp/reject_path-<time>)")
    p.add_argument("--before-fleet", type=int, default=1, help="busy workers behind target b (default 1: the held one)")
    p.add_argument("--after-fleet", type=int, default=1, help="busy workers behind target c (default 1: the held one)")
    args = p.parse_args()

    TARGETS["b"] = f"frontend {args.before_label}"
    TARGETS["c"] = f"frontend {args.after_label}"
    order = [t for t in args.targets if t in TARGETS]
    if "b" in order and not args.before_bin:
        p.error("target b needs --before-bin")
    for exe in ("fixed_529", "hammer"):
        if not os.access(os.path.join(args.examples_dir, exe), os.X_OK):
            p.error(f"{exe} not in {args.examples_dir}: cargo build --release -p loadgate-server --examples")
    bins = {"b": args.before_bin, "c": args.after_bin}
    for t in order:
        if t in bins and not os.access(bins[t], os.X_OK):
            p.error(f"target {t}: {bins[t]} is not an executable")
    log_dir = args.log_dir or f"/tmp/reject_path-{time.strftime('%Y%m%d-%H%M%S')}"
    os.makedirs(log_dir, exist_ok=True)
    if args.client_cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpu_set(args.client_cpus))

    command = shlex.join([os.path.relpath(os.path.abspath(__file__), repo)] + sys.argv[1:])
    targets = {}
    try:
        for t in order:
            if t == "a":
                targets[t] = start_bare(args, log_dir)
            else:
                targets[t] = start_frontend(t, bins[t], args, log_dir)
        probes = {}
        for t in order:
            headers, body = probe(targets[t])
            # Retry-After is computed (whole seconds, at least 1) since issue 10.
            if not headers.get("retry-after", "").isdigit() or b'"type":"Overloaded"' not in body:
                raise RuntimeError(f"target {t}: 529 without the overload reply: {headers} {body!r}")
            probes[t] = {"headers": headers, "body": body.decode()}
            log(f"target {t} ({TARGETS[t]}) at {targets[t]['addr']}: probe 529 {body.decode()}")
        bodies = {probes[t]["body"] for t in order}
        if len(bodies) > 1:
            log(f"WARNING: the targets' 529 bodies differ: {bodies}")
        with open(os.path.join(log_dir, "setup.json"), "w") as f:
            json.dump({"command": command, "args": vars(args), "probes": probes,
                       "targets": {t: {k: v for k, v in targets[t].items() if k in ("addr", "setup", "flags", "secret", "direct_to_worker")}
                                   for t in order}}, f, indent=2)

        rounds = []
        for r in range(1, args.rounds + 1):
            row = {}
            for t in order:
                res = run_hammer(args, targets[t], probes[t]["body"].encode(), log_dir, f"r{r}_{t}")
                hold = targets[t]["hold"]
                if hold is not None and not hold.open:
                    res["valid"] = False
                    log(f"round {r} target {t}: the holding stream ended")
                row[t] = res
                log(f"round {r} {t}: {res['rps']:.0f} resp/s, server CPU {fmt(res.get('server_cpu_pct'), '.0f')} %, "
                    f"client CPU {fmt(res.get('client_cpu_pct'), '.0f')} %, "
                    f"{fmt(res.get('server_us_per_response'), '.2f')} µs/resp, p50 {res['latency_us']['p50']} µs, "
                    f"by status {res['by_status']}, matched {res['matched']}, errors {res['errors']}"
                    + ("" if res["valid"] else "  ** INVALID **"))
            rounds.append(row)
        with open(os.path.join(log_dir, "rounds.json"), "w") as f:
            json.dump(rounds, f, indent=2)
    finally:
        for t in targets.values():
            if t.get("hold"):
                t["hold"].close()
            for sock in t.get("fleet") or []:
                sock.close()
        stop_all()

    report(args, order, rounds, command, log_dir, targets)


def report(args, order, rounds, command, log_dir, targets):
    def ratio(row, x, y, key="rps"):
        if x in row and y in row and row[y].get(key) and row[x].get(key) is not None:
            return row[x][key] / row[y][key]
        return None

    out = []
    cpu_note = args.server_cpus and f"servers on CPU {args.server_cpus}, client on CPU {args.client_cpus}" or "no pinning"
    out.append(f"{args.rounds} round(s) ({', '.join(order)} in turn), {args.warmup_seconds:g} s warm-up + "
               f"{args.seconds:g} s counted per target per round, {args.connections} connections, "
               f"{args.client_threads} client thread(s), {cpu_note}.")
    out.append("")
    head = ["round"] + [f"{t}: {TARGETS[t]} (resp/s)" for t in order]
    has = lambda *ts: all(t in order for t in ts)
    if has("a", "b"):
        head.append("b ÷ a")
    if has("a", "c"):
        head.append("c ÷ a")
    if has("a", "b", "c"):
        head.append("(c ÷ a) ÷ (b ÷ a)")
    head += [f"{t} server µs/resp" for t in order]
    if has("b", "c"):
        head.append("c ÷ b server µs/resp")
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---:|" * len(head))

    def cells(row, label):
        c = [label] + [fmt(row[t]["rps"], ",.0f") + ("" if row[t]["valid"] else " ✗") for t in order]
        if has("a", "b"):
            c.append(fmt(ratio(row, "b", "a"), ".3f"))
        if has("a", "c"):
            c.append(fmt(ratio(row, "c", "a"), ".3f"))
        if has("a", "b", "c"):
            c.append(fmt(ratio(row, "c", "b"), ".3f"))
        c += [fmt(row[t].get("server_us_per_response"), ".2f") for t in order]
        if has("b", "c"):
            c.append(fmt(ratio(row, "c", "b", "server_us_per_response"), ".3f"))
        return c

    for i, row in enumerate(rounds, 1):
        out.append("| " + " | ".join(cells(row, str(i))) + " |")
    medians = []
    m = ["**median**"] + [fmt(med([r[t]["rps"] for r in rounds]), ",.0f") for t in order]
    pr = {}
    for key, x, y, field in (("ba", "b", "a", "rps"), ("ca", "c", "a", "rps"), ("cb", "c", "b", "rps"),
                             ("cbcpu", "c", "b", "server_us_per_response")):
        pr[key] = med([ratio(r, x, y, field) for r in rounds])
    if has("a", "b"):
        m.append(f"**{fmt(pr['ba'], '.3f')}**")
    if has("a", "c"):
        m.append(f"**{fmt(pr['ca'], '.3f')}**")
    if has("a", "b", "c"):
        m.append(f"**{fmt(pr['cb'], '.3f')}**")
    m += [fmt(med([r[t].get("server_us_per_response") for r in rounds]), ".2f") for t in order]
    if has("b", "c"):
        m.append(fmt(pr["cbcpu"], ".3f"))
    out.append("| " + " | ".join(m) + " |")
    medians.append(m)
    out.append("")
    out.append("Ratios in the median row are medians of the per-round ratios (each round measures its "
               "targets back to back). (c ÷ a) ÷ (b ÷ a) = c ÷ b: after against before, each against the same "
               "bare handler; the issue's bound is ≥ 0.95. Server µs/resp: the server process's CPU time "
               "(/proc, every thread) over its responses in the counted window.")
    cpu = {t: med([r[t].get("server_cpu_pct") for r in rounds]) for t in order}
    ccpu = {t: med([r[t].get("client_cpu_pct") for r in rounds]) for t in order}
    out.append("Median CPU during the counted windows (100 % = one core), server / client: " +
               ", ".join(f"{t} {fmt(cpu[t], '.0f')} / {fmt(ccpu[t], '.0f')} %" for t in order) + ".")
    invalid = [(i, t) for i, r in enumerate(rounds, 1) for t in order if not r[t]["valid"]]
    checked = sum(r[t]["responses"] for r in rounds for t in order)
    if invalid:
        out.append(f"**Invalid** (a response other than the probe's 529, an error, or the holding stream ended): {invalid}.")
    else:
        out.append(f"All {checked:,} counted responses were the probe's 529 (status, body and Retry-After checked), "
                   "no connection errors.")
    for t in order:
        out.append(f"- {t}: `{targets[t]['setup']}`")
    table = "\n".join(out)
    print(table)
    print()
    builds = [
        "git worktree add ../before <before commit>",
        "(cd ../before && CARGO_TARGET_DIR=$PWD/../target-before cargo build --release -p loadgate-server)",
        "cargo build --release -p loadgate-server --bin loadgate --examples",
    ]
    repro = "\n".join(f"    {line}" for line in builds + [command])
    print("Reproduce (from the repository root; the builds, then the run):")
    print()
    print(repro)
    with open(os.path.join(log_dir, "table.md"), "w") as f:
        f.write(table + "\n\nReproduce (from the repository root; the builds, then the run):\n\n" + repro + "\n")
    log(f"raw logs in {log_dir}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        stop_all()
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 (report and clean up)
        stop_all()
        log(f"FAILED: {e}")
        sys.exit(1)
