"""The package alone, in one process: finding the library, the ABI checks, errors, buffers, world-1 groups,
and what the package refuses before the library is called (negative integers, ranks, worlds and max_bytes
out of range, all-gather-v counts, object arrays, a bootstrap that is interrupted or returns no bytes), the
Python exception of a failing bootstrap in the error's message, and the host path without numpy.
Also: numpy and torch dtype objects as ``dtype=``, what ``from tpfabric import *`` brings, a closed
group (Closed before any argument check, cap 0, path "closed"), a stream refused by a host group,
run-time type hints, and ``import tpfabric.torch`` without torch.

No daemon: a world-1 group is a plain copy, and a bootstrap that fails
fails the open before any daemon is asked.
"""

from __future__ import annotations

import builtins
import ctypes
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import tpfabric
from tpfabric import _group, _lib
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
        link = os.path.join(d, "libtpfabric.so.0")
        os.symlink(os.environ["TPF_LIBRARY"], link)
        env = {k: v for k, v in os.environ.items() if k != "TPF_LIBRARY"}
        env["LD_LIBRARY_PATH"] = d
        r = _import_in_child(env)
        assert r.returncode == 0, r.stderr
        # The file the loader opened, not the name it was asked for.
        assert r.stdout.splitlines()[0] == link


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
    if r.returncode == 0:  # an installed libtpfabric.so.0 on this machine: found as it should be, and named
        found = r.stdout.splitlines()[0]
        assert os.path.isabs(found) and os.path.basename(found).startswith("libtpfabric.so.0"), found
    else:
        assert "libtpfabric.so.0 not found. Tried: libtpfabric.so.0 through the dynamic loader" in r.stderr
        assert "set TPF_LIBRARY=/path/to/libtpfabric.so.0" in r.stderr


@pytest.mark.parametrize(
    "error, requested, dependency",
    [
        ("libnccl.so.2: cannot open shared object file: No such file or directory", "/usr/lib/libtpfabric.so.0", "libnccl.so.2"),
        ("libcudart.so.13: cannot open shared object file: No such file or directory", "libtpfabric.so.0", "libcudart.so.13"),
        ("Error loading shared library libnccl.so.2: No such file or directory (needed by /opt/t/libtpfabric.so.0)",
         "/opt/t/libtpfabric.so.0", "libnccl.so.2"),  # musl
        # The library itself: not a dependency.
        ("/x/libtpfabric.so.0: cannot open shared object file: No such file or directory", "/x/libtpfabric.so.0", None),
        ("libtpfabric.so.0: cannot open shared object file: No such file or directory", "libtpfabric.so.0", None),
        ("Error loading shared library /x/libtpfabric.so.0: No such file or directory", "/x/libtpfabric.so.0", None),
        ("/tmp: cannot read file data: Is a directory", "/tmp", None),
        ("/x/libtpfabric.so.0: invalid ELF header", "/x/libtpfabric.so.0", None),
        # Found, but another failure: dlerror says it well enough.
        ("/lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found (required by /x/libtpfabric.so.0)",
         "/x/libtpfabric.so.0", None),
        ("/x/libtpfabric.so.0: undefined symbol: ncclCommInitRankConfig", "/x/libtpfabric.so.0", None),
    ],
)
def test_missing_dependency_is_told_from_a_missing_library(error: str, requested: str, dependency: object) -> None:
    assert _lib.missing_dependency(error, requested) == dependency


def test_missing_dependency_install_hints() -> None:
    assert _lib._install_hint("libcudart.so.13") == "install the CUDA 13 runtime (libcudart.so.13)"
    assert _lib._install_hint("libnccl.so.2") == "install NCCL (libnccl.so.2)"
    assert _lib._install_hint("libibverbs.so.1") == "install the package that provides libibverbs.so.1"


