#!/usr/bin/env python3
"""Prints the Ninja targets (paths under the build dir) that the given Meson
tests need: each test's executable and its `depends`. tests/run.sh builds only
these in its sanitizer stages instead of the whole tree.

    targets_for.py BUILD_DIR [--suite S]... [NAME]...

A test is selected when it is in one of the suites or has one of the names.
"""
import json
import os
import subprocess
import sys

args = sys.argv[1:]
if not args:
    sys.exit(__doc__)
build, rest = args[0], args[1:]
suites, names = set(), set()
while rest:
    a = rest.pop(0)
    if a == "--suite":
        suites.add(rest.pop(0))
    else:
        names.add(a)


def introspect(what):
    out = subprocess.run(["meson", "introspect", build, what], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


targets = {t["id"]: t for t in introspect("--targets")}
by_file = {f: t for t in targets.values() for f in t["filename"]}
want = set()
top = os.path.realpath(build)
for test in introspect("--tests"):
    in_suite = any(s.split(":")[-1] in suites for s in test["suite"])
    if not (in_suite or test["name"] in names):
        continue
    for dep in test.get("depends", []):
        if dep in targets:
            want.update(targets[dep]["filename"])
    exe = test["cmd"][0]
    if exe in by_file:
        want.add(exe)
for f in sorted(want):
    print(os.path.relpath(os.path.realpath(f), top))
