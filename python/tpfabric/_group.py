"""Group: one rank's membership of a tpfabric group, over the C ABI.

Host groups take numpy arrays or CPU torch tensors (``all_gather``,
``all_reduce_sum``, ``all_gather_v``); device groups take raw device pointers
and a stream (the ``*_raw`` methods), as :mod:`tpfabric.torch` uses them.
"""

from __future__ import annotations

import ctypes
import operator
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Type, Union

from . import _lib
from ._buffers import DType, DTypeLike, as_dtype, host_buffer, reduce_dtype
from .errors import (Aborted, CapMismatch, Closed, DaemonLost, Error, GroupMismatch, Misaligned, OutOfRange, PeerLost,
                     Timeout, Unavailable, error_class)

_L = _lib.lib

AllGatherFn = Callable[[bytes], bytes]
"""A Python bootstrap: takes this rank's record, returns every rank's in rank order (world * len(record) bytes)."""

_U32, _U64 = 32, 64


def unsigned(value: Any, what: str, bits: int = _U32) -> int:
    """``value`` as an int that fits the C ABI's unsigned ``bits``-bit argument; ValueError naming ``what`` otherwise.

    ctypes would wrap -1 to 4294967295 (``rank 4294967295``, a timeout of 49
    days) and 2**32 to 0 without a word.
    """
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{what}={value!r}: expected an integer, got {type(value).__name__}") from None
    if v < 0:
        raise ValueError(f"{what}={v}: must not be negative")
    if v >> bits:
        raise ValueError(f"{what}={v}: above {(1 << bits) - 1}, the largest the C ABI's {bits}-bit argument takes")
    return v


@dataclass(frozen=True)
class Health:
    """A group's health word, as :meth:`Group.health` reads it (``tpf_health``).

    Attributes:
        name: ``"Ok"`` while healthy; else the failure's status name, as
            :meth:`Group.check` would raise it (``"PeerLost"``, ``"Timeout"``, ...).
        code: the status code (0 while healthy).
        rank: the rank the failure names (the peer gone, late or mismatched;
            the aborter), or None.
        nccl: the group runs on NCCL (or torch.distributed, for a
            :class:`tpfabric.torch.Communicator` that fell back): their own
            asynchronous errors are not in the word.
    """

    name: str = "Ok"
    code: int = 0
    rank: Optional[int] = None
    nccl: bool = False

    @property
    def ok(self) -> bool:
        """No failure recorded."""
        return self.code == 0

    @property
    def error(self) -> Optional[Type[Error]]:
        """The exception class :meth:`Group.check` would raise (``tpfabric.PeerLost``, ...); None while healthy."""
        return None if self.code == 0 else error_class(self.code)

    def __str__(self) -> str:
        if self.ok:
            return "Ok"
        return self.name if self.rank is None else f"{self.name} (rank {self.rank})"


CLOSED_HEALTH = Health("Closed", Closed.code)


def health_of(handle: int) -> Health:
    """``tpf_group_health`` of an open handle."""
    word = _lib.HealthWord()
    code = int(_L.tpf_group_health(handle, ctypes.byref(word)))
    if code == 0:
        return Health(nccl=bool(word.flags & _lib.HEALTH_NCCL))
    cls = error_class(code)
    name = cls.name if cls is not Error else _L.tpf_status_name(code).decode()
    rank = None if word.rank == _lib.NO_RANK else int(word.rank)
    return Health(name, code, rank, bool(word.flags & _lib.HEALTH_NCCL))


MAX_WORLD = 16
"""The largest group (``kMaxWorld``): tpf_group_open refuses more with ``OutOfRange``."""


