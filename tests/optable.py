#!/usr/bin/python3
"""The operator lists in README.md and docs/operators.md, from `pipecc --list-ops`.

pipecc's operator table (compiler/ops/, printed by `bin/pipecc --list-ops`) is
the one place that says which ops exist and how they run.  The docs repeat it,
so this script writes their copies from it:

  - README.md, between <!-- optable:begin --> and <!-- optable:end -->: the ops
    by how they run (trainable, forward only, compile-time only);
  - docs/operators.md, between the same markers: the whole table (op, family,
    how it runs, whether it folds).

With --check it rewrites nothing and fails (exit 1, naming the file) when a
copy differs, or when the conformance table of docs/operators.md (written by
tests/conformance/run.py --write-docs) does not list exactly the ops that run
at run time.  Other tests import it for the op lists (run_ops, trainable_ops).

  /usr/bin/python3 tests/optable.py [--check]

PIPECC overrides the pipecc binary (default bin/pipecc)."""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
README = os.path.join(ROOT, "README.md")
OPERATORS_MD = os.path.join(ROOT, "docs", "operators.md")
BEGIN, END = "<!-- optable:begin -->", "<!-- optable:end -->"
KINDS = ("trainable", "forward only", "compile-time only")


def table():
    """[(op, family, runs, folds)] in the table's order, from pipecc --list-ops."""
    out = subprocess.run([PIPECC, "--list-ops"], check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines()[1:]:  # the first line is the header
        m = re.match(r"(\S+)\s+(\S+)\s+(trainable|forward only|compile-time only)\s+(yes|no)$", line.strip())
        if not m:
            raise SystemExit(f"optable: cannot read this line of {PIPECC} --list-ops: {line!r}")
        rows.append(m.groups())
    return rows


def run_ops(rows=None):
    """Ops pipecc runs in a stage program (trainable or forward only), sorted."""
    return sorted(r[0] for r in rows or table() if r[2] != "compile-time only")


def trainable_ops(rows=None):
    return sorted(r[0] for r in rows or table() if r[2] == "trainable")


def readme_block(rows):
    what = {"trainable": "forward and backward kernels; gradients flow through them",
            "forward only": "a forward kernel, no gradient",
            "compile-time only": "shape rule and constant folding; a node that depends on run-time data is refused"}
    lines = ["`pipecc --list-ops` prints the operator table; `tests/optable.py` writes this list from it.", ""]
    for kind in KINDS:
        ops = [r[0] for r in rows if r[2] == kind]
        if ops:
            lines.append(f"- **{kind}** ({what[kind]}, {len(ops)}): {', '.join(ops)}")
    return "\n".join(lines)


def operators_block(rows):
    lines = ["The operator table, as `pipecc --list-ops` prints it (written by `tests/optable.py`): each op's family "
             "(its file in `compiler/ops/`), how it runs, and whether it is evaluated at compile time when its inputs "
             "are constants.", "",
             "| operator | family | runs | folds at compile time |", "|---|---|---|---|"]
    lines += [f"| {op} | {fam} | {runs} | {folds} |" for op, fam, runs, folds in rows]
    return "\n".join(lines)


def splice(text, block, path):
    """text with the part between the markers replaced by block."""
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise SystemExit(f"optable: {path} lacks the {BEGIN} ... {END} markers")
    return text[:i + len(BEGIN)] + "\n" + block + "\n" + text[j:]


def conformance_ops(text):
    """The ops in the conformance table of docs/operators.md (the one with a 'conformance' column)."""
    m = re.search(r"^\| operator \| backward \| conformance \|.*?\n\|[-|]+\|\n((?:\|.*\n)*)", text, re.M)
    return sorted(line.split("|")[1].strip() for line in m.group(1).splitlines()) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; fail when a copy differs")
    args = ap.parse_args()
    rows = table()
    problems = []
    for path, block in ((README, readme_block(rows)), (OPERATORS_MD, operators_block(rows))):
        old = open(path).read()
        new = splice(old, block, path)
        if new == old:
            continue
        if args.check:
            problems.append(f"{os.path.relpath(path, ROOT)} differs from pipecc --list-ops "
                            "(run /usr/bin/python3 tests/optable.py)")
        else:
            open(path, "w").write(new)
            print(f"optable: rewrote {os.path.relpath(path, ROOT)}")
    listed = conformance_ops(open(OPERATORS_MD).read())
    if listed != run_ops(rows):
        problems.append("the conformance table of docs/operators.md lists "
                        f"{listed} but pipecc runs {run_ops(rows)} (run tests/conformance/run.py --write-docs)")
    for p in problems:
        print(f"not ok - {p}")
    if args.check and not problems:
        print(f"ok - README.md and docs/operators.md list the {len(rows)} ops of pipecc --list-ops")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