@pytest.fixture(scope="module")
def lacking_dependency(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The built library with one NEEDED entry renamed to a library nowhere on the loader's path, and that library.

    As a pip-installed torch leaves libnccl.so.2 and libcudart.so.13 (off the
    loader's path, under site-packages/nvidia/): the CUDA runtime when the
    build needs it, else libgcc_s. ``provider``: a copy of the dependency with
    the new soname, as torch would load it; ``fake_torch``: a directory with a
    package ``torch`` that loads ``$FAKE_TORCH_LOADS`` (when set) at import.
    """
    from tpf_testing import needed_and_path, rename_in_dynstr

    d = tmp_path_factory.mktemp("lacking")
    deps = dict(needed_and_path(os.environ["TPF_LIBRARY"]))
    name = next((n for n in deps if n.startswith("libcudart.so.")), "libgcc_s.so.1")
    dot = name.index(".so")
    renamed = name[: dot - 1] + "Z" + name[dot:]  # libcudart.so.13 -> libcudarZ.so.13: the same length
    lib = str(d / "libtpfabric.so.0")
    rename_in_dynstr(os.environ["TPF_LIBRARY"], lib, name, renamed)
    (d / "provider").mkdir()
    provider = str(d / "provider" / renamed)
    rename_in_dynstr(deps[name], provider, name, renamed)  # its SONAME, and its version names with it
    (d / "fake" / "torch").mkdir(parents=True)
    (d / "fake" / "torch" / "__init__.py").write_text(
        "import ctypes, os\n"
        "__version__ = '0.0+fake'\n"
        "class version:\n"
        "    cuda = '13.0' if os.environ.get('FAKE_TORCH_LOADS') else None\n"
        "if os.environ.get('FAKE_TORCH_RAISES'):\n"
        "    raise OSError(os.environ['FAKE_TORCH_RAISES'])\n"
        "if os.environ.get('FAKE_TORCH_LOADS'):\n"
        "    ctypes.CDLL(os.environ['FAKE_TORCH_LOADS'])\n"
    )
    return {"lib": lib, "dep": renamed, "provider": provider, "fake_torch": str(d / "fake"), "dir": str(d)}


def _import_lacking(case: dict, code: str = "", python_args: tuple = (), **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("TPF_LIBRARY", "LD_LIBRARY_PATH")}
    base["PYTHONPATH"] = os.pathsep.join([case["fake_torch"], base.get("PYTHONPATH", "")])
    base.update(env)
    code = code or "import sys, tpfabric; print(tpfabric.library_path()); print('torch' in sys.modules)"
    return subprocess.run([sys.executable, *python_args, "-c", code], env=base, capture_output=True, text=True, timeout=60)


def test_missing_dependency_torch_loads_it(lacking_dependency: dict) -> None:
    """A CUDA torch loads the dependency at import (by its soname): tpfabric imports torch and loads on the retry."""
    case = lacking_dependency
    r = _import_lacking(case, TPF_LIBRARY=case["lib"], FAKE_TORCH_LOADS=case["provider"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [case["lib"], "True"]
    # The documented fix without torch: the dependency's directory on LD_LIBRARY_PATH; torch is then not imported.
    r = _import_lacking(case, TPF_LIBRARY=case["lib"], LD_LIBRARY_PATH=os.path.dirname(case["provider"]))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [case["lib"], "False"]


def test_missing_dependency_names_it_and_the_fixes(lacking_dependency: dict) -> None:
    case, dep = lacking_dependency, lacking_dependency["dep"]
    fixes = (f"or `import torch` first from a torch build that ships {dep} (pip's CUDA torch keeps it under "
             f"site-packages/nvidia/), or add the directory holding {dep} to LD_LIBRARY_PATH")
    cannot_open = f"which the dynamic loader cannot find ({dep}: cannot open shared object file"
    # torch installed, imported to load it, and not loading it (a CPU build).
    r = _import_lacking(case, TPF_LIBRARY=case["lib"])
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: tpfabric: TPF_LIBRARY={case['lib']} was found but needs {dep}, {cannot_open}"), last
    assert f"torch (torch 0.0+fake, a CPU-only build), imported here to load it, did not load {dep}. Fix: install " in last
    assert last.endswith(fixes), last
    assert "not found. Tried" not in last
    # A torch that fails its own import: named, and the ImportError is still about the dependency.
    r = _import_lacking(case, TPF_LIBRARY=case["lib"], FAKE_TORCH_RAISES="libcudnn.so.9: cannot open shared object file")
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: tpfabric: TPF_LIBRARY={case['lib']} was found but needs {dep}, "), last
    assert "; import torch, tried to load it, failed (OSError: libcudnn.so.9: cannot open shared object file). Fix:" in last
    # Imported by the caller before tpfabric.
    r = _import_lacking(case, "import torch, tpfabric", TPF_LIBRARY=case["lib"])
    assert f"torch (torch 0.0+fake, a CPU-only build), imported before tpfabric, did not load {dep}" in r.stderr
    # No torch for this Python (-S: no site directories; the fake one left off the path).
    r = _import_lacking(case, python_args=("-S",), TPF_LIBRARY=case["lib"], PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    assert r.returncode != 0
    assert "directory); torch, which loads it when it is a CUDA build, is not installed for this Python. Fix:" in r.stderr, r.stderr
    # Found through the dynamic loader: the same, with every place tried, and not "not found".
    ld = os.path.join(case["dir"], "ld")
    os.makedirs(ld, exist_ok=True)
    if not os.path.lexists(os.path.join(ld, "libtpfabric.so.0")):
        os.symlink(case["lib"], os.path.join(ld, "libtpfabric.so.0"))
    r = _import_lacking(case, LD_LIBRARY_PATH=ld)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: tpfabric: libtpfabric.so.0 (through the dynamic loader) was found but needs {dep}, "), last
    assert f"{fixes}. Tried: libtpfabric.so.0 through the dynamic loader ({dep}: cannot open" in last, last


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
    assert code == max(_errc_h().values())  # the library names every code of errc.h, and no other
    assert tpfabric.status_name(0) == "Ok"
    assert issubclass(tpfabric.Misaligned, ValueError) and issubclass(tpfabric.Timeout, TimeoutError)


def _errc_h(text: str = "") -> dict:
    """``enum tpf_status_code`` of include/tpfabric/errc.h as {name as tpf_status_name spells it: code}, TPF_OK left out.

    TPF_PEER_LOST is "PeerLost", TPF_QP_ERROR "QpError": each word capitalised, the underscores dropped.
    """
    if not text:
        root = os.environ.get("TPF_SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")
        with open(os.path.join(root, "include", "tpfabric", "errc.h")) as f:
            text = f.read()
    body = re.search(r"enum tpf_status_code\s*\{(.*?)\};", text, re.S)
    assert body is not None, "no enum tpf_status_code in errc.h"
    entries = re.findall(r"\bTPF_([A-Z0-9_]+)\s*=\s*(\d+)", body.group(1))
    assert entries, "no TPF_* = N in enum tpf_status_code"
    named = {"".join(w.capitalize() for w in caps.split("_")): int(code) for caps, code in entries}
    assert named.pop("Ok") == 0
    return named


def _table_differences(errc: dict) -> list:
    """How tpfabric.errors' table (and its classes) differs from ``errc``; empty when they agree."""
    from tpfabric.errors import STATUS_CODES

    diff = [f"{n} = {c} in errc.h, {STATUS_CODES.get(n)} in tpfabric.errors" for n, c in errc.items()
            if STATUS_CODES.get(n) != c]
    diff += [f"{n} = {c} in tpfabric.errors, not in errc.h" for n, c in STATUS_CODES.items() if n not in errc]
    for n, c in errc.items():
        cls = error_class(c)
        if (cls.name, cls.code) != (n, c) or getattr(tpfabric.errors, n, None) is not cls:
            diff.append(f"status {c} ({n}): class {cls.__name__} with name {cls.name}, code {cls.code}")
    return diff


def test_error_table_follows_errc_h() -> None:
    """One exception class per status of include/tpfabric/errc.h, with its code, from one table; parsed, not copied."""
    errc = _errc_h()
    assert len(errc) >= 29
    assert _table_differences(errc) == []
    # The comparison sees a change to errc.h: a new code, a renumbering, a rename.
    with open(os.path.join(os.environ.get("TPF_SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", ".."),
                           "include", "tpfabric", "errc.h")) as f:
        text = f.read()
    last = max(errc.values())
    grown = text.replace(f" = {last} ", f" = {last}, TPF_NEW_FAILURE = {last + 1} ", 1)
    assert grown != text
    assert _table_differences(_errc_h(grown)) == [f"NewFailure = {last + 1} in errc.h, None in tpfabric.errors",
                                                 f"status {last + 1} (NewFailure): class Error with name Unknown, code -1"]
    assert _table_differences(_errc_h(text.replace("TPF_PEER_LOST = 4", "TPF_PEER_LOST = 40")))
    assert _table_differences(_errc_h(text.replace("TPF_BUSY", "TPF_FULL")))
    # Every class of the package has its code from the table, and .code is what torch.py compares.
    assert all(error_class(c).code == c for c in tpfabric.errors.STATUS_CODES.values())
    assert tpfabric.CapMismatch.code == 7 and tpfabric.Closed.code == 25


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
    # As np.empty: a negative dimension is refused (reshape would read -1 as "infer": an empty array), numpy's ints taken.
    for shape in (-1, (2, -3), (-1, 0)):
        with pytest.raises(ValueError, match=r"negative dimensions are not allowed"):
            tpfabric.empty(shape)
        with pytest.raises(ValueError, match=r"negative dimensions are not allowed"):
            tpfabric.zeros(shape)
    assert tpfabric.empty(np.int64(5)).shape == (5,) and tpfabric.zeros((np.int32(2), 3)).shape == (2, 3)
    with pytest.raises(TypeError):
        tpfabric.empty(2.5)


def test_host_path_without_numpy_says_how_to_install_it() -> None:
    """numpy absent: the package still imports and opens groups; empty()/zeros() raise an ImportError with the fix."""
    code = """
import sys
sys.modules["numpy"] = None  # what the import system does for a package that is not installed
import tpfabric
assert "numpy" not in [m for m, v in sys.modules.items() if v is not None]
with tpfabric.Group(0, 1, 4096, lambda mine: mine) as g:
    print(g.world)
for make in (tpfabric.empty, tpfabric.zeros):
    try:
        make(4)
    except ModuleNotFoundError as e:
        assert isinstance(e, ImportError) and e.name == "numpy"
        assert e.__cause__ is not None
        print(str(e))
    else:
        raise AssertionError(make.__name__ + " returned without numpy")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "1"
    hint = "the host path needs numpy: apt-get install python3-numpy or pip install numpy"
    assert lines[1].startswith("tpfabric.empty() needs numpy (") and lines[1].endswith(hint), lines[1]
    assert lines[2].startswith("tpfabric.zeros() needs numpy (") and lines[2].endswith(hint), lines[2]


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
        with pytest.raises(ValueError, match=r"^inp: a float32 array cannot hold bfloat16 data \(expected bfloat16 or uint16 or int16\)$"):
            g.all_reduce_sum(out, inp, dtype="bfloat16")
        with pytest.raises(ValueError, match=r"^inp: a float16 array cannot hold float32 data \(expected float32\)$"):
            g.all_reduce_sum(tpfabric.empty(4, "float16"), tpfabric.empty(4, "float16"), dtype=np.float32)
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
        with pytest.raises(TypeError, match="aligned\\(\\) takes a numpy array, not list"):
            tpfabric.aligned([1.0])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="is_aligned\\(\\) takes a numpy array or a torch tensor, not bytes"):
            tpfabric.is_aligned(b"x")
    with pytest.raises(tpfabric.Closed):
        g.fits(1)


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


@pytest.mark.parametrize("args, message", [
    ((0, 0, 4096), "world 0 outside 1..16"),
    ((0, 17, 4096), "world 17 outside 1..16"),
    ((2, 2, 4096), "rank 2 outside 0..1 (not below world 2)"),
    ((16, 16, 4096), "rank 16 outside 0..15 (not below world 16)"),
    ((0, 1, 0), "max_bytes is 0: must be positive"),
    ((0, 2, 0), "max_bytes is 0: must be positive"),
])
@pytest.mark.parametrize("kind", ["callable", "host:port"])
def test_open_arguments_out_of_range_are_named(args: tuple, message: str, kind: str) -> None:
    """Refused in Python with OutOfRange naming the argument, before any bootstrap (not "bootstrap: rank 0 of 0")."""
    called = []

    def boot(mine: bytes) -> bytes:
        called.append(mine)
        return mine

    with pytest.raises(tpfabric.OutOfRange) as e:
        tpfabric.Group(*args, boot if kind == "callable" else "127.0.0.1:1")  # port 1: nothing listens
    assert str(e.value) == f"OutOfRange: {message}" or str(e.value).startswith(f"OutOfRange: {message} ")
    assert e.value.code == 14 and e.value.name == "OutOfRange" and isinstance(e.value, ValueError)
    assert "bootstrap" not in str(e.value) and not called


def test_tcp_bootstrap_rank_and_world_are_named() -> None:
    with pytest.raises(tpfabric.OutOfRange, match=r"^OutOfRange: bootstrap: world 0 outside 1\.\.16$"):
        tpfabric.TcpBootstrap(0, 0, "127.0.0.1:1")
    with pytest.raises(tpfabric.OutOfRange, match=r"^OutOfRange: bootstrap: rank 3 outside 0\.\.1 \(not below world 2\)$"):
        tpfabric.TcpBootstrap(3, 2, "127.0.0.1:1")
    with pytest.raises(tpfabric.OutOfRange, match=r"^OutOfRange: bootstrap: world 17 outside 1\.\.16$"):
        tpfabric.TcpBootstrap(0, 17, "127.0.0.1:1")  # the library's own refusal: only the root refuses a world above 16


def test_all_gather_v_counts_name_the_problem() -> None:
    """Each refusal of counts says what is wrong with which entry, before the lengths of inp and out are compared."""
    with _world1() as g:
        inp, out = tpfabric.empty(1000, "float32"), tpfabric.empty(1000, "float32")
        with pytest.raises(ValueError, match=r"^counts\[0\]=-1: must not be negative$"):
            g.all_gather_v(out, inp, [-1])
        with pytest.raises(ValueError, match=r"^counts has 2 entries, world is 1: one per rank$"):
            g.all_gather_v(out, inp, [1000, 0])
        with pytest.raises(ValueError, match=r"^counts has 0 entries, world is 1"):
            g.all_gather_v(out, inp, [])
        with pytest.raises(ValueError, match=r"^counts\[0\]=18446744073709551616: above 18446744073709551615"):
            g.all_gather_v(out, inp, [1 << 64])
        with pytest.raises(ValueError, match=r"^counts\[0\]=4611686018427387904: too large, 4611686018427387904 \* 4 bytes"):
            g.all_gather_v(out, inp, [1 << 62])  # fits 64 bits as elements, not as bytes
        with pytest.raises(TypeError, match=r"^counts\[0\]=1.5: expected an integer, got float$"):
            g.all_gather_v(out, inp, [1.5])  # type: ignore[list-item]
        with pytest.raises(TypeError, match=r"^counts: expected a sequence of 1 integers, got int$"):
            g.all_gather_v(out, inp, 1000)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"^inp has 1000 elements, counts\[0\] is 999$"):
            g.all_gather_v(out, inp, [999])
        g.all_gather_v(out, inp, np.array([1000]))  # numpy integers are integers
        addr = inp.ctypes.data
        with pytest.raises(ValueError, match=r"^counts_bytes\[0\]=-16: must not be negative$"):
            g.all_gather_v_raw(addr, addr, [-16])
        with pytest.raises(ValueError, match=r"^counts_bytes has 2 entries, world is 1"):
            g.all_gather_v_raw(addr, addr, [16, 16])
    # Entries that fit one by one but not summed: a world of two, the checks before any group is needed.
    with pytest.raises(ValueError, match=r"^counts_bytes: too large, 18446744073709551616 elements in all"):
        _group._counts([1 << 63, 1 << 63], 1, "counts_bytes")


@pytest.mark.parametrize("arg", ["rank", "world", "max_bytes", "timeout_ms", "open_timeout_ms", "spin_us", "max_blocks"])
def test_negative_and_oversized_integers_are_refused(arg: str) -> None:
    """ctypes wraps -1 into 4294967295 and 2**32 into 0: every unsigned argument is checked before the library sees it."""
    called = []

    def boot(mine: bytes) -> bytes:
        called.append(mine)
        return mine

    def open_with(value: object) -> None:
        positional = {"rank": 0, "world": 2, "max_bytes": 4096}  # world 2: a bad value let through calls boot
        if arg in positional:
            p = dict(positional, **{arg: value})
            tpfabric.Group(p["rank"], p["world"], p["max_bytes"], boot)  # type: ignore[arg-type]
        else:
            tpfabric.Group(0, 2, 4096, boot, **{arg: value})  # type: ignore[arg-type]

    too_big = 1 << (64 if arg == "max_bytes" else 32)
    with pytest.raises(ValueError, match=rf"^{arg}=-1: must not be negative$"):
        open_with(-1)
    with pytest.raises(ValueError, match=rf"^{arg}={too_big}: above {too_big - 1}"):
        open_with(too_big)
    with pytest.raises(TypeError, match=rf"^{arg}=1.5: expected an integer"):
        open_with(1.5)
    assert not called, "the open began despite a bad argument"


def test_negative_integers_on_a_group_and_a_bootstrap() -> None:
    with _world1() as g:
        with pytest.raises(ValueError, match=r"^nbytes=-1: must not be negative"):
            g.fits(-1)
        with pytest.raises(ValueError, match=r"^peer=-1: must not be negative"):
            g.route(-1)
        assert g.route(0) == "self" and g.route(1) == "none"
        assert g.fits(0) and not g.fits(1 << 70)  # Python ints: no wrap
        buf = tpfabric.zeros(16, "float32")
        with pytest.raises(ValueError, match=r"^nbytes=-1: must not be negative"):
            g.all_gather_raw(buf.ctypes.data, buf.ctypes.data, -1)
        with pytest.raises(ValueError, match=r"^count=-4: must not be negative"):
            g.all_reduce_sum_raw(buf.ctypes.data, buf.ctypes.data, -4, "float32")
        with pytest.raises(ValueError, match="negative"):
            g.all_gather_v_raw(buf.ctypes.data, buf.ctypes.data, [-16])
        g.all_reduce_sum_raw(buf.ctypes.data, buf.ctypes.data, 16, "float32")  # still usable
    for kw in ({"rank": -1}, {"world": -2}, {"timeout_ms": -1}):
        args = dict({"rank": 0, "world": 2, "timeout_ms": 0}, **kw)
        name, value = next(iter(kw.items()))
        with pytest.raises(ValueError, match=rf"^{name}={value}: must not be negative"):
            tpfabric.TcpBootstrap(args["rank"], args["world"], "127.0.0.1:1", args["timeout_ms"])


def test_object_arrays_are_refused() -> None:
    """Object arrays hold this process's PyObject pointers: gathered to another rank they crash its reader."""
    with _world1() as g:
        inp = np.empty(4, dtype=object)
        inp[:] = ["a", 1, [2], None]
        out = np.empty(4, dtype=object)
        with pytest.raises(TypeError, match=r"^inp: an object array holds Python objects"):
            g.all_gather(out, inp)
        with pytest.raises(TypeError, match=r"^out: an object array holds Python objects"):
            g.all_gather(out, tpfabric.zeros(4, "float64"))
        rec = np.zeros(2, dtype=[("x", "f8"), ("obj", "O")])  # a structured dtype with an object field
        with pytest.raises(TypeError, match="holds Python objects"):
            g.all_gather(rec.copy(), rec)
        with pytest.raises(TypeError, match="holds Python objects"):
            g.all_gather_v(out, inp, [4])
        with pytest.raises(TypeError, match="holds Python objects"):
            g.all_reduce_sum(out, inp)
        plain = np.zeros(2, dtype=[("x", "f8"), ("n", "i8")])  # records without objects: bytes, gathered as such
        plain["n"] = [7, 9]
        got = np.zeros(2, dtype=plain.dtype)
        g.all_gather(got, plain)
        assert np.array_equal(got, plain)


class _Boom(RuntimeError):
    pass


def test_bootstrap_exceptions_fail_the_open_not_the_process() -> None:
    def boom(mine: bytes) -> bytes:
        raise _Boom("the engine's store is down")

    with pytest.raises(tpfabric.PeerLost, match="callback returned 4") as e:
        tpfabric.Group(0, 2, 4096, boom)
    assert isinstance(e.value.__cause__, _Boom)
    # The Python exception is in the message too, where a log that prints only str(e) still shows it.
    assert str(e.value).endswith("; the bootstrap raised _Boom: the engine's store is down"), str(e.value)
    assert e.value.detail == str(e.value) and e.value.code == 4

    def slow(mine: bytes) -> bytes:
        raise TimeoutError("no answer from rank 1")

    with pytest.raises(tpfabric.Timeout) as t:
        tpfabric.Group(0, 2, 4096, slow)
    assert isinstance(t.value.__cause__, TimeoutError)
    assert str(t.value).endswith("; the bootstrap raised TimeoutError: no answer from rank 1"), str(t.value)

    with pytest.raises(tpfabric.PeerLost) as w:
        tpfabric.Group(0, 2, 4096, lambda mine: mine)  # one record where world * len are due
    assert isinstance(w.value.__cause__, ValueError) and "expected world" in str(w.value.__cause__)

    def aborted(mine: bytes) -> bytes:
        raise tpfabric.Aborted("Aborted: the engine is shutting down", 6)

    with pytest.raises(tpfabric.Aborted, match="callback returned 6") as a:
        tpfabric.Group(0, 2, 4096, aborted)
    assert str(a.value).endswith("; the bootstrap raised Aborted: the engine is shutting down"), str(a.value)  # once

    def silent(mine: bytes) -> bytes:
        raise RuntimeError

    with pytest.raises(tpfabric.PeerLost) as r:
        tpfabric.Group(0, 2, 4096, silent)
    assert str(r.value).endswith("; the bootstrap raised RuntimeError"), str(r.value)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)])
