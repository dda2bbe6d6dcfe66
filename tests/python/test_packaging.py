"""Installing the package: pip with no network (the in-tree backend), the wheel's bytes, and meson install.

pip runs with --no-index and a proxy that refuses every connection, on a
copy of python/ (so nothing is written into the source tree); the installed
package must import and report the release of meson.build. meson install
(--destdir, the runtime and python-runtime tags) must put the package where
it finds the library installed beside it with no TPF_LIBRARY and no
LD_LIBRARY_PATH, and (a configure of its own, nothing compiled) where the
interpreter Meson installs for imports it, with --prefix=/usr and with the
default /usr/local.
"""

from __future__ import annotations

import base64
import hashlib
import json
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Dict

import pytest


SRC = Path(os.environ["TPF_SOURCE_ROOT"])
VERSION = os.environ["TPF_EXPECT_VERSION"]
PACKAGE = sorted(p.name for p in (SRC / "python" / "tpfabric").iterdir() if p.suffix == ".py" or p.name == "py.typed")


def _offline_env() -> Dict[str, str]:
    env = dict(os.environ)
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1",
               http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9",
               HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9")
    env.pop("PYTHONPATH", None)
    return env


def _source_copy(tmp: Path) -> Path:
    """python/ and the meson.build its version comes from, as a checkout has them."""
    shutil.copytree(SRC / "python", tmp / "src" / "python", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(SRC / "meson.build", tmp / "src" / "meson.build")
    return tmp / "src" / "python"


def _import_from(path: Path, env: Dict[str, str]) -> str:
    code = "import tpfabric, os; print(tpfabric.__version__); print(os.path.dirname(tpfabric.__file__)); print(tpfabric.library_path())"
    r = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=str(path)), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_pip_install_offline(tmp_path: Path) -> None:
    src = _source_copy(tmp_path)
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--target", str(target), str(src)],
                       env=_offline_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"Successfully installed tpfabric-{VERSION}" in r.stdout
    files = sorted(p.name for p in (target / "tpfabric").iterdir() if p.name != "__pycache__")
    assert files == sorted(PACKAGE + ["_build_info.py"])
    meta = (target / f"tpfabric-{VERSION}.dist-info" / "METADATA").read_text()
    assert f"Version: {VERSION}" in meta
    out = _import_from(target, dict(os.environ)).splitlines()
    assert out[0] == VERSION and out[1] == str(target / "tpfabric")
    assert sorted(p.name for p in src.rglob("*") if "__pycache__" in p.parts or p.suffix == ".whl") == []


def _backend():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("tpfabric_build", SRC / "python" / "_backend" / "tpfabric_build.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_wheel_and_sdist(tmp_path: Path) -> None:
    backend = _backend()
    assert backend.get_requires_for_build_wheel() == [] and backend.get_requires_for_build_sdist() == []
    assert backend.version() == VERSION
    name = backend.build_wheel(str(tmp_path))
    assert name == f"tpfabric-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(tmp_path / name) as z:
        names = set(z.namelist())
        info = f"tpfabric-{VERSION}.dist-info"
        assert names == {f"tpfabric/{p}" for p in PACKAGE} | {"tpfabric/_build_info.py"} | {
            f"{info}/METADATA", f"{info}/WHEEL", f"{info}/RECORD"}
        assert "Tag: py3-none-any" in z.read(f"{info}/WHEEL").decode()
        record = [line.split(",") for line in z.read(f"{info}/RECORD").decode().splitlines()]
        assert {row[0] for row in record} == names
        for path, digest, size in record:
            if path.endswith("RECORD"):
                continue
            data = z.read(path)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={want}", len(data)), path
        assert f"VERSION = {VERSION!r}" in z.read("tpfabric/_build_info.py").decode()
    # The sdist carries its version in PKG-INFO, and pip builds it offline, away from meson.build.
    sdist = backend.build_sdist(str(tmp_path))
    with tarfile.open(tmp_path / sdist) as t:
        members = set(t.getnames())
    base = f"tpfabric-{VERSION}"
    assert {f"{base}/pyproject.toml", f"{base}/PKG-INFO", f"{base}/_backend/tpfabric_build.py", f"{base}/tpfabric/__init__.py"} <= members
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--target", str(tmp_path / "from-sdist"),
                        str(tmp_path / sdist)], env=_offline_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _import_from(tmp_path / "from-sdist", dict(os.environ)).splitlines()[0] == VERSION


def test_meson_install(tmp_path: Path) -> None:
    pkgdir = os.environ.get("TPF_PY_PKGDIR", "")
    assert pkgdir, "this build installs no Python package (-Dpython=disabled, or no python3 found)"
    dest = tmp_path / "dest"
    r = subprocess.run([os.environ["TPF_MESON"], "install", "-C", os.environ["TPF_BUILD_ROOT"], "--no-rebuild", "--quiet",
                        "--destdir", str(dest), "--tags", "runtime,python-runtime"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    installed = Path(str(dest) + pkgdir)
    assert sorted(p.name for p in installed.iterdir()) == sorted(PACKAGE + ["_build_info.py"])
    env = {k: v for k, v in os.environ.items() if k not in ("TPF_LIBRARY", "LD_LIBRARY_PATH")}
    version, where, lib = _import_from(installed.parent, env).splitlines()
    assert (version, where) == (VERSION, str(installed))
    assert lib.startswith(str(dest)) and os.path.basename(lib) == "libtpfabric.so.0", f"loaded {lib}, not the installed one"
    assert Path(lib).exists()


@pytest.mark.parametrize("prefix", ["/usr", "/usr/local"])
def test_meson_install_dir_on_sys_path(tmp_path: Path, prefix: str) -> None:
    """Debian's python3 reads /usr/lib/python3/dist-packages and /usr/local/lib/python3.X/dist-packages, not
    /usr/local/lib/python3/dist-packages, which is what Meson names for the default prefix."""
    build = tmp_path / "build"
    features = ["-D" + f + "=disabled" for f in ("cuda", "nccl", "verbs", "systemd")]
    r = subprocess.run([os.environ["TPF_MESON"], "setup", str(build), str(SRC), f"--prefix={prefix}"] + features,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([os.environ["TPF_MESON"], "introspect", "--installed", str(build)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    installed = [dest for dest in json.loads(r.stdout).values() if dest.endswith("/tpfabric/__init__.py")]
    assert len(installed) == 1, installed
    site = os.path.dirname(os.path.dirname(installed[0]))
    assert site.startswith(prefix + "/"), site
    # The interpreter python/meson.build installs for: Debian's first.
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    r = subprocess.run([python, "-c", "import json, sys; print(json.dumps(sys.path))"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert site in json.loads(r.stdout), f"meson install puts tpfabric in {site}, not on {python}'s sys.path: {r.stdout}"
