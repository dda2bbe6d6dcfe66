"""Runs one pytest file for Meson (tests/python/meson.build).

    run_pytest.py TEST_FILE [--needs MODULE]...

Exits 77 (Meson's skip) only when pytest, numpy or a --needs module cannot
be imported by this interpreter, naming it; otherwise pytest's own status.
A test skipped inside the file would let the file pass silently, so any
skip fails the run; so does a file that collects no test (pytest's 5).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, List


class _NoSkips:
    def __init__(self) -> None:
        self.skipped: List[str] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.skipped:
            self.skipped.append(report.nodeid)


def main(argv: List[str]) -> int:
    test_file, needs = argv[0], ["pytest", "numpy"]
    rest = argv[1:]
    while rest[:1] == ["--needs"]:
        needs.append(rest[1])
        rest = rest[2:]
    for mod in needs:
        try:
            importlib.import_module(mod)
        except ImportError as e:
            print(f"SKIP: {mod} cannot be imported by {sys.executable} ({e}); "
                  f"apt-get install python3-{mod} (scripts/install-deps.sh)")
            return 77
    import pytest

    guard = _NoSkips()
    # -p no:cacheprovider: no .pytest_cache in the source tree.
    rc = int(pytest.main(["-p", "no:cacheprovider", "-q", "-ra", "--durations=5", test_file] + rest, plugins=[guard]))
    if guard.skipped and rc == 0:
        print(f"FAIL: {len(guard.skipped)} tests skipped inside {test_file}: {', '.join(guard.skipped)}")
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
