"""The torch communicator: tpfabric collectives over an engine's ``torch.distributed`` process group.

::

    import torch, torch.distributed as dist
    from tpfabric.torch import Communicator

    torch.cuda.set_device(local_rank)     # first: init_process_group and Communicator use this device
    dist.init_process_group("nccl")
    comm = Communicator()                 # collective: every rank of the group
    y = comm.all_reduce(x)                # in place, on torch.cuda.current_stream()

Under ``torch.compile`` the collectives are the ``torch.library`` custom ops
``tpfabric::all_reduce`` and ``tpfabric::all_gather_into_tensor`` (functional,
with fake implementations; eager calls go through their ``*_out`` forms), so
``fullgraph=True`` and ``mode="reduce-overhead"`` trace and capture them
(:data:`custom_ops`; none before torch 2.4, where the methods work eagerly).

Opening exchanges the group's records through ``torch.distributed`` itself
(``all_gather_into_tensor`` of a byte tensor on the group's device for NCCL,
on the CPU for gloo): no extra port, no second NCCL communicator. Every call
runs on ``torch.cuda.current_stream()`` and can be captured in a CUDA graph.

A call the fabric does not take goes to ``torch.distributed`` on the same
stream, so the caller never branches: above the agreed cap, a dtype the sums
do not take, a non-contiguous or misaligned tensor, a tensor on another
device, or every call when the group fell back at open (no daemon,
``TPF_DISABLE=1`` on any rank, ...). The conditions that depend on the tensor
itself (contiguity, alignment, device) must be the same on every rank, as
they are in SPMD code where every rank makes the same calls on the same
shapes; sizes and dtypes decide alike on every rank by construction.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import time
from typing import List, Optional, Sequence, Tuple, Union

TORCH_HINT = "the Communicator needs PyTorch: apt-get install python3-torch or pip install torch (tpfabric.Group does not)"

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # as tpfabric.empty() without numpy: the fix, not only the missing name
    raise ModuleNotFoundError(f"tpfabric.torch needs torch ({e}); {TORCH_HINT}", name="torch") from e

from . import _torch_ops
from ._buffers import DType
from ._group import CLOSED_HEALTH, NO_DEADLINE, Group, Health, _RawAllGather, bootstrap_time_left_ms, forked_error
from .errors import CapMismatch, Closed, InvalidArgument, Misaligned, Unavailable

__all__ = ["Communicator", "custom_ops", "custom_ops_skipped"]

custom_ops: Tuple[str, ...] = _torch_ops.NAMES if _torch_ops.REGISTERED else ()
"""The ``torch.library`` ops this import registered (``"tpfabric::all_reduce"``, ...); empty where torch lacks
``torch.library.custom_op`` (before 2.4), where the Communicator still works eagerly and in CUDA graphs."""
custom_ops_skipped: Optional[str] = _torch_ops.SKIPPED
"""Why no op is registered (None when they are)."""

_log = logging.getLogger("tpfabric")
_REFUSED = (Misaligned, CapMismatch, InvalidArgument)  # refused at once, nothing launched, the group usable
_SUM_DTYPES = {torch.float32: DType.F32, torch.float16: DType.F16, torch.bfloat16: DType.BF16}


def _bootstrap_over(group: "dist.ProcessGroup", world: int, device: torch.device, into_tensor: bool) -> _RawAllGather:
    """The open records' all-gather through torch.distributed, on ``device`` (CUDA for NCCL, CPU for gloo)."""

    def allgather(mine: int, out: int, nbytes: int) -> None:
        if nbytes == 0:
            return
        # The open's deadline (open_timeout_ms) bounds the wait here too: a rank
        # that never constructs its Communicator would otherwise hold the others
        # for the process group's own timeout (30 min by default).
        left_ms = bootstrap_time_left_ms()
        src = torch.empty(nbytes, dtype=torch.uint8)
        ctypes.memmove(src.data_ptr(), mine, nbytes)
        src = src.to(device)
        dst = torch.empty(world * nbytes, dtype=torch.uint8, device=device)
        if into_tensor:
            work = dist.all_gather_into_tensor(dst, src, group=group, async_op=True)
        else:
            work = dist.all_gather(list(dst.chunk(world)), src, group=group, async_op=True)
        if left_ms != NO_DEADLINE:
            # Polled, not work.wait(timeout): what a timeout does there differs by
            # backend and release (NCCL's may only make the stream wait).
            deadline, nap = time.monotonic() + left_ms / 1000.0, 0.0001
            while not work.is_completed():
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"torch.distributed's all-gather of the open records did not complete within the "
                        f"{left_ms} ms the open had left (open_timeout_ms): does every rank of the group construct "
                        "its Communicator? The process group may still hold that collective: make a new one "
                        "before opening again"
                    )
                time.sleep(nap)
                nap = min(nap * 2, 0.005)
        work.wait()
        dst = dst.cpu()
        ctypes.memmove(out, dst.data_ptr(), world * nbytes)

    return _RawAllGather(allgather)


