#!/bin/sh
# The event-plane figures of docs/benchmarks.md ("Event plane at 10,000 workers (issue 22)"):
# two runs of each. Run from the workspace root; each run prints its own report.
#   server/benches/event_plane/run.sh [label]      (outputs in target/event_plane-<label>/)
set -eu
label=${1:-now}
out=${CARGO_TARGET_DIR:-target}/event_plane-$label
mkdir -p "$out"
bench() { cargo bench -q -p loadgate-server --bench event_plane -- "$@"; }
for run in 1 2; do
  # Load reports applied per second: connects paced (100 per 50 ms) so every
  # connection is open when the load starts.
  for workers in 1000 10000; do
    for flips in 0 10; do
      bench --workers "$workers" --flip-percent "$flips" --seconds 5 --hold 0 \
        --connect-batch 100 --connect-pause-ms 50 | tee "$out/load-$workers-$flips-$run.txt"
    done
  done
  # Registration in one loop of connects, then 15 s of silence.
  for workers in 1000 10000; do
    bench --workers "$workers" --seconds 0 --hold 15 | tee "$out/register-$workers-$run.txt"
  done
done