def test_bootstrap_interrupt_is_raised_as_itself(exc: BaseException) -> None:
    """Ctrl-C or sys.exit() inside the bootstrap must stop the program as it would anywhere else, not read as PeerLost."""
    calls = []

    def interrupted(mine: bytes) -> bytes:
        calls.append(len(mine))
        raise exc

    with pytest.raises(type(exc)) as e:
        tpfabric.Group(0, 2, 4096, interrupted)
    assert e.value is exc and len(calls) == 1
    assert e.value.__cause__ is None and e.value.__context__ is None  # unchanged: no tpfabric error chained


@pytest.mark.parametrize("returned", ["text", 42, None, ["a", "b"]])
def test_bootstrap_that_does_not_return_bytes(returned: object) -> None:
    with pytest.raises(TypeError, match=rf"^bootstrap: the callable returned {type(returned).__name__}; it must return bytes"):
        tpfabric.Group(0, 2, 4096, lambda mine: returned)  # world 1 exchanges nothing: 2, failing at the first record


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


def test_dtype_accepts_numpy_and_torch_dtype_objects() -> None:
    """``dtype=np.float32`` (a numpy scalar type), ``np.dtype(...)``, DType and names all name the sums' types."""
    from tpfabric._buffers import as_dtype

    F32, F16, BF16 = tpfabric.DType.F32, tpfabric.DType.F16, tpfabric.DType.BF16
    for given, want in [(np.float32, F32), (np.float16, F16), (np.dtype("float32"), F32), (np.dtype(np.float16), F16),
                        ("float32", F32), ("f16", F16), ("bf16", BF16), ("numpy.float32", F32), (F16, F16)]:
        assert as_dtype(given) is want, given
    for given, shown in [(np.float64, "float64 (<class 'numpy.float64'>)"), (np.dtype("int8"), "int8"),
                         (float, "float64 (<class 'float'>)"), ("int8", "'int8'"), ("f4", "'f4'")]:
        with pytest.raises(ValueError, match=rf"^dtype {re.escape(shown)}: the sums take float32, float16 and bfloat16$"):
            as_dtype(given)
    with _world1() as g:
        for dtype in (np.float32, np.dtype("float32"), "float32"):
            x = tpfabric.empty(8, "float32")
            x[:] = np.arange(8)
            out = tpfabric.zeros(8, "float32")
            g.all_reduce_sum(out, x, dtype=dtype)
            assert np.array_equal(out, x)
            out[:] = 0
            g.all_reduce_sum_raw(x.ctypes.data, out.ctypes.data, 8, dtype)
            assert np.array_equal(out, x)
        h = tpfabric.empty(8, "float16")
        h[:] = 1.5
        out16 = tpfabric.zeros(8, "float16")
        g.all_reduce_sum(out16, h, dtype=np.float16)
        assert np.array_equal(out16, h)
        with pytest.raises(ValueError, match=r"^dtype float64 \(<class 'numpy.float64'>\): the sums take"):
            g.all_reduce_sum(tpfabric.empty(8, "float64"), tpfabric.empty(8, "float64"), dtype=np.float64)


