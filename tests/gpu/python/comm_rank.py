"""One rank of the tpfabric.torch GPU tests (tests/gpu/python/run.sh starts W of them).

    comm_rank.py --backend nccl|gloo --socket PATH --scenario data|graph|graphabort|graphrestart|fallback|disable
                 [--disable-rank R]

torch.distributed from the environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT); rank r on GPU r % device_count. nccl: one process per GPU.
gloo: several ranks on one GPU under MPS (NCCL refuses two ranks of one
communicator on one GPU); the records and the fallback calls then cross
through gloo (CUDA tensors staged through the host by gloo itself).

Scenarios (each rank judges itself; exit 0 pass, 1 fail, 77 no CUDA):
  data      sizes 16 B .. 512 KiB: all_gather_into_tensor equal to
            torch.distributed's gather byte for byte; f32/f16/bf16 sums that
            took the fabric equal to the rank-order reference (written here)
            and identical on every rank; in place and out of place.
  graph     one torch.cuda.graph of mixed sizes and ops, replayed 64 times
            with new inputs, every output checked after every replay, and
            healthy() read at each replay's sync point.
  graphabort  the same graph; the last rank aborts the group before replay
            20 (and goes on replaying, so that the torch.distributed calls in
            the graph still pair): at each replay's sync point no output is
            wrong while healthy() says True, and at the end health() names
            Aborted and the aborter on every rank.
  graphrestart  the graph replayed 1,000 times, one every 2 ms, READY after
            replay 5; run.sh then SIGKILLs tpfabricd and starts it again on
            the same socket: the group is re-adopted, and every replay is
            right and healthy() True at its sync point, with the same graph.
  fallback  --socket names a stopped daemon: every call through
            torch.distributed, results right (nccl: also inside a graph).
  disable   TPF_DISABLE=1 on --disable-rank only: every rank falls back.
Prints RESULT lines (run.sh collects them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import List, Optional, Tuple

import torch

if not torch.cuda.is_available():
    print("SKIP: no CUDA device visible to torch")
    sys.exit(77)

import torch.distributed as dist  # noqa: E402

import tpfabric  # noqa: E402
from tpfabric.torch import Communicator  # noqa: E402

SIZES = [16, 100, 4096, 16384, 65536, 131072, 262144, 524288]  # bytes of a shard / of the summed tensor
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def hard_values(rank: int, call: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Mixed magnitudes and signs (the order of addition shows), on the CPU, deterministic per (rank, call)."""
    g = torch.Generator().manual_seed(100003 * call + rank)
    scale = 0.25 if dtype == torch.float16 else 1.0
    v = torch.randn(n, generator=g) * torch.exp2(torch.randint(-8, 9, (n,), generator=g).float()) * scale
    return v.to(dtype)