def _check_open(rank: int, world: int, max_bytes: int, bootstrap: object) -> None:
    """OutOfRange naming the argument, for what tpf_group_open would refuse (its words: ``world 17 outside 1..16``).

    Rank and world are left to the library over a TcpBootstrap object: there
    the bootstrap has its own, and the library tells the other ranks which
    rank opens with what (GroupMismatch) instead of leaving them to time out.
    Over a "host:port" string they are checked before its TcpBootstrap is made
    (which would say ``bootstrap: rank 0 of 0``), over a callable before any call.
    """
    if not isinstance(bootstrap, TcpBootstrap):
        if not 1 <= world <= MAX_WORLD:
            raise OutOfRange(f"OutOfRange: world {world} outside 1..{MAX_WORLD}")
        if rank >= world:
            raise OutOfRange(f"OutOfRange: rank {rank} outside 0..{world - 1} (not below world {world})")
    if max_bytes == 0:
        raise OutOfRange("OutOfRange: max_bytes is 0: must be positive (the largest shard, in bytes, this rank will pass)")


NO_DEADLINE = 0xFFFFFFFF
"""What ``tpf_bootstrap_time_left_ms()`` answers outside an open, or for an open without a deadline."""


def bootstrap_time_left_ms() -> int:
    """Milliseconds the open running on this thread has left for its bootstrap (:data:`NO_DEADLINE` if none).

    For a Python bootstrap that waits on something of its own (``tpfabric.torch``'s
    all-gather over torch.distributed), so that its wait ends with the open's.
    """
    return int(_L.tpf_bootstrap_time_left_ms())


def forked_error(pid: int, what: str = "group") -> Closed:
    """What a forked child gets for using its parent's group: it shares the parent's sockets and rings."""
    return Closed(
        f"Closed: this {what} was opened by process {pid}; a forked child cannot use it: open a new {what} in the child"
    )


# What to do after a failure, by code: appended to the library's detail.
_BROKEN = "the group is broken: close() it and open a new one on every rank"
_HINTS = {
    # numpy arrays; a torch tensor of its own storage (torch.empty) is 64-byte aligned, a view may not be
    Misaligned.code: "allocate with tpfabric.empty() or copy with tpfabric.aligned() (numpy), or torch.empty() / "
                     ".clone() (torch)",
    Timeout.code: _BROKEN,
    PeerLost.code: _BROKEN,
    DaemonLost.code: _BROKEN,
    Aborted.code: _BROKEN,
    CapMismatch.code: "the call is above the group's agreed cap (agreed_cap: the least max_bytes of every rank and "
                      "daemon); the group stays usable: split the call, or open the group with a larger max_bytes on "
                      "every rank",
    GroupMismatch.code: _BROKEN,
}
_OPEN_HINTS = {Misaligned.code: _HINTS[Misaligned.code]}  # an open that fails leaves no group to close or keep


def raise_status(code: int, context: str = "", *, opened: bool = True) -> None:
    """Raise the exception of ``code`` with this thread's ``tpf_last_error()`` (no-op for TPF_OK).

    The message is the library's detail, which starts with the status name,
    the ``context`` in parentheses, then what to do: for a call on an open
    group (``opened``) that breaks it (Timeout, PeerLost, DaemonLost,
    Aborted, GroupMismatch), close it and open a new one on every rank; for a
    CapMismatch, that the group stays usable; for Misaligned, how to allocate.
    """
    if code == _lib.OK:
        return
    detail = _lib.last_error()  # first: any later call into the library may replace it
    cls = error_class(code)
    name = cls.name if cls is not Error else _L.tpf_status_name(code).decode()
    if not detail.startswith(name):
        detail = f"{name}: {_L.tpf_strerror(code).decode()}"
    elif detail.endswith(f" is gone ({name})"):  # older libraries repeat the name: "PeerLost: rank 1 is gone (PeerLost)"
        detail = detail[: -len(name) - 3]
    if context:
        detail = f"{detail} ({context})"
    hint = (_HINTS if opened else _OPEN_HINTS).get(code)
    if hint:
        detail = f"{detail}; {hint}"
    raise cls(detail, code, name)


