"""Loading libtpfabric.so.0 and declaring its C ABI (``<tpfabric/tpfabric.h>``) for ctypes.

Where the library is looked for, first match wins:

1. ``$TPF_LIBRARY``: a path to the library file. When set, nothing else is tried.
2. The library installed beside this package by ``meson install`` (the
   relation between the two directories is recorded at install time, so a
   ``--destdir`` tree or a moved prefix still finds its own library).
3. The dynamic loader's search for ``libtpfabric.so.0`` (``LD_LIBRARY_PATH``,
   ``ld.so.cache``, the system directories); ``path`` is then the file it
   opened, as ``dladdr`` reports it.

Failing all, ImportError names every place tried and why each failed. A
library that is found but needs one the loader cannot find (``libnccl.so.2``;
``libcudart.so.13`` for a library built before its CUDA runtime was linked
in: a pip-installed torch keeps them under ``site-packages/nvidia/``, off
the loader's path, and loads them at ``import torch``) is retried once after ``import torch`` when torch is installed and not
yet imported; failing that, ImportError names the missing library and the fixes.
At load, the layout of ``tpf_open_options`` and the status names are
checked against the library (``check_abi``).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import re
import sys
from typing import List, Optional, Tuple

SONAME = "libtpfabric.so.0"

# enum tpf_dtype, tpf_buffers, tpf_fallback, tpf_gpu_route (tpfabric.h)
DTYPE_F32, DTYPE_F16, DTYPE_BF16 = 0, 1, 2
BUFFERS_HOST, BUFFERS_DEVICE = 0, 1
FALLBACK_DEFAULT, FALLBACK_NCCL, FALLBACK_ERROR = 0, 1, 2
GPU_ROUTE_DEFAULT, GPU_ROUTE_AUTO, GPU_ROUTE_IPC, GPU_ROUTE_PROXY = 0, 1, 2, 3
OK = 0

#: tpf_status (*tpf_allgather_fn)(void* ctx, const void* mine, void* out, size_t bytes)
ALLGATHER_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class OpenOptions(ctypes.Structure):
    """``tpf_open_options``; initialised by ``tpf_open_options_init`` (which sets struct_size)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("buffers", ctypes.c_int32),
        ("socket_path", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_uint32),
        ("open_timeout_ms", ctypes.c_uint32),
        ("spin_us", ctypes.c_uint32),
        ("fallback", ctypes.c_int32),
        ("gpu_route", ctypes.c_int32),
        ("max_blocks", ctypes.c_uint32),
        ("nccl_comm", ctypes.c_void_p),
    ]


class HealthWord(ctypes.Structure):
    """``tpf_health``: what ``tpf_group_health`` reads (32 bytes)."""

    _fields_ = [
        ("status", ctypes.c_int32),
        ("rank", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32 * 5),
    ]


#: tpf_health.rank when the failure names no rank; tpf_health.flags bit of a group on NCCL.
NO_RANK = 0xFFFFFFFF
HEALTH_NCCL = 1

_c = ctypes
_vp, _sz, _st, _u32, _u64, _i32 = _c.c_void_p, _c.c_size_t, _c.c_int32, _c.c_uint32, _c.c_uint64, _c.c_int32
_group_pp = _c.POINTER(_c.c_void_p)

# name: (restype, argtypes). Every function of tpfabric.h.
_PROTOTYPES = {
    "tpf_open_options_init": (None, [_c.POINTER(OpenOptions)]),
    "tpf_group_open": (_st, [_u32, _u32, _u64, _vp, _vp, _c.POINTER(OpenOptions), _group_pp]),
    "tpf_group_close": (None, [_vp]),
    "tpf_all_gather": (_st, [_vp, _vp, _vp, _sz]),
    "tpf_all_gather_v": (_st, [_vp, _vp, _vp, _c.POINTER(_sz)]),
    "tpf_all_reduce_sum": (_st, [_vp, _vp, _vp, _sz, _i32]),
    "tpf_all_gather_async": (_st, [_vp, _vp, _vp, _sz, _vp]),
    "tpf_all_reduce_sum_async": (_st, [_vp, _vp, _vp, _sz, _i32, _vp]),
    "tpf_all_gather_v_async": (_st, [_vp, _vp, _vp, _c.POINTER(_sz), _vp]),
    "tpf_check": (_st, [_vp]),
    "tpf_group_health": (_st, [_vp, _c.POINTER(HealthWord)]),
    "tpf_abort": (_st, [_vp]),
    "tpf_agreed_cap": (_u64, [_vp]),
    "tpf_fits": (_c.c_int, [_vp, _sz]),
    "tpf_path": (_c.c_char_p, [_vp]),
    "tpf_route": (_c.c_char_p, [_vp, _u32]),
    "tpf_rank": (_u32, [_vp]),
    "tpf_world": (_u32, [_vp]),
    "tpf_tcp_bootstrap_create": (_st, [_u32, _u32, _c.c_char_p, _u32, _c.POINTER(_vp)]),
    "tpf_tcp_bootstrap_destroy": (None, [_vp]),
    "tpf_tcp_bootstrap_allgather": (_st, [_vp, _vp, _vp, _sz]),
    "tpf_status_name": (_c.c_char_p, [_st]),
    "tpf_strerror": (_c.c_char_p, [_st]),
    "tpf_last_error": (_c.c_char_p, []),
    "tpf_version": (_c.c_char_p, []),
    "tpf_bootstrap_time_left_ms": (_u32, []),
    "tpf_last_open_may_fall_back": (_c.c_int, []),
}