def int_values(rank: int, call: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Small integers: exact sums in any order (for calls that go to torch.distributed)."""
    return ((torch.arange(n) * 7 + rank * 3 + call) % 23 - 11).to(dtype)


def rank_order_sum(rows: List[torch.Tensor]) -> torch.Tensor:
    """f32 accumulation in rank order, one rounding to the dtype at the end (CPU: IEEE adds, RNE conversion)."""
    acc = rows[0].float()
    for r in rows[1:]:
        acc = acc + r.float()
    return acc.to(rows[0].dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.cpu().contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8))


class Ranks:
    def __init__(self, backend: str) -> None:
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.device = torch.device("cuda", self.rank % torch.cuda.device_count())
        torch.cuda.set_device(self.device)
        dist.init_process_group(backend)
        self.backend = backend
        self.failures: List[str] = []

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)
            print(f"FAIL rank {self.rank}: {what}", flush=True)

    def gather_reference(self, inp: torch.Tensor) -> torch.Tensor:
        """torch.distributed's own all-gather of inp (NCCL: all_gather_into_tensor; gloo: through the host)."""
        if self.backend == "nccl":
            out = torch.empty(self.world * inp.numel(), dtype=inp.dtype, device=inp.device)
            dist.all_gather_into_tensor(out, inp)
            return out
        rows = [torch.empty_like(inp, device="cpu") for _ in range(self.world)]
        dist.all_gather(rows, inp.cpu())
        return torch.cat(rows)

    def identical_everywhere(self, t: torch.Tensor) -> bool:
        rows = self.gather_reference(t.contiguous().view(-1).view(torch.uint8)).view(self.world, -1).cpu()
        return all(torch.equal(rows[0], rows[q]) for q in range(1, self.world))


def scenario_data(r: Ranks, comm: Communicator) -> None:
    fabric_sums = 0
    for call, nbytes in enumerate(SIZES):
        inp = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(call * 31 + r.rank))
        inp = inp.to(r.device)
        out = torch.full((r.world * nbytes,), 0xA5, dtype=torch.uint8, device=r.device)
        comm.all_gather_into_tensor(out, inp)
        r.expect(same_bits(out, r.gather_reference(inp)), f"all_gather of {nbytes} B differs from torch.distributed's")
        for dtype in DTYPES:
            n = max(1, nbytes // torch.tensor([], dtype=dtype).element_size())
            for in_place in (True, False):
                before = comm.calls["fabric"]
                x = hard_values(r.rank, call, n, dtype).to(r.device)
                if in_place:
                    y = comm.all_reduce(x)
                else:
                    y = comm.all_reduce(x, out=torch.empty_like(x))
                    r.expect(same_bits(x, hard_values(r.rank, call, n, dtype)), "out of place changed its input")
                torch.cuda.synchronize()
                what = f"{dtype} sum of {n} ({'in place' if in_place else 'out of place'})"
                rows = [hard_values(q, call, n, dtype) for q in range(r.world)]
                if comm.calls["fabric"] > before:  # the fabric's: rank order, bit for bit, the same everywhere
                    fabric_sums += 1
                    r.expect(same_bits(y, rank_order_sum(rows)), f"{what} differs from the rank-order reference")
                    r.expect(r.identical_everywhere(y), f"{what} differs between ranks")
                else:  # torch.distributed's, in its own order: within its rounding
                    bound = 2 * r.world * torch.finfo(dtype).eps * sum(q.float().abs() for q in rows)
                    err = (y.cpu().float() - sum(q.float() for q in rows)).abs()
                    r.expect(bool((err <= bound).all()), f"{what} (torch.distributed) off by {err.max().item()}")
    r.expect(fabric_sums > 0, "no sum took the fabric")
    print(f"RESULT rank {r.rank} data: {comm.calls['fabric']} calls by the fabric, "
          f"{comm.calls['torch.distributed']} by torch.distributed, cap {comm.agreed_cap}", flush=True)


# (op, dtype, bytes): 64 KiB and less take the fabric at any W; 1 MiB is above the default cap (NCCL groups only).
GRAPH_OPS: List[Tuple[str, torch.dtype, int]] = [
    ("all_reduce", torch.bfloat16, 4096), ("all_gather", torch.uint8, 100), ("all_reduce", torch.float32, 65536),
    ("all_gather", torch.bfloat16, 16384), ("all_reduce", torch.float16, 1008), ("all_reduce", torch.bfloat16, 1 << 20),
]


def scenario_graph(r: Ranks, comm: Communicator, replays: int = 64, abort_at: Optional[int] = None,
                   ready_at: Optional[int] = None) -> None:
    ops = list(GRAPH_OPS)
    esz = {d: torch.tensor([], dtype=d).element_size() for d in (torch.uint8, *DTYPES)}

    def buffers() -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        ins = [torch.zeros(b // esz[d], dtype=d, device=r.device) for _, d, b in ops]
        outs = [torch.empty((r.world if op == "all_gather" else 1) * x.numel(), dtype=x.dtype, device=r.device)
                for (op, _, _), x in zip(ops, ins)]
        return ins, outs

    def issue(fabric: List[bool]) -> None:
        for (op, _, _), x, y in zip(ops, ins, outs):
            before = comm.calls["fabric"]
            if op == "all_gather":
                comm.all_gather_into_tensor(y, x)
            else:
                comm.all_reduce(x, out=y)
            fabric.append(comm.calls["fabric"] > before)

    ins, outs = buffers()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    warm: List[bool] = []
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph wants
        issue(warm)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if r.backend != "nccl":  # gloo calls are not capturable: only what the fabric takes
        ops = [op for op, f in zip(ops, warm) if f]
        ins, outs = buffers()
    fabric: List[bool] = []
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        issue(fabric)
    for rep in range(replays):
        rows_of = []
        for i, ((op, d, _), x) in enumerate(zip(ops, ins)):
            gen = hard_values if (fabric[i] or op == "all_gather") else int_values
            rows = [gen(q, 1000 * rep + i, x.numel(), d) if d != torch.uint8 else
                    torch.randint(0, 256, (x.numel(),), dtype=d, generator=torch.Generator().manual_seed(rep * 977 + i * 13 + q))
                    for q in range(r.world)]
            x.copy_(rows[r.rank])
            rows_of.append(rows)
        if rep == abort_at and r.rank == r.world - 1:
            comm.abort()
        if rep == ready_at:  # run.sh kills and restarts the daemon from here on
            print(f"READY rank {r.rank}", flush=True)
        if ready_at is not None:
            time.sleep(0.002)
        graph.replay()
        torch.cuda.synchronize()  # the engine's own sync point
        healthy = comm.healthy()  # no sync of its own, no CUDA call
        # The abort may land while another rank still waits in replay
        # abort_at - 1 (it is not queued behind the aborter's last shards, as
        # in the host tests): from there on a replay may fail, never silently.
        strict = abort_at is None or rep + 2 <= abort_at
        r.expect(healthy or not strict, f"replay {rep}: health {comm.health()} before any failure")
        for i, ((op, d, b), y) in enumerate(zip(ops, outs)):
            want = torch.cat(rows_of[i]) if op == "all_gather" else rank_order_sum(rows_of[i])
            right = same_bits(y, want)
            what = f"replay {rep}: {op} {d} {b} B ({'fabric' if fabric[i] else 'torch.distributed'})"
            if strict:
                r.expect(right, f"{what} wrong")
            else:  # a failed call writes nothing: never so while the word says healthy
                r.expect(right or not healthy, f"{what} wrong while healthy() says True")
        if r.failures:
            break
    if abort_at is None:
        comm.check()
        name = "graph" if ready_at is None else "graphrestart"
        print(f"RESULT rank {r.rank} {name}: {len(ops)} ops ({sum(fabric)} by the fabric) x {replays} replays", flush=True)
        return
    health = comm.health()
    r.expect(health.name == "Aborted" and health.rank == r.world - 1, f"health after the abort: {health}")
    try:
        comm.check()
        r.expect(False, "check() raised nothing after the abort")
    except tpfabric.Aborted:
        pass
    print(f"RESULT rank {r.rank} graphabort: {len(ops)} ops x {replays} replays, abort before replay {abort_at}: {health}",
          flush=True)


def scenario_fallback(r: Ranks, comm: Communicator, why: str) -> None:
    r.expect(comm.path == "torch.distributed" and comm.reason is not None and why in comm.reason,
             f"expected a fallback naming {why!r}: path {comm.path}, reason {comm.reason}")
    for call, nbytes in enumerate([16, 4096, 65536]):
        inp = int_values(r.rank, call, nbytes // 4, torch.float32).to(r.device)
        out = torch.empty(r.world * inp.numel(), device=r.device)
        comm.all_gather_into_tensor(out, inp)
        r.expect(same_bits(out, r.gather_reference(inp)), f"fallback gather of {nbytes} B")
        for dtype in DTYPES:
            x = int_values(r.rank, call, nbytes // 4, dtype).to(r.device)
            comm.all_reduce(x)
            r.expect(same_bits(x, rank_order_sum([int_values(q, call, nbytes // 4, dtype) for q in range(r.world)])),
                     f"fallback {dtype} sum of {nbytes} B")
    if r.backend == "nccl":  # torch.distributed's NCCL calls inside the graph
        x = torch.zeros(1024, device=r.device)
        y = torch.empty_like(x)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            comm.all_reduce(x, out=y)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            comm.all_reduce(x, out=y)
        for rep in range(8):
            x.copy_(int_values(r.rank, rep, 1024, torch.float32))
            graph.replay()
            torch.cuda.synchronize()
            r.expect(same_bits(y, rank_order_sum([int_values(q, rep, 1024, torch.float32) for q in range(r.world)])),
                     f"fallback graph replay {rep}")
    r.expect(comm.calls["fabric"] == 0, "a call took the fabric after a fallback")
    comm.check()
    print(f"RESULT rank {r.rank} fallback: {comm.calls['torch.distributed']} calls by torch.distributed ({comm.reason})", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["nccl", "gloo"], required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--scenario", choices=["data", "graph", "graphabort", "graphrestart", "fallback", "disable"], required=True)
    ap.add_argument("--disable-rank", type=int, default=-1)
    a = ap.parse_args()
    r = Ranks(a.backend)
    if r.rank == a.disable_rank:
        os.environ["TPF_DISABLE"] = "1"
    try:
        comm = Communicator(device=r.device, socket_path=a.socket, timeout_ms=10000)
        print(f"INFO rank {r.rank} {comm!r} library {tpfabric.library_path()}", flush=True)
        if a.scenario == "data":
            r.expect(comm.path == "fabric", f"path {comm.path}: {comm.reason}")
            scenario_data(r, comm)
        elif a.scenario == "graph":
            r.expect(comm.path == "fabric", f"path {comm.path}: {comm.reason}")
            scenario_graph(r, comm)
        elif a.scenario == "graphabort":
            r.expect(comm.path == "fabric", f"path {comm.path}: {comm.reason}")
            scenario_graph(r, comm, abort_at=20)
        elif a.scenario == "graphrestart":
            r.expect(comm.path == "fabric", f"path {comm.path}: {comm.reason}")
            scenario_graph(r, comm, replays=1000, ready_at=5)
        elif a.scenario == "fallback":
            scenario_fallback(r, comm, "")
        else:
            scenario_fallback(r, comm, f"TPF_DISABLE=1 on rank {a.disable_rank}")
        comm.close()
    except Exception:  # noqa: BLE001 - reported, and the rank fails
        r.failures.append(traceback.format_exc())
        print(f"FAIL rank {r.rank}:\n{r.failures[-1]}", flush=True)
    dist.destroy_process_group()
    rc = 1 if r.failures else 0
    # Leave without the interpreter's teardown: torch's own threads have
    # aborted it after a finished run ("terminate called without an active
    # exception" once in W = 4 disable, 2026-12-01, after every RESULT line).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
