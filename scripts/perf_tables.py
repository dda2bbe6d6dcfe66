#!/usr/bin/env python3
"""Rewrite docs/perf.md's result tables from the benchmarks' own output.

Each table of docs/perf.md's "Current results" lies between two markers,

    <!-- perf-table: NAME -->
    ... the table, then one line naming machine, date and commit ...
    <!-- /perf-table: NAME -->

and this script replaces what is between them, so re-measuring replaces a
table. docs/development.md ("Measuring performance") says which run writes
which input.

    perf_tables.py host JSON [--commit C] [--machine M] [--date D] [--doc PERF_MD]
        tables host and host-control from the JSON of `tpf-bench run --json`,
        or table host-tcp from that of `tpf-bench run --nodes 2 --json`;
    perf_tables.py gpu LOGDIR [--commit C] [--machine M] [--date D] [--doc PERF_MD]
        from the tpf-gpubench logs that tests/gpu/run.sh leaves in LOGDIR
        ($TPF_GPU_LOG), every table whose logs are there:
          mps-ipc    tpf-gpubench-sizes-ipc-w*.log   (one GPU under MPS, ipc)
          mps-proxy  tpf-gpubench-sizes-proxy-w*.log (one GPU under MPS, proxy route)
          mps-hop    tpf-gpubench-hop-proxy-w2.log   (the proxy hop)
          mps-tcp    tpf-gpubench-{sizes,hop}-proxy-w2-tcp.log beside -onehost.log and
                     hop-proxy-w2.log (two daemons over the tcp wire beside one daemon)
          nccl       tpf-gpubench-nccl-ipc-w*.log    (one process per GPU beside NCCL; several runs: medians)
    perf_tables.py readme [--doc PERF_MD] [--readme README_MD]
        README.md's Performance table (between <!-- perf-readme --> markers)
        from the cells of perf.md's tables it quotes (README_ROWS below);
    perf_tables.py check [--doc PERF_MD]
        every table's markers present once, each with a table and its line.

--commit defaults to `git rev-parse --short HEAD` (give the commit the
binaries were built from), --date to the JSON's date or the newest log's
time (UTC), --machine to what the input says: the CPUs and kernel for the
host path; for the GPU tables the machine kind they are usually run on
(nvidia-h200 under MPS, nvidia-h200-x2 beside NCCL), followed by how the
ranks sit on it.
--hand: the inputs are the numbers a run recorded, typed in by hand; the
line under the table says so. Exit 0 done, 1 an input or a marker missing.
"""
import argparse
import datetime
import glob
import json
import os
import re
import statistics
import subprocess
import sys

KIB = 1024
TABLES = ["host", "host-control", "host-tcp", "mps-ipc", "mps-proxy", "mps-hop", "mps-tcp", "nccl"]
GPU_SIZES = [4 * KIB, 16 * KIB, 64 * KIB, 512 * KIB]
ROW = re.compile(r"^ROW (\S+) W=(\d+) (\d+) ([\d.]+)\s*$")


def size_name(b: int) -> str:
    if b >= KIB and b % KIB == 0:
        return f"{b // KIB} KiB"
    return f"{b} B"


def num(v, decimals: int = 2) -> str:
    return "" if v is None else f"{v:.{decimals}f}"


def ratio(a, b, decimals: int = 2) -> str:
    return "" if a is None or not b else f"{a / b:.{decimals}f}x"


def judged(what: str, value, limit) -> str:
    if value is None:
        return f"{what}: not measured"
    return f"{what}: {'met' if value <= limit else 'missed'}"