class Communicator:
    """tpfabric all-gather and all-reduce sum over a ``torch.distributed`` process group.

    Args:
        group: the process group (default: the world group). Opening is
            collective over it: every rank constructs its Communicator with
            the same ``max_bytes``, in the same order relative to other
            collectives on the group.
        device: where the tensors live. Default: the current CUDA device when
            the group's backend is NCCL, else the CPU. A CUDA device opens a
            device group (calls on ``torch.cuda.current_stream()``); the CPU a
            host group (blocking calls, as for tests and CPU engines).
        max_bytes: the largest shard this rank will pass to the fabric
            (all-gather: input bytes; all-reduce: tensor bytes). The group's
            cap (:attr:`agreed_cap`) is the minimum over ranks and daemons;
            anything above goes to torch.distributed.
        fallback: when the fabric path is unavailable at open: True, every
            call goes to torch.distributed (:attr:`path` is
            ``"torch.distributed"``); False, the open raises on every rank:
            :class:`tpfabric.Unavailable`, or :class:`tpfabric.Busy` when
            a daemon is full (``daemon.max_clients``). None (default):
            ``$TPF_FALLBACK`` (``error`` means False) of every rank, voted by
            the library: any rank asking for errors makes it an error everywhere.
            ``TPF_DISABLE=1`` on any rank always falls back.
        socket_path, timeout_ms, open_timeout_ms, gpu_route, max_blocks: as
            :class:`tpfabric.Group` (``tpf_open_options``).

    Raises:
        tpfabric.Error: the open failed for a reason that is not a fallback
            (``ConfigError`` for a bad ``TPF_*`` variable on any rank,
            ``Timeout``, ...), on every rank alike.
    """

    def __init__(
        self,
        group: Optional["dist.ProcessGroup"] = None,
        device: Union[torch.device, str, int, None] = None,
        max_bytes: int = 512 * 1024,
        *,
        fallback: Optional[bool] = None,
        socket_path: Optional[Union[str, bytes, os.PathLike]] = None,
        timeout_ms: int = 0,
        open_timeout_ms: int = 0,
        gpu_route: str = "default",
        max_blocks: int = 0,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("tpfabric.torch.Communicator: torch.distributed is not initialised (init_process_group)")
        self.group = group if group is not None else dist.group.WORLD
        self.rank: int = dist.get_rank(self.group)
        self.world: int = dist.get_world_size(self.group)
        self.backend: str = str(dist.get_backend(self.group)).lower()
        self._pid = os.getpid()  # a forked child shares the group's sockets and rings: see _live()
        self.device: torch.device = self._device_of(device)
        self._cuda = self.device.type == "cuda"
        # CUDA tensors go to NCCL where the group has it ("nccl", "cpu:gloo,cuda:nccl"), the rest to gloo.
        self._nccl = "nccl" in self.backend
        self._g: Optional[Group] = None
        self._cap = 0
        self._closed = False
        # Per op, the smallest size the library refused (CapMismatch): larger ones go straight to torch.distributed.
        self._refused = {"all_gather": 1 << 62, "all_reduce": 1 << 62, "all_gather_v": 1 << 62}
        self.reason: Optional[str] = None
        """Why the group fell back to torch.distributed at open (None when it did not)."""
        self.calls = {"fabric": 0, "torch.distributed": 0}
        """Calls issued each way (in a graph: when captured, not per replay)."""

        # The open's records: on the CPU where gloo serves the group, else on a GPU for NCCL.
        boot_device = torch.device("cpu")
        if "gloo" not in self.backend and self._nccl:
            boot_device = self.device if self._cuda else torch.device("cuda", torch.cuda.current_device())
        policy = "default" if fallback is None else ("nccl" if fallback else "error")
        try:
            ctx = torch.cuda.device(self.device) if self._cuda else contextlib.nullcontext()
            with ctx:
                self._g = Group(
                    self.rank,
                    self.world,
                    max_bytes,
                    _bootstrap_over(self.group, self.world, boot_device, boot_device.type == "cuda"),
                    buffers="device" if self._cuda else "host",
                    socket_path=socket_path,
                    timeout_ms=timeout_ms,
                    open_timeout_ms=open_timeout_ms,
                    fallback=policy,
                    gpu_route=gpu_route,
                    max_blocks=max_blocks,
                )
        except Unavailable as e:
            if not e.may_fall_back:
                raise
            self.reason = e.detail
            _log.warning("rank %d: fabric path unavailable (%s); torch.distributed takes this group's calls",
                         self.rank, e.detail)
        if self._g is not None:
            self._cap = self._g.agreed_cap  # read on every call: an attribute, not the Group's property
        # The ops take the communicator by this number (Dynamo passes no Python object to an op); the
        # registry holds it weakly. Registered after a fallback too: those calls go to torch.distributed.
        self._number = _torch_ops.register(self)

    def _device_of(self, device: Union[torch.device, str, int, None]) -> torch.device:
        if device is None:
            if "nccl" in self.backend and torch.cuda.is_available():
                return torch.device("cuda", torch.cuda.current_device())
            return torch.device("cpu")
        if isinstance(device, int) and device < 0:
            raise ValueError(f"device={device}: a CUDA device index must not be negative")
        try:
            d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device={device!r}: not a torch device ({e}); 'cuda', 'cuda:N', N or 'cpu'") from None
        if d.type not in ("cuda", "cpu"):
            raise ValueError(f"device={device!r}: cuda or cpu")
        # Before torch.cuda asks for it: a CPU-only torch answers with a bare AssertionError.
        if d.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"device={device!r}: this torch has no usable CUDA (torch.cuda.is_available() is False; "
                f"built with CUDA {torch.version.cuda or 'none'}); leave device=None or pass 'cpu' for a host group"
            )
        if d.type == "cuda" and d.index is None:
            d = torch.device("cuda", torch.cuda.current_device())
        return d

    # -- what the group is -----------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """``"fabric"`` (tpfabric takes the calls that fit), ``"torch.distributed"`` (fell back at open) or ``"closed"``."""
        if self._closed:
            return "closed"
        return "fabric" if self._g is not None else "torch.distributed"

    @property
    def agreed_cap(self) -> int:
        """The largest shard in bytes the fabric takes (0 after a fallback)."""
        return self._g.agreed_cap if self._g is not None else 0

    @property
    def disabled(self) -> bool:
        """True when no call goes to the fabric: every call to torch.distributed (fell back at open), or closed."""
        return self._g is None

    def should_use(self, tensor: torch.Tensor, op: str = "all_reduce") -> bool:
        """Whether the fabric takes ``op`` (``"all_reduce"``, ``"all_gather"``, ``"all_gather_v"``) of ``tensor``; otherwise torch.distributed does.

        The communicator decides by itself; this is for engines that want to
        know (as vLLM's ``should_custom_ar``), never needed for correctness.
        """
        if self._g is None or op not in self._refused or os.getpid() != self._pid:
            return False
        if op == "all_reduce" and tensor.dtype not in _SUM_DTYPES:
            return False
        return self._takes(tensor, tensor.numel() * tensor.element_size(), op)

    def _takes(self, t: torch.Tensor, nbytes: int, op: str) -> bool:
        return (
            t.device == self.device
            and t.is_contiguous()
            and t.data_ptr() % 16 == 0
            and nbytes <= self._cap
            and nbytes < self._refused[op]
        )

    def _stream(self) -> Optional[int]:
        return torch.cuda.current_stream(self.device).cuda_stream if self._cuda else None

    def _live(self) -> None:
        if self._closed:
            raise Closed("Closed: the communicator was closed")
        # Either path: the fabric group and the torch.distributed group are both the parent's.
        if os.getpid() != self._pid:
            raise forked_error(self._pid, "communicator")

    def _refuse(self, e: Exception, nbytes: int, op: str) -> None:
        """The library refused a call at once (nothing launched): torch.distributed takes it."""
        if isinstance(e, CapMismatch):  # below the cap: the group's NCCL crossover; decided alike on every rank
            self._refused[op] = min(self._refused[op], nbytes)

    # -- collectives -------------------------------------------------------------------------------------
    # Compiled code goes through the functional ops and a copy_ that Inductor removes (_torch_ops);
    # eager calls (and hand-captured CUDA graphs) call the ops' implementation, _all_reduce_into /
    # _all_gather_into, themselves: one implementation either way, without the dispatcher's per-call
    # cost of a Python custom op (tens of microseconds on the host), which a CUDA graph does not
    # replay but an eager decode step pays on every call.
    def all_reduce(self, tensor: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Sum ``tensor`` over the group; in place (``out`` None) or into ``out``. Returns the result tensor.

        float32, float16 and bfloat16 through the fabric (added in rank order,
        bit-identical on every rank); any other dtype, and anything the fabric
        does not take, through ``torch.distributed.all_reduce`` on the same stream.
        Inside ``torch.compile`` it is the op ``tpfabric::all_reduce`` (no graph break).
        """
        if _torch_ops.REGISTERED and _torch_ops.compiling():
            dst = tensor if out is None else out
            _check_out(tensor, out)
            if tensor.numel() == 0:
                return dst
            return dst.copy_(_torch_ops.all_reduce(tensor, self._number))
        self._live()
        dst = tensor if out is None else out
        _check_out(tensor, out)
        if tensor.numel() == 0:
            return dst
        self._all_reduce_into(tensor, dst)
        return dst

    def _all_reduce_into(self, tensor: torch.Tensor, dst: torch.Tensor) -> None:
        """The sum, at run time: the fabric when it takes the call, else torch.distributed; on the current stream."""
        self._live()
        g = self._g
        if g is not None and tensor.dtype in _SUM_DTYPES:
            nbytes = tensor.numel() * tensor.element_size()
            if self._takes(tensor, nbytes, "all_reduce") and self._takes(dst, nbytes, "all_reduce"):
                try:
                    g.all_reduce_sum_raw(tensor.data_ptr(), dst.data_ptr(), tensor.numel(), _SUM_DTYPES[tensor.dtype],
                                         self._stream())
                except _REFUSED as e:
                    self._refuse(e, nbytes, "all_reduce")
                else:
                    self.calls["fabric"] += 1
                    return
        # torch.distributed takes contiguous tensors only: a staged copy for the others. Gloo has no
        # bfloat16 in many torch releases: it sums those in float32, rounded once at the end.
        widen = tensor.dtype == torch.bfloat16 and not (self._nccl and tensor.is_cuda)
        if widen:
            work = tensor.float()
        else:
            work = dst if dst.is_contiguous() else torch.empty(dst.shape, dtype=dst.dtype, device=dst.device)
            if work is not tensor:
                work.copy_(tensor)
        self.calls["torch.distributed"] += 1
        dist.all_reduce(work, group=self.group)
        if work is not dst:
            dst.copy_(work)

    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
        """``out`` (world * inp.numel() elements, inp's dtype, any shape) gets every rank's ``inp`` in rank order.

        As ``torch.distributed.all_gather_into_tensor``, which takes what the fabric does not. Returns ``out``.
        Inside ``torch.compile`` it is the op ``tpfabric::all_gather_into_tensor`` (no graph break).
        """
        if _torch_ops.REGISTERED and _torch_ops.compiling():
            self._check_gather(out, inp)
            if inp.numel() == 0:
                return out
            gathered = _torch_ops.all_gather_into_tensor(inp, self._number, self.world)
            return out.copy_(gathered.view(out.shape))
        self._live()
        self._check_gather(out, inp)
        if inp.numel() == 0:
            return out
        self._all_gather_into(out, inp)
        return out

    def _check_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        if out.dtype != inp.dtype or out.numel() != self.world * inp.numel():
            raise ValueError(
                f"out ({out.numel()} x {out.dtype}) must hold world * inp ({self.world} x {inp.numel()} x {inp.dtype})"
            )
        if out.device != inp.device:  # the fabric never takes it, and torch.distributed fails by backend
            raise ValueError(f"out is on {out.device}, inp on {inp.device}: all_gather_into_tensor takes one device")

    def _all_gather_into(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """The gather, at run time: the fabric when it takes the call, else torch.distributed; on the current stream."""
        self._live()
        g = self._g
        nbytes = inp.numel() * inp.element_size()
        if g is not None and self._takes(inp, nbytes, "all_gather") and self._takes(out, nbytes, "all_gather"):
            try:
                g.all_gather_raw(inp.data_ptr(), out.data_ptr(), nbytes, self._stream())
            except _REFUSED as e:
                self._refuse(e, nbytes, "all_gather")
            else:
                self.calls["fabric"] += 1
                return
        work = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype, device=out.device)
        self._dist_gather(work, inp)
        if work is not out:
            out.copy_(work)

    def _dist_gather(self, work: torch.Tensor, inp: torch.Tensor) -> None:
        """torch.distributed's all-gather of ``inp`` into the contiguous ``work``, in rank order."""
        # As bytes: every dtype gathers alike (gloo has no bfloat16 in older torch), contiguous as torch.distributed needs.
        dst, src = work.view(-1).view(torch.uint8), inp.contiguous().view(-1).view(torch.uint8)
        self.calls["torch.distributed"] += 1
        if self._nccl and dst.is_cuda:
            dist.all_gather_into_tensor(dst, src, group=self.group)
        else:  # gloo: the list form (all_gather_into_tensor is NCCL's in older torch)
            dist.all_gather(list(dst.chunk(self.world)), src, group=self.group)

    def all_gather_v(self, out: torch.Tensor, inp: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
        """All-gather with a length per rank: ``counts[r]`` rows (along dim 0) from rank r, packed in rank order into ``out``.

        ``counts`` (world entries, the same list on every rank); this rank's
        ``inp`` has ``counts[rank]`` rows, ``out`` ``sum(counts)`` rows of
        inp's row shape, dtype and device. The fabric takes it when the
        largest rank's rows fit the cap, else torch.distributed (padded to the
        largest, then packed). Returns ``out``. Inside ``torch.compile`` it is
        the op ``tpfabric::all_gather_v`` (no graph break).
        """
        counts = [int(c) for c in counts]
        if _torch_ops.REGISTERED and _torch_ops.compiling():
            self._check_gather_v(out, inp, counts)
            if out.numel() == 0:
                return out
            return out.copy_(_torch_ops.all_gather_v(inp, counts, self._number))
        self._live()
        self._check_gather_v(out, inp, counts)
        if out.numel() == 0:
            return out
        self._all_gather_v_into(out, inp, counts)
        return out

    def _check_gather_v(self, out: torch.Tensor, inp: torch.Tensor, counts: List[int]) -> None:
        if len(counts) != self.world or min(counts) < 0:
            raise ValueError(f"counts {counts}: one count (rows, not negative) per rank, {self.world} in all")
        if inp.dim() == 0 or inp.shape[0] != counts[self.rank]:
            raise ValueError(f"inp is {tuple(inp.shape)}: counts[{self.rank}] = {counts[self.rank]} rows along dim 0")
        want = (sum(counts),) + tuple(inp.shape[1:])
        if tuple(out.shape) != want or out.dtype != inp.dtype or out.device != inp.device:
            raise ValueError(f"out is {tuple(out.shape)} {out.dtype} on {out.device}; all_gather_v needs {want} "
                             f"{inp.dtype} on {inp.device} (sum(counts) rows of inp's)")

    def _all_gather_v_into(self, out: torch.Tensor, inp: torch.Tensor, counts: List[int]) -> None:
        """The packed gather, at run time: the fabric when it takes the call, else torch.distributed."""
        self._live()
        g = self._g
        row = inp.element_size()
        for d in inp.shape[1:]:
            row *= d
        largest = max(counts) * row
        if g is not None and self._takes(inp, largest, "all_gather_v") and self._takes(out, largest, "all_gather_v"):
            # A rank with no rows passes out as its (unread) source: never a null pointer the library would
            # refuse on that rank alone, sending it another way than the others.
            send = inp.data_ptr() if inp.numel() else out.data_ptr()
            try:
                g.all_gather_v_raw(send, out.data_ptr(), [c * row for c in counts], self._stream())
            except _REFUSED as e:
                self._refuse(e, largest, "all_gather_v")
            else:
                self.calls["fabric"] += 1
                return
        # Every rank's rows padded to the largest count, gathered, then packed.
        most = max(counts)
        padded = torch.zeros((most,) + tuple(inp.shape[1:]), dtype=inp.dtype, device=inp.device)
        padded[: counts[self.rank]].copy_(inp)
        rows = torch.empty((self.world * most,) + tuple(inp.shape[1:]), dtype=inp.dtype, device=inp.device)
        self._dist_gather(rows, padded)
        at = 0
        for r, c in enumerate(counts):
            out[at:at + c].copy_(rows[r * most:r * most + c])
            at += c

    # -- failures and the end --------------------------------------------------------------------------------
    def check(self, synchronize: bool = True) -> None:
        """Raise the group's recorded failure (``tpfabric.PeerLost``, ``Timeout``, ...), if any.

        Device groups record a failed wait on the device: with ``synchronize``
        (default) the current stream is synchronised first. Nothing to report
        after a fallback.
        """
        self._live()
        if self._g is None:
            return
        if synchronize and self._cuda:
            torch.cuda.current_stream(self.device).synchronize()
        self._g.check()

    def health(self) -> Health:
        """The group's health word (:class:`tpfabric.Health`): ``ok``, or the failure and the rank it names.

        No synchronisation, no CUDA call: read it once per step, after the
        engine's own synchronisation point (where the sampled tokens reach the
        host); a failed call of the step (also one replayed in a CUDA graph)
        is flagged by then. Once set it stays set: :meth:`check` raises the
        detail; close and construct a new Communicator on every rank (and
        capture the graphs again). After a fallback to torch.distributed:
        ``ok`` with ``nccl`` set (its errors are torch's to raise). Closed, or
        a forked child's copy: ``Closed``. Never raises.
        """
        if self._closed or os.getpid() != self._pid:
            return CLOSED_HEALTH
        if self._g is None:
            return Health(nccl=True)
        return self._g.health()

    def healthy(self) -> bool:
        """``health().ok``: the cheap per-step test."""
        return self.health().ok

    def abort(self) -> None:
        """End every rank's waits with ``tpfabric.Aborted`` and break the group (fabric path only)."""
        self._live()
        if self._g is not None:
            self._g.abort()

    def close(self) -> None:
        """Leave the group (synchronising this device first). Idempotent; later calls raise ``tpfabric.Closed``.

        In a forked child, forgets the parent's group without leaving it.
        """
        if self._closed:
            return
        self._closed = True
        if self._g is not None:
            if self._cuda and os.getpid() == self._pid:
                torch.cuda.synchronize(self.device)
            self._g.close()  # in a forked child: drops the handle, the parent's membership stays
            self._g = None

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"path={self.path} cap={self.agreed_cap}"
        return f"<tpfabric.torch.Communicator rank {self.rank} of {self.world} on {self.device} {state}>"


def _check_out(tensor: torch.Tensor, out: Optional[torch.Tensor]) -> None:
    """all_reduce's ``out`` has tensor's shape, dtype and device on every path.

    Shape too, not only the count: torch.distributed's path copies tensor into
    out, which fails for most other shapes; the fabric's would take them, and a
    call would work or fail by its size.
    """
    if out is not None and (out.shape != tensor.shape or out.dtype != tensor.dtype or out.device != tensor.device):
        raise ValueError(
            f"out is {tuple(out.shape)} {out.dtype} on {out.device}, tensor {tuple(tensor.shape)} {tensor.dtype} "
            f"on {tensor.device}: all_reduce's out must match tensor (torch.empty_like(tensor))"
        )
