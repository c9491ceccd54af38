#!/usr/bin/env bash
# What a request's tenant lookup costs a frontend with a large tenants file.
#
#   benches/tenant_keys/run.sh BEFORE_BIN AFTER_BIN [ROUNDS]
#
# Writes a tenants file of 1,000 tenants (one key each: tenant `tI` has the
# key `tI`), then, ROUNDS times (default 3), alternating the two builds:
# starts `BIN frontend --tenants-file` pinned to core 0 (no worker, so every
# request is answered at once, after its tenant is found), sends 3,000
# requests a second for 8 s with `loadgate bench --tenants t999=1` (the key
# of the file's last tenant) from core 1, and prints the frontend's CPU time
# per answered request (its utime + stime over the tenant counters' total).
set -euo pipefail
before=$1 after=$2 rounds=${3:-3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 0 999); do
    hash=$(printf 't%s' "$i" | sha256sum | cut -d' ' -f1)
    printf '[[tenant]]\nname = "t%s"\nkeys = ["sha256:%s"]\n' "$i" "$hash"
done > "$dir/tenants.toml"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
one() {
    local bin=$1 http
    http=$(port)
    taskset -c 0 "$bin" frontend --http-port "$http" --event-port 0 --disable-admin-api \
        --tenants-file "$dir/tenants.toml" > "$dir/frontend.log" 2>&1 &
    local fe=$!
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$http/health" > /dev/null && break; sleep 0.1; done
    taskset -c 1 "$after" bench --url "http://127.0.0.1:$http" --model m --rate 3000 --duration 8 \
        --prompt-tokens 16 --tenants t999=1 --quiet --json > /dev/null
    local ticks answered
    ticks=$(awk '{print $14 + $15}' "/proc/$fe/stat")
    answered=$(curl -s "http://127.0.0.1:$http/metrics" | awk '/^loadgate_frontend_tenant_requests_total/ {s += $2} END {print s}')
    kill "$fe"; wait "$fe" 2> /dev/null || true
    python3 -c "import os; print(f'{$ticks / os.sysconf(\"SC_CLK_TCK\") / $answered * 1e6:.1f}')"
}
printf 'round  before µs/request  after µs/request  after/before\n'
for round in $(seq "$rounds"); do
    b=$(one "$before") a=$(one "$after")
    printf '%5s  %17s  %16s  %12s\n' "$round" "$b" "$a" "$(python3 -c "print(f'{$a / $b:.3f}')")"
done
