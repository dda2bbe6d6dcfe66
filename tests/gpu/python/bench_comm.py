"""One rank of the tpfabric.torch benchmark: µs per call inside a CUDA graph, the Communicator beside torch.distributed (NCCL).

    bench_comm.py --socket PATH [--calls 100] [--replays 5] [--timing synced|pipelined] [--backend nccl|gloo]
                  [--gpu-route default|auto|ipc|proxy]

One process per GPU (tests/gpu/python/run.sh starts them; torch.distributed
from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). For each size 4 KiB ..
512 KiB (a rank's shard for the all-gather, the tensor for the bf16 sum),
each way captures --calls back-to-back calls on the same buffers into one
torch.cuda.graph, replays it once to warm up, then times --replays replays,
each between two CUDA events; a call's time is a replay's time / calls, the
best replay and the mean. --timing synced (default) synchronises after each
replay, exactly as tpf-gpubench's timeGraph (best of 5); pipelined replays
back to back. Beside the Communicator, the same graph built from direct
calls of the C ABI through ctypes (tpf_all_gather_async /
tpf_all_reduce_sum_async on the Communicator's handle, same buffers, same
stream): the Python layer's own cost inside a graph is the difference of
those two columns, measured in one process. A last column times the C ABI
calls in a graph captured and launched through the CUDA runtime (ctypes on
libcudart, as tpf-gpubench), not torch.cuda.graph, and the last the same on
buffers from cudaMalloc instead of torch's allocator. Rank 0 prints the table (ROW
lines) with the path the Communicator's calls took. --backend gloo (ranks sharing one GPU under MPS, where NCCL refuses
two ranks of a communicator on one GPU): the Communicator alone, its
torch columns "-"; run.sh prints tpf-gpubench's C++ rows of the same sizes
in the same run, for the Python layer's cost inside a graph.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

import torch

if not torch.cuda.is_available():
    print("SKIP: no CUDA device visible to torch")
    sys.exit(77)

import torch.distributed as dist  # noqa: E402

from tpfabric import _lib as tpfabric_lib  # noqa: E402
from tpfabric.torch import Communicator  # noqa: E402

BF16 = tpfabric_lib.DTYPE_BF16


def raw_check(code: int) -> None:
    if code != 0:
        raise RuntimeError(f"C ABI call failed: tpf_errc {code}")

SIZES = [4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10]


def per_call_us(fn: Callable[[], None], calls: int, replays: int, synced: bool = True) -> "tuple[float, float]":
    """(best, mean) µs per call over the replays, each replay timed alone (as bench/gpu's best of N)."""
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
    laps = []
    if synced:  # as tpf-gpubench's timeGraph: record, launch, record, synchronize, each replay
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(replays):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            laps.append(start.elapsed_time(end) * 1000.0 / calls)
    else:
        events = [torch.cuda.Event(enable_timing=True) for _ in range(replays + 1)]
        events[0].record()
        for i in range(replays):
            graph.replay()
            events[i + 1].record()
        torch.cuda.synchronize()
        laps = [events[i].elapsed_time(events[i + 1]) * 1000.0 / calls for i in range(replays)]
    return min(laps), sum(laps) / replays


class RuntimeGraph:
    """A graph captured and launched through the CUDA runtime itself (ctypes on
    torch's libcudart), as tpf-gpubench's timeGraph does, not torch.cuda.graph."""

    def __init__(self) -> None:
        import ctypes

        self.rt = ctypes.CDLL("libcudart.so.13")
        self.c = ctypes

    def per_call_us(self, fn: Callable[[], None], calls: int, replays: int) -> float:
        c, rt = self.c, self.rt
        stream = torch.cuda.Stream()
        st = c.c_void_p(stream.cuda_stream)
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        stream.synchronize()
        graph, exe = c.c_void_p(), c.c_void_p()

        def ck(err: int) -> None:
            if err != 0:
                raise RuntimeError(f"CUDA runtime error {err}")

        ck(rt.cudaStreamBeginCapture(st, 1))  # cudaStreamCaptureModeThreadLocal, as tpf-gpubench
        with torch.cuda.stream(stream):
            for _ in range(calls):
                fn()
        ck(rt.cudaStreamEndCapture(st, c.byref(graph)))
        ck(rt.cudaGraphInstantiate(c.byref(exe), graph, c.c_ulonglong(0)))
        ck(rt.cudaGraphLaunch(exe, st))
        ck(rt.cudaStreamSynchronize(st))
        dist.barrier()
        best = 1e30
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(replays):
            start.record(stream)
            ck(rt.cudaGraphLaunch(exe, st))
            end.record(stream)
            end.synchronize()
            best = min(best, start.elapsed_time(end) * 1000.0 / calls)
        rt.cudaGraphExecDestroy(exe)
        rt.cudaGraphDestroy(graph)
        return best

    def malloc(self, nbytes: int) -> int:
        """Device memory from cudaMalloc itself (as tpf-gpubench's buffers), not torch's caching allocator."""
        p = self.c.c_void_p()
        if self.rt.cudaMalloc(self.c.byref(p), self.c.c_size_t(nbytes)) != 0:
            raise RuntimeError("cudaMalloc failed")
        if self.rt.cudaMemset(p, 0, self.c.c_size_t(nbytes)) != 0:
            raise RuntimeError("cudaMemset failed")
        return int(p.value)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--timing", choices=["synced", "pipelined"], default="synced")
    ap.add_argument("--gpu-route", choices=["default", "auto", "ipc", "proxy"], default="default")
    ap.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group(a.backend)
    comm = Communicator(device=dev, socket_path=a.socket, gpu_route=a.gpu_route)
    nccl = a.backend == "nccl"
    if rank == 0:
        print(f"INFO {comm!r}; {torch.cuda.get_device_name(dev)}; torch {torch.__version__}; "
              f"{a.calls} calls a graph, best of {a.replays} replays, {a.timing}", flush=True)
        print("ROW op size_bytes tpfabric_us torch_nccl_us ratio tpfabric_mean_us torch_nccl_mean_us path c_abi_us "
              "c_abi_runtime_graph_us c_abi_runtime_graph_cudamalloc_us", flush=True)
    runtime = RuntimeGraph()
    mx, my = runtime.malloc(SIZES[-1]), runtime.malloc(world * SIZES[-1])  # cudaMalloc'd send / recv
    synced = a.timing == "synced"
    lib, h = tpfabric_lib.lib, comm._g._handle()  # the C ABI beside the Communicator: same handle, buffers, stream
    for op in ("all_gather", "all_reduce_bf16"):
        for size in SIZES:
            if op == "all_gather":
                x = torch.zeros(size, dtype=torch.uint8, device=dev)
                y = torch.empty(world * size, dtype=torch.uint8, device=dev)
                ours: Callable[[], None] = lambda: comm.all_gather_into_tensor(y, x)  # noqa: E731
                theirs: Callable[[], None] = lambda: dist.all_gather_into_tensor(y, x)  # noqa: E731
                raw: Callable[[], None] = lambda: raw_check(  # noqa: E731
                    lib.tpf_all_gather_async(h, x.data_ptr(), y.data_ptr(), size, torch.cuda.current_stream().cuda_stream))
                rawm: Callable[[], None] = lambda: raw_check(  # noqa: E731
                    lib.tpf_all_gather_async(h, mx, my, size, torch.cuda.current_stream().cuda_stream))
            else:
                x = torch.zeros(size // 2, dtype=torch.bfloat16, device=dev)  # zeros: no overflow over many calls
                ours = lambda: comm.all_reduce(x)  # noqa: E731
                theirs = lambda: dist.all_reduce(x)  # noqa: E731
                raw = lambda: raw_check(lib.tpf_all_reduce_sum_async(  # noqa: E731
                    h, x.data_ptr(), x.data_ptr(), size // 2, BF16, torch.cuda.current_stream().cuda_stream))
                rawm = lambda: raw_check(lib.tpf_all_reduce_sum_async(  # noqa: E731
                    h, mx, my, size // 2, BF16, torch.cuda.current_stream().cuda_stream))
            before = dict(comm.calls)
            t_ours, m_ours = per_call_us(ours, a.calls, a.replays, synced)
            path = "fabric" if comm.calls["torch.distributed"] == before["torch.distributed"] else "torch.distributed"
            t_raw = per_call_us(raw, a.calls, a.replays, synced)[0] if path == "fabric" else None
            t_rt = runtime.per_call_us(raw, a.calls, a.replays) if path == "fabric" else None
            t_rtm = runtime.per_call_us(rawm, a.calls, a.replays) if path == "fabric" else None
            if nccl:
                t_theirs, m_theirs = per_call_us(theirs, a.calls, a.replays, synced)
                row = f"{t_ours:.2f} {t_theirs:.2f} {t_ours / t_theirs:.2f} {m_ours:.2f} {m_theirs:.2f}"
            else:  # gloo: torch.distributed's calls are not capturable on CUDA tensors
                row = f"{t_ours:.2f} - - {m_ours:.2f} -"
            if rank == 0:
                extra = " ".join("-" if t is None else f"{t:.2f}" for t in (t_raw, t_rt, t_rtm))
                print(f"ROW {op} {size} {row} {path} {extra}", flush=True)
    comm.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
