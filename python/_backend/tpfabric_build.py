"""A PEP 517 build backend that needs nothing but the standard library.

``pip install ./python`` builds in an isolated environment and would
download the backend named in pyproject.toml (setuptools) first; this one is
in the tree (``backend-path``) and requires nothing, so the install works with
no network. It writes a pure-Python wheel (``py3-none-any``) of
``tpfabric/`` with zipfile; the version is the library's release, read from
the ``project(... version:)`` of the Meson build one directory up (or, in an
sdist, from its PKG-INFO).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
NAME = "tpfabric"
TAG = "py3-none-any"
SUMMARY = "tpfabric collectives from Python: numpy host groups and a torch.distributed communicator"


def version() -> str:
    """The release: meson.build's project version (the library's), else an sdist's PKG-INFO."""
    meson = os.path.join(HERE, "..", "meson.build")
    if os.path.exists(meson):
        with open(meson, encoding="utf-8") as f:
            m = re.search(r"project\([^)]*?version\s*:\s*'([^']+)'", f.read(), re.S)
        if m:
            return m.group(1)
    pkg_info = os.path.join(HERE, "PKG-INFO")
    if os.path.exists(pkg_info):
        with open(pkg_info, encoding="utf-8") as f:
            for line in f:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    raise RuntimeError(
        f"tpfabric_build: no version: neither {os.path.normpath(meson)} (the checkout's meson.build, one directory "
        f"above python/) nor {pkg_info} (an sdist's) exists. Build from a whole checkout, or install the wheel "
        f"that `pip wheel ./python` made there (docs/python.md, Installing)"
    )


def _metadata(ver: str) -> str:
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {NAME}\n"
        f"Version: {ver}\n"
        f"Summary: {SUMMARY}\n"
        "License: Apache-2.0\n"
        "Requires-Python: >=3.8\n"
        "Provides-Extra: numpy\n"
        'Requires-Dist: numpy; extra == "numpy"\n'
        "Provides-Extra: torch\n"
        'Requires-Dist: torch; extra == "torch"\n'
        "\n"
        "Pure Python over libtpfabric's C ABI (ctypes). Needs libtpfabric.so.0 installed, "
        "or TPF_LIBRARY pointing at it. Guide: docs/python.md of the tpfabric source.\n"
    )


def _package_files() -> List[Tuple[str, str]]:
    """(path in the archive, path on disk) of the package: .py files and py.typed, no caches."""
    out = []
    root = os.path.join(HERE, NAME)
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") or name == "py.typed":
            if name == "_build_info.py":  # written by meson install only
                continue
            out.append((f"{NAME}/{name}", os.path.join(root, name)))
    return out


def _build_info(ver: str) -> bytes:
    return (
        "# Written by the wheel backend (python/_backend/tpfabric_build.py).\n"
        f"VERSION = {ver!r}\n"
        "LIBDIR = None  # a wheel does not know where the library is: TPF_LIBRARY or the dynamic loader\n"
        "PKGDIR = None\n"
    ).encode()


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory: str, files: Dict[str, bytes]) -> str:
    ver = version()
    dist_info = f"{NAME}-{ver}.dist-info"
    files = dict(files)
    files[f"{dist_info}/METADATA"] = _metadata(ver).encode()
    files[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: tpfabric_build\nRoot-Is-Purelib: true\nTag: {TAG}\n"
    ).encode()
    record = f"{dist_info}/RECORD"
    lines = [_record_line(n, d) for n, d in files.items()] + [f"{record},,"]
    files[record] = ("\n".join(lines) + "\n").encode()
    wheel = f"{NAME}-{ver}-{TAG}.whl"
    stamp = time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")))[:6]  # reproducible
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return wheel


# ---- PEP 517 / PEP 660 hooks ----------------------------------------------------------------

def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[dict] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Optional[dict] = None) -> str:
    ver = version()
    dist_info = f"{NAME}-{ver}.dist-info"
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    with open(os.path.join(metadata_directory, dist_info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata(ver))
    return dist_info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory: str, config_settings: Optional[dict] = None, metadata_directory: Optional[str] = None) -> str:
    files = {}
    for arcname, path in _package_files():
        with open(path, "rb") as f:
            files[arcname] = f.read()
    files[f"{NAME}/_build_info.py"] = _build_info(version())
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory: str, config_settings: Optional[dict] = None, metadata_directory: Optional[str] = None) -> str:
    """A wheel of one .pth file that puts this source directory on sys.path."""
    return _write_wheel(wheel_directory, {f"_{NAME}_editable.pth": (HERE + "\n").encode()})


def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    ver = version()
    base = f"{NAME}-{ver}"
    members = [("pyproject.toml", os.path.join(HERE, "pyproject.toml")),
               ("_backend/tpfabric_build.py", os.path.abspath(__file__))] + _package_files()
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        def add(arcname: str, data: bytes) -> None:
            info = tarfile.TarInfo(f"{base}/{arcname}")
            info.size, info.mode, info.mtime = len(data), 0o644, int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
            t.addfile(info, io.BytesIO(data))

        for arcname, path in members:
            with open(path, "rb") as f:
                add(arcname, f.read())
        add("PKG-INFO", _metadata(ver).encode())
    return name
