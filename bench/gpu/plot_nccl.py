#!/usr/bin/env python3
"""Table and plot of `tpf-gpubench --mode nccl` (rank 0's ROW lines).

    python3 bench/gpu/plot_nccl.py OUT.md OUT.png LOG...

Several logs (runs): each point is the median of the runs; "worst run" is
the worst run's LL / NCCL ratio (both from the same run); the last column
sets the LL path beside the exchange floor launched as it is (PDL): one
kernel storing the same bytes into the peer and releasing a flag it waits
on (issue 16, target 1: within 1.3x).

ROW <what> W=<w> <bytes> <us>. Bus bandwidth as nccl-tests defines it:
all-gather algbw = W x bytes / t, busbw = algbw x (W - 1) / W; all-reduce
algbw = bytes / t, busbw = algbw x 2 (W - 1) / W (bytes = one rank's buffer).
"""
import re
import sys
from collections import defaultdict

md, png, logs = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = []
world = 2
for log in logs:
    r = defaultdict(dict)
    for line in open(log):
        m = re.match(r"ROW (\S+) W=(\d+) (\d+) ([\d.]+)", line)
        if m:
            what, w, b, us = m.group(1), int(m.group(2)), int(m.group(3)), float(m.group(4))
            world = w
            r[b][what] = us
    runs.append(r)
t = defaultdict(dict)
for b in sorted(set().union(*runs)):
    for what in set().union(*(r[b].keys() for r in runs)):
        vals = sorted(r[b][what] for r in runs if what in r[b])
        t[b][what] = vals[len(vals) // 2] if len(vals) % 2 else (vals[len(vals) // 2 - 1] + vals[len(vals) // 2]) / 2
sizes = sorted(t)


def worst(b, key):
    ratios = [r[b][f"ll-{key}"] / r[b][f"nccl-{key}"] for r in runs if f"ll-{key}" in r[b] and f"nccl-{key}" in r[b]]
    return max(ratios) if ratios else None


def busbw(op, b, us):
    if op == "gather":
        return world * b / (us * 1e-6) * (world - 1) / world / 1e9
    return b / (us * 1e-6) * 2 * (world - 1) / world / 1e9


def kib(b):
    return f"{b // 1024} KiB"


rows = []
for op, key in (("gather", "gather"), ("sum", "sum-bf16")):
    rows.append(f"\n{'all-gather' if op == 'gather' else 'all-reduce sum bf16'}, W = {world}, µs per call "
                f"(bus bandwidth GB/s), median of {len(runs)} run(s):\n")
    rows.append("| bytes a rank | copy floor | store+flag floor, plain / PDL | tpfabric LL | tpfabric flag path | NCCL | "
                "routed group | LL / NCCL | worst run | LL / PDL floor |")
    rows.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b in sizes:
        r = t[b]
        def cell(name):
            us = r.get(name)
            return "" if us is None else f"{us:.2f} ({busbw(op, b, us):.1f})"
        ll, nc = r.get(f"ll-{key}"), r.get(f"nccl-{key}")
        ratio = f"{ll / nc:.2f}x" if ll and nc else ""
        wr = worst(b, key)
        fl, fp = r.get("store-flag-floor"), r.get("store-flag-floor-pdl")
        floors = f"{fl:.2f} / {fp:.2f}" if fl and fp else ""
        vs_floor = f"{ll / fp:.2f}x" if ll and fp else ""
        rows.append(f"| {kib(b)} | {r.get('copy-kernel', 0):.2f} | {floors} | {cell('ll-' + key)} | {cell('flag-' + key)} | "
                    f"{cell('nccl-' + key)} | {cell('routed-' + key)} | {ratio} | {'' if wr is None else f'{wr:.2f}x'} | "
                    f"{vs_floor} |")
rows.append(f"\nLL grid variants, W = {world}, µs per call: the default grid, and 256-thread blocks of 1, 2 or 4 "
            "16-byte chunks a thread (TPF_GPU_LL_CHUNKS):\n")
rows.append("| bytes a rank | gather default | gather c1 | gather c2 | gather c4 | sum default | sum c1 | sum c2 | sum c4 |")
rows.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for b in sizes:
    r = t[b]
    c = lambda n: f"{r[n]:.2f}" if n in r else ""
    rows.append(f"| {kib(b)} | {c('ll-gather')} | {c('ll1-gather')} | {c('ll2-gather')} | {c('ll4-gather')} | "
                f"{c('ll-sum-bf16')} | {c('ll1-sum-bf16')} | {c('ll2-sum-bf16')} | {c('ll4-sum-bf16')} |")
open(md, "w").write("\n".join(rows) + "\n")
print("\n".join(rows))

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
for ax, (op, key, title) in zip(axes, (("gather", "gather", "all-gather"), ("sum", "sum-bf16", "all-reduce sum bf16"))):
    for name, label, style in ((f"ll-{key}", "tpfabric (LL path)", "o-"), (f"flag-{key}", "tpfabric (flag path)", "s--"),
                               (f"nccl-{key}", "NCCL", "^-"), (f"routed-{key}", "routed group", "x:"),
                               ("copy-kernel", "copy-kernel floor", ".-"),
                               ("store-flag-floor-pdl", "store+flag floor (PDL)", "+-")):
        xs = [b for b in sizes if name in t[b]]
        ax.plot([b / 1024 for b in xs], [t[b][name] for b in xs], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes a rank (KiB)")
    ax.set_ylabel(f"µs per call (graph of 100, best of 5; median of {len(runs)} runs)")
    ax.set_title(f"{title}, W = {world}, 2 x H200 NVLink")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(png, dpi=110)