def test_star_import_brings_only_the_api() -> None:
    """``from tpfabric import *`` must not replace the importer's __version__ or the builtin SystemError."""
    ns: dict = {"__version__": "the importer's", "__name__": "importer"}
    exec("from tpfabric import *", ns)  # noqa: S102 - the star import under test, in its own namespace
    assert ns["__version__"] == "the importer's"
    assert "SystemError" not in ns and "error_class" not in ns and "annotations" not in ns
    assert {"Group", "TcpBootstrap", "empty", "Error", "PeerLost", "Busy", "InvalidArgument"} <= set(ns)
    assert set(tpfabric.__all__) == {k for k in ns if k != "__builtins__" and k != "__name__" and k != "__version__"}
    # Still there by name: the C status's class, the helper, the version.
    assert tpfabric.SystemError.code == 27 and tpfabric.SystemError is not builtins.SystemError
    assert "SystemError" not in tpfabric.__all__ and "__all__" in (tpfabric.SystemError.__doc__ or "")
    assert tpfabric.error_class(27) is tpfabric.SystemError and tpfabric.__version__ == tpfabric.library_version()
    assert not hasattr(tpfabric, "annotations"), "the __future__ import leaks as a public name"
    for name in tpfabric.__all__:
        assert hasattr(tpfabric, name), name


