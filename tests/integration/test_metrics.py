#!/usr/bin/env python3
"""`tpfabricctl metrics` against a real tpfabricd and real ranks, parsed with
prometheus_client's own text parser (Debian python3-prometheus-client).

One daemon (daemon.max_groups = 1) sees a known workload, one group at a time:
  A  W=3, 40 mixed calls a rank (gathers and sums of known sizes), closed in order;
  B  W=2 gathers, rank 1 dies (_exit) before its call 10: the group breaks
     (PeerLost), rank 0's call 10 fails with PeerLost;
  C  W=2 sums, paused after 8 calls, group held open, while
  D  W=2 tries to open and is refused (max_groups): both ranks report the
     fallback (host buffers: the open fails Unavailable);
  then C finishes its 24 calls and closes.
Every counter must equal what this script computes from the workload, live
(C's calls while its group is open) and after every group closed (lifetime
counters). Needs TPF_DAEMON, TPF_TESTRANK, TPF_CTL (tests/integration/meson.build).
Exit 0 pass, 1 fail, 77 skip (prometheus_client missing)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print(f"SKIP: {sys.executable} has no module prometheus_client (Debian: apt-get install python3-prometheus-client, "
          "for /usr/bin/python3; scripts/debian-packages.txt lists it)")
    sys.exit(77)

DAEMON = os.environ["TPF_DAEMON"]
TESTRANK = os.environ["TPF_TESTRANK"]
CTL = os.environ["TPF_CTL"]

FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(sock, world, common, per_rank=None):
    boot = f"127.0.0.1:{free_port()}"
    procs = []
    for r in range(world):
        argv = [TESTRANK, "--socket", sock, "--bootstrap", boot, "--rank", str(r), "--world", str(world)] + common
        argv += (per_rank or {}).get(r, [])
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def finish(procs, timeout=120):
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
        out.append((p.returncode, [l for l in text.splitlines() if l.startswith("RESULT")]))
    return out


def wait_line(proc, needle, timeout=60):
    """Read proc's stdout until a line contains needle (the proc keeps running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            return False
        if needle in line:
            return True
    return False


def ctl(*args, timeout=30):
    return subprocess.run([CTL, *args], capture_output=True, text=True, timeout=timeout)


def scrape(sock):
    """Parse `tpfabricctl metrics`: ({(sample name, sorted labels): value}, [families])."""
    r = ctl("metrics", "--socket", sock)
    if r.returncode != 0:
        raise RuntimeError(f"tpfabricctl metrics exited {r.returncode}: {r.stderr.strip()}")
    families = list(text_string_to_metric_families(r.stdout))
    samples = {}
    for fam in families:
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, families, r.stdout


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def by_label(samples, name, label):
    """{label value: sample value} of every sample of `name`."""
    return {dict(k[1])[label]: v for k, v in samples.items() if k[0] == name and v}


def wait_until(sock, pred, what, timeout=20):
    deadline = time.monotonic() + timeout
    while True:
        samples, _, _ = scrape(sock)
        if pred(samples):
            return samples
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting until {what}")
        time.sleep(0.05)


def idle(samples, clients=1):
    """No group left in the table and only `clients` connections (this scrape's among them)."""
    return sum(v for k, v in samples.items() if k[0] == "tpfabric_groups") == 0 and \
        value(samples, "tpfabric_clients") == clients


class Expect:
    """What the daemon must have counted, computed from the workload alone."""

    def __init__(self):
        self.calls = {"all_gather": 0, "all_reduce_sum": 0}
        self.failed = {"all_gather": 0, "all_reduce_sum": 0}
        self.bytes = {"all_gather": 0, "all_reduce_sum": 0}
        self.errors = {}
        self.opened = 0
        self.broken = {}
        self.refused = {}
        self.fallbacks = {}

    def rank_calls(self, mode, sizes, done, failed_at=None):
        """One rank of tpf-testrank: `done` completed calls, then maybe one failed call."""
        for it in range(done + (1 if failed_at else 0)):
            op = "all_reduce_sum" if mode == "sum" or (mode == "mixed" and it % 2) else "all_gather"
            self.calls[op] += 1
            if it < done:
                self.bytes[op] += sizes[it % len(sizes)]  # sizes are multiples of 4: count * dtype size == size
            else:
                self.failed[op] += 1
                self.errors[failed_at] = self.errors.get(failed_at, 0) + 1


