#!/usr/bin/env python3
"""An ideal deadline-bounded waiting line, simulated: what it refuses at 1x.

Poisson arrivals at `load` times the capacity of `slots` slots that each
serve a request in exactly `service` seconds; a request waits in one FIFO
line for the first slot to free and is refused if none frees within
`patience` seconds. Nothing is lost to refills (a freed slot takes the next
waiter at once, the `--gap` option adds dead time per request), so this is
the least any waiting line can refuse with that patience. It is a model, not
a measurement: docs/demo.md uses it to tell what the llama.cpp demo's 1x
target asks of any line.

usage: line-sim.py [--slots 8] [--service 0.584] [--patience 0.986]
                   [--duration 20] [--runs 60] [--gap 0] [--loads 0.94,1,1.03,1.06]
"""
import argparse
import heapq
import random


def refused_share(load, slots, service, patience, duration, seed, gap):
    """The share of one run's arrivals refused at their deadline."""
    rng = random.Random(seed)
    rate = load * slots / service
    free_at = [0.0] * slots
    arrivals = refused = 0
    now = rng.expovariate(rate)
    while now < duration:
        arrivals += 1
        start = max(now, free_at[0])
        if start - now > patience:
            refused += 1
        else:
            heapq.heapreplace(free_at, start + service + gap)
        now += rng.expovariate(rate)
    return refused / max(arrivals, 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--service", type=float, default=0.584, help="seconds per request (slots / capacity)")
    parser.add_argument("--patience", type=float, default=0.986, help="the line's timeout, seconds")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals per run")
    parser.add_argument("--runs", type=int, default=60, help="runs (seeds) per load")
    parser.add_argument("--gap", type=float, default=0.0, help="dead time per request, seconds")
    parser.add_argument("--loads", default="0.94,1,1.03,1.06", help="offered load / capacity")
    args = parser.parse_args()
    print(f"{args.slots} slots, {args.service} s per request, patience {args.patience} s, "
          f"{args.duration} s of arrivals, {args.runs} runs per load, gap {args.gap} s")
    for load in (float(x) for x in args.loads.split(",")):
        shares = [refused_share(load, args.slots, args.service, args.patience, args.duration, seed, args.gap)
                  for seed in range(args.runs)]
        over = sum(share > 0.05 for share in shares)
        print(f"load {load:.2f}: mean refused {100 * sum(shares) / len(shares):.1f} %, "
              f"runs above 5 %: {over} of {len(shares)}")


if __name__ == "__main__":
    main()
