"""Fixtures of the Python tests (tests/python/meson.build runs each file through run_pytest.py)."""

from __future__ import annotations

from typing import Iterator

import pytest

from tpf_testing import Daemon, scrub_env

scrub_env()


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    """The real tpfabricd on a temporary socket, shared by a test file; it must stop cleanly (status 0)."""
    d = Daemon()
    try:
        yield d
    finally:
        rc = d.stop()
    assert rc == 0, f"tpfabricd exited with {rc}:\n{d.log()}"