def check_counters(samples, e, when):
    for op in e.calls:
        check(value(samples, "tpfabric_calls_total", op=op) == e.calls[op],
              f"{when}: tpfabric_calls_total{{op={op}}} == {e.calls[op]} (got {value(samples, 'tpfabric_calls_total', op=op)})")
        check(value(samples, "tpfabric_failed_calls_total", op=op) == e.failed[op],
              f"{when}: tpfabric_failed_calls_total{{op={op}}} == {e.failed[op]}")
        check(value(samples, "tpfabric_bytes_total", op=op) == e.bytes[op],
              f"{when}: tpfabric_bytes_total{{op={op}}} == {e.bytes[op]} (got {value(samples, 'tpfabric_bytes_total', op=op)})")
        completed = e.calls[op] - e.failed[op]
        count = value(samples, "tpfabric_call_latency_seconds_count", op=op)
        check(count == completed, f"{when}: latency histogram of {op} counts {completed} completed calls (got {count})")
        inf = value(samples, "tpfabric_call_latency_seconds_bucket", op=op, le="+Inf")
        check(inf == completed, f"{when}: its +Inf bucket too")
        buckets = sorted((float(dict(k[1])["le"]), v) for k, v in samples.items()
                         if k[0] == "tpfabric_call_latency_seconds_bucket" and dict(k[1])["op"] == op)
        check(all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), f"{when}: its le buckets are cumulative")
        total = value(samples, "tpfabric_call_latency_seconds_sum", op=op)
        check((total > 0) == (completed > 0) and total < 60 * max(completed, 1), f"{when}: its sum is plausible ({total} s)")
    check(by_label(samples, "tpfabric_call_errors_total", "error") == e.errors,
          f"{when}: tpfabric_call_errors_total by error == {e.errors}")
    check(value(samples, "tpfabric_groups_opened_total") == e.opened, f"{when}: tpfabric_groups_opened_total == {e.opened}")
    check(by_label(samples, "tpfabric_groups_broken_total", "reason") == e.broken,
          f"{when}: tpfabric_groups_broken_total by reason == {e.broken}")
    check(by_label(samples, "tpfabric_open_refusals_total", "reason") == e.refused,
          f"{when}: tpfabric_open_refusals_total by reason == {e.refused}")
    fallbacks = {(dict(k[1])["reason"], dict(k[1])["outcome"]): v for k, v in samples.items()
                 if k[0] == "tpfabric_open_fallbacks_total" and v}
    check(fallbacks == e.fallbacks, f"{when}: tpfabric_open_fallbacks_total == {e.fallbacks} (got {fallbacks})")


