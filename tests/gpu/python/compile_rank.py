"""One rank of the tpfabric.torch compile scenario (tests/gpu/python/run.sh starts W of them).

    compile_rank.py --backend gloo|nccl --socket PATH [--json-dir DIR] [--steps 100] [--bench]

torch.distributed from the environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), rank r on GPU r % device_count, as comm_rank.py. What the
Communicator's custom ops (tpfabric::all_reduce, ...) must do inside
torch.compile, each rank judging itself (exit 0 pass, 1 fail):

  explain      torch._dynamo.explain of a function calling each collective
               (all_reduce in place and into out, all_gather_into_tensor,
               all_gather_v):
               0 graph breaks, one graph, the tpfabric op in it.
  mlp          a tensor-parallel MLP (bf16, hidden 4096: a column-parallel
               up projection, relu, a row-parallel down projection summed by
               all_reduce, the residual, a column-parallel head gathered by
               all_gather_into_tensor), compiled with fullgraph=True and with
               mode="reduce-overhead" (CUDA graphs), over --steps steps with
               new inputs: outputs bit-identical to the same model run eagerly
               through the Communicator, every call by the fabric.
  fallback     inside compiled functions: a sum above the cap, an int32 sum,
               and a communicator that fell back at open (no daemon) go to
               torch.distributed, and are right.
  --bench      (rank 0 prints) µs per step of the compiled TP MLP with the
               fabric (reduce-overhead) beside the same model with
               torch.distributed's all-reduce (gloo: eager, as gloo can be
               neither captured nor, in torch 2.11, compiled without a crash;
               nccl: reduce-overhead, on a reset dynamo cache),
               and µs per call inside one CUDA graph of the ops
               (tpfabric::all_reduce_out, tpfabric::all_reduce) beside the
               C ABI call on the same handle, buffers and stream.

Prints PASS/FAIL lines per check, RESULT lines (run.sh collects them), and
with --json-dir writes py-compile-w{W}-rank{r}.json there. A torch without
torch.compile or torch.library.custom_op prints SKIP and exits 0.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # W ranks compile at once on one machine
# One cuBLAS workspace size on every stream: the same GEMM algorithm eagerly and inside a CUDA graph's capture stream.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

if not torch.cuda.is_available():
    print("SKIP: no CUDA device visible to torch")
    sys.exit(77)

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tpfabric  # noqa: E402
import tpfabric.torch as tt  # noqa: E402
from tpfabric.torch import Communicator  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from comm_rank import Ranks, int_values, same_bits  # noqa: E402

HIDDEN, FFN, VOCAB, TOKENS = 4096, 4 * 4096, 4096, 8


def skip_reason() -> Optional[str]:
    if not hasattr(torch, "compile") or not hasattr(torch, "_dynamo"):
        return f"torch {torch.__version__} has no torch.compile"
    if not tt.custom_ops:
        return f"no tpfabric custom ops: {tt.custom_ops_skipped}"
    return None


class Checks:
    """PASS/FAIL lines and the JSON record of one rank."""

    def __init__(self, r: Ranks) -> None:
        self.r = r
        self.record: Dict[str, Any] = {"rank": r.rank, "world": r.world, "torch": torch.__version__, "checks": {}}

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.record["checks"][name] = {"ok": bool(ok), "detail": detail}
        print(f"{'PASS' if ok else 'FAIL'} rank {self.r.rank} {name}{': ' + detail if detail else ''}", flush=True)
        if not ok:
            self.r.failures.append(f"{name}: {detail}")
        return ok


def fresh() -> None:
    """Forget what Dynamo compiled (explain counts the graphs of one function, from scratch)."""
    torch._dynamo.reset()


# -- explain ------------------------------------------------------------------------------------------------
def scenario_explain(c: Checks, comm: Communicator) -> None:
    r = c.r
    x = torch.randn(64, 64, device=r.device).to(torch.bfloat16)

    def in_place(t: torch.Tensor) -> torch.Tensor:
        return comm.all_reduce(t * 2) + 1

    def into_out(t: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(t)
        comm.all_reduce(t.relu(), out=y)
        return y * 3

    def gather(t: torch.Tensor) -> torch.Tensor:
        out = torch.empty(comm.world * t.shape[0], t.shape[1], dtype=t.dtype, device=t.device)
        comm.all_gather_into_tensor(out, t + 1)
        return out.sum(dim=0)

    counts = [(q % 3) + 1 for q in range(comm.world)]  # rows per rank, alike on every rank

    def gather_v(t: torch.Tensor) -> torch.Tensor:
        out = torch.empty(sum(counts), t.shape[1], dtype=t.dtype, device=t.device)
        comm.all_gather_v(out, t[: counts[comm.rank]] * 2, counts)
        return out - 1

    for name, fn, op in [("all_reduce", in_place, "tpfabric.all_reduce"), ("all_reduce(out=)", into_out, "tpfabric.all_reduce"),
                         ("all_gather_into_tensor", gather, "tpfabric.all_gather_into_tensor"),
                         ("all_gather_v", gather_v, "tpfabric.all_gather_v")]:
        fresh()
        e = torch._dynamo.explain(fn)(x)
        code = "\n".join(g.code for g in e.graphs)
        reasons = "; ".join(str(b.reason) for b in e.break_reasons)[:300]
        c.check(f"explain {name}", e.graph_break_count == 0 and e.graph_count == 1 and op in code,
                f"{e.graph_count} graph(s), {e.graph_break_count} break(s){' (' + reasons + ')' if reasons else ''}"
                f"{'' if op in code else ', ' + op + ' not in the graph'}")
    torch.cuda.synchronize()
    comm.check()


# -- the tensor-parallel MLP --------------------------------------------------------------------------------
class TPMLP(torch.nn.Module):
    """Megatron's MLP over the Communicator: up (column-parallel) -> relu -> down (row-parallel, summed) -> + x
    -> head (column-parallel, gathered). relu and one add: eager and Inductor round alike between the matmuls."""

    def __init__(self, comm: Any, seed: int = 7, like: Optional["TPMLP"] = None) -> None:
        super().__init__()
        self.comm = comm
        if like is not None:  # the same weights (shared), other collectives: the benchmark's torch.distributed model
            self.up, self.down, self.head = like.up, like.down, like.head
            return
        w, r = comm.world, comm.rank
        g = torch.Generator().manual_seed(seed)  # the full weights, alike on every rank; each keeps its shard
        up = torch.randn(FFN, HIDDEN, generator=g) / HIDDEN ** 0.5
        down = torch.randn(HIDDEN, FFN, generator=g) / FFN ** 0.5
        head = torch.randn(VOCAB, HIDDEN, generator=g) / HIDDEN ** 0.5
        f, v = FFN // w, VOCAB // w
        dev = comm.device
        self.up = torch.nn.Parameter(up[r * f:(r + 1) * f].to(dev, torch.bfloat16), requires_grad=False)
        self.down = torch.nn.Parameter(down[:, r * f:(r + 1) * f].contiguous().to(dev, torch.bfloat16), requires_grad=False)
        self.head = torch.nn.Parameter(head[r * v:(r + 1) * v].to(dev, torch.bfloat16), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, self.up).relu()                 # [T, FFN / W]
        y = self.comm.all_reduce(F.linear(h, self.down))  # [T, HIDDEN], the partial sums added
        y = y + x
        z = F.linear(y, self.head)                      # [T, VOCAB / W]
        w = self.comm.world
        gathered = torch.empty(w * z.shape[0], z.shape[1], dtype=z.dtype, device=z.device)
        self.comm.all_gather_into_tensor(gathered, z)   # [W * T, VOCAB / W]
        return gathered.view(w, z.shape[0], z.shape[1]).permute(1, 0, 2).reshape(z.shape[0], w * z.shape[1])


class TorchCollectives:
    """torch.distributed in the Communicator's place, for the benchmark's other column."""

    def __init__(self, comm: Communicator) -> None:
        self.world, self.rank, self.device, self.group = comm.world, comm.rank, comm.device, comm.group
        self.nccl = "nccl" in comm.backend

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.nccl:
            dist.all_reduce(t, group=self.group)
            return t
        wide = t.float()  # gloo lacks bfloat16 in many releases: as the Communicator hands it over
        dist.all_reduce(wide, group=self.group)
        return t.copy_(wide)

    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
        if self.nccl:
            dist.all_gather_into_tensor(out, inp, group=self.group)
        else:  # gloo: the list form, which every release has
            dist.all_gather(list(out.view(self.world, -1).unbind(0)), inp.reshape(-1), group=self.group)
        return out


def step_input(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)  # the same activations on every rank (replicated)
    return (torch.randn(TOKENS, HIDDEN, generator=g)).to(torch.bfloat16)


def first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    diff = (a.float() - b.float()).abs()
    return f"{int((a != b).sum())} elements differ, max |diff| {diff.max().item():.3g}"


def scenario_mlp(c: Checks, comm: Communicator, steps: int) -> Dict[str, Any]:
    r = c.r
    inductor_config = getattr(getattr(torch, "_inductor", None), "config", None)
    if inductor_config is not None and hasattr(inductor_config, "emulate_precision_casts"):
        inductor_config.emulate_precision_casts = True  # bf16 rounded where eager rounds it
    model = TPMLP(comm).eval()
    inputs = [step_input(s).to(r.device) for s in range(steps)]
    with torch.no_grad():
        before = dict(comm.calls)
        eager = [model(x).clone() for x in inputs]
        torch.cuda.synchronize()
        c.check("mlp eager calls by the fabric", comm.calls["torch.distributed"] == before["torch.distributed"],
                f"{comm.calls['fabric'] - before['fabric']} fabric calls, "
                f"{comm.calls['torch.distributed'] - before['torch.distributed']} torch.distributed")
        out: Dict[str, Any] = {}
        for label, kwargs in [("fullgraph", {"fullgraph": True}),
                              ("reduce-overhead", {"fullgraph": True, "mode": "reduce-overhead"})]:
            compiled = torch.compile(model, **kwargs)
            mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
            before = dict(comm.calls)
            start = time.monotonic()
            got: List[torch.Tensor] = []
            for x in inputs:
                if mark is not None and label == "reduce-overhead":
                    mark()
                got.append(compiled(x).clone())  # a CUDA graph's output is overwritten by its next replay
            torch.cuda.synchronize()
            took = time.monotonic() - start
            bad = [s for s in range(steps) if not same_bits(got[s], eager[s])]
            detail = f"{steps} steps, first step with compilation, {took:.1f} s in all"
            if bad:
                detail += f"; steps {bad[:5]}{'...' if len(bad) > 5 else ''} differ ({first_difference(got[bad[0]], eager[bad[0]])})"
            c.check(f"mlp {label} bit-identical to eager", not bad, detail)
            c.check(f"mlp {label} calls by the fabric", comm.calls["torch.distributed"] == before["torch.distributed"],
                    f"{comm.calls['fabric'] - before['fabric']} fabric calls issued (CUDA graphs: counted at capture)")
            out[label] = compiled
        out["eager"] = model
        # The same on every rank (the gather and the rank-order sums make it so).
        c.check("mlp outputs identical on every rank", r.identical_everywhere(eager[-1]))
    comm.check()
    return out


# -- what the fabric does not take, inside compiled code ------------------------------------------------------
def scenario_fallback(c: Checks, comm: Communicator) -> None:
    r = c.r
    n = comm.agreed_cap // 4 + 1024  # f32 elements: above the cap
    big = [int_values(q, 1, n, torch.float32) for q in range(r.world)]
    ints = [int_values(q, 2, 1000, torch.int32) for q in range(r.world)]

    def sum_twice(t: torch.Tensor) -> torch.Tensor:
        return comm.all_reduce(t * 2)

    for name, rows in [("above the cap", big), ("int32", ints)]:
        f = torch.compile(sum_twice, fullgraph=True)
        before = dict(comm.calls)
        got = f(rows[r.rank].to(r.device))
        torch.cuda.synchronize()
        want = sum(q.double() for q in rows).mul(2).to(rows[0].dtype)
        went = comm.calls["torch.distributed"] - before["torch.distributed"]
        c.check(f"compiled {name} sum by torch.distributed", went == 1 and comm.calls["fabric"] == before["fabric"]
                and torch.equal(got.cpu(), want), f"{went} torch.distributed call(s), result {'right' if torch.equal(got.cpu(), want) else 'WRONG'}")

    # A communicator that fell back at open (no daemon): every compiled call to torch.distributed.
    fell = Communicator(device=r.device, socket_path="/nonexistent/tpfabricd.sock", fallback=True)
    c.check("fallback communicator at open", fell.path == "torch.distributed", f"{fell.path}: {fell.reason}")

    def through(t: torch.Tensor) -> torch.Tensor:
        y = fell.all_reduce(t + 0)
        out = torch.empty(fell.world * t.numel(), dtype=t.dtype, device=t.device)
        fell.all_gather_into_tensor(out, t)
        return torch.cat([y, out])

    f = torch.compile(through, fullgraph=True)
    rows = [int_values(q, 3, 256, torch.float32) for q in range(r.world)]
    got = f(rows[r.rank].to(r.device)).cpu()
    want = torch.cat([sum(q.double() for q in rows).float(), torch.cat(rows)])
    c.check("compiled calls after a fallback at open", torch.equal(got, want) and fell.calls == {"fabric": 0, "torch.distributed": 2},
            f"calls {fell.calls}, result {'right' if torch.equal(got, want) else 'WRONG'}")
    fell.close()
    comm.check()


# -- benchmark (rank 0 prints) ------------------------------------------------------------------------------
def per_step_us(fn: Callable[[], Any], steps: int, sync_each: bool = False) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
        if sync_each:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6 / steps


def graph_call_us(fn: Callable[[], None], calls: int = 100, replays: int = 5) -> float:
    """Best µs per call over replays of one CUDA graph holding ``calls`` calls of fn (as bench_comm.py)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    best = 1e30
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1000.0 / calls)
    return best