def markdown(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    """A Markdown table: the first `left` columns and a last "target" column of text, the numbers right-aligned."""
    rule = ["---" if i < left or (i == len(header) - 1 and header[i] == "target") else "---:" for i in range(len(header))]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def stamp(machine: str, date: str, commit: str, source: str, hand: bool) -> str:
    how = ("Filled by hand from the numbers this run recorded (a blank cell: not recorded); "
           "`scripts/perf_tables.py` replaces the table at the next measurement.") if hand else \
          f"Written by `scripts/perf_tables.py` from {source}."
    return f"Machine: {machine}. Date: {date}. Commit: {commit}. {how}"


# ---- the host path: tpf-bench run --json ------------------------------------------------------

def host_tables(doc: dict, machine: str, date: str, commit: str, hand: bool) -> dict[str, str]:
    floor = {f["size"]: f for f in doc.get("floor", [])}
    res = {}
    for r in doc.get("results", []):
        res[(r["op"], r["world"], r["size"])] = r
    pairs = {(p["world"], p["size"]): p for p in doc.get("sum_vs_gather", []) if p.get("op") == "sum"}
    wide = doc.get("target_wide") or {}
    targets = {t["op"]: t for t in doc.get("target", [])}
    keys = sorted({(w, s) for (_, w, s) in res} | set(pairs))
    rows = []
    for w, s in keys:
        g, b, f, p = res.get(("gather", w, s), {}), res.get(("sum_bf16", w, s), {}), floor.get(s, {}), pairs.get((w, s), {})
        gp50, fp50 = g.get("p50_us"), f.get("p50_us")
        gf = g.get("ratio_p50") if g.get("ratio_p50") is not None else (gp50 / fp50 if gp50 and fp50 else None)
        sg = p.get("ratio_p50")
        if sg is None and b.get("p50_us") and gp50:
            sg = b["p50_us"] / gp50
        target = []
        if "gather" in targets and w == 2 and s == 4096:
            t = targets["gather"]
            target.append(judged(f"gather ≤ {t['limit']:g}x floor", t.get("ratio_p50"), t["limit"]))
        if wide and w == wide.get("world") and s == wide.get("size"):
            target.append(judged(f"gather ≤ {wide['limit_us']:g} µs", wide.get("p50_us"), wide["limit_us"]))
        if s == 4096 and sg is not None:
            limit = p.get("limit", 1.3)
            target.append(judged(f"sum ≤ {limit:g}x gather", sg, limit))
        rows.append([str(w), size_name(s), num(gp50, 1), num(g.get("p99_us"), 1), num(fp50, 2),
                     "" if gf is None else f"{gf:.1f}x", num(b.get("p50_us"), 1),
                     "" if sg is None else f"{sg:.2f}x", "; ".join(target)])
    host = markdown(["W", "bytes", "gather p50 µs", "gather p99 µs", "floor p50 µs", "gather / floor",
                     "bf16 sum p50 µs", "sum / gather", "target"], rows, left=2)

    ctl = doc.get("control", {})
    limits = ctl.get("limits", {})
    open_limit, rss_limit, cpu_limit = limits.get("open_p50_ms_w16", 100), limits.get("rss_mib_w16", 32), \
        limits.get("idle_cpu_percent", 1)

    def sample(s: dict) -> tuple[str, str, str, object]:
        rss, shm, cpu = s.get("rss_kib"), s.get("rss_shmem_kib"), s.get("cpu_percent")
        mib = lambda k: "" if k is None or k < 0 else f"{k / 1024:.1f}"
        return mib(rss), mib(shm), "" if cpu is None or cpu < 0 else f"{cpu:.2f}", cpu

    crow = []
    for label, s in (("none (before)", ctl.get("idle_before")),):
        if s:
            rss, shm, cpu, c = sample(s)
            crow.append([label, "", "", rss, shm, cpu, judged(f"CPU ≤ {cpu_limit:g} %", c, cpu_limit) if c is not None else ""])
    for wd in ctl.get("worlds", []):
        rss, shm, cpu, c = sample(wd.get("daemon_groups_open", {}))
        opens = wd.get("open_ns") or []
        p50 = wd.get("open_p50_ms")
        target = []
        if wd["world"] == 16:
            target.append(judged(f"open ≤ {open_limit:g} ms", p50, open_limit))
            r = wd.get("daemon_groups_open", {}).get("rss_kib")
            target.append(judged(f"RSS ≤ {rss_limit:g} MiB", None if r is None else r / 1024, rss_limit))
        if c is not None:
            target.append(judged(f"CPU ≤ {cpu_limit:g} %", c, cpu_limit))
        crow.append([f"W = {wd['world']}", num(p50, 1), f"{max(opens) / 1e6:.1f}" if opens else "", rss, shm, cpu,
                     "; ".join(target)])
    for label, s in (("none (after)", ctl.get("idle_after")),):
        if s:
            rss, shm, cpu, c = sample(s)
            crow.append([label, "", "", rss, shm, cpu, judged(f"CPU ≤ {cpu_limit:g} %", c, cpu_limit) if c is not None else ""])
    control = markdown(["groups open", "open p50 ms", "open max ms", "daemon RSS MiB", "of it shared MiB",
                        "daemon CPU % of a core", "target"], crow)
    load = doc.get("machine", {})
    lb, la = load.get("loadavg_1m_before"), load.get("loadavg_1m_after")
    loadline = f" Load average {lb:.2f} before the run, {la:.2f} after it." if lb is not None and la is not None and lb >= 0 else ""
    src = "`tpf-bench run --json`"
    return {"host": host + "\n\n" + stamp(machine, date, commit, src, hand) + loadline,
            "host-control": control + "\n\n" + stamp(machine, date, commit, src, hand)}


def host_tcp_table(doc: dict, machine: str, date: str, commit: str, hand: bool) -> dict[str, str]:
    """Table host-tcp from `tpf-bench run --nodes 2 --json`: ranks across two daemons over the tcp wire beside the TCP floor."""
    floor = {f["size"]: f for f in doc.get("floor", [])}
    res = {(r["op"], r["world"], r["size"]): r for r in doc.get("results", [])}
    rows = []
    for w, s in sorted({(w, s) for (_, w, s) in res}):
        g, b, f = res.get(("gather", w, s), {}), res.get(("sum_bf16", w, s), {}), floor.get(s, {})
        fp50 = f.get("p50_us")
        rows.append([str(w), size_name(s), (g or b).get("routes", ""), num(g.get("p50_us"), 1), num(g.get("p99_us"), 1),
                     num(b.get("p50_us"), 1), num(b.get("p99_us"), 1), num(fp50, 1), num(f.get("p99_us"), 1),
                     ratio(g.get("p50_us"), fp50, 1), ratio(b.get("p50_us"), fp50, 1)])
    table = markdown(["W", "bytes", "routes", "gather p50 µs", "gather p99 µs", "bf16 sum p50 µs", "sum p99 µs",
                      "tcp floor p50 µs", "tcp floor p99 µs", "gather / floor", "sum / floor"], rows, left=3)
    m = doc.get("machine", {})
    lb, la = m.get("loadavg_1m_before"), m.get("loadavg_1m_after")
    loadline = f" Load average {lb:.2f} before the run, {la:.2f} after it." if lb is not None and la is not None and lb >= 0 else ""
    note = ("Two tpfabricd on this machine as two nodes (`peer.wire = \"tcp\"`, loopback), rank r on node r % 2; "
            "the tcp floor is a raw TCP ping-pong between two processes on loopback, one way = round trip / 2, "
            f"its two processes {doc.get('floor_pinning', 'pinning not recorded')}. Loopback on one host is not a network: these rows "
            "measure the daemons' share of a call across nodes (the sending proxy, both kernels' socket copies, the "
            "receiving daemon's receiver thread), not a wire.")
    src = "`tpf-bench run --nodes 2 --json`"
    return {"host-tcp": table + "\n\n" + note + "\n\n" + stamp(machine, date, commit, src, hand) + loadline}


# ---- the GPU paths: tpf-gpubench's ROW lines --------------------------------------------------

def read_rows(paths: list[str]) -> dict:
    """{(what, W, bytes): µs}, the median over the files (runs) that have the row."""
    seen: dict = {}
    for p in paths:
        for line in open(p, errors="replace"):
            m = ROW.match(line)
            if m:
                seen.setdefault((m.group(1), int(m.group(2)), int(m.group(3))), []).append(float(m.group(4)))
    return {k: statistics.median(v) for k, v in seen.items()}


def mps_ipc(rows: dict) -> str:
    out = []
    for w in sorted({k[1] for k in rows}):
        for s in GPU_SIZES:
            g, sm = rows.get(("ipc-gather", w, s)), rows.get(("ipc-sum-bf16", w, s))
            c, x = rows.get(("copy-kernel", w, s)), rows.get(("store-flag-floor-pdl", w, s))
            if g is None and sm is None:
                continue
            target = ""
            if s == 4096 and c:
                limit = 1.5 if w == 2 else 2.0
                target = judged(f"gather ≤ {limit:g}x copy kernel", None if g is None else g / c, limit)
            out.append([str(w), size_name(s), num(g), num(sm), num(c), ratio(g, c), num(x), ratio(g, x), target])
    return markdown(["W", "bytes", "gather µs", "bf16 sum µs", "copy kernel µs", "gather / copy kernel",
                     "exchange floor µs", "gather / exchange floor", "target"], out, left=2)


def mps_proxy(rows: dict) -> str:
    out = []
    limits = {4 * KIB: 7.0, 64 * KIB: 14.0}
    for w in sorted({k[1] for k in rows}):
        for s in GPU_SIZES:
            g = rows.get(("proxy-gather", w, s))
            if g is None and rows.get(("proxy-sum-bf16", w, s)) is None:
                continue
            target = judged(f"gather ≤ {limits[s]:g} µs", g, limits[s]) if w == 2 and s in limits else ""
            out.append([str(w), size_name(s), num(g), num(rows.get(("proxy-sum-bf16", w, s))),
                        num(rows.get(("proxy-gather-1poll", w, s))), num(rows.get(("copy-kernel", w, s))), target])
    return markdown(["W", "bytes", "gather µs", "bf16 sum µs", "gather, one poller warp µs", "copy kernel µs", "target"],
                    out, left=2)


def mps_hop(rows: dict) -> str:
    w = min((k[1] for k in rows), default=2)
    get = lambda what, b=16: rows.get((what, w, b))
    ping = get("hostmapped-pingpong-rtt", 8)
    out = []
    for stat, limit in (("p50", 1.25), ("mean", 1.4), ("p99", 2.0)):
        v = get(f"proxy-hop-{stat}")
        out.append([f"hop, {stat}", num(v), ratio(v, ping), judged(f"≤ {limit:g}x ping-pong", None if v is None or not ping
                                                                    else v / ping, limit)])
    for stat in ("p50", "mean", "p99"):
        v = get(f"proxy-hop-1poll-{stat}")
        if v is not None:
            out.append([f"hop with one poller warp, {stat}", num(v), ratio(v, ping), ""])
    out.append(["host-mapped ping-pong, round trip", num(ping), "1.00x" if ping else "", ""])
    for what, label in (("proxy-gather", "whole 16 B proxy-route gather"),
                        ("proxy-gather-1poll", "whole 16 B proxy-route gather, one poller warp")):
        if get(what) is not None:
            out.append([label, num(get(what)), ratio(get(what), ping), ""])
    return markdown(["W = 2, 16 B", "µs", "/ ping-pong", "target"], out)


def mps_tcp(logdir: str) -> tuple[str, list[str]]:
    """The proxy route across two daemons over the tcp wire beside one daemon, same run; ("", []) without its logs."""
    names = {"tcp": "tpf-gpubench-sizes-proxy-w2-tcp.log", "one": "tpf-gpubench-sizes-proxy-w2-onehost.log",
             "hop-tcp": "tpf-gpubench-hop-proxy-w2-tcp.log", "hop-one": "tpf-gpubench-hop-proxy-w2.log"}
    paths = {k: os.path.join(logdir, v) for k, v in names.items() if os.path.exists(os.path.join(logdir, v))}
    if "tcp" not in paths or "one" not in paths:
        return "", []
    tcp, one = read_rows([paths["tcp"]]), read_rows([paths["one"]])
    out = []
    for s in GPU_SIZES:
        g, go = tcp.get(("proxy-gather", 2, s)), one.get(("proxy-gather", 2, s))
        sm, so = tcp.get(("proxy-sum-bf16", 2, s)), one.get(("proxy-sum-bf16", 2, s))
        if g is None and sm is None:
            continue
        out.append([f"gather {size_name(s)}", num(g), num(go), ratio(g, go)])
        out.append([f"bf16 sum {size_name(s)}", num(sm), num(so), ratio(sm, so)])
    if "hop-tcp" in paths and "hop-one" in paths:
        ht, ho = read_rows([paths["hop-tcp"]]), read_rows([paths["hop-one"]])
        for stat in ("p50", "p99"):
            a, b = ht.get((f"proxy-hop-{stat}", 2, 16)), ho.get((f"proxy-hop-{stat}", 2, 16))
            out.append([f"hop (doorbell to the peer's flag), {stat}", num(a), num(b), ratio(a, b)])
    table = markdown(["W = 2, one rank a daemon", "two daemons, tcp µs", "one daemon µs", "tcp / one daemon"], out)
    return table, sorted(paths.values())


def nccl(rows: dict) -> str:
    out = []
    for s in sorted({k[2] for k in rows if k[0] == "nccl-gather"}):
        w = min(k[1] for k in rows if k[2] == s)
        g, ng = rows.get(("ll-gather", w, s)), rows.get(("nccl-gather", w, s))
        sm, ns = rows.get(("ll-sum-bf16", w, s)), rows.get(("nccl-sum-bf16", w, s))
        x = rows.get(("store-flag-floor-pdl", w, s))
        out.append([size_name(s), num(g), num(ng), ratio(g, ng), num(sm), num(ns), ratio(sm, ns), num(x), ratio(g, x)])
    return markdown(["bytes a rank", "gather µs", "NCCL gather µs", "gather / NCCL", "bf16 sum µs", "NCCL sum µs",
                     "sum / NCCL", "exchange floor µs", "gather / exchange floor"], out)


def gpu_tables(logdir: str, machine: str, date: str, commit: str, hand: bool) -> dict[str, str]:
    # (table, logs, builder, the machine kind it is usually run on, how the ranks sit on it)
    specs = [
        ("mps-ipc", "tpf-gpubench-sizes-ipc-w*.log", mps_ipc, "nvidia-h200", "one H200, W rank processes under MPS"),
        ("mps-proxy", "tpf-gpubench-sizes-proxy-w*.log", mps_proxy, "nvidia-h200", "one H200, W rank processes under MPS"),
        ("mps-hop", "tpf-gpubench-hop-proxy-w*.log", mps_hop, "nvidia-h200", "one H200, 2 rank processes under MPS"),
        ("nccl", "tpf-gpubench-nccl-ipc-w*.log", nccl, "nvidia-h200-x2", "two H200s (NVLink), one rank process per GPU"),
    ]
    out = {}
    # A tag after the world (-tcp, -onehost, -pergpu) names another setup's log; -runN one run of several.
    plain = re.compile(r"-w\d+(-run\d+)?\.log$")
    for name, pattern, build, kind, setup in specs:
        paths = sorted(p for p in glob.glob(os.path.join(logdir, pattern)) if plain.search(p))
        if not paths:
            continue
        rows = read_rows(paths)
        if not rows:
            continue
        when = date or datetime.datetime.fromtimestamp(max(os.path.getmtime(p) for p in paths),
                                                       datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        runs = len(paths) if name == "nccl" else 0
        src = "`tpf-gpubench` (" + ", ".join(os.path.basename(p) for p in paths) + ")"
        if runs > 1:
            src += f", the median of {runs} runs"
        out[name] = build(rows) + "\n\n" + stamp(f"{machine or kind}, {setup}", when, commit, src, hand)
    table, paths = mps_tcp(logdir)
    if table:
        when = date or datetime.datetime.fromtimestamp(max(os.path.getmtime(p) for p in paths),
                                                       datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        src = "`tpf-gpubench` (" + ", ".join(os.path.basename(p) for p in paths) + ")"
        out["mps-tcp"] = table + "\n\n" + stamp(f"{machine or 'nvidia-h200'}, one H200, 2 rank processes under MPS, "
                                                 "two tpfabricd on loopback as two nodes", when, commit, src, hand)
    return out


# ---- perf.md ---------------------------------------------------------------------------------

def markers(name: str) -> tuple[str, str]:
    return f"<!-- perf-table: {name} -->", f"<!-- /perf-table: {name} -->"


def replace(text: str, name: str, body: str) -> str:
    begin, end = markers(name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit(f"perf_tables.py: the markers of table {name} ({begin} ... {end}) are not there once each")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return head + begin + "\n" + body.rstrip("\n") + "\n" + end + tail


def tables_of(text: str) -> dict[str, str]:
    """{name: what lies between its markers}."""
    return {m.group(1): m.group(2) for m in
            re.finditer(r"<!-- perf-table: ([\w-]+) -->\n(.*?)<!-- /perf-table: \1 -->", text, re.S)}


def check(text: str) -> list[str]:
    fails, found = [], tables_of(text)
    for name in TABLES:
        begin, end = markers(name)
        if text.count(begin) != 1 or text.count(end) != 1:
            fails.append(f"table {name}: its markers are not there once each")
            continue
        body = found.get(name, "")
        if not re.search(r"^\| .* \|$\n^\| -", body, re.M):
            fails.append(f"table {name}: no Markdown table between its markers")
        if not re.search(r"^Machine: .+\. Date: .+\. Commit: [0-9a-f]{7,40}\. ", body, re.M):
            fails.append(f"table {name}: no line 'Machine: ... Date: ... Commit: ...' under it")
    return fails


# README's Performance rows: (what, table, the row's first cells, the measured cell and its unit, the
# "beside" text with {column} fields of the same row; {date} is the table's date).
README_ROWS = [
    ("host path, W = 2, 4 KiB gather p50 (16 idle host CPUs)", "host", ["2", "4 KiB"], "gather p50 µs", " µs",
     "{gather / floor} a shared-memory ping-pong's one way ({floor p50 µs} µs)"),
    ("host path, W = 16, 4 KiB gather p50", "host", ["16", "4 KiB"], "gather p50 µs", " µs", "target 10 µs"),
    ("host path, W = 2, 4 KiB bf16 sum p50", "host", ["2", "4 KiB"], "bf16 sum p50 µs", " µs",
     "{sum / gather} the gather of the same bytes"),
    ("GPU ipc, one H200 under MPS, W = 2, 4 KiB gather", "mps-ipc", ["2", "4 KiB"], "gather µs", " µs",
     "{gather / copy kernel} a copy kernel of the same bytes ({copy kernel µs} µs)"),
    ("GPU ipc, two H200s (NVLink), W = 2, 4 KiB gather ({date})", "nccl", ["4 KiB"], "gather µs", " µs",
     "{gather / NCCL} NCCL ({NCCL gather µs} µs)"),
    ("GPU ipc, two H200s (NVLink), W = 2, 64 KiB gather ({date})", "nccl", ["64 KiB"], "gather µs", " µs",
     "{gather / NCCL} NCCL ({NCCL gather µs} µs)"),
    ("GPU proxy route, one H200, W = 2, 4 KiB gather", "mps-proxy", ["2", "4 KiB"], "gather µs", " µs", "target 7 µs"),
    ("GPU proxy hop (doorbell to the peer's flag), p50", "mps-hop", ["hop, p50"], "µs", " µs",
     "{/ ping-pong} a host-mapped GPU-CPU ping-pong ({ping-pong} µs)"),
]


def parsed(body: str) -> tuple[list[dict], str]:
    """The rows of a table's Markdown (as {column: cell}) and its date."""
    lines = [l for l in body.splitlines() if l.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(head, [c.strip() for c in l.strip().strip("|").split("|")])) for l in lines[2:]]
    m = re.search(r"Date: (\d{4}-\d\d-\d\d)", body)
    return rows, m.group(1) if m else ""


def readme_table(text: str, old: list[str]) -> tuple[str, list[str]]:
    """README's table from perf.md's tables; a row whose cells are not there keeps its `old` line."""
    tables = {name: parsed(body) for name, body in tables_of(text).items()}
    out, missing = ["| what | measured | beside |", "| --- | ---: | --- |"], []

    def keep(i: int, why: str) -> None:
        missing.append(why)
        if i < len(old):
            out.append(old[i])

    for i, (what, table, first, col, unit, beside) in enumerate(README_ROWS):
        rows, date = tables.get(table, ([], ""))
        row = next((r for r in rows if list(r.values())[:len(first)] == first), None)
        if row is None or not row.get(col):
            keep(i, f"{what}: no {col} in table {table}")
            continue
        cells = dict(row)
        if table == "mps-hop":  # the ping-pong's own row
            ping = next((r for r in rows if list(r.values())[0].startswith("host-mapped ping-pong")), {})
            cells["ping-pong"] = ping.get("µs", "")
        try:
            text_beside = beside.format(**cells)
        except KeyError as e:
            keep(i, f"{what}: no {e} in table {table}")
            continue
        if re.search(r"\(\s*µs\)|^\s", text_beside):
            keep(i, f"{what}: an empty cell in '{text_beside}'")
            continue
        out.append(f"| {what.format(date=date)} | {row[col]}{unit} | {text_beside} |")
    return "\n".join(out), missing


def git_head(doc: str) -> str:
    r = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(doc)), "rev-parse", "--short", "HEAD"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["host", "gpu", "readme", "check"])
    ap.add_argument("input", nargs="?", help="host: the JSON file; gpu: the log directory")
    ap.add_argument("--doc", default=os.path.join(here, "..", "docs", "perf.md"))
    ap.add_argument("--readme", default=os.path.join(here, "..", "README.md"))
    ap.add_argument("--commit")
    ap.add_argument("--machine")
    ap.add_argument("--date")
    ap.add_argument("--hand", action="store_true", help="the inputs are a run's recorded numbers typed in by hand")
    a = ap.parse_args()
    text = open(a.doc).read()
    if a.what == "check":
        fails = check(text)
        for f in fails:
            print(f"FAIL: {f}")
        if not fails:
            print(f"ok: {len(TABLES)} tables with their markers and lines in {a.doc}")
        return 1 if fails else 0
    if a.what == "readme":
        readme = open(a.readme).read()
        begin, end = "<!-- perf-readme -->", "<!-- /perf-readme -->"
        if readme.count(begin) != 1 or readme.count(end) != 1:
            print(f"perf_tables.py: {a.readme} has not the markers {begin} ... {end} once each", file=sys.stderr)
            return 1
        head, rest = readme.split(begin)
        old = [l for l in rest.split(end)[0].splitlines() if l.startswith("| ")][2:]
        table, missing = readme_table(text, old)
        for m in missing:
            print(f"perf_tables.py: README row kept as it was: {m}", file=sys.stderr)
        open(a.readme, "w").write(head + begin + "\n" + table + "\n" + end + rest.split(end)[1])
        print(f"perf_tables.py: README's Performance table rewritten from {a.doc} "
              f"({len(README_ROWS) - len(missing)} rows new, {len(missing)} kept)")
        return 1 if missing else 0
    if not a.input:
        ap.error(f"{a.what} needs its input (host: the JSON of tpf-bench run --json; gpu: tests/gpu/run.sh's log directory)")
    commit = a.commit or git_head(a.doc)
    if a.what == "host":
        doc = json.load(open(a.input))
        m = doc.get("machine", {})
        model = f" ({m['cpu_model']})" if m.get("cpu_model") else ""
        machine = a.machine or f"{m.get('cpus', '?')} CPUs{model}, {m.get('kernel', '?')}"
        date = a.date or m.get("date_utc", "?").replace("T", " ").replace("Z", " UTC")
        build = host_tcp_table if doc.get("nodes", 1) == 2 else host_tables
        new = build(doc, machine, date, commit, a.hand)
    else:
        new = gpu_tables(a.input, a.machine, a.date, commit, a.hand)
        if not new:
            print(f"perf_tables.py: no tpf-gpubench log with ROW lines in {a.input}", file=sys.stderr)
            return 1
    for name, body in new.items():
        text = replace(text, name, body)
        print(f"perf_tables.py: table {name} rewritten in {a.doc}")
    open(a.doc, "w").write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
