#!/usr/bin/env python3
"""tpf-bench as an operator runs it: its command line, and one short real run
against a tpfabricd it starts itself (--daemon), read back from its --json.

  usage      bad usage exits 2 with two lines on stderr (the problem, then a
             pointer to --help) and nothing on stdout; every --help ends with
             the exit statuses; a --daemon that does not start exits 1 naming it.
  run        W = 2 and 3, 64 B and 4 KiB, gather and both sums, exactly
             --iters timed calls a rank (--point-ms 0): every (op, W, size)
             row is in the JSON with W x iters samples and sane percentiles,
             the floor beside each size (its CPUs named, or why not pinned),
             issue 16's targets judged (W = 2 4 KiB
             within 2x the floor; the W = 16 line says it was not measured),
             an open time for each W, and the Markdown on stdout says the same.
Timing is not asserted (2 CPUs here): the numbers only have to exist and
agree with each other. Needs TPF_BENCH and TPF_DAEMON
(tests/integration/meson.build). Exit 0 pass, 1 fail."""

import json
import os
import subprocess
import sys
import tempfile

BENCH = os.environ["TPF_BENCH"]
DAEMON = os.environ["TPF_DAEMON"]
FAILURES = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        FAILURES.append(what)


def run(args, timeout=60):
    return subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=timeout)


def usage(args, says=""):
    r = run(args)
    err = r.stderr.splitlines()
    check(r.returncode == 2 and r.stdout == "" and len(err) == 2 and err[0].startswith("tpf-bench: ")
          and says in r.stderr and err[1].startswith("Run 'tpf-bench --help'"),
          f"tpf-bench {' '.join(args)!s}: usage error{' saying ' + repr(says) if says else ''} "
          f"(exit {r.returncode}, stderr {r.stderr!r})")


def footer(args):
    r = run(args)
    last = r.stdout.rstrip("\n").splitlines()[-1] if r.stdout.strip() else ""
    check(r.returncode == 0 and last.startswith("Exit status: 0 "),
          f"tpf-bench {' '.join(args)}: exit {r.returncode}, last line {last!r}")


def main():
    usage(["run", "--world", "1"])
    usage(["run", "--sizes", "17"])
    usage(["run", "--ops", "nope"])
    usage(["run", "--sizes", "2GiB"], "above 1GiB")
    usage(["run", "--sizes", "1.5KiB"], "no fractions")
    usage(["run", "--socket", ""], "an empty path names no socket")
    usage(["reduce", "--sizes", "3"], "'tpf-bench reduce --help'")
    usage(["bogus"])
    usage([])
    for args in (["--help"], ["run", "--help"], ["reduce", "--help"]):
        footer(args)
    r = run(["run", "--daemon", "/nonexistent/tpfabricd", "--world", "2", "--sizes", "64"])
    check(r.returncode == 1 and "/nonexistent/tpfabricd" in r.stderr,
          f"a --daemon that cannot start: exit {r.returncode}, stderr {r.stderr.strip()!r}")

    worlds, sizes, iters = (2, 3), (64, 4096), 30
    ops = ("gather", "sum_bf16", "sum_f16")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.json")
        r = run(["run", "--daemon", DAEMON, "--world", "2,3", "--sizes", "64,4KiB", "--ops", "gather,sum,sum-f16",
                 "--iters", str(iters), "--warmup", "5", "--point-ms", "0", "--floor-iters", "200", "--opens", "2",
                 "--idle-ms", "100", "--settle-ms", "20", "--json", path, "--markdown"], timeout=240)
        check(r.returncode == 0, f"the run exits 0 (exit {r.returncode}; stderr tail {r.stderr[-600:]!r})")
        if r.returncode != 0:
            return
        with open(path) as f:
            doc = json.load(f)
    rows = {(x["op"], x["world"], x["size"]): x for x in doc["results"]}
    want = {(op, w, s) for op in ops for w in worlds for s in sizes}
    check(set(rows) == want, f"one row per (op, W, size): {sorted(set(rows) ^ want)} differ")
    for key, x in sorted(rows.items()):
        ok = (x["samples"] == key[1] * iters and 0 < x["p50_us"] <= x["p99_us"] and x["floor_p50_us"] > 0
              and abs(x["ratio_p50"] - x["p50_us"] / x["floor_p50_us"]) < 0.01 * x["ratio_p50"] + 1e-6)
        check(ok, f"row {key}: {x['samples']} samples (want {key[1] * iters}), p50 {x['p50_us']} p99 {x['p99_us']}, "
                  f"floor {x['floor_p50_us']}, ratio {x['ratio_p50']}")
    floors = {f["size"]: f for f in doc["floor"]}
    check(set(floors) == set(sizes) and all(f["samples"] == 200 and f["p50_us"] > 0 for f in floors.values()),
          f"a floor for each size, 200 round trips: {doc['floor']}")
    pin = doc.get("floor_pinning", "")
    check(pin.startswith("pinned to CPUs ") or pin.startswith("not pinned ("),
          f"the floor's CPUs named, or why it was not pinned: {pin!r}")
    target = {t["op"]: t for t in doc["target"]}
    check(set(target) == set(ops) and all(t["limit"] == 2.0 and t["met"] == (t["ratio_p50"] <= 2.0)
                                          for t in target.values()),
          f"W = 2 4 KiB judged against 2x the floor for every op: {doc['target']}")
    check(doc["target_wide"] is None, f"no W = 16 in the run, no W = 16 verdict: {doc['target_wide']}")
    opened = {w["world"]: w for w in doc["control"]["worlds"]}
    check(set(opened) == set(worlds) and all(w["open_p50_ms"] > 0 for w in opened.values()),
          f"an open time for each W: {[(w, o.get('open_p50_ms')) for w, o in opened.items()]}")
    out = r.stdout
    check("| op " in out and "| gather " in out and "| sum bf16 " in out and "| sum f16 " in out,
          "the Markdown table on stdout has the gather and both sums")
    check("target: W=2 at 4 KiB within 2x the floor (p50): gather " in out,
          "stdout judges W = 2 4 KiB against 2x the floor")
    check("target: W=16 4 KiB gather within 10 µs (p50): not measured in this run" in out,
          "stdout says the W = 16 target was not measured")


if __name__ == "__main__":
    try:
        main()
    except subprocess.TimeoutExpired as e:
        FAILURES.append(f"timed out: {e}")
        print(f"FAIL: timed out: {e}")
    print(f"{len(FAILURES)} failed" if FAILURES else "all passed")
    sys.exit(1 if FAILURES else 0)
