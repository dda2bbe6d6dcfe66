#!/usr/bin/env python3
"""Counts Meson test results (testlog.json files) into one line:
"N passed, N failed, N skipped". Exit 1 if anything failed or nothing ran."""
import json
import sys

passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line).get("result")
                if r in ("OK", "EXPECTEDFAIL"):
                    passed += 1
                elif r == "SKIP":
                    skipped += 1
                else:
                    failed += 1
    except OSError as e:
        print(f"summary: cannot read {path}: {e.strerror}", file=sys.stderr)
        failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or passed == 0 else 0)
