#!/usr/bin/env python3
"""Sums `ncu --csv --metrics gpu__time_duration.sum[,dram__bytes.sum]` output per kernel name: time, launches,
share (and DRAM TB/s where the bytes were measured). Usage:
ncu_summary.py ncu.csv"""
import csv
import sys
from collections import defaultdict

tot = defaultdict(float)
cnt = defaultdict(int)
dram = defaultdict(float)  # bytes, where the csv has dram__bytes.sum
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for row in csv.DictReader(lines):
    name = row["Kernel Name"].split("(")[0]
    if row.get("Metric Name") == "dram__bytes.sum":
        scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(row.get("Metric Unit", "byte"), 1)
        dram[name] += float(row["Metric Value"].replace(",", "")) * scale
        continue
    if row.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(row["Metric Value"].replace(",", ""))
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(row.get("Metric Unit", "ns"), 1e-3)
    tot[name] += v * scale
    cnt[name] += 1
all_us = sum(tot.values())
print(f"kernels {sum(cnt.values())}, total {all_us:.1f} us")
for name, us in sorted(tot.items(), key=lambda kv: -kv[1])[:16]:
    bw = f" {dram[name] / (us * 1e6):5.2f} TB/s" if dram else ""
    print(f"{us:9.1f} us {100 * us / all_us:5.1f}%  x{cnt[name]:<4d}{bw} {name[:90]}")