def main():
    work = tempfile.mkdtemp(prefix="tpf-metrics-")
    sock = os.path.join(work, "tpfabricd.sock")
    cfg = os.path.join(work, "tpfabricd.conf")
    with open(cfg, "w") as f:
        f.write("[daemon]\nmax_groups = 1\n")
    log = open(os.path.join(work, "daemon.log"), "w")
    daemon = subprocess.Popen([DAEMON, "--config", cfg, "--socket", sock, "--foreground", "--log-level", "info"],
                              stdout=log, stderr=subprocess.STDOUT)
    procs = []
    try:
        for _ in range(500):
            if os.path.exists(sock) and ctl("status", "--socket", sock).returncode == 0:
                break
            time.sleep(0.01)
        e = Expect()
        samples, families, text = scrape(sock)
        check_counters(samples, e, "fresh daemon")
        status = json.loads(ctl("status", "--json", "--socket", sock).stdout)
        check(value(samples, "tpfabric_daemon_info", version=status["daemon"]["version"],
                    node_id=status["daemon"]["node_id"]) == 1, "tpfabric_daemon_info names version and node")
        check(abs(value(samples, "tpfabric_daemon_start_time_seconds") - status["daemon"]["started_unix_ns"] / 1e9) < 1e-3,
              "tpfabric_daemon_start_time_seconds is the daemon's start")

        # A: W=3, mixed gathers and sums, closed in order.
        sizes_a = [64, 4096, 256]
        procs = start_ranks(sock, 3, ["--mode", "mixed", "--iters", "40", "--sizes", ",".join(map(str, sizes_a))])
        res = finish(procs)
        check(all(rc == 0 for rc, _ in res), f"group A: every rank ok {res}")
        for _ in range(3):
            e.rank_calls("mixed", sizes_a, 40)
        e.opened += 1
        samples = wait_until(sock, idle, "group A is gone")
        check_counters(samples, e, "after A closed")

        # B: W=2 gathers; rank 1 exits without closing before its call 10.
        sizes_b = [512]
        procs = start_ranks(sock, 2, ["--mode", "gather", "--iters", "30", "--sizes", "512", "--timeout-ms", "20000"],
                            {1: ["--exit-at", "10"]})
        res = finish(procs)
        check(res[0][0] == 1 and res[0][1] and "error=PeerLost calls=10" in res[0][1][0], f"group B: rank 0 PeerLost {res[0]}")
        e.rank_calls("gather", sizes_b, 10, failed_at="PeerLost")  # rank 0
        e.rank_calls("gather", sizes_b, 10)                        # rank 1, folded when its connection dropped
        e.opened += 1
        e.broken["PeerLost"] = 1
        samples = wait_until(sock, idle, "group B is gone")
        check_counters(samples, e, "after B broke")

        # C: W=2 sums, paused with the group open after 8 calls.
        go = os.path.join(work, "go")
        sizes_c = [1024]
        procs = start_ranks(sock, 2, ["--mode", "sum", "--iters", "24", "--sizes", "1024", "--pause-at", "8", "--go-file", go])
        check(all(wait_line(p, "PAUSED") for p in procs), "group C: both ranks paused with the group open")
        e.opened += 1
        live = Expect()
        live.__dict__.update({k: (dict(v) if isinstance(v, dict) else v) for k, v in e.__dict__.items()})
        for _ in range(2):
            live.rank_calls("sum", sizes_c, 8)
        samples = wait_until(sock, lambda s: value(s, "tpfabric_clients") == 3, "only C's ranks and this scrape are connected")
        check_counters(samples, live, "C open and paused (live ring counts)")
        check(value(samples, "tpfabric_groups", state="open") == 1, "tpfabric_groups{state=open} == 1 while C is open")
        check(value(samples, "tpfabric_regions") == 2, "tpfabric_regions == 2 while C is open")
        doc = json.loads(ctl("status", "--json", "--socket", sock).stdout)
        layout = json.loads(ctl("layout", "--world", "2", "--max-bytes", str(doc["groups"][0]["agreed_cap"]), "--json").stdout)
        check(value(samples, "tpfabric_region_bytes", kind="host") == 2 * layout["region_bytes"],
              f"tpfabric_region_bytes{{kind=host}} == 2 x {layout['region_bytes']}")
        check(value(samples, "tpfabric_region_bytes", kind="device") == 0, "tpfabric_region_bytes{kind=device} == 0")
        check(value(samples, "tpfabric_queue_pairs") == 0, "tpfabric_queue_pairs == 0 (one node)")

        # D: refused while C holds the daemon's only group.
        res = finish(start_ranks(sock, 2, ["--mode", "gather", "--iters", "5", "--sizes", "64"]))
        check(all(rc == 1 and lines and "error=Unavailable" in lines[0] for rc, lines in res), f"group D: refused {res}")
        live.refused["Unavailable"] = 2
        live.fallbacks[("Unavailable", "unavailable")] = 2.0
        # Each refusal in the journal too, naming the rank and why: where the refusal alert leads.
        log.flush()
        with open(os.path.join(work, "daemon.log")) as f:
            refusals = [l for l in f if "refused rank" in l and "Unavailable: daemon serves its maximum of 1 groups (daemon.max_groups)" in l]
        check(len(refusals) == 2, f"the daemon logged group D's two refusals: {refusals}")
        # D's reports precede its connections' close: once only C's ranks and this scrape are left, both are in.
        samples = wait_until(sock, lambda s: value(s, "tpfabric_clients") == 3, "group D's connections are gone")
        check_counters(samples, live, "D refused while C is open")

        # C finishes; nothing is open any more, every counter stays.
        open(go, "w").close()
        res = finish(procs)
        procs = []
        check(all(rc == 0 and lines == [f"RESULT rank={r} ok calls=24"] for r, (rc, lines) in enumerate(res)),
              f"group C: both ranks ok {res}")
        for _ in range(2):
            e.rank_calls("sum", sizes_c, 24)
        e.refused, e.fallbacks = live.refused, live.fallbacks
        samples = wait_until(sock, idle, "group C is gone")
        check_counters(samples, e, "every group closed (lifetime counters)")
        # Every family (each labelled one has a series by now, but tpfabric_adoption_refusals_total: no daemon
        # restarted here, test_restart) has HELP text and a tpfabric_ name.
        _, families, _ = scrape(sock)
        for fam in families:
            check(fam.name.startswith("tpfabric_") and fam.documentation, f"{fam.name}: tpfabric_ name and HELP")
        check(len(families) == 26, f"26 metric families (got {len(families)}: {[f.name for f in families]})")
        check(value(samples, "tpfabric_groups_adopted_total") == 0, "no group re-adopted (no daemon restarted)")
        check(value(samples, "tpfabric_peer_rejoins_total") == 0, "no other node's daemon rejoined (one daemon)")
        check(value(samples, "tpfabric_proxy_carry_threads") == 2, "the default carry threads (proxy.carry_threads 2)")
        check(value(samples, "tpfabric_regions") == 0 and value(samples, "tpfabric_region_bytes", kind="host") == 0,
              "no regions left")
        busy = value(samples, "tpfabric_proxy_busy_seconds_total")
        uptime = json.loads(ctl("status", "--json", "--socket", sock).stdout)["daemon"]["uptime_s"]
        check(0 < busy <= uptime + 0.01, f"proxy busy {busy} s within the uptime {uptime} s")
        completed = sum(e.calls.values()) - sum(e.failed.values())
        doorbells = value(samples, "tpfabric_proxy_doorbells_total")
        if os.environ.get("TPF_HOST_DIRECT") == "0":
            check(doorbells >= completed, f"every completed call rang a doorbell (TPF_HOST_DIRECT=0; {doorbells})")
        else:  # one-node host groups: the ranks write into each other's regions, the proxy carries nothing
            check(doorbells == 0, f"host-direct ranks on one node rang no doorbell (got {doorbells})")

        # Exit status and error lines as `tpfabricctl status`.
        r = ctl("metrics", "--socket", os.path.join(work, "nothing.sock"))
        check(r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1 and r.stderr.startswith("tpfabricctl: "),
              f"no daemon: exit 1 and one line ({r.returncode}, {r.stderr!r})")
        r = ctl("metrics", "--no-such-option")
        check(r.returncode == 2 and r.stderr.startswith("tpfabricctl: "), f"bad usage: exit 2 ({r.returncode}, {r.stderr!r})")
        r = ctl("metrics", "--help")
        check(r.returncode == 0 and "Prometheus" in r.stdout, "--help: exit 0, says what it prints")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        daemon.terminate()
        try:
            rc = daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            rc = daemon.wait()
        log.close()
        if FAILURES or rc != 0:
            print(f"tpfabricd exited {rc}; its log:")
            with open(os.path.join(work, "daemon.log")) as f:
                print(f.read()[-20000:])
        shutil.rmtree(work, ignore_errors=True)
    check(rc == 0, "tpfabricd stopped cleanly on SIGTERM")
    print(f"{len(FAILURES)} check(s) failed" if FAILURES else "every check passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
