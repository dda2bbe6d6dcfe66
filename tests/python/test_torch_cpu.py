"""torch (CPU build) against the real tpfabricd: CPU tensors on host groups, and the Communicator over gloo.

The Communicator opens through torch.distributed itself (a gloo group: its
records cross as CPU byte tensors) and takes the calls that fit; the rest,
and every call after a fallback, go to torch.distributed. Which way each call
went is counted by wrapping torch.distributed's collectives in the rank, so
a call that silently took the other path fails the test. Sums that go
through the fabric are checked bit for bit against refs.py; those through
gloo use integer-valued data, exact in any order of addition. The
Communicator's refusals (an out of another shape, CUDA on a torch without it,
a fork()ed child) are the same whichever path a call would take.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List

import numpy as np
import pytest

import refs
from tpf_testing import Daemon, free_port, in_child, run_ranks


def _torch_of(a: np.ndarray, bf16: bool = False) -> Any:
    import torch

    if bf16:  # bf16 bits (uint16) -> a bfloat16 tensor
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _bits(t: Any) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy().view({4: np.uint32, 2: np.uint16, 1: np.uint8, 8: np.uint64}[t.element_size()])


def rank_host_tensors(rank: int, world: int, sock: str, port: int) -> None:
    import torch

    import tpfabric

    with tpfabric.Group(rank, world, 16384, f"127.0.0.1:{port}", socket_path=sock) as g:
        inp = _torch_of(refs.values_f32(rank, 1, 1000))
        out = torch.empty(world, 1000)
        g.all_gather(out, inp)
        want = np.stack([refs.values_f32(q, 1, 1000) for q in range(world)])
        assert np.array_equal(_bits(out), want.view(np.uint32))
        rows = [refs.values_f32(q, 2, 999) for q in range(world)]
        x = _torch_of(rows[rank])
        g.all_reduce_sum(x, x)
        assert np.array_equal(_bits(x), refs.sum_f32(rows).view(np.uint32))
        rows16 = [refs.values_f16(q, 3, 4096) for q in range(world)]
        y = torch.empty(4096, dtype=torch.float16)
        g.all_reduce_sum(y, _torch_of(rows16[rank]))
        assert np.array_equal(_bits(y), refs.sum_f16(rows16).view(np.uint16))
        rowsb = [refs.values_bf16(q, 4, 4096) for q in range(world)]
        z = torch.empty(4096, dtype=torch.bfloat16)
        g.all_reduce_sum(z, _torch_of(rowsb[rank], bf16=True))  # dtype from the tensor
        assert np.array_equal(_bits(z), refs.sum_bf16(rowsb))
        with pytest.raises(ValueError, match="not contiguous"):
            g.all_gather(out, torch.zeros(1000, 2)[:, 0])


def test_host_group_takes_cpu_tensors(daemon: Daemon) -> None:
    run_ranks(rank_host_tensors, 2, daemon.socket, free_port())


def test_empty_refuses_a_torch_dtype_by_name() -> None:
    import torch

    import tpfabric

    # empty() makes numpy arrays; a torch dtype is told apart from numpy's "Cannot interpret" and pointed to torch.
    with pytest.raises(TypeError, match=r"torch\.bfloat16: a torch dtype; .*torch\.empty"):
        tpfabric.empty(4, torch.bfloat16)
    with pytest.raises(TypeError, match="a torch dtype"):
        tpfabric.zeros(4, torch.float32)


def _init_gloo(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


class _Counted:
    """Counts calls of torch.distributed's collectives (the Communicator calls them through the module)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.calls: Dict[str, int] = {}
        for name in ("all_reduce", "all_gather", "all_gather_into_tensor"):
            real = getattr(dist, name)

            def counted(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
                self.calls[_name] = self.calls.get(_name, 0) + 1
                return _real(*a, **k)

            setattr(dist, name, counted)

    def total(self) -> int:
        return sum(self.calls.values())


def _ints(rank: int, n: int, dtype: Any) -> Any:
    """Small integers: sums exact in any order, in f32 and f16."""
    import torch

    return ((torch.arange(n) * 7 + rank * 3) % 23 - 11).to(dtype)


def _int_sum(world: int, n: int, dtype: Any) -> Any:
    return sum(_ints(q, n, dtype).double() for q in range(world)).to(dtype)


def rank_communicator(rank: int, world: int, sock: str, port: int) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    import tpfabric
    from tpfabric.torch import Communicator

    _init_gloo(rank, world, port)
    count = _Counted()
    comm = Communicator(max_bytes=16384, socket_path=sock)
    assert (comm.path, comm.agreed_cap, comm.reason, comm.device) == ("fabric", 16384, None, torch.device("cpu"))
    opened_with = count.total()
    assert opened_with > 0, "the open's records did not cross through torch.distributed"

    # Through the fabric: bit-exact rank-order sums, in place and out of place; no torch.distributed call.
    before = count.total()
    rows = [refs.values_f32(q, 1, 4096) for q in range(world)]  # 16 KiB: the cap itself
    x = _torch_of(rows[rank])
    assert comm.should_use(x)
    assert comm.all_reduce(x) is x
    assert np.array_equal(_bits(x), refs.sum_f32(rows).view(np.uint32))
    rows16 = [refs.values_f16(q, 2, 1000) for q in range(world)]
    src = _torch_of(rows16[rank])
    out = torch.empty_like(src)
    assert comm.all_reduce(src, out=out) is out
    assert np.array_equal(_bits(out), refs.sum_f16(rows16).view(np.uint16))
    assert np.array_equal(_bits(src), rows16[rank].view(np.uint16)), "out of place changed the input"
    rowsb = [refs.values_bf16(q, 3, 2048) for q in range(world)]
    xb = _torch_of(rowsb[rank], bf16=True)
    comm.all_reduce(xb)
    assert np.array_equal(_bits(xb), refs.sum_bf16(rowsb))
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
        inp = (torch.arange(300) * (rank + 3)).to(dtype)
        got = torch.empty(world * 300, dtype=dtype)
        comm.all_gather_into_tensor(got, inp)
        assert torch.equal(got.view(world, 300), torch.stack([(torch.arange(300) * (q + 3)).to(dtype) for q in range(world)]))
    assert count.total() == before, f"a call that fits went to torch.distributed: {count.calls}"
    assert comm.calls == {"fabric": 7, "torch.distributed": 0}

    # The same gather through gloo gives the same bytes.
    inp = _torch_of(refs.values_f32(rank, 4, 500))
    mine, theirs = torch.empty(world, 500), [torch.empty(500) for _ in range(world)]
    comm.all_gather_into_tensor(mine, inp)
    dist.all_gather(theirs, inp)
    assert np.array_equal(_bits(mine), _bits(torch.stack(theirs)))

    # What the fabric does not take goes to torch.distributed, results still right.
    routed: List[str] = []

    def through_torch(what: str, call: Any) -> None:
        n = count.total()
        call()
        assert count.total() > n, f"{what}: expected torch.distributed"
        routed.append(what)

    big = _ints(rank, 8192, torch.float32)  # 32 KiB, above the cap
    assert not comm.should_use(big)
    through_torch("above the cap", lambda: comm.all_reduce(big))
    assert torch.equal(big, _int_sum(world, 8192, torch.float32))
    ints = _ints(rank, 100, torch.int32)
    assert not comm.should_use(ints)
    through_torch("int32 sum", lambda: comm.all_reduce(ints))
    assert torch.equal(ints, _int_sum(world, 100, torch.int32))
    grid = torch.stack([_ints(rank, 64, torch.float16)] * 2, dim=1)  # (64, 2); a column is not contiguous
    col = grid[:, 1]
    assert not comm.should_use(col)
    through_torch("non-contiguous", lambda: comm.all_reduce(col))
    assert torch.equal(grid[:, 1], _int_sum(world, 64, torch.float16)) and torch.equal(grid[:, 0], _ints(rank, 64, torch.float16))
    buf = _ints(rank, 65, torch.float32)
    mis = buf[1:]  # 4 bytes off a 16-byte boundary
    assert not comm.should_use(mis)
    through_torch("misaligned", lambda: comm.all_reduce(mis))
    assert torch.equal(buf[1:], _int_sum(world, 65, torch.float32)[1:])
    gbig = torch.full((5000,), rank, dtype=torch.float32)  # 20 KB a rank
    gout = torch.empty(world, 5000)
    through_torch("gather above the cap", lambda: comm.all_gather_into_tensor(gout, gbig))
    assert torch.equal(gout, torch.arange(world, dtype=torch.float32)[:, None].expand(world, 5000))
    assert comm.calls == {"fabric": 8, "torch.distributed": 5}
    with pytest.raises(ValueError, match="must hold world"):
        comm.all_gather_into_tensor(torch.empty(3), inp)

    # The functional kernels behind tpfabric::all_reduce / all_gather_into_tensor (the ops themselves where this
    # torch registers them): a new tensor, the input untouched, the same choice of path as the methods.
    from tpfabric import _torch_ops

    rows = [refs.values_f32(q, 5, 1024) for q in range(world)]
    x = _torch_of(rows[rank]).view(32, 32)
    summed = _torch_ops.all_reduce(x, comm._number)
    assert summed.shape == (32, 32) and summed.data_ptr() != x.data_ptr() and summed.is_contiguous()
    assert np.array_equal(_bits(summed.reshape(-1)), refs.sum_f32(rows).view(np.uint32))
    assert np.array_equal(_bits(x.reshape(-1)), rows[rank].view(np.uint32)), "the functional sum changed its input"
    big = _ints(rank, 8192, torch.float32).view(2, 4096)  # above the cap: torch.distributed, inside the kernel
    assert torch.equal(_torch_ops.all_reduce(big, comm._number), _int_sum(world, 8192, torch.float32).view(2, 4096))
    part = (torch.arange(6, dtype=torch.int16) + 100 * rank).view(3, 2)
    gathered = _torch_ops.all_gather_into_tensor(part, comm._number, world)
    assert gathered.shape == (3 * world, 2)
    assert torch.equal(gathered, torch.cat([(torch.arange(6, dtype=torch.int16) + 100 * q).view(3, 2) for q in range(world)]))
    scalar = torch.tensor(float(rank))
    assert torch.equal(_torch_ops.all_gather_into_tensor(scalar, comm._number, world), torch.arange(world, dtype=torch.float32))
    with pytest.raises(ValueError, match=f"world {world + 1}, but communicator {comm._number} has {world} ranks"):
        _torch_ops.all_gather_into_tensor(part, comm._number, world + 1)
    assert comm.calls == {"fabric": 11, "torch.distributed": 6}, comm.calls

    comm.check()
    assert comm.healthy() and comm.health().ok and not comm.health().nccl
    with comm:
        pass
    assert not comm.healthy() and comm.health().name == "Closed"  # never raises
    with pytest.raises(tpfabric.Closed):
        comm.all_reduce(x)
    with pytest.raises(tpfabric.Closed, match="the communicator was closed"):  # the op, as compiled code calls it
        _torch_ops.all_reduce(x, comm._number)
    number = comm._number
    del comm
    import gc

    gc.collect()
    with pytest.raises(tpfabric.Closed, match=f"no communicator {number} in this process"):
        _torch_ops.all_reduce(x, number)
    dist.destroy_process_group()
    return {"opened_with": opened_with, "routed": routed}


@pytest.mark.parametrize("world", [2, 3])
def test_communicator_over_gloo(daemon: Daemon, world: int) -> None:
    results = run_ranks(rank_communicator, world, daemon.socket, free_port(), timeout=120)
    assert len({r["opened_with"] for r in results}) == 1


def rank_comm_gather_v(rank: int, world: int, sock: str, port: int) -> Dict[str, int]:
    import torch
    import torch.distributed as dist

    from tpfabric import _torch_ops
    from tpfabric.torch import Communicator

    _init_gloo(rank, world, port)
    count = _Counted()
    comm = Communicator(max_bytes=16384, socket_path=sock)
    def rows_of(q: int, n: int, dtype: Any) -> Any:
        return (torch.arange(n * 5) + 1000 * q).to(dtype).view(n, 5)

    for counts, dtype, way in [([2, 0, 3][:world], torch.float32, "fabric"), ([1, 7, 4][:world], torch.bfloat16, "fabric"),
                               ([1000, 3, 900][:world], torch.float32, "torch.distributed")]:  # 20 kB rows > the cap
        want = torch.cat([rows_of(q, counts[q], dtype) for q in range(world)])
        before, n = dict(comm.calls), count.total()
        out = torch.full((sum(counts), 5), -1, dtype=dtype)
        assert comm.all_gather_v(out, rows_of(rank, counts[rank], dtype), counts) is out
        assert torch.equal(out, want), (counts, dtype)
        assert comm.calls[way] == before[way] + 1 and (count.total() > n) == (way == "torch.distributed"), (counts, comm.calls)
        got = _torch_ops.all_gather_v(rows_of(rank, counts[rank], dtype), counts, comm._number)  # the functional kernel
        assert got.shape == want.shape and torch.equal(got, want)
    with pytest.raises(ValueError, match=r"counts \[1\]: one count"):
        comm.all_gather_v(torch.empty(1, 5), rows_of(rank, 1, torch.float32)[: 1 if rank == 0 else 0], [1])
    with pytest.raises(ValueError, match=r"all_gather_v needs"):
        comm.all_gather_v(torch.empty(3, 4), rows_of(rank, 1, torch.float32), [1] * world)
    assert comm.calls == {"fabric": 4, "torch.distributed": 2}, comm.calls
    comm.close()
    dist.destroy_process_group()
    return comm.calls


def test_communicator_all_gather_v(daemon: Daemon) -> None:
    """Rows per rank (a rank with none too), packed in rank order: by the fabric within the cap, by
    torch.distributed (padded, then packed) above it; the method and the functional kernel alike."""
    assert run_ranks(rank_comm_gather_v, 3, daemon.socket, free_port(), timeout=120)[0] == {"fabric": 4, "torch.distributed": 2}


def rank_comm_fallback(rank: int, world: int, sock: str, port: int, why: str) -> str:
    import torch
    import torch.distributed as dist

    import tpfabric
    from tpfabric.torch import Communicator

    _init_gloo(rank, world, port)
    import logging

    warned: List[logging.LogRecord] = []
    collect = logging.Handler(logging.WARNING)
    collect.emit = warned.append  # type: ignore[method-assign]
    logging.getLogger("tpfabric").addHandler(collect)
    comm = Communicator(max_bytes=16384, socket_path=sock)
    logging.getLogger("tpfabric").removeHandler(collect)
    assert comm.path == "torch.distributed" and comm.agreed_cap == 0 and comm.disabled
    assert comm.reason is not None and why in comm.reason, comm.reason
    # One WARNING on the "tpfabric" logger, which names the package: the message does not again.
    assert [(r.name, r.levelname, r.getMessage()) for r in warned] == [
        ("tpfabric", "WARNING", f"rank {rank}: fabric path unavailable ({comm.reason}); torch.distributed takes this group's calls")
    ]
    count = _Counted()
    x = _ints(rank, 1000, torch.float32)
    assert not comm.should_use(x)
    comm.all_reduce(x)
    assert torch.equal(x, _int_sum(world, 1000, torch.float32))
    y = _ints(rank, 100, torch.float16)
    out = torch.empty_like(y)
    comm.all_reduce(y, out=out)
    assert torch.equal(out, _int_sum(world, 100, torch.float16)) and torch.equal(y, _ints(rank, 100, torch.float16))
    z = _ints(rank, 300, torch.bfloat16)  # gloo has no bfloat16 in torch 1.13: summed in float32
    comm.all_reduce(z)
    assert torch.equal(z, _int_sum(world, 300, torch.bfloat16))
    g = torch.empty(world, 10, dtype=torch.bfloat16)
    comm.all_gather_into_tensor(g, torch.full((10,), rank, dtype=torch.bfloat16))
    assert torch.equal(g, torch.arange(world, dtype=torch.bfloat16)[:, None].expand(world, 10))
    assert count.total() == 4 and comm.calls == {"fabric": 0, "torch.distributed": 4}, count.calls
    comm.check()  # nothing to report
    assert comm.healthy() and comm.health() == tpfabric.Health(nccl=True)  # torch.distributed's failures are its own
    comm.close()
    dist.destroy_process_group()
    return comm.reason


def test_communicator_disabled_on_one_rank(daemon: Daemon) -> None:
    before = daemon.connections()
    reasons = run_ranks(rank_comm_fallback, 3, daemon.socket, free_port(), "TPF_DISABLE=1 on rank 2",
                        env={2: {"TPF_DISABLE": "1"}}, timeout=120)
    assert len(set(reasons)) == 1
    assert daemon.connections() == before, "a rank contacted the daemon despite TPF_DISABLE=1"


def test_communicator_without_daemon(daemon: Daemon) -> None:
    run_ranks(rank_comm_fallback, 2, os.path.join(daemon.dir, "nothing-here.sock"), free_port(), "DaemonUnreachable",
              timeout=120)


def rank_comm_no_fallback(rank: int, world: int, sock: str, port: int) -> None:
    import torch.distributed as dist

    import tpfabric
    from tpfabric.torch import Communicator

    _init_gloo(rank, world, port)
    # the option, not the variable, named as what refused the fallback
    with pytest.raises(tpfabric.Unavailable, match=r"\(fallback = error in rank 0's open options\)$") as refused:
        Communicator(max_bytes=4096, socket_path=sock, fallback=False)
    assert refused.value.may_fall_back is False
    # TPF_FALLBACK=error on rank 1 alone: an error on every rank (fallback=None reads it, the library votes)
    if rank == 1:
        os.environ["TPF_FALLBACK"] = "error"
    with pytest.raises(tpfabric.Unavailable, match=r"\(TPF_FALLBACK=error on rank 1\)$") as refused:
        Communicator(max_bytes=4096, socket_path=sock)
    assert refused.value.may_fall_back is False
    # ... unless this open says fallback=True on every rank: the explicit option wins over the variable
    comm = Communicator(max_bytes=4096, socket_path=sock, fallback=True)
    assert comm.path == "torch.distributed"
    dist.destroy_process_group()


def test_communicator_fallback_error(daemon: Daemon) -> None:
    run_ranks(rank_comm_no_fallback, 2, os.path.join(daemon.dir, "nothing-here.sock"), free_port(), timeout=120)


def rank_comm_open_deadline(rank: int, world: int, sock: str, port: int) -> float:
    """Rank 0 opens alone: its open ends Timeout at open_timeout_ms, not at gloo's own timeout (30 min by default)."""
    import time

    import torch.distributed as dist

    import tpfabric
    from tpfabric.torch import Communicator

    _init_gloo(rank, world, port)
    if rank != 0:
        time.sleep(8)  # never constructs its Communicator; alive, so gloo itself sees nothing wrong
        return 0.0
    start = time.monotonic()
    with pytest.raises(tpfabric.Timeout, match="did not complete within the .* ms the open had left") as late:
        Communicator(max_bytes=4096, socket_path=sock, open_timeout_ms=2000)
    assert "does every rank of the group construct its Communicator" in str(late.value)
    return time.monotonic() - start


def test_communicator_open_honours_open_timeout(daemon: Daemon) -> None:
    took = run_ranks(rank_comm_open_deadline, 2, daemon.socket, free_port(), timeout=120)
    assert 1.5 <= took[0] <= 6.0, took  # bounded by open_timeout_ms (2 s) plus the bootstrap's grace


def rank_comm_misuse(rank: int, world: int, sock: str, port: int) -> Dict[str, Any]:
    import gc

    import torch
    import torch.distributed as dist

    import tpfabric
    from tpfabric.torch import Communicator

    _init_gloo(rank, world, port)
    # CUDA asked of a torch without it: a ValueError naming the argument, before any collective (not
    # torch's bare AssertionError). Simulated where this torch has CUDA: the check is the package's.
    if torch.cuda.is_available():
        torch.cuda.is_available = lambda: False
    for device in ("cuda", 0, "cuda:0", torch.device("cuda", 1)):
        with pytest.raises(ValueError, match="^" + re.escape(f"device={device!r}: this torch has no usable CUDA")):
            Communicator(device=device, socket_path=sock)
    with pytest.raises(ValueError, match=r"^device=-1: a CUDA device index must not be negative"):
        Communicator(device=-1, socket_path=sock)
    with pytest.raises(ValueError, match=r"^device='gpu': not a torch device"):
        Communicator(device="gpu", socket_path=sock)
    with pytest.raises(ValueError, match=r"^max_bytes=-1: must not be negative"):
        Communicator(max_bytes=-1, socket_path=sock)
    with pytest.raises(ValueError, match=r"^timeout_ms=-1: must not be negative"):
        Communicator(timeout_ms=-1, socket_path=sock)

    count = _Counted()
    comm = Communicator(max_bytes=4096, socket_path=sock)  # the default: the CPU over gloo, unchanged
    assert (comm.path, comm.device) == ("fabric", torch.device("cpu"))
    opened_with = count.total()

    # all_reduce's out must be tensor's shape on every path: below the cap (the fabric's), above it and
    # for int32 (torch.distributed's), so that no call works or fails by its size or dtype.
    for dtype, n in [(torch.float32, 64), (torch.float32, 4096), (torch.int32, 64), (torch.bfloat16, 64)]:
        x = _ints(rank, n, dtype).view(n // 4, 4)
        for out in (torch.empty(n, dtype=dtype), torch.empty(4, n // 4, dtype=dtype)):
            want = f"out is {tuple(out.shape)} {dtype} on cpu, tensor ({n // 4}, 4) {dtype} on cpu: all_reduce's out must"
            with pytest.raises(ValueError, match="^" + re.escape(want)):
                comm.all_reduce(x, out=out)
        with pytest.raises(ValueError, match="must match tensor"):
            comm.all_reduce(x, out=torch.empty(n // 4, 4, dtype=torch.float64))
        with pytest.raises(ValueError, match=r"on meta, tensor .* on cpu"):
            comm.all_reduce(x, out=torch.empty(n // 4, 4, dtype=dtype, device="meta"))
        out = torch.empty(n // 4, 4, dtype=dtype)  # the same shape works on either path
        assert comm.all_reduce(x, out=out) is out
        assert torch.equal(out, _int_sum(world, n, dtype).view(n // 4, 4))
    assert comm.calls == {"fabric": 2, "torch.distributed": 2}, comm.calls
    # all_gather_into_tensor: any shape of out on both paths; one device
    for n in (64, 2048):
        inp = _ints(rank, n, torch.float32)
        out = torch.empty(n, world)  # world * n elements, an unusual shape: fine below and above the cap
        comm.all_gather_into_tensor(out, inp)
        assert torch.equal(out.view(world, n), torch.stack([_ints(q, n, torch.float32) for q in range(world)]))
        with pytest.raises(ValueError, match=r"^out is on meta, inp on cpu"):
            comm.all_gather_into_tensor(torch.empty(world * n, device="meta"), inp)
    assert comm.calls == {"fabric": 3, "torch.distributed": 3}, comm.calls

    # A fork()ed child: every call raises at once, close() and collection leave the parent's group alone.
    forked = 0
    if rank == 0:
        parent, x = os.getpid(), _ints(rank, 64, torch.float32)
        want = rf"^Closed: this communicator was opened by process {parent}; a forked child cannot use it"

        def use_then_close() -> None:
            before = count.total()
            for call in (lambda: comm.all_reduce(x), lambda: comm.all_gather_into_tensor(torch.empty(world * 64), x),
                         comm.check, comm.abort):
                with pytest.raises(tpfabric.Closed, match=want):
                    call()
            assert not comm.should_use(x)
            assert count.total() == before, "the child called torch.distributed"
            comm.close()
            assert comm.path == "closed"

        def collected() -> None:
            nonlocal comm
            del comm
            gc.collect()

        for body in (use_then_close, collected):
            assert in_child(body) == 0, "the forked child failed (its traceback is above)"
            forked += 1
    for call in range(4):  # the parent's group, and its peer's, go on
        x = _ints(rank, 64, torch.float32)
        comm.all_reduce(x)
        assert torch.equal(x, _int_sum(world, 64, torch.float32))
    assert comm.calls["fabric"] == 7
    comm.check()

    # Closed: path and repr say so, not "torch.distributed"
    comm.close()
    assert comm.path == "closed" and comm.disabled and comm.agreed_cap == 0
    assert repr(comm).endswith(" closed>") and "path=" not in repr(comm), repr(comm)
    dist.destroy_process_group()
    return {"opened_with": opened_with, "forked": forked}


def test_communicator_misuse(daemon: Daemon) -> None:
    results = run_ranks(rank_comm_misuse, 2, daemon.socket, free_port(), timeout=120)
    assert [r["forked"] for r in results] == [2, 0]
    assert results[0]["opened_with"] == results[1]["opened_with"] > 0


def test_custom_ops_registered_where_torch_has_custom_op() -> None:
    """torch.library.custom_op (torch 2.4+): the six ops exist with fake kernels; without it (Debian's 1.13)
    the registration is skipped, said why, and nothing named tpfabric exists in torch.ops."""
    import torch

    import tpfabric.torch as tt
    from tpfabric import _torch_ops

    names = ("tpfabric::all_reduce", "tpfabric::all_reduce_out", "tpfabric::all_gather_into_tensor",
             "tpfabric::all_gather_into_tensor_out", "tpfabric::all_gather_v", "tpfabric::all_gather_v_out")
    if hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake"):
        assert tt.custom_ops == names and tt.custom_ops_skipped is None and _torch_ops.REGISTERED
        assert _torch_ops.all_reduce is torch.ops.tpfabric.all_reduce.default
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():  # the fake kernels: shapes without a communicator or a call
            x = torch.empty(4, 6, dtype=torch.bfloat16)
            assert torch.ops.tpfabric.all_reduce(x, 12345).shape == (4, 6)
            g = torch.ops.tpfabric.all_gather_into_tensor(x, 12345, 3)
            assert g.shape == (12, 6) and g.dtype == torch.bfloat16
            assert torch.ops.tpfabric.all_gather_v(x, [4, 0, 5], 12345).shape == (9, 6)
    else:
        assert tt.custom_ops == () and not _torch_ops.REGISTERED
        assert tt.custom_ops_skipped is not None and "has no torch.library.custom_op" in tt.custom_ops_skipped
        # the kernels, called directly (behind torch._disable_dynamo where torch has it)
        assert getattr(_torch_ops.all_reduce, "__wrapped__", _torch_ops.all_reduce) is _torch_ops._all_reduce
        with pytest.raises((RuntimeError, AttributeError)):
            torch.ops.tpfabric.all_reduce
    assert _torch_ops.compiling() is False


_WITHOUT_CUSTOM_OP = """
import os, sys, tempfile, torch, torch.distributed as dist
for name in ("custom_op", "register_fake"):  # as torch before 2.4 (a no-op on 1.13, which has neither)
    if hasattr(torch.library, name):
        delattr(torch.library, name)
import tpfabric.torch as tt
assert tt.custom_ops == () and "has no torch.library.custom_op" in tt.custom_ops_skipped, tt.custom_ops_skipped
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
comm = tt.Communicator(max_bytes=4096)
x = torch.arange(64, dtype=torch.float32)
assert comm.all_reduce(x) is x and torch.equal(x, torch.arange(64, dtype=torch.float32))
out = torch.empty(64)
comm.all_gather_into_tensor(out, x)
assert torch.equal(out, x) and comm.calls == {"fabric": 2, "torch.distributed": 0}, comm.calls
comm.close()
print("eager without ops:", comm.calls["fabric"], "fabric calls")
sys.stdout.flush()
os._exit(0)  # past gloo's teardown (tpf_testing._child says why)
"""


def test_without_custom_op_the_package_imports_and_works_eagerly() -> None:
    """torch.library.custom_op removed before the import (torch before 2.4): the import says why and the
    eager path works, through the same kernels (a world-1 group: no daemon)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _WITHOUT_CUSTOM_OP], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, GLOO_SOCKET_IFNAME="lo"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "eager without ops: 2 fabric calls" in r.stdout
