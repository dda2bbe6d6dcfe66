"""tpfabric's Python package with no torch: the per-call time of a W-rank ipc gather in a CUDA graph.

    bench_notorch.py --rank R --world W --bootstrap HOST:PORT --socket PATH --cudart LIBCUDART [--calls 100]
                     [--import-torch]

The C ABI through the package's Group (``all_gather_raw``), buffers from
cudaMalloc, a graph captured and launched through the CUDA runtime (ctypes on
``--cudart``), each replay timed alone between two events and synchronised,
best of 5: tpf-gpubench's ``--mode sizes`` method, from a Python process.
Beside tpf-gpubench it shows what a Python process costs without torch;
beside bench_comm.py (the Communicator, the same C ABI calls in a torch
process) what the torch program costs (docs/perf.md, 2026-12-01 07:00).
--import-torch imports torch and initialises CUDA through it first. Rank 0
prints ``ROW notorch-gather BYTES US``.
"""

from __future__ import annotations

import argparse
import ctypes as c
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--cudart", required=True, help="path of libcudart.so.13 (loaded before libtpfabric)")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--import-torch", action="store_true")
    a = ap.parse_args()
    if a.import_torch:
        import torch

        torch.cuda.init()
        torch.cuda.set_device(0)
    rt = c.CDLL(a.cudart, mode=c.RTLD_GLOBAL)  # first: libtpfabric's libcudart.so.13 is this one

    import tpfabric

    def ck(err: int) -> None:
        if err != 0:
            raise RuntimeError(f"CUDA runtime error {err}")

    big = 512 << 10
    ck(rt.cudaSetDevice(0))
    send, recv, st = c.c_void_p(), c.c_void_p(), c.c_void_p()
    ck(rt.cudaMalloc(c.byref(send), c.c_size_t(big)))
    ck(rt.cudaMalloc(c.byref(recv), c.c_size_t(a.world * big)))
    ck(rt.cudaMemset(send, 1, c.c_size_t(big)))
    ck(rt.cudaStreamCreateWithFlags(c.byref(st), 1))  # cudaStreamNonBlocking, as tpf-gpubench
    e0, e1 = c.c_void_p(), c.c_void_p()
    ck(rt.cudaEventCreate(c.byref(e0)))
    ck(rt.cudaEventCreate(c.byref(e1)))
    with tpfabric.Group(a.rank, a.world, big, a.bootstrap, buffers="device", socket_path=a.socket, gpu_route="ipc") as g:
        size = 4096
        while size <= big:
            graph, exe = c.c_void_p(), c.c_void_p()
            ck(rt.cudaStreamBeginCapture(st, 1))  # cudaStreamCaptureModeThreadLocal
            for _ in range(a.calls):
                g.all_gather_raw(send.value, recv.value, size, st.value)
            ck(rt.cudaStreamEndCapture(st, c.byref(graph)))
            ck(rt.cudaGraphInstantiate(c.byref(exe), graph, c.c_ulonglong(0)))
            ck(rt.cudaGraphLaunch(exe, st))  # warm-up
            ck(rt.cudaStreamSynchronize(st))
            best = 1e30
            for _ in range(5):
                ck(rt.cudaEventRecord(e0, st))
                ck(rt.cudaGraphLaunch(exe, st))
                ck(rt.cudaEventRecord(e1, st))
                ck(rt.cudaStreamSynchronize(st))
                ms = c.c_float()
                ck(rt.cudaEventElapsedTime(c.byref(ms), e0, e1))
                best = min(best, ms.value * 1000.0 / a.calls)
            g.check()
            rt.cudaGraphExecDestroy(exe)
            rt.cudaGraphDestroy(graph)
            if a.rank == 0:
                print(f"ROW notorch-gather {size} {best:.2f}", flush=True)
            size *= 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