def test_closed_group_raises_closed_before_arguments() -> None:
    """A closed group: Closed from every call whatever its arguments; cap 0 and path "closed", as a Communicator's."""
    g = _world1()
    assert (g.agreed_cap, g.path) == (4096, "fabric")
    x = tpfabric.empty(8, "float32")
    g.close()
    assert (g.closed, g.agreed_cap, g.path, g.rank, g.world) == (True, 0, "closed", 0, 1)
    assert repr(g) == "<tpfabric.Group rank 0 of 1 host closed>"
    bad = [
        lambda: g.all_gather(x, [1.0]),                              # TypeError on an open group
        lambda: g.all_gather(tpfabric.empty(3, "float32"), x),       # out of the wrong size
        lambda: g.all_reduce_sum(np.zeros(3), np.zeros(3)),          # float64
        lambda: g.all_reduce_sum(x, x, dtype="int8"),
        lambda: g.all_gather_v(x, x, [1, 2, 3]),
        lambda: g.all_gather_raw(0, 0, -1),
        lambda: g.all_reduce_sum_raw(0, 0, 8, "float64", stream=7),
        lambda: g.all_gather_v_raw(0, 0, "counts"),
        lambda: g.fits(-1),
        lambda: g.route(-1),
        g.check,
        g.abort,
    ]
    for call in bad:
        with pytest.raises(tpfabric.Closed, match="^Closed: the group was closed$"):
            call()


