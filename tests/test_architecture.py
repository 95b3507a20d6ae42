"""docs/ARCHITECTURE.md's package table against the code, so the page cannot drift.

Every package `go list ./...` sees has exactly one row; a row's "imports (ours)" cell lists exactly
the module's packages it imports (its tests' imports for a package whose own files import
nothing, a test-only suite); its cgo cell says yes exactly when it has cgo files.
"""
import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
MODULE = "github.com/gorovod/gorovod"


def go_packages():
    out = subprocess.run(["go", "list", "-json", "./..."], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    dec = json.JSONDecoder()
    pos, pkgs = 0, {}
    while pos < len(out):
        while pos < len(out) and out[pos].isspace():
            pos += 1
        if pos == len(out):
            break
        p, pos = dec.raw_decode(out, pos)
        name = p["ImportPath"].removeprefix(MODULE + "/")

        def ours(paths):
            return {i.removeprefix(MODULE + "/") for i in paths or [] if i.startswith(MODULE + "/")} - {name}

        imports = ours(p.get("Imports"))
        if not p.get("Imports"):  # only a package clause and its doc: a test-only package
            imports = ours(p.get("TestImports")) | ours(p.get("XTestImports"))
        pkgs[name] = {"imports": imports, "cgo": bool(p.get("CgoFiles"))}
    return pkgs


def table_rows(text):
    """The rows of the table under '## Packages', as (line number, cells)."""
    rows, inside = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            inside = line.startswith("## Packages")
            continue
        if inside and line.startswith("|") and not re.match(r"^\|\s*-", line):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] != "package":
                rows.append((n, cells))
    return rows


def names(cell):
    return re.findall(r"`([^`]+)`", cell)


def test_architecture_table_matches_go_list():
    pkgs = go_packages()
    rows = table_rows(DOC.read_text())
    assert rows, f"{DOC}: no package table under a '## Packages' heading"
    problems, seen = [], {}
    for line, cells in rows:
        where = f"{DOC.name}:{line}"
        if len(cells) != 4:
            problems.append(f"{where}: {len(cells)} cells, want package | owns | imports (ours) | cgo")
            continue
        listed, owns, allowed, cgo = names(cells[0]), cells[1], names(cells[2]), cells[3]
        if not listed or not owns:
            problems.append(f"{where}: a row needs its packages in backquotes and what they own")
        for pkg in listed:
            if pkg in seen:
                problems.append(f"{where}: {pkg} already has a row at line {seen[pkg]}")
            seen[pkg] = line
            if pkg not in pkgs:
                problems.append(f"{where}: {pkg} is not a package of the module (go list ./...)")
                continue
            got = pkgs[pkg]["imports"]
            if got - set(allowed):
                problems.append(f"{where}: {pkg} imports {sorted(got - set(allowed))}, which its row does not list")
            if len(listed) == 1 and set(allowed) - got:
                problems.append(f"{where}: {pkg}'s row lists {sorted(set(allowed) - got)}, which it does not import")
            if cgo.startswith("yes") != pkgs[pkg]["cgo"]:
                problems.append(f"{where}: {pkg} cgo column says {cgo!r}, it {'has' if pkgs[pkg]['cgo'] else 'has no'} cgo files")
        if len(listed) > 1:  # a shared row lists what its packages import together
            together = set().union(*(pkgs[p]["imports"] for p in listed if p in pkgs))
            if set(allowed) - together:
                problems.append(f"{where}: the row lists {sorted(set(allowed) - together)}, which none of its packages imports")
    for pkg in sorted(set(pkgs) - set(seen)):
        problems.append(f"{DOC.name}: package {pkg} (go list ./...) has no row")
    assert not problems, "docs/ARCHITECTURE.md's package table drifted from the code:\n" + "\n".join(problems)
