"""Host groups from Python against the real tpfabricd: W = 2, 3, 4 rank processes.

Gathers byte-exact, sums bit-exact against refs.py's rank-order reference and
identical on every rank, all-gather-v, and failures as named exceptions: a
killed peer (PeerLost), abort (Aborted), a silent peer (Timeout), a killed
daemon (DaemonLost), sizes that differ between ranks (GroupMismatch), each
saying once in its message what it is and that the group must be reopened on
every rank; misaligned buffers (Misaligned), a
size above the cap (CapMismatch, saying the group stays usable), a closed
group (Closed before any argument check), a stream given to a host group
(ValueError), TPF_DISABLE=1 on one rank (Unavailable on
every rank, no daemon contacted), no daemon (Unavailable), a bad TPF_*
variable (ConfigError on every rank), a world above 16 on one rank over a
TcpBootstrap (OutOfRange there, GroupMismatch on the others), a Python
bootstrap over files, and a fork()ed child that must leave its parent's group alone.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import List, Tuple

import numpy as np
import pytest

import refs
from tpf_testing import Daemon, free_port, in_child, run_ranks

CAP = 65536
BROKEN_HINT = "; the group is broken: close() it and open a new one on every rank"


def assert_breaks(e: Exception, name: str) -> None:
    """``e`` is a failure that broke the group: its name once, at the start, and the way back at the end."""
    msg = str(e)
    assert type(e).__name__ == name and msg.startswith(f"{name}: "), msg
    assert msg.endswith(BROKEN_HINT) and msg.count(name) == 1, msg


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(a.tobytes())
    return h.hexdigest()


def rank_data(rank: int, world: int, sock: str, port: int) -> Tuple[str, bool]:
    import tpfabric

    with tpfabric.TcpBootstrap(rank, world, f"127.0.0.1:{port}", 20000) as boot:
        g = tpfabric.Group(rank, world, CAP, boot, socket_path=sock, timeout_ms=10000)
    with g:
        assert (g.rank, g.world, g.agreed_cap, g.path) == (rank, world, CAP, "fabric")
        assert g.route(rank) == "self" and g.route((rank + 1) % world) == "shm" and g.route(world) == "none"
        seen = []
        # Gathers: byte-exact, sizes 16 B .. the cap, odd ones too.
        for call, nbytes in enumerate([16, 100, 4096, 4099, CAP]):
            inp = tpfabric.empty(nbytes, "uint8")
            inp[:] = refs.pattern(rank, call, nbytes)
            out = tpfabric.empty(world * nbytes, "uint8")
            out.fill(0xA5)
            g.all_gather(out, inp)
            want = np.concatenate([refs.pattern(q, call, nbytes) for q in range(world)])
            assert np.array_equal(out, want), f"all_gather of {nbytes} bytes differs"
            seen.append(out)
        # In place: this rank's shard already where it belongs in out.
        out = tpfabric.empty((world, 256), "uint8")
        out[rank] = refs.pattern(rank, 9, 256)
        g.all_gather(out, out[rank])
        assert np.array_equal(out.reshape(-1), np.concatenate([refs.pattern(q, 9, 256) for q in range(world)]))
        # float32 data through a gather keeps its dtype and shape
        f = refs.values_f32(rank, 1, 1000)
        inp32 = tpfabric.aligned(f)
        out32 = tpfabric.empty((world, 1000), "float32")
        g.all_gather(out32, inp32)
        assert np.array_equal(out32.view(np.uint32), np.stack([refs.values_f32(q, 1, 1000) for q in range(world)]).view(np.uint32))

        # Sums, against the rank-order reference, bit for bit.
        order_matters = False
        for call, count in [(2, 1000), (3, 33), (4, CAP // 4)]:
            rows = [refs.values_f32(q, call, count) for q in range(world)]
            out = tpfabric.empty(count, "float32")
            g.all_reduce_sum(out, tpfabric.aligned(rows[rank]))
            assert np.array_equal(out.view(np.uint32), refs.sum_f32(rows).view(np.uint32)), f"f32 sum of {count}"
            order_matters = order_matters or refs.reversed_sum_differs(rows)
            seen.append(out)
        for call, count in [(5, 4096), (6, 7)]:
            rows16 = [refs.values_f16(q, call, count) for q in range(world)]
            out16 = tpfabric.empty(count, "float16")
            g.all_reduce_sum(out16, tpfabric.aligned(rows16[rank]))
            assert np.array_equal(out16.view(np.uint16), refs.sum_f16(rows16).view(np.uint16)), f"f16 sum of {count}"
            rowsb = [refs.values_bf16(q, call, count) for q in range(world)]
            outb = tpfabric.empty(count, "bfloat16")
            g.all_reduce_sum(outb, tpfabric.aligned(rowsb[rank]), dtype="bfloat16")
            assert np.array_equal(outb, refs.sum_bf16(rowsb)), f"bf16 sum of {count}"
            seen += [out16, outb]
        # In place.
        rows = [refs.values_f32(q, 7, 512) for q in range(world)]
        x = tpfabric.aligned(rows[rank].copy())
        g.all_reduce_sum(x, x)
        assert np.array_equal(x.view(np.uint32), refs.sum_f32(rows).view(np.uint32))

        # all-gather-v: uneven rows, one empty, packed in rank order.
        counts = [0 if q == 1 else 100 + 37 * q for q in range(world)]
        inp = tpfabric.empty(counts[rank], "uint8")
        inp[:] = refs.pattern(rank, 11, counts[rank])
        out = tpfabric.empty(sum(counts), "uint8")
        g.all_gather_v(out, inp, counts)
        assert np.array_equal(out, np.concatenate([refs.pattern(q, 11, counts[q]) for q in range(world)]))
        # ... in float32 elements
        counts = [3 + q for q in range(world)]
        rows = [refs.values_f32(q, 12, counts[q]) for q in range(world)]
        out = tpfabric.empty(sum(counts), "float32")
        g.all_gather_v(out, tpfabric.aligned(rows[rank]), counts)
        assert np.array_equal(out.view(np.uint32), np.concatenate(rows).view(np.uint32))
        seen.append(out)
        g.check()
        assert g.healthy() and g.health() == tpfabric.Health() and g.health().ok and g.health().error is None
    assert not g.healthy() and g.health().name == "Closed" and g.health().error is tpfabric.Closed  # after close
    return _digest(*seen), order_matters


@pytest.mark.parametrize("world", [2, 3, 4])
def test_data(daemon: Daemon, world: int) -> None:
    results = run_ranks(rank_data, world, daemon.socket, free_port())
    digests = {d for d, _ in results}
    assert len(digests) == 1, "ranks hold different results"
    if world > 2:  # the inputs are such that another order of addition would show
        assert all(order for _, order in results)


def rank_refusals(rank: int, world: int, sock: str, port: int) -> None:
    import tpfabric

    with tpfabric.Group(rank, world, 4096, f"127.0.0.1:{port}", socket_path=sock) as g:
        raw = tpfabric.empty(4096 + 64, "uint8")
        out = tpfabric.empty(world * 4096, "uint8")
        with pytest.raises(tpfabric.Misaligned, match="^Misaligned: .*16-byte aligned") as e:
            g.all_gather(out[: world * 100], raw[1:101])
        assert (e.value.code, e.value.name) == (2, "Misaligned")
        with pytest.raises(tpfabric.Misaligned):
            g.all_reduce_sum(tpfabric.empty(40, "uint8")[4:].view(np.float32), raw[4:40].view(np.float32))
        with pytest.raises(tpfabric.CapMismatch, match="^CapMismatch: 4100 bytes above the agreed cap of 4096") as c:
            g.all_gather(tpfabric.empty(world * 4100, "uint8"), tpfabric.empty(4100, "uint8"))
        assert (c.value.code, c.value.name) == (7, "CapMismatch")
        assert str(c.value).endswith(
            "; the call is above the group's agreed cap (agreed_cap: the least max_bytes of every rank and daemon); "
            "the group stays usable: split the call, or open the group with a larger max_bytes on every rank"
        ), str(c.value)
        assert "broken" not in str(c.value) and str(c.value).count("CapMismatch") == 1
        # A stream is for device groups: given to a host group it is refused, not ignored, before any call.
        x = tpfabric.empty(64, "float32")
        for raw in (lambda: g.all_gather_raw(x.ctypes.data, out.ctypes.data, 256, stream=1234),
                    lambda: g.all_reduce_sum_raw(x.ctypes.data, x.ctypes.data, 64, "float32", stream=1234),
                    lambda: g.all_gather_v_raw(x.ctypes.data, out.ctypes.data, [256] * world, stream=1234)):
            with pytest.raises(ValueError, match=r"^stream=1234: a host group's calls block and take no stream"):
                raw()
        with pytest.raises(tpfabric.CapMismatch):
            g.all_gather_v(tpfabric.empty(5000 * world, "uint8"), tpfabric.empty(5000, "uint8"), [5000] * world)
        g.check()  # refusals leave the group usable; every rank calls on
        inp = tpfabric.empty(64, "uint8")
        inp[:] = refs.pattern(rank, 0, 64)
        g.all_gather(out[: world * 64], inp)
        assert np.array_equal(out[: world * 64], np.concatenate([refs.pattern(q, 0, 64) for q in range(world)]))
        # all-gather-v counts that disagree between ranks: GroupMismatch everywhere, nothing written
        counts = [16] * world
        counts[0] = 16 + 16 * rank
        out[:] = 0xA5
        with pytest.raises(tpfabric.GroupMismatch) as m:
            g.all_gather_v(out[: sum(counts)], tpfabric.empty(counts[rank], "uint8"), counts)
        assert_breaks(m.value, "GroupMismatch")
        assert (out == 0xA5).all()
    # Closed: what a Communicator says (cap 0, path "closed"), and Closed before any argument is looked at.
    assert (g.closed, g.agreed_cap, g.path, g.rank, g.world) == (True, 0, "closed", rank, world)
    for call in (lambda: g.all_gather(out, [1, 2]), lambda: g.all_reduce_sum(out, out, dtype="int8"),
                 lambda: g.all_gather_v(out, out, [-1]), lambda: g.all_gather_raw(0, 0, -1, stream=1),
                 lambda: g.all_reduce_sum_raw(0, 0, 1, "float64"), lambda: g.all_gather_v_raw(0, 0, None),
                 lambda: g.fits(-1), lambda: g.route(-1), g.check, g.abort):
        with pytest.raises(tpfabric.Closed, match="^Closed: the group was closed$"):
            call()


def rank_size_mismatch(rank: int, world: int, sock: str, port: int, op: str) -> None:
    import tpfabric

    with tpfabric.Group(rank, world, 4096, f"127.0.0.1:{port}", socket_path=sock) as g:
        n = 256 if rank == world - 1 else 512  # the last rank passes half the elements
        inp = tpfabric.empty(n, "float32")
        inp[:] = 1.0
        out = tpfabric.empty(world * 512, "float32")
        out[:] = 7.0
        with pytest.raises(tpfabric.GroupMismatch, match="same op, dtype and size") as e:
            if op == "gather":
                g.all_gather(out[: world * n], inp)
            else:
                g.all_reduce_sum(out[:n], inp)
        assert f" of {n * 4} bytes" in str(e.value) and "passed another size" in str(e.value), str(e.value)
        assert_breaks(e.value, "GroupMismatch")
        assert (out == 7.0).all()  # nothing written
        with pytest.raises(tpfabric.GroupMismatch) as again:
            g.check()  # the group is broken: reopen
        assert_breaks(again.value, "GroupMismatch")


@pytest.mark.parametrize("op", ["gather", "sum"])
def test_size_mismatch_between_ranks(daemon: Daemon, op: str) -> None:
    run_ranks(rank_size_mismatch, 3, daemon.socket, free_port(), op)


def test_refusals(daemon: Daemon) -> None:
    run_ranks(rank_refusals, 2, daemon.socket, free_port())


def rank_killed(rank: int, world: int, sock: str, port: int) -> str:
    import tpfabric

    g = tpfabric.Group(rank, world, 4096, f"127.0.0.1:{port}", socket_path=sock, timeout_ms=5000)
    assert g.healthy()
    inp = tpfabric.zeros(256, "uint8")
    out = tpfabric.empty(256 * world, "uint8")
    for call in range(20):
        g.all_gather(out, inp)
    assert g.healthy()
    if rank == world - 1:
        os._exit(0)  # dies without closing
    start = time.monotonic()
    with pytest.raises(tpfabric.PeerLost) as e:
        for call in range(1000):
            g.all_gather(out, inp)
    assert time.monotonic() - start < 5, "PeerLost took too long"
    assert e.value.code == 4
    # "PeerLost: rank 2 is gone (its connection closed without Close: ...); the group is broken: ..."
    # (the daemon's reason, told before the group's word; the library's detail ends "(PeerLost)": said once)
    assert str(e.value).startswith(f"PeerLost: rank {world - 1} is gone (its connection closed without Close"), str(e.value)
    assert_breaks(e.value, "PeerLost")
    # The health word, before check(): the failure and the dead rank.
    assert not g.healthy()
    assert g.health() == tpfabric.Health("PeerLost", 4, world - 1), g.health()
    assert g.health().error is tpfabric.PeerLost and str(g.health()) == f"PeerLost (rank {world - 1})"
    with pytest.raises(tpfabric.PeerLost) as again:
        g.check()
    assert_breaks(again.value, "PeerLost")
    with pytest.raises(tpfabric.PeerLost):  # broken stays broken
        g.all_gather(out, inp)
    g.close()
    return e.value.name


def test_killed_peer(daemon: Daemon) -> None:
    names = run_ranks(rank_killed, 3, daemon.socket, free_port(), may_exit=[2])
    assert names[:2] == ["PeerLost", "PeerLost"]


def rank_abort(rank: int, world: int, sock: str, port: int) -> None:
    import tpfabric

    with tpfabric.Group(rank, world, 4096, f"127.0.0.1:{port}", socket_path=sock) as g:
        inp, out = tpfabric.zeros(64, "uint8"), tpfabric.empty(64 * world, "uint8")
        for _ in range(9):
            g.all_gather(out, inp)
        assert g.healthy()  # no rank can have aborted yet: none can finish call 10 before this rank posts it
        g.all_gather(out, inp)
        if rank == 1:
            g.abort()
            assert g.health() == tpfabric.Health("Aborted", 6, 1), g.health()
            with pytest.raises(tpfabric.Aborted) as e:
                g.check()
        else:
            with pytest.raises(tpfabric.Aborted) as e:
                for _ in range(1000):
                    g.all_gather(out, inp)
            assert_breaks(e.value, "Aborted")
            assert g.health() == tpfabric.Health("Aborted", 6, 1), g.health()  # names the aborter
            with pytest.raises(tpfabric.Aborted) as e:
                g.check()
        assert_breaks(e.value, "Aborted")


def test_abort(daemon: Daemon) -> None:
    run_ranks(rank_abort, 3, daemon.socket, free_port())


def rank_silent_peer(rank: int, world: int, sock: str, port: int) -> float:
    import tpfabric

    g = tpfabric.Group(rank, world, 4096, f"127.0.0.1:{port}", socket_path=sock, timeout_ms=500)
    inp, out = tpfabric.zeros(64, "uint8"), tpfabric.empty(64 * world, "uint8")
    g.all_gather(out, inp)
    if rank == 1:  # makes no call while rank 0 waits (well past its 500 ms), then leaves
        time.sleep(3)
        g.close()
        return 0.0
    start = time.monotonic()
    with pytest.raises(tpfabric.Timeout) as e:
        g.all_gather(out, inp)
    took = time.monotonic() - start
    assert isinstance(e.value, TimeoutError) and "rank 1 did not deliver" in str(e.value), str(e.value)
    assert_breaks(e.value, "Timeout")
    assert g.health() == tpfabric.Health("Timeout", 3, 1), g.health()  # before check(): the late rank
    with pytest.raises(tpfabric.Timeout) as again:
        g.check()
    assert_breaks(again.value, "Timeout")
    g.close()
    return took


def test_silent_peer_times_out(daemon: Daemon) -> None:
    took = run_ranks(rank_silent_peer, 2, daemon.socket, free_port())[0]
    assert 0.4 < took < 2.5, f"Timeout after {took:.2f} s with timeout_ms=500"


def rank_daemon_killed(rank: int, world: int, sock: str, port: int, daemon_pid: int) -> str:
    import signal

    import tpfabric

    # Host-direct calls go on without the daemon until the open timeout, in which none came back to re-adopt the group.
    g = tpfabric.Group(rank, world, 4096, f"127.0.0.1:{port}", socket_path=sock, timeout_ms=5000, open_timeout_ms=2000)
    inp, out = tpfabric.zeros(64, "uint8"), tpfabric.empty(64 * world, "uint8")
    g.all_gather(out, inp)
    if rank == 0:
        os.kill(daemon_pid, signal.SIGKILL)
    with pytest.raises(tpfabric.DaemonLost) as e:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            g.all_gather(out, inp)
    assert_breaks(e.value, "DaemonLost")
    with pytest.raises(tpfabric.DaemonLost) as again:
        g.check()
    assert_breaks(again.value, "DaemonLost")
    g.close()
    return e.value.name


def test_daemon_killed() -> None:
    own = Daemon()  # not the module's: this one is killed
    try:
        assert run_ranks(rank_daemon_killed, 2, own.socket, free_port(), own.proc.pid) == ["DaemonLost"] * 2
    finally:
        rc = own.stop()
    assert rc == -9, f"tpfabricd exited with {rc}, not by the SIGKILL:\n{own.log()}"


def rank_dtype_objects(rank: int, world: int, sock: str, port: int) -> None:
    import tpfabric

    with tpfabric.Group(rank, world, 8192, f"127.0.0.1:{port}", socket_path=sock) as g:
        # numpy's scalar types and dtypes name the sums' element types as the strings do.
        for call, (dtype, make) in enumerate([(np.float32, refs.values_f32), (np.dtype("float32"), refs.values_f32),
                                              (np.float16, refs.values_f16), (np.dtype(np.float16), refs.values_f16)]):
            rows = [make(q, 20 + call, 1000) for q in range(world)]
            out = tpfabric.empty(1000, rows[0].dtype)
            g.all_reduce_sum(out, tpfabric.aligned(rows[rank]), dtype=dtype)
            want = refs.sum_f32(rows) if rows[0].dtype == np.float32 else refs.sum_f16(rows)
            assert np.array_equal(out.view(np.uint8), want.view(np.uint8)), f"sum with dtype={dtype!r}"
        x = tpfabric.aligned(refs.values_f32(rank, 30, 64))
        out = tpfabric.empty(64, "float32")
        g.all_reduce_sum_raw(x.ctypes.data, out.ctypes.data, 64, np.float32)
        assert np.array_equal(out.view(np.uint32), refs.sum_f32([refs.values_f32(q, 30, 64) for q in range(world)]).view(np.uint32))
        g.check()


def test_dtype_objects(daemon: Daemon) -> None:
    run_ranks(rank_dtype_objects, 2, daemon.socket, free_port())


def rank_open_fails(rank: int, world: int, sock: str, port: int, want: str, text: str) -> str:
    import tpfabric

    with pytest.raises(tpfabric.Error) as e:
        tpfabric.Group(rank, world, 4096, f"127.0.0.1:{port}", socket_path=sock)
    assert e.value.name == want, str(e.value)
    assert text in str(e.value), str(e.value)
    if want == "Unavailable":  # no rank asked for fallback="error": the caller may take its own path
        assert e.value.may_fall_back is True, str(e.value)
    return str(e.value)


def test_disable_on_one_rank(daemon: Daemon) -> None:
    before = daemon.connections()
    run_ranks(rank_open_fails, 3, daemon.socket, free_port(), "Unavailable", "TPF_DISABLE=1 on rank 2",
              env={2: {"TPF_DISABLE": "1"}})
    assert before > 0, "the earlier tests' ranks should have connected"
    assert daemon.connections() == before, "a rank contacted the daemon despite TPF_DISABLE=1"


def test_no_daemon(daemon: Daemon) -> None:
    nothing = os.path.join(daemon.dir, "nothing-here.sock")
    run_ranks(rank_open_fails, 2, nothing, free_port(), "Unavailable", "DaemonUnreachable")


def test_bad_variable_on_one_rank(daemon: Daemon) -> None:
    msgs = run_ranks(rank_open_fails, 2, daemon.socket, free_port(), "ConfigError", "",
                     env={0: {"TPF_FALLBACK": "ncll"}})
    assert "TPF_FALLBACK=ncll" in msgs[0] and "rank 0 has an invalid TPF_* variable" in msgs[1]


def rank_opens_with_world(rank: int, world: int, sock: str, port: int, bad_rank: int, bad_world: int) -> str:
    import tpfabric

    with tpfabric.TcpBootstrap(rank, world, f"127.0.0.1:{port}", 20000) as boot:
        with pytest.raises(tpfabric.Error) as e:
            tpfabric.Group(rank, bad_world if rank == bad_rank else world, 4096, boot, socket_path=sock)
    return f"{e.value.name}|{e.value}"


def test_world_out_of_range_over_a_bootstrap_object_tells_the_others(daemon: Daemon) -> None:
    """Over a TcpBootstrap object the package leaves world to the library, which tells the other ranks at once."""
    t0 = time.monotonic()
    got = run_ranks(rank_opens_with_world, 3, daemon.socket, free_port(), 2, 17)
    assert got[2] == "OutOfRange|OutOfRange: world 17 outside 1..16", got
    for msg in got[:2]:
        assert msg.startswith("GroupMismatch|") and "rank 2 opens with world 17" in msg, got
    assert time.monotonic() - t0 < 15, "the others waited for a timeout instead of being told"


class FileStore:
    """An engine-style bootstrap in Python: records through files in a shared directory."""

    def __init__(self, rank: int, world: int, directory: str) -> None:
        self.rank, self.world, self.dir, self.seq = rank, world, directory, 0

    def __call__(self, mine: bytes) -> bytes:
        seq, self.seq = self.seq, self.seq + 1
        tmp = os.path.join(self.dir, f"{seq}-{self.rank}.tmp")
        with open(tmp, "wb") as f:
            f.write(mine)
        os.rename(tmp, os.path.join(self.dir, f"{seq}-{self.rank}.rec"))
        rows: List[bytes] = []
        deadline = time.monotonic() + 30
        for q in range(self.world):
            path = os.path.join(self.dir, f"{seq}-{q}.rec")
            while not os.path.exists(path):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {q}'s record {seq} did not come")
                time.sleep(0.001)
            with open(path, "rb") as f:
                rows.append(f.read())
        return b"".join(rows)


def rank_python_bootstrap(rank: int, world: int, sock: str, directory: str) -> None:
    import tpfabric

    store = FileStore(rank, world, directory)
    # Any bytes-like return will do, one kind a rank: bytes, bytearray, memoryview, a numpy array.
    as_returned = [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, np.uint8)][rank % 4]
    with tpfabric.Group(rank, world, 8192, lambda mine: as_returned(store(mine)), socket_path=sock) as g:
        inp = tpfabric.empty(8192, "uint8")
        inp[:] = refs.pattern(rank, 3, 8192)
        out = tpfabric.empty(8192 * world, "uint8")
        g.all_gather(out, inp)
        assert np.array_equal(out, np.concatenate([refs.pattern(q, 3, 8192) for q in range(world)]))


def test_python_bootstrap(daemon: Daemon, tmp_path: "os.PathLike[str]") -> None:
    run_ranks(rank_python_bootstrap, 4, daemon.socket, str(tmp_path))


def rank_fork(rank: int, world: int, sock: str, port: int) -> int:
    import gc

    import tpfabric

    g = tpfabric.Group(rank, world, 4096, f"127.0.0.1:{port}", socket_path=sock, timeout_ms=5000)
    rows = [refs.values_f32(q, 1, 256) for q in range(world)]
    x, out = tpfabric.aligned(rows[rank]), tpfabric.empty(256, "float32")

    def sum_ok() -> None:
        out.fill(0)
        g.all_reduce_sum(out, x)
        assert np.array_equal(out.view(np.uint32), refs.sum_f32(rows).view(np.uint32))

    sum_ok()
    forked = 0
    if rank == 0:
        parent = os.getpid()
        want = rf"^Closed: this group was opened by process {parent}; a forked child cannot use it: open a new group"

        def use_then_close() -> None:
            # Raised at once: a call from the child would consume the parent's collective.
            with pytest.raises(tpfabric.Closed, match=want):
                g.all_reduce_sum(out, x)
            for call in (g.check, lambda: g.route(1), lambda: g.all_gather(tpfabric.empty((world, 256), "float32"), x)):
                with pytest.raises(tpfabric.Closed, match=want):
                    call()
            g.close()  # must not leave the parent's group
            assert g.closed
            g.close()

        def collected() -> None:
            nonlocal g
            del g  # __del__ in the child: must not close the parent's group either
            gc.collect()

        for body in (use_then_close, collected):
            assert in_child(body) == 0, "the forked child failed (its traceback is above)"
            forked += 1
    # The parent's group, and its peer's, are untouched: no PeerLost, no DaemonLost, sums still right.
    for _ in range(5):
        sum_ok()
    g.check()
    g.close()
    return forked


def test_forked_child_leaves_the_parents_group_alone(daemon: Daemon) -> None:
    assert run_ranks(rank_fork, 2, daemon.socket, free_port()) == [2, 0]