def test_host_group_refuses_a_stream() -> None:
    """``stream=`` is for device groups: a host group raises ValueError naming it rather than ignoring it."""
    with _world1() as g:
        x, out = tpfabric.empty(16, "float32"), tpfabric.empty(16, "float32")
        x[:] = 2.0
        calls = [
            lambda s: g.all_gather_raw(x.ctypes.data, out.ctypes.data, 64, stream=s),
            lambda s: g.all_reduce_sum_raw(x.ctypes.data, out.ctypes.data, 16, "float32", stream=s),
            lambda s: g.all_gather_v_raw(x.ctypes.data, out.ctypes.data, [64], stream=s),
        ]
        for call in calls:
            out[:] = 0
            with pytest.raises(ValueError, match=r"^stream=1234: a host group's calls block and take no stream; "
                                                 r"stream is for buffers='device' groups \(pass stream=None here\)$"):
                call(1234)
            with pytest.raises(ValueError, match=r"^stream=0: "):  # 0, the default stream, is a stream too
                call(0)
            assert not out.any(), "a refused call wrote"
            call(None)
            assert (out == 2.0).all()


def test_type_hints_resolve_at_run_time() -> None:
    """typing.get_type_hints (sphinx-autodoc-typehints, run-time validators) works without numpy imported by the package."""
    import typing

    for fn in (tpfabric.empty, tpfabric.zeros, tpfabric.aligned, tpfabric.is_aligned, tpfabric.Group.all_reduce_sum,
               tpfabric.Group.__init__, tpfabric.TcpBootstrap.__init__):
        hints = typing.get_type_hints(fn)
        assert "return" in hints, fn


