#!/usr/bin/env python3
"""Prints the ninja targets (paths relative to the build dir) of every target
that `meson install` installs, read from `meson introspect BUILDDIR --targets`
on stdin. debian/rules builds only these."""
import json
import os
import sys

build = os.path.abspath(sys.argv[1])
for t in json.load(sys.stdin):
    if t.get("installed"):
        for f in t["filename"]:
            print(os.path.relpath(f, build))
