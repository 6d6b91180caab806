#!/usr/bin/env python3
"""Per-kernel critical-path costs of the decode steps in a hybrid-bench --cuda-trace file (builds with
-DHY_CUDA_TRACE=ON; kernels/cuda/cuda_backend.cu).

Each kernel's cost is the time from its ready stamp (its wait for the predecessor returned) to the next kernel's
ready stamp: what the kernel adds to the pipelined step. A step starts at every launch of the first kernel named
by --first (default: the embedding gather). Usage: trace_summary.py TRACE [--steps N] [--first NAME]"""
import argparse
from collections import defaultdict

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--steps", type=int, default=32, help="the last N complete steps")
ap.add_argument("--first", default="embedding gather kernel")
a = ap.parse_args()

rows = []
with open(a.trace) as f:
    for line in f:
        if line.startswith("#"):
            print(line.rstrip())
            continue
        i, what, blocks, threads, start, ready = line.rstrip("\n").split("\t")
        rows.append((what, int(blocks), int(start), int(ready)))
firsts = [i for i, r in enumerate(rows) if r[0] == a.first]
if len(firsts) < 2:
    raise SystemExit(f"fewer than two steps start with '{a.first}'")
firsts = firsts[-(a.steps + 1):]
n_steps = len(firsts) - 1
cost = defaultdict(float)
wait = defaultdict(float)
count = defaultdict(int)
order = []
step_ns = []
for s in range(n_steps):
    b, e = firsts[s], firsts[s + 1]
    step_ns.append(rows[e][3] - rows[b][3])
    for i in range(b, e):
        what, blocks, start, ready = rows[i]
        key = f"{what} [{blocks} blocks]"
        if key not in cost:
            order.append(key)
        cost[key] += rows[i + 1][3] - ready
        wait[key] += ready - start
        count[key] += 1
step_us = sum(step_ns) / n_steps / 1e3
print(f"{n_steps} steps, {step_us:.1f} us per step ({1e6 / step_us:.1f} steps/s); the last kernel of a step also carries the gap to the next step")
print(f"{'us/step':>9} {'share':>6} {'n/step':>6} {'us each':>8} {'waited':>7}  kernel (cost = its ready to the next ready)")
for key in sorted(cost, key=lambda k: -cost[k]):
    per = cost[key] / n_steps / 1e3
    n = count[key] / n_steps
    print(f"{per:9.1f} {100 * per / step_us:5.1f}% {n:6.1f} {per / n:8.2f} {wait[key] / count[key] / 1e3:7.2f}  {key}")