class TcpBootstrap:
    """The library's TCP bootstrap: rank 0 listens on ``host_port`` ("127.0.0.1:29650"), the others connect.

    For CPU tools and tests; engines pass their own all-gather instead. Only
    needed while a :class:`Group` opens: close it (or use ``with``) after.
    """

    def __init__(self, rank: int, world: int, host_port: str, timeout_ms: int = 0) -> None:
        handle = ctypes.c_void_p()
        self._handle: Optional[int] = None
        self._pid = os.getpid()
        rank, world = unsigned(rank, "rank"), unsigned(world, "world")
        timeout_ms = unsigned(timeout_ms, "timeout_ms")
        # The library would say "bootstrap: rank 0 of 0". A world above 16 is left to it: only rank 0 refuses one.
        if world == 0:
            raise OutOfRange(f"OutOfRange: bootstrap: world 0 outside 1..{MAX_WORLD}")
        if rank >= world:
            raise OutOfRange(f"OutOfRange: bootstrap: rank {rank} outside 0..{world - 1} (not below world {world})")
        raise_status(_L.tpf_tcp_bootstrap_create(rank, world, host_port.encode(), timeout_ms, ctypes.byref(handle)),
                     opened=False)
        self._handle = handle.value
        self.rank, self.world = rank, world

    def close(self) -> None:
        """Free the bootstrap (its sockets). Idempotent. In a forked child: forgets the parent's, frees nothing."""
        if self._handle:
            h, self._handle = self._handle, None
            if os.getpid() == self._pid:
                _L.tpf_tcp_bootstrap_destroy(h)

    def __enter__(self) -> "TcpBootstrap":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def _describe(e: BaseException) -> str:
    """``"RuntimeError: the store is down"``: an exception's type and message, once (tpfabric errors start with their name)."""
    name, text = type(e).__name__, str(e)
    if not text:
        return name
    if isinstance(e, Error) and text.startswith(f"{e.name}:"):
        return text
    return f"{name}: {text}"


class _NotBytes(TypeError):
    """The Python bootstrap returned something that is not bytes: the caller's mistake, a TypeError after the open."""


class _Trampoline:
    """A Python all-gather as a ``tpf_allgather_fn``. An exception inside it becomes a failing
    status (the open then fails, and raises with the exception as its cause and named in its message), never a crash;
    KeyboardInterrupt and SystemExit are raised as themselves after it, a return that is not bytes as a TypeError."""

    def __init__(self, raw: Callable[[int, int, int], None]) -> None:
        self.raw = raw
        self.error: Optional[BaseException] = None
        self.cfunc = _lib.ALLGATHER_FN(self._call)  # kept here: ctypes must not collect it during the open

    def _call(self, ctx: Optional[int], mine: Optional[int], out: Optional[int], nbytes: int) -> int:
        try:
            self.raw(mine or 0, out or 0, nbytes)
            return _lib.OK
        except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt too: nothing may unwind through C
            if self.error is None:
                self.error = e
            if isinstance(e, Error) and e.code > 0:
                return e.code
            return Timeout.code if isinstance(e, TimeoutError) else PeerLost.code


def bytes_allgather(fn: AllGatherFn, world: int) -> Callable[[int, int, int], None]:
    """A raw (pointer) all-gather over a Python one of bytes."""

    def raw(mine: int, out: int, nbytes: int) -> None:
        returned = fn(ctypes.string_at(mine, nbytes) if nbytes else b"")
        try:  # bytes-like only: ctypes would copy a str's characters as raw memory
            got = bytes(memoryview(returned))
        except TypeError:
            raise _NotBytes(
                f"bootstrap: the callable returned {type(returned).__name__}; it must return bytes "
                f"(every rank's record in rank order, world * len(mine) bytes: b''.join(records))"
            ) from None
        if len(got) != world * nbytes:
            raise ValueError(f"the bootstrap returned {len(got)} bytes, expected world * {nbytes} = {world * nbytes}")
        if nbytes:
            ctypes.memmove(out, got, len(got))

    return raw