def bench(c: Checks, comm: Communicator, compiled: Dict[str, Any], backend: str) -> Dict[str, Any]:
    r = c.r
    rows: Dict[str, Any] = {}
    x = step_input(0).to(r.device)
    with torch.no_grad():
        model = compiled["reduce-overhead"]
        mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

        def fabric_step() -> Any:
            if mark is not None:
                mark()
            return model(x)

        print(f"INFO rank {r.rank} bench: the compiled MLP, fabric", flush=True)
        rows["mlp_fabric_reduce_overhead_us"] = per_step_us(fabric_step, 100)
        rows["mlp_fabric_fullgraph_us"] = per_step_us(lambda: compiled["fullgraph"](x), 100)
        eager_model = compiled["eager"]
        rows["mlp_fabric_eager_us"] = per_step_us(lambda: eager_model(x), 50)
        baseline = TPMLP(TorchCollectives(comm), like=eager_model).eval()
        if backend != "nccl":
            # gloo: measured eagerly. It cannot be captured in a CUDA graph, and
            # the compiled gloo model crashed torch 2.11 (a segfault inside the
            # Inductor-generated call, seen on nvidia-h200 under MPS at W = 2).
            how = "eager (gloo is neither captured nor compiled here)"
            print(f"INFO rank {r.rank} bench: the MLP over torch.distributed, {how}", flush=True)
            rows["mlp_torch_distributed_us"] = per_step_us(lambda: baseline(x), 20)
            rows["mlp_torch_distributed_how"] = how
            return bench_ops(c, comm, rows, backend, how)
        # NCCL: compiled and captured, as the fabric's; on a clean dynamo cache, so
        # that no code compiled for the fabric's model (same class, same forward) is reused.
        torch._dynamo.reset()
        kwargs: Dict[str, Any] = {"mode": "reduce-overhead"}
        how = f"torch.compile({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
        print(f"INFO rank {r.rank} bench: the MLP over torch.distributed, {how}", flush=True)
        try:
            tb = torch.compile(baseline, **kwargs)

            def torch_step() -> Any:
                if mark is not None and kwargs:
                    mark()
                return tb(x)

            rows["mlp_torch_distributed_us"] = per_step_us(torch_step, 20 if backend == "gloo" else 100)
        except Exception as e:  # noqa: BLE001 - measured eagerly instead, and said so
            how = f"eager (torch.compile failed: {type(e).__name__}: {str(e)[:120]})"
            rows["mlp_torch_distributed_us"] = per_step_us(lambda: baseline(x), 20)
        rows["mlp_torch_distributed_how"] = how
    return bench_ops(c, comm, rows, backend, how)


