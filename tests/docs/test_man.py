#!/usr/bin/env python3
"""The man pages (man/*.scd, built by scdoc) against the programs and the config loader.

    test_man.py render PAGE...
        each page renders with `man -l` and with `groff -man -ww -z` without a
        warning or an error;
    test_man.py options PAGE PROGRAM
        every option and command that `PROGRAM --help` prints (and each
        command's `PROGRAM COMMAND --help`) appears in PAGE;
    test_man.py config PAGE CONFIG_CPP
        every key the config loader accepts (the KeySpec tables of
        daemon/config/config.cpp) appears in PAGE as `key = ...` under the
        heading of its section ([daemon], [proxy], ...).

Exit 0 when every check passes, 1 naming each one that fails, 77 (skip) when
no page was built (scdoc absent at configure time) or man/groff is missing.
"""
import os
import re
import shutil
import subprocess
import sys

SKIP = 77


def skip(why: str) -> None:
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def rendered(page: str) -> str:
    """The page as a reader sees it, unhyphenated and wide, as plain text."""
    env = dict(os.environ, MANWIDTH="200", MANROFFOPT="-rHY=0", MAN_KEEP_FORMATTING="", LC_ALL="C.UTF-8")
    out = subprocess.run(["man", "-l", page], capture_output=True, text=True, env=env, check=True).stdout
    return re.sub(r".\x08", "", out)  # overstrike (bold, underline) to plain


def render(pages: list[str]) -> list[str]:
    fails = []
    env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8")
    for page in pages:
        g = subprocess.run(["groff", "-man", "-ww", "-z", page], capture_output=True, text=True)
        if g.returncode != 0 or g.stderr.strip():
            fails.append(f"{page}: groff -man -ww -z: exit {g.returncode}: {g.stderr.strip()}")
        m = subprocess.run(["man", "--warnings", "-l", page], capture_output=True, text=True, env=env)
        if m.returncode != 0 or m.stderr.strip():
            fails.append(f"{page}: man --warnings -l: exit {m.returncode}: {m.stderr.strip()}")
        elif len(m.stdout.splitlines()) < 10:
            fails.append(f"{page}: man -l printed {len(m.stdout.splitlines())} lines")
        else:
            print(f"ok: {page} renders without warnings")
    return fails


def help_text(argv: list[str]) -> str:
    r = subprocess.run(argv + ["--help"], capture_output=True, text=True, env=dict(os.environ, COLUMNS="200"))
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(argv)} --help exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def options_of(text: str) -> tuple[list[str], list[str]]:
    """Options (-h, --json, ...) and commands a CLI11 help text lists."""
    opts, cmds, section = [], [], ""
    for line in text.splitlines():
        if line and not line[0].isspace():
            section = line.strip().rstrip(":")
            continue
        m = re.match(r"\s+(-[\w-]+(?:,\s*-[\w-]+)*)", line)
        if m and section != "Subcommands":
            opts += [o.strip() for o in m.group(1).split(",")]
        m = re.match(r"\s+([a-z][\w-]*)\s{2,}\S", line)
        if m and section == "Subcommands":
            cmds.append(m.group(1))
    return opts, cmds


def options(page: str, program: str) -> list[str]:
    name = os.path.basename(program)
    top = help_text([program])
    opts, cmds = options_of(top)
    wanted = [(o, f"{name} --help") for o in opts] + [(c, f"{name} --help (command)") for c in cmds]
    for c in cmds:
        sub_opts, _ = options_of(help_text([program, c]))
        wanted += [(o, f"{name} {c} --help") for o in sub_opts]
    if not opts:
        return [f"{name} --help: no option found in its output (has its format changed?)"]
    text = rendered(page)
    fails, seen = [], set()
    for word, where in wanted:
        if word in seen:
            continue
        seen.add(word)
        if re.search(r"(?<![\w-])" + re.escape(word) + r"(?![\w-])", text):
            print(f"ok: {word} ({where}) is in {os.path.basename(page)}")
        else:
            fails.append(f"{word}, printed by {where}, is not in {os.path.basename(page)}")
    return fails


def config_keys(config_cpp: str) -> dict[str, list[str]]:
    """{section: [key, ...]} from the KeySpec tables and kSections of config.cpp."""
    src = open(config_cpp).read()
    tables = {}
    for m in re.finditer(r"const KeySpec (k\w+)\[\] = \{(.*?)\n\};", src, re.S):
        tables[m.group(1)] = re.findall(r'^    \{"(\w+)",', m.group(2), re.M)
    sections = re.search(r"const SectionSpec kSections\[\] = \{(.*?)\};", src, re.S)
    if not sections:
        raise SystemExit(f"FAIL: no kSections table in {config_cpp} (has the loader changed?)")
    out = {}
    for name, table in re.findall(r'\{"(\w+)",\s*(k\w+)\}', sections.group(1)):
        if not tables.get(table):
            raise SystemExit(f"FAIL: no keys found in {table} of {config_cpp} (has the loader changed?)")
        out[name] = tables[table]
    return out


def config(page: str, config_cpp: str) -> list[str]:
    keys = config_keys(config_cpp)
    text = rendered(page)
    # The page's sections: a heading at column 0, its body indented below it.
    bodies, head = {}, None
    for line in text.splitlines():
        if line and not line[0].isspace():
            head = line.strip()
            bodies.setdefault(head, [])
        elif head is not None:
            bodies[head].append(line)
    fails = []
    for section, names in keys.items():
        body = bodies.get(f"[{section}]")
        if body is None:
            fails.append(f"section [{section}] has no heading in {os.path.basename(page)}")
            continue
        for key in names:
            if any(re.match(r"\s+" + re.escape(key) + r" = ", line) for line in body):
                print(f"ok: {section}.{key} is in [{section}] of {os.path.basename(page)}")
            else:
                fails.append(f"{section}.{key} (accepted by {os.path.basename(config_cpp)}) is not described under "
                             f"[{section}] in {os.path.basename(page)}")
    return fails


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    mode, args = sys.argv[1], sys.argv[2:]
    if not args or not args[0]:
        skip("the man pages were not built: scdoc was not found when the build was configured "
             "(apt install scdoc, then meson setup --reconfigure)")
    for tool in ("man", "groff"):
        if not shutil.which(tool):
            skip(f"{tool} is not installed")
    if mode == "render":
        fails = render(args)
    elif mode == "options":
        fails = options(args[0], args[1])
    elif mode == "config":
        fails = config(args[0], args[1])
    else:
        print(f"test_man.py: unknown mode {mode}")
        return 2
    for f in fails:
        print(f"FAIL: {f}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
