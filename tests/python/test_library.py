"""The package alone, in one process: finding the library, the ABI checks, errors, buffers, world-1 groups.

No daemon: a world-1 group is a plain copy, and a bootstrap that fails
fails the open before any daemon is asked.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import tpfabric
from tpfabric import _lib
from tpfabric.errors import error_class


def _import_in_child(env: dict) -> subprocess.CompletedProcess:
    code = "import tpfabric; print(tpfabric.library_path()); print(tpfabric.library_version())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_library_from_tpf_library() -> None:
    assert os.path.samefile(tpfabric.library_path(), os.environ["TPF_LIBRARY"])
    assert tpfabric.library_version() == os.environ["TPF_EXPECT_VERSION"]
    assert tpfabric.__version__ == tpfabric.library_version()  # a source tree: the library's release


def test_library_through_the_dynamic_loader() -> None:
    with tempfile.TemporaryDirectory() as d:
        os.symlink(os.environ["TPF_LIBRARY"], os.path.join(d, "libtpfabric.so.0"))
        env = {k: v for k, v in os.environ.items() if k != "TPF_LIBRARY"}
        env["LD_LIBRARY_PATH"] = d
        r = _import_in_child(env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "libtpfabric.so.0"


def test_library_missing_names_what_it_tried() -> None:
    env = dict(os.environ, TPF_LIBRARY="/nonexistent/libtpfabric.so.0")
    r = _import_in_child(env)
    assert r.returncode != 0
    assert "ImportError: tpfabric: TPF_LIBRARY=/nonexistent/libtpfabric.so.0 could not be loaded" in r.stderr
    assert "unset it to use the installed library" in r.stderr
    # Not set, and nothing on the loader's path: every place tried is named.
    env = {k: v for k, v in os.environ.items() if k != "TPF_LIBRARY"}
    env["LD_LIBRARY_PATH"] = "/nonexistent"
    r = _import_in_child(env)
    if r.returncode == 0:  # an installed libtpfabric.so.0 on this machine: found as it should be
        assert r.stdout.splitlines()[0] == "libtpfabric.so.0"
    else:
        assert "libtpfabric.so.0 not found. Tried: libtpfabric.so.0 through the dynamic loader" in r.stderr
        assert "set TPF_LIBRARY=/path/to/libtpfabric.so.0" in r.stderr


def test_options_layout_and_status_names() -> None:
    opts = _lib.OpenOptions()
    _lib.lib.tpf_open_options_init(ctypes.byref(opts))
    assert opts.struct_size == ctypes.sizeof(_lib.OpenOptions) == 48
    assert opts.buffers == 0 and opts.socket_path is None and opts.nccl_comm is None
    # Every code the library names has its own class of the same name, and back.
    code = 0
    while tpfabric.status_name(code + 1) != "Unknown":
        code += 1
        cls = error_class(code)
        assert cls is not tpfabric.Error, f"no exception class for status {code} ({tpfabric.status_name(code)})"
        assert cls.name == tpfabric.status_name(code) and cls.code == code
        assert getattr(tpfabric, cls.name) is cls
    assert code == 29  # TPF_BUSY, the last one of errc.h today
    assert tpfabric.status_name(0) == "Ok"
    assert issubclass(tpfabric.Misaligned, ValueError) and issubclass(tpfabric.Timeout, TimeoutError)


def test_empty_and_aligned() -> None:
    for shape, dtype in [(1, "float32"), ((3, 5), "float16"), (17, "bfloat16"), (0, "uint8"), ((2, 3, 4), np.float64)]:
        for align in (16, 64, 4096):
            a = tpfabric.empty(shape, dtype, align=align)
            assert a.ctypes.data % align == 0 and a.flags["C_CONTIGUOUS"]
            assert a.shape == ((shape,) if isinstance(shape, int) else shape)
    assert tpfabric.empty(4, "bfloat16").dtype == np.uint16
    assert not tpfabric.zeros(8).any()
    raw = tpfabric.empty(65, "uint8")
    mis = raw[1:]
    assert not tpfabric.is_aligned(mis)
    fixed = tpfabric.aligned(mis)
    assert tpfabric.is_aligned(fixed) and np.array_equal(fixed, mis)
    assert tpfabric.aligned(raw) is raw
    with pytest.raises(ValueError):
        tpfabric.empty(4, align=24)


def _world1() -> tpfabric.Group:
    return tpfabric.Group(0, 1, 4096, lambda mine: mine)


def test_world1_group_and_python_misuse() -> None:
    with _world1() as g:
        assert (g.rank, g.world, g.agreed_cap, g.path) == (0, 1, 4096, "fabric")
        assert g.fits(4096) and not g.fits(4097)
        inp = tpfabric.empty(100, "float32")
        inp[:] = np.arange(100, dtype=np.float32)
        out = tpfabric.zeros(100, "float32")
        g.all_gather(out, inp)
        assert np.array_equal(out, inp)
        g.all_reduce_sum(out, inp)
        assert np.array_equal(out, inp)
        bf = tpfabric.empty(10, "bfloat16")
        with pytest.raises(ValueError, match="numpy has no bfloat16"):
            g.all_reduce_sum(bf, bf)
        g.all_reduce_sum(bf, bf, dtype="bfloat16")
        with pytest.raises(ValueError, match="cannot hold"):
            g.all_reduce_sum(out, inp, dtype="bfloat16")
        with pytest.raises(ValueError, match="sums take"):
            g.all_reduce_sum(np.zeros(4, np.int32), np.zeros(4, np.int32))
        with pytest.raises(ValueError, match="expected world"):
            g.all_gather(tpfabric.empty(99, "float32"), inp)
        with pytest.raises(ValueError, match="one dtype"):
            g.all_gather(tpfabric.empty(50, "float64"), inp)
        with pytest.raises(ValueError, match="C-contiguous"):
            g.all_gather(tpfabric.empty(50, "float32"), tpfabric.empty(100, "float32")[::2])
        with pytest.raises(ValueError, match="read-only"):
            ro = tpfabric.empty(100, "float32")
            ro.flags.writeable = False
            g.all_gather(ro, inp)
        with pytest.raises(TypeError, match="numpy array or a CPU torch tensor"):
            g.all_gather([0.0] * 100, inp)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="counts has"):
            g.all_gather_v(out, inp, [100, 1])
        g.all_gather_v(out[:7], inp[:7], [7])


def test_world1_library_refusals_raise_named_errors() -> None:
    with _world1() as g:
        raw = tpfabric.empty(8192 + 64, "uint8")
        mis = raw[1:17]
        with pytest.raises(tpfabric.Misaligned) as e:
            g.all_gather(tpfabric.empty(16, "uint8"), mis)
        assert e.value.code == 2 and e.value.name == "Misaligned" and isinstance(e.value, ValueError)
        assert str(e.value).startswith("Misaligned: ") and "tpfabric.empty()" in str(e.value)
        with pytest.raises(tpfabric.CapMismatch, match=r"^CapMismatch: 8192 bytes above the agreed cap of 4096"):
            g.all_gather(tpfabric.empty(8192, "uint8"), tpfabric.empty(8192, "uint8"))
        g.check()  # the refusals leave it usable
        g.all_gather(tpfabric.empty(16, "uint8"), tpfabric.empty(16, "uint8"))
    with pytest.raises(tpfabric.Closed):
        g.all_gather(tpfabric.empty(16, "uint8"), tpfabric.empty(16, "uint8"))
    g.close()  # idempotent
    assert g.closed


def test_open_refusals() -> None:
    with pytest.raises(tpfabric.OutOfRange, match="world 17 outside 1..16"):
        tpfabric.Group(0, 17, 4096, lambda m: m)
    with pytest.raises(ValueError, match="buffers='gpu'"):
        tpfabric.Group(0, 2, 4096, lambda m: m, buffers="gpu")
    with pytest.raises(TypeError, match="bootstrap"):
        tpfabric.Group(0, 2, 4096, 42)  # type: ignore[arg-type]


class _Boom(RuntimeError):
    pass


def test_bootstrap_exceptions_fail_the_open_not_the_process() -> None:
    def boom(mine: bytes) -> bytes:
        raise _Boom("the engine's store is down")

    with pytest.raises(tpfabric.PeerLost, match="callback returned 4") as e:
        tpfabric.Group(0, 2, 4096, boom)
    assert isinstance(e.value.__cause__, _Boom)

    def slow(mine: bytes) -> bytes:
        raise TimeoutError("no answer from rank 1")

    with pytest.raises(tpfabric.Timeout) as t:
        tpfabric.Group(0, 2, 4096, slow)
    assert isinstance(t.value.__cause__, TimeoutError)

    with pytest.raises(tpfabric.PeerLost) as w:
        tpfabric.Group(0, 2, 4096, lambda mine: mine)  # one record where world * len are due
    assert isinstance(w.value.__cause__, ValueError) and "expected world" in str(w.value.__cause__)

    def aborted(mine: bytes) -> bytes:
        raise tpfabric.Aborted("Aborted: the engine is shutting down", 6)

    with pytest.raises(tpfabric.Aborted, match="callback returned 6"):
        tpfabric.Group(0, 2, 4096, aborted)


def test_tcp_bootstrap_bad_address() -> None:
    with pytest.raises(tpfabric.Error) as e:
        tpfabric.TcpBootstrap(0, 2, "no-port-here")
    assert e.value.code > 0 and e.value.name == tpfabric.status_name(e.value.code)


def test_every_header_function_has_a_prototype() -> None:
    """_lib's table binds every TPF_API function of tpfabric.h (argument types checked, not guessed by ctypes)."""
    import re
    from pathlib import Path

    header = Path(__file__).resolve().parents[2] / "include" / "tpfabric" / "tpfabric.h"
    declared = set(re.findall(r"TPF_API[^;(]*?\b(tpf_\w+)\s*\(", header.read_text()))
    assert declared, f"no TPF_API functions found in {header}"
    assert declared == set(_lib._PROTOTYPES), (
        f"in tpfabric.h only: {sorted(declared - set(_lib._PROTOTYPES))}; "
        f"in _lib only: {sorted(set(_lib._PROTOTYPES) - declared)}"
    )