def bench_ops(c: Checks, comm: Communicator, rows: Dict[str, Any], backend: str, how: str) -> Dict[str, Any]:
    """The ops inside one CUDA graph beside the C ABI call on the same handle, buffers and stream; prints the table."""
    r = c.r
    from tpfabric import _lib, _torch_ops

    h = comm._g._handle()  # the benchmark's own reach past the Communicator: the C ABI beside the op
    lib, number, bf16 = _lib.lib, comm._number, _lib.DTYPE_BF16
    ops: List[Dict[str, Any]] = []
    for size in (4096, 65536, 262144):
        print(f"INFO rank {r.rank} bench: ops in a CUDA graph, {size} B", flush=True)
        t = torch.zeros(size // 2, dtype=torch.bfloat16, device=r.device)
        o = torch.empty_like(t)

        def raw() -> None:
            code = lib.tpf_all_reduce_sum_async(h, t.data_ptr(), o.data_ptr(), t.numel(), bf16,
                                                torch.cuda.current_stream().cuda_stream)
            if code:
                raise RuntimeError(f"tpf_all_reduce_sum_async: status {code}")

        row = {"op": "all_reduce_bf16", "bytes": size,
               "c_abi_us": graph_call_us(raw),
               "op_out_us": graph_call_us(lambda: _torch_ops.all_reduce_out(t, o, number)),
               "op_functional_us": graph_call_us(lambda: _torch_ops.all_reduce(t, number)),
               "communicator_us": graph_call_us(lambda: comm.all_reduce(t, out=o)),
               # Eager, back to back: what a call costs the CPU (the op's dispatch) beside the bare C ABI call.
               "eager_c_abi_us": per_step_us(raw, 200),
               "eager_communicator_us": per_step_us(lambda: comm.all_reduce(t, out=o), 200)}
        row["op_overhead_pct"] = 100.0 * (row["op_out_us"] / row["c_abi_us"] - 1.0)
        ops.append(row)
    rows["graph_calls"] = ops
    comm.check()
    if r.rank == 0:
        print(f"BENCH W={r.world} {backend}: compiled TP MLP (bf16, hidden {HIDDEN}, ffn {FFN}, {TOKENS} tokens, "
              f"all_reduce {TOKENS * HIDDEN * 2} B + all_gather {TOKENS * VOCAB // r.world * 2} B a step), µs per step:",
              flush=True)
        print(f"BENCH   fabric reduce-overhead {rows['mlp_fabric_reduce_overhead_us']:.1f}  fabric fullgraph (no CUDA graph) "
              f"{rows['mlp_fabric_fullgraph_us']:.1f}  fabric eager {rows['mlp_fabric_eager_us']:.1f}  "
              f"torch.distributed ({backend}, {how}) {rows['mlp_torch_distributed_us']:.1f}", flush=True)
        print("BENCH   inside one CUDA graph, µs per call (best of 5 replays of 100): "
              "op bytes c_abi tpfabric::all_reduce_out tpfabric::all_reduce Communicator.all_reduce overhead% "
              "| eager back to back: c_abi Communicator.all_reduce", flush=True)
        for row in ops:
            print(f"BENCH   {row['op']} {row['bytes']} {row['c_abi_us']:.2f} {row['op_out_us']:.2f} "
                  f"{row['op_functional_us']:.2f} {row['communicator_us']:.2f} {row['op_overhead_pct']:+.1f}% "
                  f"| {row['eager_c_abi_us']:.2f} {row['eager_communicator_us']:.2f}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["nccl", "gloo"], required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--json-dir", default="")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--bench", action="store_true")
    a = ap.parse_args()
    faulthandler.enable()  # a crash below Python (a signal in a native library) still prints where it was
    why = skip_reason()
    if why:
        print(f"SKIP compile: {why}", flush=True)
        return 0
    r = Ranks(a.backend)
    c = Checks(r)
    start = time.monotonic()
    try:
        # Compiling takes a rank tens of seconds, at different times on each: the fabric's waits must outlast it.
        comm = Communicator(device=r.device, socket_path=a.socket, timeout_ms=300000)
        print(f"INFO rank {r.rank} {comm!r} library {tpfabric.library_path()} torch {torch.__version__}", flush=True)
        c.check("fabric path", comm.path == "fabric", f"{comm.path} {comm.reason or ''}")
        scenario_explain(c, comm)
        compiled = scenario_mlp(c, comm, a.steps)
        scenario_fallback(c, comm)
        if a.bench:
            c.record["bench"] = bench(c, comm, compiled, a.backend)
        comm.close()
    except Exception:  # noqa: BLE001 - reported, and the rank fails
        r.failures.append(traceback.format_exc())
        print(f"FAIL rank {r.rank}:\n{r.failures[-1]}", flush=True)
    c.record["seconds"] = time.monotonic() - start
    c.record["failures"] = r.failures
    print(f"RESULT rank {r.rank} compile: {sum(v['ok'] for v in c.record['checks'].values())} of "
          f"{len(c.record['checks'])} checks passed in {c.record['seconds']:.0f} s", flush=True)
    if a.json_dir:
        os.makedirs(a.json_dir, exist_ok=True)
        with open(os.path.join(a.json_dir, f"py-compile-{a.backend}-w{r.world}-rank{r.rank}.json"), "w") as f:
            json.dump(c.record, f, indent=1)
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if r.failures else 0)  # past torch's teardown (comm_rank.py says why)


if __name__ == "__main__":
    sys.exit(main())
