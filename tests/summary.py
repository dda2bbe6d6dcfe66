#!/usr/bin/env python3
"""Counts Meson test results into one line: "N passed, N failed, N skipped".

    summary.py [--build-failures N] testlog.json...

Every testlog.json given (one per build dir: build, build-asan, build-tsan,
build-fuzz) is counted; a stage that did not build counts as one failure each
(--build-failures). A line per file comes before the final line. Exit 1 if anything failed or nothing ran."""
import json
import sys

args = sys.argv[1:]
build_failures = 0
if len(args) >= 2 and args[0] == "--build-failures":
    build_failures = int(args[1])
    args = args[2:]

passed = failed = skipped = 0
for path in args:
    p = f = s = 0
    try:
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line).get("result")
                if r in ("OK", "EXPECTEDFAIL"):
                    p += 1
                elif r == "SKIP":
                    s += 1
                else:
                    f += 1
    except OSError as e:
        print(f"summary: cannot read {path}: {e.strerror}")
        f += 1
    except ValueError as e:
        print(f"summary: {path} is not a Meson test log: {e}")
        f += 1
    print(f"  {path}: {p} passed, {f} failed, {s} skipped")
    passed, failed, skipped = passed + p, failed + f, skipped + s
failed += build_failures
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or passed == 0 else 0)
