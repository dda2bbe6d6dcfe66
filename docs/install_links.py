#!/usr/bin/env python3
"""Rewrite one guide's relative links for the installed doc directory.

The guides link each other and the source tree (`../systemd/...`,
`../examples/...`, `../include/...`) as they lie in the repository. Installed
into PREFIX/share/doc/tpfabric (examples/ below it, the example config beside
them, the headers in PREFIX/include), a link keeps working when its target is
installed too: it is rewritten to the installed place. A link to what is not
installed (a developer's guide, a test's README) becomes its text followed by
"(PATH in the tpfabric source tree)", so no installed link points nowhere.

Usage: install_links.py IN OUT [--in-examples]
  --in-examples: IN is examples/README.md (installed as examples/README.md).
"""

import re
import sys

# Installed beside the guides (share/doc/tpfabric).
INSTALLED_DOCS = {
    "configuration.md", "integration.md", "operations.md", "status.md", "python.md", "gpu.md",
    "verbs.md", "design.md", "perf.md", "reliability.md", "perf-x2.png",
}
# Repository path (from docs/) -> installed path (from share/doc/tpfabric).
MOVED = {
    "../systemd/tpfabricd.conf.example": "tpfabricd.conf.example",
    "../examples/README.md": "examples/README.md",
    "../examples/CMakeLists.txt": "examples/CMakeLists.txt",
    "../examples/hello.c": "examples/hello.c",
    "../examples/hello.cpp": "examples/hello.cpp",
    "../examples/hello.rs": "examples/hello.rs",
    "../include/tpfabric/errc.h": "../../../include/tpfabric/errc.h",
}

LINK = re.compile(r"\[([^\]]*)\]\(([^)\s#]*)(#[^)\s]*)?\)")


def rewrite(text: str, in_examples: bool) -> str:
    def one(m: re.Match) -> str:
        label, target, anchor = m.group(1), m.group(2), m.group(3) or ""
        if not target or re.match(r"^[a-z]+:", target):
            return m.group(0)  # an anchor of this page, or a URL
        repo = target
        if in_examples:  # relative to examples/: as seen from docs/
            repo = target[len("../docs/"):] if target.startswith("../docs/") else "../examples/" + target
        if repo in INSTALLED_DOCS:
            dest = repo
        elif repo in MOVED:
            dest = MOVED[repo]
        else:
            source = repo[3:] if repo.startswith("../") else "docs/" + repo
            if label.strip("`") == source.rsplit("/", 1)[-1]:
                return f"{source} in the tpfabric source tree"
            return f"{label} ({source} in the tpfabric source tree)"
        if in_examples:  # back to a path from examples/
            dest = dest[len("examples/"):] if dest.startswith("examples/") else "../" + dest
        return f"[{label}]({dest}{anchor})"

    return LINK.sub(one, text)


def main() -> int:
    args = sys.argv[1:]
    in_examples = "--in-examples" in args
    paths = [a for a in args if a != "--in-examples"]
    if len(paths) != 2:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    with open(paths[0], encoding="utf-8") as f:
        text = f.read()
    with open(paths[1], "w", encoding="utf-8") as f:
        f.write(rewrite(text, in_examples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