def _installed_candidates() -> List[str]:
    """The library beside a ``meson install`` of this package, from ``_build_info`` (absent in a source tree or a wheel)."""
    try:
        from . import _build_info  # type: ignore[attr-defined]
    except ImportError:
        return []
    libdir = getattr(_build_info, "LIBDIR", None)
    pkgdir = getattr(_build_info, "PKGDIR", None)
    if not libdir:
        return []
    found = []
    if pkgdir:
        here = os.path.dirname(os.path.abspath(__file__))
        found.append(os.path.normpath(os.path.join(here, os.path.relpath(libdir, pkgdir), SONAME)))
    found.append(os.path.join(libdir, SONAME))
    return list(dict.fromkeys(found))


class _DlInfo(ctypes.Structure):
    """glibc's and musl's ``Dl_info`` (``<dlfcn.h>``)."""

    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _loaded_from(found: ctypes.CDLL) -> Optional[str]:
    """The file the dynamic loader opened for ``found`` (``dladdr`` of one of its functions), absolute; None if unknown.

    The loader's search (LD_LIBRARY_PATH, ld.so.cache) is not Python's to
    repeat: ask it where the code it mapped came from.
    """
    for libc in (None, "libdl.so.2"):  # dladdr is in libc since glibc 2.34, in libdl before
        try:
            dladdr = ctypes.CDLL(libc).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.restype, dladdr.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        info = _DlInfo()
        if dladdr(ctypes.cast(found.tpf_version, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            return os.path.abspath(os.fsdecode(info.dli_fname))
        return None
    return None


# dlerror()'s words for a file it cannot open: glibc "NAME: cannot open shared object file: ...",
# musl "Error loading shared library NAME: ... (needed by ...)".
_GLIBC_CANNOT_OPEN = re.compile(r"(?:^|[\s(])([^\s:()]+): cannot open shared object file")
_MUSL_NEEDED = re.compile(r"Error loading shared library ([^\s:()]+): .*\(needed by ")


def missing_dependency(error: str, requested: str) -> Optional[str]:
    """The library that ``requested`` needs and the loader cannot find, from ``dlopen``'s error (ctypes' OSError text).

    None when the error is about ``requested`` itself (no such file: glibc
    then names the path or name it was asked for) or is another failure
    (not an ELF file, a missing symbol or symbol version).
    """
    m = _GLIBC_CANNOT_OPEN.search(error)
    if m is not None:
        return m.group(1) if m.group(1) != requested else None
    m = _MUSL_NEEDED.search(error)
    return m.group(1) if m is not None else None


def _install_hint(dep: str) -> str:
    """What to install for a missing dependency, by its soname."""
    m = re.match(r"libcudart\.so\.(\d+)", dep)
    if m:
        return f"install the CUDA {m.group(1)} runtime ({dep})"
    if dep.startswith("libnccl.so"):
        return f"install NCCL ({dep})"
    return f"install the package that provides {dep}"


class _TorchPreload:
    """``import torch``, at most once, when a library libtpfabric needs is missing.

    A CUDA torch loads its own libcudart and libnccl at import (pip's from
    ``site-packages/nvidia/``), process-wide; the loader then takes them for
    libtpfabric's NEEDED entries of the same soname.
    """

    def __init__(self) -> None:
        self.tried = False
        self.imported_here = False
        self.failure = ""

    def attempt(self) -> bool:
        """Whether torch was imported just now (so a retry may load); only the first call tries."""
        if self.tried:
            return False
        self.tried = True
        if "torch" in sys.modules:
            return False
        try:
            installed = importlib.util.find_spec("torch") is not None
        except (ImportError, ValueError):
            installed = False
        if not installed:
            return False
        try:
            importlib.import_module("torch")
        except Exception as e:  # noqa: BLE001 - a broken torch is reported in the error, not raised instead of it
            self.failure = f"{type(e).__name__}: {e}"
            return False
        self.imported_here = True
        return True

    def outcome(self, dep: str) -> str:
        """What torch did about ``dep``, for the error."""
        torch = sys.modules.get("torch")
        if torch is None:
            if self.failure:
                return f"import torch, tried to load it, failed ({self.failure})"
            return "torch, which loads it when it is a CUDA build, is not installed for this Python"
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        build = f"torch {getattr(torch, '__version__', '?')}, " + (f"CUDA {cuda}" if cuda else "a CPU-only build")
        when = "imported here to load it" if self.imported_here else "imported before tpfabric"
        return f"torch ({build}), {when}, did not load {dep}"


def _dependency_error(what: str, dep: str, error: str, torch: _TorchPreload, tried: List[str]) -> ImportError:
    return ImportError(
        f"tpfabric: {what} was found but needs {dep}, which the dynamic loader cannot find ({error}); "
        f"{torch.outcome(dep)}. Fix: {_install_hint(dep)}, or `import torch` first from a torch build that "
        f"ships {dep} (pip's CUDA torch keeps it under site-packages/nvidia/), or add the directory holding "
        f"{dep} to LD_LIBRARY_PATH"
        + (". Tried: " + "; ".join(tried) if tried else "")
    )


def _load() -> Tuple[ctypes.CDLL, str]:
    tried: List[str] = []
    torch = _TorchPreload()
    missing: List[Tuple[str, str, str]] = []  # (what was found, the dependency it lacks, dlopen's error)

    def open_library(name: str) -> ctypes.CDLL:
        """ctypes.CDLL(name); once more after ``import torch`` when a dependency is missing and torch may bring it."""
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            if missing_dependency(str(e), name) is None or not torch.attempt():
                raise
        return ctypes.CDLL(name)

    override = os.environ.get("TPF_LIBRARY", "")
    if override:
        try:
            return open_library(override), override
        except OSError as e:
            dep = missing_dependency(str(e), override)
            if dep is not None:
                raise _dependency_error(f"TPF_LIBRARY={override}", dep, str(e), torch, []) from e
            raise ImportError(
                f"tpfabric: TPF_LIBRARY={override} could not be loaded ({e}); "
                "point TPF_LIBRARY at libtpfabric.so.0, or unset it to use the installed library"
            ) from e
    for path in _installed_candidates():
        if not os.path.exists(path):
            tried.append(f"{path} (beside the installed package: no such file)")
            continue
        try:
            return open_library(path), path
        except OSError as e:
            tried.append(f"{path} ({e})")
            dep = missing_dependency(str(e), path)
            if dep is not None:
                missing.append((path, dep, str(e)))
    try:
        found = open_library(SONAME)
    except OSError as e:
        tried.append(f"{SONAME} through the dynamic loader ({e})")
        dep = missing_dependency(str(e), SONAME)
        if dep is not None:
            missing.append((f"{SONAME} (through the dynamic loader)", dep, str(e)))
    else:
        return found, _loaded_from(found) or SONAME
    if missing:
        what, dep, error = missing[0]
        raise _dependency_error(what, dep, error, torch, tried)
    raise ImportError(
        "tpfabric: libtpfabric.so.0 not found. Tried: "
        + "; ".join(tried)
        + ". Install the library (meson install, docs/integration.md), add its directory to LD_LIBRARY_PATH, "
        "or set TPF_LIBRARY=/path/to/libtpfabric.so.0"
    )


def _declare(lib: ctypes.CDLL) -> None:
    missing = []
    for name, (res, args) in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = res
        fn.argtypes = args
    if missing:
        raise ImportError(f"tpfabric: the loaded library lacks {', '.join(missing)}; it is older than this package")


def check_abi(lib: ctypes.CDLL) -> None:
    """What a C compiler would check: the options struct's size, and every status name against the exceptions."""
    opts = OpenOptions()
    lib.tpf_open_options_init(ctypes.byref(opts))
    if opts.struct_size != ctypes.sizeof(OpenOptions):
        raise ImportError(
            f"tpfabric: tpf_open_options is {opts.struct_size} bytes in the library, "
            f"{ctypes.sizeof(OpenOptions)} here; the package and the library are of different releases"
        )
    from .errors import error_class

    code = 1
    while True:
        name = lib.tpf_status_name(code).decode()
        if name == "Unknown":
            break
        cls = error_class(code)
        if cls.name not in (name, "Unknown"):
            raise ImportError(f"tpfabric: status {code} is {name} in the library but {cls.name} here")
        code += 1


lib, path = _load()
_declare(lib)
check_abi(lib)


def last_error() -> str:
    """``tpf_last_error()`` of this thread, decoded."""
    raw: Optional[bytes] = lib.tpf_last_error()
    return raw.decode(errors="replace") if raw else ""
