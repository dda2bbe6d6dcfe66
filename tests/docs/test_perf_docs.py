#!/usr/bin/env python3
"""docs/perf.md's tables, README.md's Performance table and scripts/perf_tables.py.

    test_perf_docs.py readme README_MD PERF_MD
        README's Performance table has at most 8 rows, one measured number
        a row, and every number of its "measured" and "beside" columns
        appears in one of perf.md's current tables (between its markers);
    test_perf_docs.py tables PERF_MD SCRIPT
        `SCRIPT check` passes (every table's markers, each with its machine,
        date and commit line) and perf.md is at most 600 lines;
    test_perf_docs.py script PERF_MD SCRIPT TPF_BENCH TPFABRICD README_MD
        SCRIPT rewrites a copy of perf.md from a short real `tpf-bench run
        --json`, one of `tpf-bench run --nodes 2 --json` and from
        tpf-gpubench ROW lines of each mode: every table
        replaced, holding the input's numbers, the rest of the file kept;
        then a copy of README's Performance table from those tables, a row
        whose cells the copy lacks kept as it was.

Exit 0 when every check passes, 1 naming each one that fails.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

NUMBER = re.compile(r"\d+(?:\.\d+)?")


def tables_text(perf: str) -> str:
    text = open(perf).read()
    return "\n".join(m.group(1) for m in
                     re.finditer(r"<!-- perf-table: [\w-]+ -->\n(.*?)<!-- /perf-table: [\w-]+ -->", text, re.S))


def has_number(text: str, n: str) -> bool:
    return re.search(r"(?<![\d.])" + re.escape(n) + r"(?![\d]|\.\d)", text) is not None


def readme(readme_md: str, perf: str) -> list[str]:
    text = open(readme_md).read()
    m = re.search(r"^## Performance\n(.*?)(?=^## )", text, re.S | re.M)
    if not m:
        return ["README.md has no '## Performance' section"]
    rows = [line for line in m.group(1).splitlines() if line.startswith("|")]
    if len(rows) < 3:
        return ["README.md's Performance section has no table"]
    body = rows[2:]
    fails = []
    if len(body) > 8:
        fails.append(f"README.md's Performance table has {len(body)} rows (at most 8)")
    if "perf.md" not in m.group(1):
        fails.append("README.md's Performance section does not link docs/perf.md")
    tables = tables_text(perf)
    if not tables.strip():
        return fails + [f"{perf} has no current table between perf-table markers"]
    for row in body:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 3:
            fails.append(f"README row of {len(cells)} cells (what, measured, beside): {row}")
            continue
        what, measured, beside = cells
        got = NUMBER.findall(measured)
        if len(got) != 1:
            fails.append(f"README row '{what}': {len(got)} numbers in its measured cell '{measured}' (one)")
        for n in got + NUMBER.findall(beside):
            if has_number(tables, n):
                print(f"ok: README '{what}': {n} is in perf.md's tables")
            else:
                fails.append(f"README '{what}': {n} is in no current table of perf.md (re-measured? "
                             "update README's row from docs/perf.md)")
    return fails


def tables(perf: str, script: str) -> list[str]:
    fails = []
    r = subprocess.run([sys.executable, script, "check", "--doc", perf], capture_output=True, text=True)
    print(r.stdout, end="")
    if r.returncode != 0:
        fails.append(f"perf_tables.py check failed:\n{r.stdout}{r.stderr}")
    lines = len(open(perf).read().splitlines())
    if lines > 600:
        fails.append(f"{perf} is {lines} lines (at most 600: the method and the current tables)")
    else:
        print(f"ok: {perf} is {lines} lines")
    return fails


# One line of each kind tests/gpu/run.sh's logs hold, in tpf-gpubench's format (not measurements).
GPU_LOGS = {
    "tpf-gpubench-sizes-ipc-w2.log": ["ROW copy-kernel W=2 4096 1.11", "ROW ipc-gather W=2 4096 3.33",
                                      "ROW ipc-sum-bf16 W=2 4096 3.44", "ROW store-flag-floor-pdl W=2 4096 2.22",
                                      "ROW ipc-gather W=2 65536 4.44"],
    "tpf-gpubench-sizes-proxy-w2.log": ["ROW proxy-gather W=2 4096 8.88", "ROW proxy-gather-1poll W=2 4096 9.99"],
    "tpf-gpubench-hop-proxy-w2.log": ["ROW proxy-hop-p50 W=2 16 3.21", "ROW proxy-hop-mean W=2 16 3.43",
                                      "ROW proxy-hop-p99 W=2 16 6.54", "ROW hostmapped-pingpong-rtt W=2 8 3.00"],
    "tpf-gpubench-nccl-ipc-w2-run1.log": ["ROW ll-gather W=2 4096 2.00", "ROW nccl-gather W=2 4096 4.00"],
    "tpf-gpubench-nccl-ipc-w2-run2.log": ["ROW ll-gather W=2 4096 3.00", "ROW nccl-gather W=2 4096 6.00"],
}


def script(perf: str, script_py: str, bench: str, daemon: str, readme_md: str) -> list[str]:
    fails = []
    with tempfile.TemporaryDirectory() as tmp:
        doc = os.path.join(tmp, "perf.md")
        shutil.copy(perf, doc)
        before = open(doc).read()
        js = os.path.join(tmp, "host.json")
        r = subprocess.run([bench, "run", "--daemon", daemon, "--world", "2", "--sizes", "4KiB", "--iters", "20",
                            "--floor-iters", "100", "--opens", "1", "--idle-ms", "50", "--settle-ms", "20", "--json", js],
                           capture_output=True, text=True, timeout=240)
        if r.returncode != 0:
            return [f"tpf-bench run exited {r.returncode}: {r.stderr[-2000:]}"]
        r = subprocess.run([sys.executable, script_py, "host", js, "--doc", doc, "--commit", "abc1234"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return [f"perf_tables.py host exited {r.returncode}: {r.stderr}"]
        tcp_js = os.path.join(tmp, "host-tcp.json")
        r = subprocess.run([bench, "run", "--daemon", daemon, "--nodes", "2", "--world", "2", "--sizes", "4KiB", "--iters",
                            "20", "--floor-iters", "100", "--opens", "1", "--idle-ms", "50", "--settle-ms", "20", "--json",
                            tcp_js], capture_output=True, text=True, timeout=240)
        if r.returncode != 0:
            return [f"tpf-bench run --nodes 2 exited {r.returncode}: {r.stderr[-2000:]}"]
        r = subprocess.run([sys.executable, script_py, "host", tcp_js, "--doc", doc, "--commit", "abc1234"],
                           capture_output=True, text=True)
        if r.returncode != 0 or "table host-tcp rewritten" not in r.stdout or "table host " in r.stdout:
            return [f"perf_tables.py host (two nodes) exited {r.returncode}, rewriting other than host-tcp: {r.stdout}{r.stderr}"]
        logs = os.path.join(tmp, "logs")
        os.mkdir(logs)
        for name, lines in GPU_LOGS.items():
            with open(os.path.join(logs, name), "w") as f:
                f.write("noise before\n" + "\n".join(lines) + "\n")
        r = subprocess.run([sys.executable, script_py, "gpu", logs, "--doc", doc, "--commit", "def5678",
                            "--date", "2030-01-02 03:04 UTC"], capture_output=True, text=True)
        if r.returncode != 0:
            return [f"perf_tables.py gpu exited {r.returncode}: {r.stderr}"]
        after = open(doc).read()
        import json
        host = json.load(open(js))
        g = next(x for x in host["results"] if x["op"] == "gather" and x["world"] == 2)
        tcp = json.load(open(tcp_js))
        tg = next(x for x in tcp["results"] if x["op"] == "gather" and x["world"] == 2)
        tf = next(x for x in tcp["floor"] if x["size"] == 4096)
        parts = {}
        for m in re.finditer(r"<!-- perf-table: ([\w-]+) -->\n(.*?)<!-- /perf-table: \1 -->", after, re.S):
            parts[m.group(1)] = m.group(2)
        want = {
            "host": [f"| 2 | 4 KiB | {g['p50_us']:.1f} |", "Commit: abc1234."],
            "host-control": ["| W = 2 |", "Commit: abc1234."],
            "host-tcp": [f"| 2 | 4 KiB | tcp | {tg['p50_us']:.1f} | {tg['p99_us']:.1f} |", f"| {tf['p50_us']:.1f} | {tf['p99_us']:.1f} |",
                         "Loopback on one host is not a network", "Commit: abc1234."],
            "mps-ipc": ["| 2 | 4 KiB | 3.33 | 3.44 | 1.11 | 3.00x | 2.22 | 1.50x |", "| 2 | 64 KiB | 4.44 |",
                        "Date: 2030-01-02 03:04 UTC. Commit: def5678."],
            "mps-proxy": ["| 2 | 4 KiB | 8.88 |  | 9.99 |", "gather ≤ 7 µs: missed"],
            "mps-hop": ["| hop, p50 | 3.21 | 1.07x | ≤ 1.25x ping-pong: met |", "| hop, p99 | 6.54 | 2.18x | ≤ 2x ping-pong: missed |"],
            "nccl": ["| 4 KiB | 2.50 | 5.00 | 0.50x |", "the median of 2 runs"],
        }
        for name, needles in want.items():
            for needle in needles:
                if needle in parts.get(name, ""):
                    print(f"ok: table {name} holds {needle!r}")
                else:
                    fails.append(f"table {name} does not hold {needle!r} after the rewrite:\n{parts.get(name, '(none)')}")
        strip = lambda t: re.sub(r"(<!-- perf-table: ([\w-]+) -->\n).*?(<!-- /perf-table: \2 -->)", r"\1\3", t, flags=re.S)
        if strip(before) != strip(after):
            fails.append("the rewrite changed perf.md outside the tables' markers")
        else:
            print("ok: nothing outside the markers changed")
        r = subprocess.run([sys.executable, script_py, "check", "--doc", doc], capture_output=True, text=True)
        if r.returncode != 0:
            fails.append(f"check of the rewritten copy failed: {r.stdout}")
        rd = os.path.join(tmp, "README.md")
        shutil.copy(readme_md, rd)
        old_rows = [l for l in open(rd).read().splitlines() if l.startswith("| ")]
        r = subprocess.run([sys.executable, script_py, "readme", "--doc", doc, "--readme", rd], capture_output=True, text=True)
        new_readme = open(rd).read()
        if r.returncode != 1 or "kept as it was" not in r.stderr:
            fails.append(f"perf_tables.py readme exited {r.returncode} (1: rows kept): {r.stdout}{r.stderr}")
        for needle in ["| GPU ipc, one H200 under MPS, W = 2, 4 KiB gather | 3.33 µs | 3.00x a copy kernel of the same bytes (1.11 µs) |",
                       "| GPU ipc, two H200s (NVLink), W = 2, 4 KiB gather (2030-01-02) | 2.50 µs | 0.50x NCCL (5.00 µs) |",
                       "| GPU proxy hop (doorbell to the peer's flag), p50 | 3.21 µs | 1.07x a host-mapped GPU-CPU ping-pong (3.00 µs) |",
                       f"| host path, W = 2, 4 KiB gather p50 (16 idle host CPUs) | {g['p50_us']:.1f} µs |"]:
            if needle in new_readme:
                print(f"ok: README's copy holds {needle!r}")
            else:
                fails.append(f"README's copy does not hold {needle!r}")
        kept = next((l for l in old_rows if "64 KiB gather" in l), None)
        if kept and kept in new_readme:
            print("ok: the row whose cells the tables lack is kept")
        else:
            fails.append(f"README's 64 KiB row was not kept: {kept}")
        if len([l for l in new_readme.splitlines() if l.startswith("| ")]) != len(old_rows):
            fails.append("README's copy has another number of table lines")
        r = subprocess.run([sys.executable, script_py, "gpu", tmp, "--doc", doc], capture_output=True, text=True)
        if r.returncode != 1:
            fails.append(f"perf_tables.py gpu on a directory without logs exited {r.returncode} (1 expected)")
    return fails


def main() -> int:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "readme":
        fails = readme(*args)
    elif mode == "tables":
        fails = tables(*args)
    elif mode == "script":
        fails = script(*args)
    else:
        print(f"test_perf_docs.py: unknown mode {mode}")
        return 2
    for f in fails:
        print(f"FAIL: {f}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
