"""Helpers of the Python tests: the real tpfabricd on a temporary socket, and rank processes.

Ranks are separate processes started with multiprocessing's *spawn* method
(a fresh interpreter each, as engines' workers are); a rank function is a
module-level function ``fn(rank, world, *args)`` whose return value comes back
to the test. A rank that raises fails the test with its traceback.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence


# Set by tests/python/meson.build for the tests; the library reads none of them.
TEST_VARIABLES = ("TPF_LIBRARY", "TPF_DAEMON", "TPF_EXPECT_VERSION", "TPF_SOURCE_ROOT", "TPF_BUILD_ROOT", "TPF_MESON",
                  "TPF_PY_PKGDIR")


def scrub_env() -> None:
    """A developer's TPF_* variables must not change what is tested (the library reads them at every open)."""
    for k in list(os.environ):
        if k.startswith("TPF_") and k not in TEST_VARIABLES:
            del os.environ[k]


class Daemon:
    """``$TPF_DAEMON`` (Meson sets it to the built tpfabricd) on a socket in a fresh temporary directory."""

    def __init__(self) -> None:
        exe = os.environ.get("TPF_DAEMON")
        if not exe:
            raise RuntimeError("TPF_DAEMON is not set (meson test sets it to the built tpfabricd)")
        self.dir = tempfile.mkdtemp(prefix="tpf-py-")
        self.socket = os.path.join(self.dir, "tpfabricd.sock")
        self.log_path = os.path.join(self.dir, "daemon.log")
        self._log = open(self.log_path, "wb")
        # debug: the log names every connection, so a test can tell the daemon was never contacted
        self.proc = subprocess.Popen(
            [exe, "--socket", self.socket, "--foreground", "--log-level", "debug"], stdout=self._log, stderr=self._log
        )
        deadline = time.monotonic() + 10
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tpfabricd did not listen on {self.socket}:\n{self.log()}")
            time.sleep(0.02)

    def _answers(self) -> bool:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def connections(self) -> int:
        """Clients the daemon accepted so far."""
        return self.log().count("connected (pid")

    def stop(self) -> int:
        """SIGTERM; the daemon's exit status (0 for a clean stop)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn: Callable[..., Any], rank: int, world: int, args: Sequence[Any], env: Dict[str, str], q: Any) -> None:
    os.environ.update(env)
    try:
        q.put((rank, True, fn(rank, world, *args)))
    except BaseException:  # noqa: BLE001 - reported to the parent with its traceback
        q.put((rank, False, traceback.format_exc()))
    # torch's gloo worker threads can abort the interpreter's teardown
    # ("terminate called without an active exception", SIGABRT; pytorch
    # issue 190489; seen once in four runs of test_torch_cpu.py with torch
    # 1.13), after the rank's work is done and reported. A rank that imported
    # torch.distributed leaves without that teardown, its report flushed first.
    if "torch.distributed" in sys.modules:
        q.close()
        q.join_thread()
        os._exit(0)


def in_child(body: Callable[[], None]) -> int:
    """Run ``body`` in a fork()ed child; its exit status (0: body returned, 1: it raised, printed)."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            body()
            status = 0
        except BaseException:  # noqa: BLE001 - reported through the status; the parent's stack must not unwind here
            traceback.print_exc()
        finally:
            os._exit(status)  # no atexit, no finalisers of the parent's objects: only what body did
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def run_ranks(
    fn: Callable[..., Any],
    world: int,
    *args: Any,
    env: Optional[Dict[int, Dict[str, str]]] = None,
    may_exit: Sequence[int] = (),
    timeout: float = 90.0,
) -> List[Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` spawned processes; their return values by rank.

    ``env[rank]`` is set in that rank before ``fn`` runs. Ranks in
    ``may_exit`` may end without a result (a killed peer). Fails on a rank
    that raises, exits non-zero, or outlives ``timeout`` seconds.
    """
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_child, args=(fn, r, world, args, (env or {}).get(r, {}), q), name=f"rank{r}")
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: Dict[int, Any] = {}
    failures: List[str] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            rank, ok, value = q.get(timeout=0.1)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break  # every rank ended and everything they sent is read
        else:
            results[rank] = value if ok else None
            if not ok:
                failures.append(f"rank {rank} of {world} raised:\n{value}")
        if time.monotonic() > deadline:
            for p in procs:
                if p.is_alive():
                    failures.append(f"rank {p.name[4:]} of {world} did not finish within {timeout} s")
                    p.kill()
            break
    for r, p in enumerate(procs):
        p.join(5)
        if p.exitcode not in (0, None) and r not in may_exit:
            failures.append(f"rank {r} exited with {p.exitcode}")
        if r not in results and r not in may_exit and not any(f.startswith(f"rank {r} ") for f in failures):
            failures.append(f"rank {r} returned nothing")
    if failures:
        raise AssertionError("\n".join(failures))
    return [results.get(r) for r in range(world)]


def needed_and_path(library: str) -> "List[tuple]":
    """(soname, resolved path) of each library ``library`` loads, as ``ldd`` lists them (dependencies' too)."""
    out = subprocess.run(["ldd", library], capture_output=True, text=True, check=True, timeout=60).stdout
    found = []
    for line in out.splitlines():
        name, arrow, rest = line.strip().partition(" => ")
        if arrow and rest.startswith("/"):
            found.append((name, rest.split(" (")[0]))
    return found


def rename_in_dynstr(src: str, dst: str, old: str, new: str) -> None:
    """Copy the ELF64 little-endian file ``src`` to ``dst`` with every string ``old`` of its ``.dynstr`` spelled ``new``.

    ``new`` has ``old``'s length, so no offset moves: a NEEDED entry, the
    SONAME and the symbol-version names that share the string change together
    (what ``patchelf --replace-needed`` / ``--set-soname`` would do, without it).
    """
    import struct

    if len(new) != len(old):
        raise ValueError(f"{new!r} is not as long as {old!r}")
    with open(src, "rb") as f:
        data = bytearray(f.read())
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{src}: not an ELF64 little-endian file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def section(i: int) -> "tuple":  # (name offset, offset, size) of Elf64_Shdr i
        name, _type, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, off, size

    names_at = section(shstrndx)[1]
    for i in range(shnum):
        name, off, size = section(i)
        if data[names_at + name : data.index(b"\0", names_at + name)] == b".dynstr":
            table, needle = bytes(data[off : off + size]), b"\0" + old.encode() + b"\0"
            if needle not in table:
                raise ValueError(f"{src}: {old!r} is not in .dynstr")
            data[off : off + size] = table.replace(needle, b"\0" + new.encode() + b"\0")
            break
    else:
        raise ValueError(f"{src}: no .dynstr section")
    with open(dst, "wb") as f:
        f.write(data)