_BUFFERS = {"host": _lib.BUFFERS_HOST, "device": _lib.BUFFERS_DEVICE}
_FALLBACK = {"default": _lib.FALLBACK_DEFAULT, "nccl": _lib.FALLBACK_NCCL, "error": _lib.FALLBACK_ERROR}
_GPU_ROUTE = {"default": _lib.GPU_ROUTE_DEFAULT, "auto": _lib.GPU_ROUTE_AUTO, "ipc": _lib.GPU_ROUTE_IPC, "proxy": _lib.GPU_ROUTE_PROXY}


def _choice(table: dict, value: str, what: str) -> int:
    if value not in table:
        raise ValueError(f"{what}={value!r}: one of {', '.join(table)}")
    return table[value]


class Group:
    """One rank's membership of a group; opening is collective (every rank, same world and max_bytes).

    Args:
        rank, world: this rank and the group's size (1..16).
        max_bytes: the largest shard this rank will pass (all-gather: bytes a
            rank; sum: count * element size); the group's cap is the minimum
            over ranks and daemons (:attr:`agreed_cap`).
        bootstrap: how the ranks exchange their open records: a
            :class:`TcpBootstrap`, a ``"host:port"`` string (a TcpBootstrap
            made and freed here), or a Python callable ``f(mine: bytes) ->
            bytes`` returning every rank's record in rank order (bytes-like;
            anything else is a TypeError).
        buffers: ``"host"`` (numpy arrays, CPU tensors) or ``"device"`` (CUDA
            pointers on a stream: the ``*_raw`` methods; needs a CUDA build).
        socket_path: the daemon's socket, a str, bytes or ``os.PathLike``
            (default ``$TPF_SOCKET``, else ``/run/tpfabric/tpfabricd.sock``).
        timeout_ms, open_timeout_ms, spin_us, max_blocks: as ``tpf_open_options`` (0: the default).
        fallback: ``"default"``, ``"nccl"`` or ``"error"`` (``tpf_open_options.fallback``).
        gpu_route: ``"default"``, ``"auto"``, ``"ipc"`` or ``"proxy"``.

    Raises:
        tpfabric.OutOfRange: before any call into the library, naming the
            argument: world outside 1..16, rank outside 0..world-1 (over a
            :class:`TcpBootstrap` object the library checks these against
            the bootstrap's and tells the other ranks), max_bytes 0.
        ValueError, TypeError: a negative or oversized integer, an unknown option.
        tpfabric.Error: the open failed; the subclass names why (``Unavailable``
            with the reason, ``ConfigError``, ``Timeout``, ...), the same on every rank.
            An exception raised by a callable bootstrap fails the open with
            ``Timeout`` (a TimeoutError), its own code (a tpfabric.Error) or
            ``PeerLost``, its type and message appended to the error's and
            itself the ``__cause__``.

    A group is used by one thread at a time, of the process that opened it: in a fork()ed
    child every call raises :class:`tpfabric.Closed`, and close() leaves the parent's group
    alone. Use it as a context manager, or call :meth:`close`. After close(), every method but
    close() raises :class:`tpfabric.Closed` before it looks at its arguments; :attr:`agreed_cap`
    is then 0 and :attr:`path` ``"closed"``, as for :class:`tpfabric.torch.Communicator`.
    """

    def __init__(
        self,
        rank: int,
        world: int,
        max_bytes: int,
        bootstrap: Union[TcpBootstrap, str, AllGatherFn],
        *,
        buffers: str = "host",
        socket_path: Optional[Union[str, bytes, os.PathLike]] = None,
        timeout_ms: int = 0,
        open_timeout_ms: int = 0,
        spin_us: int = 0,
        fallback: str = "default",
        gpu_route: str = "default",
        max_blocks: int = 0,
    ) -> None:
        self._h: Optional[int] = None
        self._pid = os.getpid()  # a forked child shares this group's sockets and rings: it must not use or close them
        rank, world, max_bytes = unsigned(rank, "rank"), unsigned(world, "world"), unsigned(max_bytes, "max_bytes", _U64)
        timeout_ms, open_timeout_ms = unsigned(timeout_ms, "timeout_ms"), unsigned(open_timeout_ms, "open_timeout_ms")
        spin_us, max_blocks = unsigned(spin_us, "spin_us"), unsigned(max_blocks, "max_blocks")
        opts = _lib.OpenOptions()
        _L.tpf_open_options_init(ctypes.byref(opts))
        opts.buffers = _choice(_BUFFERS, buffers, "buffers")
        opts.fallback = _choice(_FALLBACK, fallback, "fallback")
        opts.gpu_route = _choice(_GPU_ROUTE, gpu_route, "gpu_route")
        if socket_path is not None and not isinstance(socket_path, (str, bytes, os.PathLike)):
            raise TypeError(f"socket_path: a str, bytes or os.PathLike, got {type(socket_path).__name__}")
        socket_bytes = os.fsencode(socket_path) if socket_path else None
        opts.socket_path = socket_bytes
        opts.timeout_ms, opts.open_timeout_ms, opts.spin_us, opts.max_blocks = timeout_ms, open_timeout_ms, spin_us, max_blocks
        self.buffers = buffers

        _check_open(rank, world, max_bytes, bootstrap)
        owned: Optional[TcpBootstrap] = None
        trampoline: Optional[_Trampoline] = None
        if isinstance(bootstrap, str):
            bootstrap = owned = TcpBootstrap(rank, world, bootstrap)
        if isinstance(bootstrap, TcpBootstrap):
            if bootstrap._handle is None:
                raise ValueError("the TcpBootstrap is closed")
            fn = ctypes.cast(_L.tpf_tcp_bootstrap_allgather, ctypes.c_void_p)
            ctx: Optional[int] = bootstrap._handle
        elif isinstance(bootstrap, _RawAllGather):
            trampoline = _Trampoline(bootstrap.fn)
            fn, ctx = ctypes.cast(trampoline.cfunc, ctypes.c_void_p), None
        elif callable(bootstrap):
            trampoline = _Trampoline(bytes_allgather(bootstrap, world))
            fn, ctx = ctypes.cast(trampoline.cfunc, ctypes.c_void_p), None
        else:
            raise TypeError(f"bootstrap: a TcpBootstrap, 'host:port' or a callable, got {type(bootstrap).__name__}")
        handle = ctypes.c_void_p()
        try:
            code = _L.tpf_group_open(rank, world, max_bytes, fn, ctx, ctypes.byref(opts), ctypes.byref(handle))
            if code != _lib.OK:
                may_fall_back = bool(_L.tpf_last_open_may_fall_back())  # this thread's, before any other call
                cause = trampoline.error if trampoline is not None else None
                # Ctrl-C or sys.exit() inside the bootstrap, or a wrong return type: not a peer's failure.
                if cause is not None and not isinstance(cause, Exception):
                    raise cause
                if isinstance(cause, _NotBytes):
                    raise TypeError(str(cause)) from None
                try:
                    raise_status(code, opened=False)
                except Error as e:
                    if isinstance(e, Unavailable):
                        e.may_fall_back = may_fall_back
                    if cause is not None:
                        e.detail = f"{e.detail}; the bootstrap raised {_describe(cause)}"
                        e.args = (e.detail,)
                        raise e from cause
                    raise
        finally:
            if owned is not None:
                owned.close()
        self._h = handle.value
        # Read once: fixed for the group's life, and read on every call below.
        self.rank: int = int(_L.tpf_rank(self._h))
        self.world: int = int(_L.tpf_world(self._h))
        self._cap = int(_L.tpf_agreed_cap(self._h))
        self._path = _L.tpf_path(self._h).decode()

    # -- state -----------------------------------------------------------------------------------------
    def _handle(self) -> int:
        if self._h is None:
            raise Closed("Closed: the group was closed")
        if os.getpid() != self._pid:
            raise forked_error(self._pid)
        return self._h

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._h is None

    @property
    def agreed_cap(self) -> int:
        """The largest shard (bytes) the fabric takes: the minimum over every rank's max_bytes and every daemon's.

        0 after :meth:`close`, as :attr:`tpfabric.torch.Communicator.agreed_cap`.
        """
        return 0 if self._h is None else self._cap

    @property
    def path(self) -> str:
        """``"fabric"``, ``"nccl"`` for a device group that fell back to its NCCL communicator, or ``"closed"``
        after :meth:`close` (as :attr:`tpfabric.torch.Communicator.path`)."""
        return "closed" if self._h is None else self._path

    def fits(self, nbytes: int) -> bool:
        """``nbytes <= agreed_cap``: the same answer on every rank (Closed after :meth:`close`)."""
        self._handle()
        n = operator.index(nbytes)
        if n < 0:  # not "fits": a negative size is a mistake, as it is for every call that takes one
            raise ValueError(f"nbytes={n}: must not be negative")
        return n <= self._cap

    def route(self, peer: int) -> str:
        """How this rank reaches ``peer``: ``"self"``, ``"shm"``, ``"verbs"``, ``"ipc"``, ``"tcp"`` (``"none"`` out of range)."""
        return _L.tpf_route(self._handle(), unsigned(peer, "peer")).decode()

    def check(self) -> None:
        """Raise the group's recorded failure, if any (device groups: after synchronising the stream)."""
        raise_status(_L.tpf_check(self._handle()))

    def health(self) -> Health:
        """The group's health word: :class:`Health`, ``ok`` or the failure and the rank it names, as :meth:`check` would raise it.

        Reads host memory only (no stream synchronisation, no system call):
        cheap enough for every step of an engine. Device groups see a failed
        call once its kernel ran: read it after the step's own
        synchronisation point. Once set it stays set: call :meth:`check` for
        the detail, close, and open again on every rank. A closed group, or
        a forked child's copy, answers ``Closed``; never raises.
        """
        if self._h is None or os.getpid() != self._pid:
            return CLOSED_HEALTH
        return health_of(self._h)

    def healthy(self) -> bool:
        """``health().ok``: False once a failure is recorded, and after :meth:`close`."""
        return self.health().ok

    def abort(self) -> None:
        """End every rank's waits with ``Aborted`` and break the group (raises ``DaemonLost`` if the daemon could not be told)."""
        raise_status(_L.tpf_abort(self._handle()))

    def close(self) -> None:
        """Leave the group and free it. Idempotent. Device groups: every call must have finished (synchronise first).

        In a forked child, forgets the parent's group without telling the
        library: leaving would end the parent's membership too.
        """
        if self._h is not None:
            h, self._h = self._h, None
            if os.getpid() == self._pid:
                _L.tpf_group_close(h)

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_h", None) is None:
            return
        if os.getpid() != self._pid:  # a forked child's copy: the parent's group, not ours to close
            self._h = None
            return
        if self.buffers == "device":  # its calls may still run on a stream we cannot synchronise here
            warnings.warn("tpfabric.Group (device) collected without close(); leaked", ResourceWarning, stacklevel=1)
            return
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"path={self.path} cap={self.agreed_cap}"
        return f"<tpfabric.Group rank {getattr(self, 'rank', '?')} of {getattr(self, 'world', '?')} {self.buffers} {state}>"

    # -- host buffers ------------------------------------------------------------------------------------
    def all_gather(self, out: Any, inp: Any) -> None:
        """``out`` (world * inp's bytes, same dtype) gets every rank's ``inp`` in rank order.

        Host groups; ``inp`` and ``out`` are numpy arrays or CPU tensors,
        C-contiguous and 16-byte aligned (:class:`tpfabric.Misaligned`
        otherwise); inp's bytes at most :attr:`agreed_cap`
        (:class:`tpfabric.CapMismatch`). A failed call writes nothing into out.
        """
        h = self._handle()  # first: a closed group raises Closed whatever the arguments
        i = host_buffer(inp, "inp")
        o = host_buffer(out, "out", writable=True)
        if o.dtype != i.dtype:
            raise ValueError(f"out is {o.dtype}, inp {i.dtype}: all_gather takes one dtype")
        if o.nbytes != self.world * i.nbytes:
            raise ValueError(f"out has {o.nbytes} bytes, expected world * {i.nbytes} = {self.world * i.nbytes}")
        raise_status(_L.tpf_all_gather(h, i.ptr, o.ptr, i.nbytes))

    def all_reduce_sum(self, out: Any, inp: Any, dtype: Optional[DTypeLike] = None) -> None:
        """``out`` = the sum over ranks of ``inp``, added in rank order, bit-identical on every rank.

        float32, float16 or bfloat16 (numpy: a uint16 array with
        ``dtype="bfloat16"``); f16/bf16 accumulate in f32 and round once.
        ``out`` may be ``inp``. Host groups; buffers as for :meth:`all_gather`.
        ``dtype`` as :data:`DTypeLike`: ``"bfloat16"``, ``np.float16``, ``torch.float32``, ...
        """
        h = self._handle()
        i = host_buffer(inp, "inp")
        o = host_buffer(out, "out", writable=True)
        d = reduce_dtype(i, dtype, "inp")
        if o.dtype != i.dtype or o.nbytes != i.nbytes:
            raise ValueError(f"out ({o.count} x {o.dtype}) must match inp ({i.count} x {i.dtype})")
        raise_status(_L.tpf_all_reduce_sum(h, i.ptr, o.ptr, i.count, int(d)))

    def all_gather_v(self, out: Any, inp: Any, counts: Sequence[int]) -> None:
        """All-gather with a length per rank: ``counts[r]`` elements from rank r, packed in rank order into ``out``.

        ``counts`` (world entries, elements of inp's dtype) must be the same on
        every rank (else :class:`tpfabric.GroupMismatch` everywhere); this
        rank's ``inp`` has ``counts[rank]`` elements and ``out`` ``sum(counts)``.
        Checked first, each refusal naming the entry and the problem: a wrong
        number of entries, a negative one, one too large for the C ABI's
        size_t in bytes (ValueError), one not an integer (TypeError).
        """
        h = self._handle()
        i = host_buffer(inp, "inp")
        o = host_buffer(out, "out", writable=True)
        elements = _element_counts(counts, self.world, "counts")
        c = _counts(elements, i.itemsize, "counts")
        if o.dtype != i.dtype:
            raise ValueError(f"out is {o.dtype}, inp {i.dtype}: all_gather_v takes one dtype")
        if i.count != elements[self.rank]:
            raise ValueError(f"inp has {i.count} elements, counts[{self.rank}] is {elements[self.rank]}")
        if o.count != sum(elements):
            raise ValueError(f"out has {o.count} elements, sum(counts) is {sum(elements)}")
        raise_status(_L.tpf_all_gather_v(h, i.ptr, o.ptr, c))

    # -- raw pointers (device groups on a stream; host groups with stream None) -----------------------------
    def _stream_of(self, stream: Optional[int]) -> Optional[int]:
        """``stream`` for a device group; ValueError for one given to a host group, whose calls block on none."""
        if stream is not None and self.buffers != "device":
            raise ValueError(
                f"stream={stream!r}: a host group's calls block and take no stream; stream is for "
                f"buffers='device' groups (pass stream=None here)"
            )
        return stream

    def all_gather_raw(self, send: int, recv: int, nbytes: int, stream: Optional[int] = None) -> None:
        """``tpf_all_gather`` (host group, ``stream`` None) or ``tpf_all_gather_async`` on ``stream`` (a cudaStream_t as an int).

        Raises ValueError for a ``stream`` given to a host group.
        """
        h = self._handle()
        nbytes, stream = unsigned(nbytes, "nbytes", _U64), self._stream_of(stream)
        if self.buffers == "device":
            raise_status(_L.tpf_all_gather_async(h, send, recv, nbytes, stream))
        else:
            raise_status(_L.tpf_all_gather(h, send, recv, nbytes))

    def all_reduce_sum_raw(self, send: int, recv: int, count: int, dtype: DTypeLike, stream: Optional[int] = None) -> None:
        """``tpf_all_reduce_sum`` / ``tpf_all_reduce_sum_async`` as :meth:`all_gather_raw`."""
        h = self._handle()
        d, count = int(as_dtype(dtype)), unsigned(count, "count", _U64)
        stream = self._stream_of(stream)
        if self.buffers == "device":
            raise_status(_L.tpf_all_reduce_sum_async(h, send, recv, count, d, stream))
        else:
            raise_status(_L.tpf_all_reduce_sum(h, send, recv, count, d))

    def all_gather_v_raw(self, send: int, recv: int, counts_bytes: Sequence[int], stream: Optional[int] = None) -> None:
        """``tpf_all_gather_v`` / ``tpf_all_gather_v_async``; ``counts_bytes`` in bytes, world entries, checked as ``counts``."""
        h = self._handle()
        c = _counts(_element_counts(counts_bytes, self.world, "counts_bytes"), 1, "counts_bytes")
        stream = self._stream_of(stream)
        if self.buffers == "device":
            raise_status(_L.tpf_all_gather_v_async(h, send, recv, c, stream))
        else:
            raise_status(_L.tpf_all_gather_v(h, send, recv, c))