def test_torch_absent_says_how_to_install_it() -> None:
    """``import tpfabric.torch`` without torch: an ImportError with the fix, as the host path's without numpy."""
    code = """
import sys
sys.modules["torch"] = None  # what the import system does for a package that is not installed
import tpfabric
try:
    import tpfabric.torch
except ModuleNotFoundError as e:
    assert isinstance(e, ImportError) and e.name == "torch" and e.__cause__ is not None
    print(str(e))
else:
    raise AssertionError("tpfabric.torch imported without torch")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("tpfabric.torch needs torch ("), r.stdout
    assert r.stdout.rstrip().endswith(
        "; the Communicator needs PyTorch: apt-get install python3-torch or pip install torch (tpfabric.Group does not)"
    ), r.stdout


def test_non_native_byte_order_is_refused() -> None:
    """A byte-swapped array has numpy's name of the native one: summed or gathered beside a native one it would give garbage."""
    with tpfabric.Group(0, 1, 4096, lambda m: m) as g:
        x = tpfabric.empty(4, ">f4" if np.little_endian else "<f4")
        x[:] = [1, 2, 3, 4]
        o = tpfabric.zeros(4, "float32")
        with pytest.raises(ValueError, match=r"not in this machine's byte order; convert it first: x\.astype"):
            g.all_reduce_sum(o, x)
        with pytest.raises(ValueError, match="byte order"):
            g.all_gather(o, x)
        assert not o.any()  # nothing written
        g.all_reduce_sum(o, x.astype(x.dtype.newbyteorder("=")))
        assert list(o) == [1, 2, 3, 4]


def test_socket_path_takes_path_like() -> None:
    """pathlib.Path and bytes name a socket as a str does (world 1 asks no daemon); anything else is a TypeError naming it."""
    import pathlib

    for path in (pathlib.Path("/nonexistent/tpfabricd.sock"), b"/nonexistent/tpfabricd.sock"):
        with tpfabric.Group(0, 1, 4096, lambda m: m, socket_path=path) as g:
            assert g.world == 1
    with pytest.raises(TypeError, match="socket_path: a str, bytes or os.PathLike, got int"):
        tpfabric.Group(0, 1, 4096, lambda m: m, socket_path=5)  # type: ignore[arg-type]
