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
  nodes 2    --nodes 3, --nodes 2 without two sockets: usage errors naming
             what is needed; two sockets of one daemon: exit 1, the ranks did
             not take the tcp wire; a short --daemon --nodes 2 run (W = 2 and
             3, 64 B and 4 KiB): every row's routes (tcp, or shm and tcp at
             W = 3), a TCP floor for each size, no one-node target judged, and
             the Markdown's title, tcp floor columns and loopback note.
Timing is not asserted (2 CPUs here): the numbers only have to exist and
agree with each other. Needs TPF_BENCH and TPF_DAEMON
(tests/integration/meson.build). Exit 0 pass, 1 fail."""

import json
import os
import re
import subprocess
import sys
import tempfile
import time

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
    check(doc["nodes"] == 1 and doc["floor_kind"] == "shm" and all(x["routes"] == "shm" for x in doc["results"]),
          f"one node: a shared-memory floor and every row's routes shm: {[x['routes'] for x in doc['results']]}")


def two_nodes():
    usage(["run", "--nodes", "3"], "tpf-bench runs one node (1) or two")
    usage(["run", "--nodes", "2"], "--nodes 2 needs two daemons, one per node: --socket A,B")
    usage(["run", "--nodes", "2", "--socket", "/tmp/one.sock"], "(--socket named 1)")
    usage(["run", "--socket", "/tmp/a.sock,/tmp/b.sock"], "give --nodes 2")
    worlds, sizes, iters = (2, 3), (64, 4096), 20
    with tempfile.TemporaryDirectory() as tmp:
        # One daemon named twice is one node: its ranks meet over shm, and the run refuses.
        sock = os.path.join(tmp, "one.sock")
        daemon = subprocess.Popen([DAEMON, "--socket", sock, "--foreground", "--log-level", "warn"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
            r = run(["run", "--nodes", "2", "--socket", f"{sock},{sock}", "--world", "2", "--sizes", "64", "--iters", "5",
                     "--point-ms", "0", "--floor-iters", "50", "--opens", "1", "--idle-ms", "10", "--settle-ms", "1"],
                    timeout=120)
            check(r.returncode == 1 and "over 'shm', not the tcp wire" in r.stderr and r.stdout == "",
                  f"two sockets of one daemon: exit 1 naming the wire taken, no table (exit {r.returncode}, "
                  f"stderr tail {r.stderr[-400:]!r})")
        finally:
            daemon.terminate()
            daemon.wait(timeout=10)
        path = os.path.join(tmp, "nodes.json")
        r = run(["run", "--daemon", DAEMON, "--nodes", "2", "--world", "2,3", "--sizes", "64,4KiB", "--ops", "gather,sum",
                 "--iters", str(iters), "--warmup", "3", "--point-ms", "0", "--floor-iters", "100", "--opens", "1",
                 "--idle-ms", "50", "--settle-ms", "10", "--json", path, "--markdown"], timeout=240)
        check(r.returncode == 0, f"the two-node run exits 0 (exit {r.returncode}; stderr tail {r.stderr[-600:]!r})")
        if r.returncode != 0:
            return
        with open(path) as f:
            doc = json.load(f)
    check(doc["nodes"] == 2 and doc["floor_kind"] == "tcp", f"the JSON says 2 nodes and a tcp floor: "
                                                           f"{doc.get('nodes')}, {doc.get('floor_kind')}")
    rows = {(x["op"], x["world"], x["size"]): x for x in doc["results"]}
    want = {(op, w, s) for op in ("gather", "sum_bf16") for w in worlds for s in sizes}
    check(set(rows) == want, f"one row per (op, W, size): {sorted(set(rows) ^ want)} differ")
    for key, x in sorted(rows.items()):
        routes = "tcp" if key[1] == 2 else "shm, tcp"  # W = 3: ranks 0 and 2 share node 0
        ok = (x["routes"] == routes and x["samples"] == key[1] * iters and 0 < x["p50_us"] <= x["p99_us"]
              and x["floor_p50_us"] > 0 and abs(x["ratio_p50"] - x["p50_us"] / x["floor_p50_us"]) < 0.01 * x["ratio_p50"] + 1e-6)
        check(ok, f"two nodes, row {key}: routes {x['routes']!r} (want {routes!r}), {x['samples']} samples, "
                  f"p50 {x['p50_us']} p99 {x['p99_us']}, tcp floor {x['floor_p50_us']}, ratio {x['ratio_p50']}")
    floors = {f["size"]: f for f in doc["floor"]}
    check(set(floors) == set(sizes) and all(f["samples"] == 100 and 0 < f["p50_us"] <= f["p99_us"] for f in floors.values()),
          f"a TCP floor for each size, 100 round trips: {doc['floor']}")
    check(doc["target"] == [] and doc["target_wide"] is None,
          f"the one-node targets are not judged across nodes: {doc['target']}, {doc['target_wide']}")
    out = r.stdout
    check("**Host path across 2 nodes over the tcp wire**" in out and "tcp floor p50 µs" in out
          and "p50 / tcp floor" in out and "raw two-process TCP ping-pong" in out,
          "the Markdown's title and columns name the tcp wire and its floor")
    check(re.search(r"^\| gather +\| 2 \| 4KiB \| tcp +\|", out, re.M) and re.search(r"^\| gather +\| 3 \| 4KiB \| shm, tcp \|", out, re.M),
          "the Markdown's rows show the routes taken")
    check("loopback on one host is not a network" in out, "the Markdown says loopback is not a network")


if __name__ == "__main__":
    try:
        main()
        two_nodes()
    except subprocess.TimeoutExpired as e:
        FAILURES.append(f"timed out: {e}")
        print(f"FAIL: timed out: {e}")
    print(f"{len(FAILURES)} failed" if FAILURES else "all passed")
    sys.exit(1 if FAILURES else 0)