class _RawAllGather:
    """A bootstrap over pointers: ``fn(mine_ptr, out_ptr, nbytes)`` fills out with world * nbytes (tpfabric.torch)."""

    def __init__(self, fn: Callable[[int, int, int], None]) -> None:
        self.fn = fn


def _element_counts(counts: Sequence[int], world: int, what: str) -> List[int]:
    """``counts`` as ints, one per rank: TypeError or ValueError naming the entry and what is wrong with it."""
    try:
        n = len(counts)
    except TypeError:
        raise TypeError(f"{what}: expected a sequence of {world} integers, got {type(counts).__name__}") from None
    if n != world:
        raise ValueError(f"{what} has {n} entries, world is {world}: one per rank")
    return [unsigned(c, f"{what}[{r}]", _U64) for r, c in enumerate(counts)]


def _counts(counts: List[int], itemsize: int, what: str) -> "ctypes.Array[ctypes.c_size_t]":
    """Counts of ``itemsize``-byte elements as the C ABI's byte counts; ValueError where they overflow its size_t."""
    limit = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1
    for r, c in enumerate(counts):
        if c * itemsize > limit:
            raise ValueError(f"{what}[{r}]={c}: too large, {c} * {itemsize} bytes is above {limit}, the C ABI's size_t")
    if sum(counts) * itemsize > limit:
        raise ValueError(f"{what}: too large, {sum(counts)} elements in all, {sum(counts) * itemsize} bytes, above {limit}")
    return (ctypes.c_size_t * len(counts))(*(c * itemsize for c in counts))


def library_version() -> str:
    """The loaded library's release (``tpf_version()``)."""
    return _L.tpf_version().decode()


def library_path() -> str:
    """The library file that was loaded: ``$TPF_LIBRARY`` as given, else the path the dynamic loader opened."""
    return _lib.path


def status_name(code: int) -> str:
    """``tpf_status_name``: ``"PeerLost"`` for 4."""
    return _L.tpf_status_name(code).decode()


__all__: List[str] = [
    "Group", "TcpBootstrap", "DType", "AllGatherFn", "library_version", "library_path", "status_name", "raise_status",
]
