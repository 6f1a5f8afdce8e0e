"""The sources' shape (issue 32): include cycles, long functions, kernels.def against the kernels.

1. Include cycles.  The `#include "..."` lines of compiler/ (and compiler/ops/), runtime/ (and its
   subfolders) and tools/ make a graph of modules, x.c and x.h (and x.def) of one folder being one
   module.  Any cycle between modules fails, except those pinned in tests/include_cycles_known.txt
   (printed as "refused (pinned) - ..."); a pinned cycle that is gone fails too, until its line is
   removed, so that the list only shrinks (to empty: issue 32).  The strongly connected components are
   printed with their sizes, and a layer order of the modules: the condensed graph's topological order,
   each component's own modules in the order that leaves the fewest include edges pointing up (the
   "upward arrows", printed).  Also printed, for information: the .c files with no header of their own
   (leaves of the include graph) and the module whose header declares their functions.
2. Long functions.  A brace-matching scan of the C sources of compiler/, runtime/ and tools/ prints the
   15 longest functions; any over 120 lines fails, except those in tests/long_functions.txt, each pinned
   at its length today: one that grows fails, and one that is no longer over 120 lines fails until its
   line is removed (the list is to shrink to empty: issue 32).
3. kernels.def against the kernels' prototypes: build/tools/kernelsig (tools/kernelsig.c, which make
   runs before linking bin/pipecc) passes on compiler/kernels.def and fails, naming the kernel, on
   copies with one letter changed, with an extra argument, and with a kernel that has no prototype.
Each checker also runs on a small planted tree, where it must find what was planted.
Run with /usr/bin/python3 from anywhere; ends with the tally's line (tests/tally.py)."""
import itertools
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 120
KNOWN_CYCLES = os.path.join(ROOT, "tests", "include_cycles_known.txt")
LONG_ALLOWED = os.path.join(ROOT, "tests", "long_functions.txt")
KERNELSIG = os.path.join(ROOT, "build", "tools", "kernelsig")
sys.path.insert(0, os.path.join(ROOT, "tests"))
import tally  # noqa: E402

check = tally.check


# ---- the sources ----

C_EXT = (".c", ".h", ".def")
# Where a "..." include is looked for after the includer's own folder: the -I of each part's build
# (Makefile: -Icompiler for the compiler and tools; templates/Makefile.in: -I$(PIPERUN) for the runtime).
SEARCH = {"compiler": ["compiler"], "tools": ["compiler"], "runtime": ["runtime"]}


def source_files(root, exts):
    out = []
    for top in ("compiler", "runtime", "tools"):
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(exts):
                    out.append(os.path.relpath(os.path.join(d, f), root))
    return out


def module_of(rel):
    return os.path.splitext(rel)[0]


def include_graph(root):
    """{module: {included module: [(file, line), ...]}}, the number of files and the unresolved
    includes (system-like or generated headers: build/gen's onnx.pb-c.h, templates.inc)."""
    files = source_files(root, C_EXT)
    edges, unresolved = {}, set()
    for rel in files:
        m = module_of(rel)
        edges.setdefault(m, {})
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            for ln, line in enumerate(fh, 1):
                mo = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
                if not mo:
                    continue
                name = mo.group(1)
                cands = [os.path.dirname(rel)] + SEARCH[rel.split(os.sep)[0]]
                target = None
                for c in cands:
                    p = os.path.normpath(os.path.join(c, name))
                    if os.path.isfile(os.path.join(root, p)):
                        target = p
                        break
                if target is None or not target.endswith(C_EXT) or target.split(os.sep)[0] not in SEARCH:
                    unresolved.add(name)
                    continue
                t = module_of(target)
                if t != m:
                    edges[m].setdefault(t, []).append((rel, ln))
                    edges.setdefault(t, {})
    return edges, len(files), unresolved


def sccs(edges):
    """Tarjan's strongly connected components, each a sorted list."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out  # Tarjan emits a component after every component it reaches: bottom-up


def canonical(cycle):
    """A cycle (its modules, first not repeated) rotated to start at its smallest module."""
    k = cycle.index(min(cycle))
    return tuple(cycle[k:] + cycle[:k])


def elementary_cycles(edges, comp, limit=5000):
    """The elementary cycles within one component (each once, canonical), at most `limit`."""
    inside = set(comp)
    found = set()
    for start in comp:
        # cycles whose smallest module is start: a DFS over modules greater than start
        path, onpath = [start], {start}

        def dfs(v):
            for w in sorted(edges[v]):
                if w not in inside or len(found) >= limit:
                    continue
                if w == start:
                    found.add(canonical(list(path)))
                elif w > start and w not in onpath:
                    path.append(w)
                    onpath.add(w)
                    dfs(w)
                    path.pop()
                    onpath.discard(w)

        dfs(start)
    return sorted(found, key=lambda c: (len(c), c))


def cycle_text(c):
    return " -> ".join(list(c) + [c[0]])


def best_order(edges, comp):
    """The order of a component's modules, bottom first, with the fewest edges from a module to one
    above it (upward arrows): exact (a DP over subsets) up to 16 modules, greedy past that."""
    n = len(comp)
    pos = {m: k for k, m in enumerate(comp)}
    pred = [0] * n  # pred[v]: the modules that include v
    for u in comp:
        for w in edges[u]:
            if w in pos:
                pred[pos[w]] |= 1 << pos[u]
    if n <= 16:
        INF = 1 << 30
        f = [INF] * (1 << n)
        how = [-1] * (1 << n)
        f[0] = 0
        for s in range(1 << n):
            if f[s] == INF:
                continue
            for v in range(n):
                if s >> v & 1:
                    continue
                c = f[s] + bin(s & pred[v]).count("1")  # modules below v that include v
                t = s | 1 << v
                if c < f[t]:
                    f[t], how[t] = c, v
        order, s = [], (1 << n) - 1
        while s:
            order.append(comp[how[s]])
            s &= ~(1 << how[s])
        return order[::-1], True
    # greedy: the next module up is one that includes the fewest modules not yet placed
    order, left = [], set(comp)
    while left:
        v = min(sorted(left), key=lambda m: sum(1 for w in edges[m] if w in left and w != m))
        order.append(v)
        left.discard(v)
    return order, False


def read_list(path):
    """The non-comment lines of a pinning file."""
    if not os.path.isfile(path):
        return []
    out = []
    with open(path) as fh:
        for line in fh:
            line = line.split("#", 1)[0].strip()
            if line:
                out.append(line)
    return out


def parse_cycle(line):
    mods = [m.strip() for m in line.split("->")]
    if len(mods) >= 3 and mods[0] == mods[-1]:
        return canonical(mods[:-1])
    return None


# ---- functions ----

def blank_c(text):
    """Comments, string and character literals' contents and preprocessor lines blanked, newlines kept."""
    out, i, n, bol = [], 0, len(text), True
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if bol and c == "#":
            j = i
            while j < n and text[j] != "\n":
                j += 2 if text.startswith("\\\n", j) else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + (c if j < n else ""))
            i = j + 1
            continue
        if c == "\n":
            bol = True
        elif c not in " \t":
            bol = False
        out.append(c)
        i += 1
    return "".join(out)


def functions(root, rel):
    """[(name, first line, lines)] of the function definitions in one file, and a problem (or None):
    a function is a file-scope '{' after ')' (the parameter list, whose '(' follows the name)."""
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
        text = blank_c(fh.read())
    out, brace, paren, start = [], 0, 0, None
    line = 1
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "(":
            paren += 1
        elif c == ")":
            paren -= 1
        elif c == "{":
            if brace == 0 and paren == 0:
                start = None
                j = i - 1
                while j >= 0 and text[j].isspace():
                    j -= 1
                if j >= 0 and text[j] == ")":
                    depth, k = 0, j
                    while k >= 0:  # to the matching '('
                        if text[k] == ")":
                            depth += 1
                        elif text[k] == "(":
                            depth -= 1
                            if depth == 0:
                                break
                        k -= 1
                    k -= 1
                    while k >= 0 and text[k].isspace():
                        k -= 1
                    e = k + 1
                    while k >= 0 and (text[k].isalnum() or text[k] == "_"):
                        k -= 1
                    name = text[k + 1:e]
                    if name and not name[0].isdigit() and name not in ("if", "for", "while", "switch", "return", "sizeof"):
                        start = (name, text.count("\n", 0, k + 1) + 1)
            brace += 1
        elif c == "}":
            brace -= 1
            if brace < 0:
                return out, "line %d: a '}' with no '{' (the scan needs balanced braces outside #if branches)" % line
            if brace == 0 and start:
                out.append((start[0], start[1], line - start[1] + 1))
                start = None
    if brace or paren:
        return out, "unbalanced at the end (%d '{', %d '(' open)" % (brace, paren)
    return out, None


def all_functions(root):
    funcs, problems = [], []
    for rel in source_files(root, (".c", ".h")):
        fs, prob = functions(root, rel)
        if prob:
            problems.append("%s: %s" % (rel, prob))
        funcs += [(name, rel, first, n) for name, first, n in fs]
    return funcs, problems


def parse_allowed(lines):
    """file function lines -> {(file, function): lines}, and the lines that do not parse."""
    out, bad = {}, []
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            out[(parts[0], parts[1])] = int(parts[2])
        else:
            bad.append(line)
    return out, bad


# ---- the checks ----

def cycle_report(root, known):
    """New cycles, pinned cycles that are gone, components, and the cycles found."""
    edges, nfiles, unresolved = include_graph(root)
    comps = sccs(edges)
    cycles = []
    for comp in comps:
        if len(comp) > 1:
            cycles += elementary_cycles(edges, comp)
    now = set(cycles)
    new = [c for c in cycles if c not in known]
    gone = [c for c in sorted(known) if c not in now]
    return edges, nfiles, unresolved, comps, cycles, new, gone


def write(root, rel, text):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as fh:
        fh.write(text)


def planted():
    """Each checker on a small tree where something is planted: it must be found."""
    with tempfile.TemporaryDirectory() as t:
        write(t, "compiler/a.c", '#include "a.h"\n#include "b.h"\n')
        write(t, "compiler/a.h", "")
        write(t, "compiler/b.c", '#include "ops/c.h"\n')
        write(t, "compiler/b.h", "")
        write(t, "compiler/ops/c.c", '#include "a.h"\n')  # resolved through -Icompiler
        write(t, "compiler/ops/c.h", "")
        write(t, "compiler/d.c", '#include "b.h"\n#include "onnx.pb-c.h"\n')
        write(t, "runtime/k.h", '#include "cpu/x.h"\n')
        write(t, "runtime/cpu/x.h", '#include "../k.h"\n')
        body = "\n".join("  x += %d;" % k for k in range(125))
        write(t, "tools/t.c", "static int x;\nstatic void longest(int a,\n    int b) {\n  if (a) {\n" + body +
              "\n  }\n  const char *s = \"}\"; /* } */\n  (void)s, (void)b;\n}\nint main(void) { longest(1, 2); return 0; }\n")
        _, _, unresolved, comps, cycles, new, gone = cycle_report(t, {("compiler/a", "compiler/b", "compiler/ops/c")})
        want = [("compiler/a", "compiler/b", "compiler/ops/c"), ("runtime/cpu/x", "runtime/k")]
        check(cycles == want and new == [want[1]] and not gone and "onnx.pb-c.h" in unresolved,
              "planted tree: both include cycles found (one through ops/, one through runtime/cpu/), the pinned "
              "one told apart from the new one", "found %s, new %s, gone %s" % (cycles, new, gone))
        _, _, _, _, _, _, gone = cycle_report(t, {("compiler/a", "compiler/d")})
        check(gone == [("compiler/a", "compiler/d")], "planted tree: a pinned cycle that does not exist is reported gone")
        funcs, problems = all_functions(t)
        got = {(f[0], f[1]): (f[2], f[3]) for f in funcs}
        check(got.get(("longest", "tools/t.c")) == (2, 132) and got.get(("main", "tools/t.c")) == (134, 1)
              and not problems, "planted tree: the brace scan measures a 132-line function (its parameters on two lines, a '}' in a "
              "string and one in a comment) and a one-line one", "got %s, problems %s" % (got, problems))
        write(t, "tools/u.c", "void f(void) {\n#if A\n  if (1) {\n#else\n  if (2) {\n#endif\n  }\n}\n")
        _, problems = all_functions(t)
        check(any(p.startswith("tools/u.c") for p in problems),
              "planted tree: braces unbalanced across #if branches are reported, not measured wrong")


def headerless(root):
    """{x.c: (header module, [functions])} for each x.c with no x.h beside it whose external functions are
    declared in another module's header: by its include lines such a file is a leaf, but it is that
    module's code (autodiff.c, pipefb.c, freeze.c implement plan.h and stageprog.h)."""
    headers = {}
    for rel in source_files(root, (".h",)):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            headers[rel] = blank_c(fh.read())
    out = {}
    for rel in source_files(root, (".c",)):
        if os.path.isfile(os.path.join(root, os.path.splitext(rel)[0] + ".h")):
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            text = blank_c(fh.read())
        names = {f[0] for f in functions(root, rel)[0]}
        ext = []
        for mo in re.finditer(r"(?:^|(?<=[;}]))([^;{}]*?)\b(\w+)\s*\(", text):
            if mo.group(2) in names and "static" not in mo.group(1).split() and mo.group(2) != "main":
                ext.append(mo.group(2))
        votes = {}
        for h, ht in headers.items():
            got = [n for n in sorted(set(ext)) if re.search(r"\b%s\s*\(" % n, ht)]
            if got:
                votes[h] = got
        if votes:
            h = max(sorted(votes), key=lambda k: len(votes[k]))
            out[rel] = (module_of(h), votes[h])
    return out


def cycles_check():
    raw = read_list(KNOWN_CYCLES)
    known = set()
    for line in raw:
        c = parse_cycle(line)
        check(c is not None, "tests/include_cycles_known.txt: '%s' is a cycle written 'a -> b -> ... -> a'" % line)
        if c:
            known.add(c)
    edges, nfiles, unresolved, comps, cycles, new, gone = cycle_report(ROOT, known)
    nedges = sum(len(v) for v in edges.values())
    check(nfiles > 50 and nedges > 50, "include graph: %d files, %d modules, %d edges between modules "
          "(not followed: %s)" % (nfiles, len(edges), nedges, ", ".join(sorted(unresolved))))
    big = [c for c in comps if len(c) > 1]
    print("strongly connected components: %d modules, %d components, %s" % (
        len(edges), len(comps), "sizes " + ", ".join(str(len(c)) for c in big) + " (the rest single modules)"
        if big else "every one a single module"))
    # A layer order: components bottom-up, each one's modules in its best order.
    order, up = [], []
    for comp in comps:
        if len(comp) == 1:
            order += comp
            continue
        o, exact = best_order(edges, comp)
        at = {m: k for k, m in enumerate(o)}
        ups = sorted((u, w) for u in o for w in edges[u] if w in at and at[w] > at[u])
        print("component of %d modules, bottom up: %s; %s%d upward include edge%s: %s" % (
            len(comp), " < ".join(o), "" if exact else "at most ", len(ups), "" if len(ups) == 1 else "s",
            ", ".join("%s includes %s" % e for e in ups)))
        order += o
        up += ups
    print("upward arrows (include edges against the layer order above): %d of %d" % (len(up), nedges))
    # For information (nothing fails on it): files with no header of their own are leaves of the include
    # graph, though they are the code of the module whose header declares their functions.
    hl = headerless(ROOT)
    for rel, (mod, fns) in sorted(hl.items()):
        print("header-less (a leaf of the include graph): %s implements %s (%s)" % (rel, mod, ", ".join(fns[:4]) + (", ..." if len(fns) > 4 else "")))
    for c in cycles:
        if c in known:
            tally.refused("include cycle %s" % cycle_text(c), "pinned in tests/include_cycles_known.txt")
    detail = "\n".join("include cycle %s: %s" % (cycle_text(c), "; ".join(
        "%s (%s:%d)" % (c[(k + 1) % len(c)], *edges[c[k]][c[(k + 1) % len(c)]][0]) for k in range(len(c))))
        for c in new)
    check(not new, "no include cycle between modules but the %d pinned in tests/include_cycles_known.txt "
          "(%d cycles in all)" % (len(known), len(cycles)), detail)
    check(not gone, "every pinned include cycle still exists (the list only shrinks)",
          "\n".join("gone: %s - remove its line from tests/include_cycles_known.txt" % cycle_text(c) for c in gone))


def functions_check():
    raw = read_list(LONG_ALLOWED)
    allowed, bad = parse_allowed(raw)
    check(not bad, "tests/long_functions.txt: every line is 'file function lines'", "\n".join(bad))
    funcs, problems = all_functions(ROOT)
    check(not problems and len(funcs) > 500, "the brace scan of compiler/, runtime/, tools/: %d functions, "
          "braces balanced in every file" % len(funcs), "\n".join(problems))
    funcs.sort(key=lambda f: (-f[3], f[1], f[0]))
    print("the 15 longest functions:")
    for name, rel, first, n in funcs[:15]:
        print("  %4d lines  %-28s %s:%d%s" % (n, name, rel, first, "  (allowed: tests/long_functions.txt)"
                                              if (rel, name) in allowed else ""))
    over = [f for f in funcs if f[3] > MAX_LINES]
    now = {(f[1], f[0]): f[3] for f in over}
    unlisted = [f for f in over if (f[1], f[0]) not in allowed]
    grew = [f for f in over if (f[1], f[0]) in allowed and f[3] > allowed[(f[1], f[0])]]
    stale = [k for k in sorted(allowed) if k not in now]
    check(not unlisted, "no function over %d lines (%d over, %d of them allowed by tests/long_functions.txt)" % (
        MAX_LINES, len(over), len(over) - len(unlisted)),
        "\n".join("%s:%d: %s is %d lines" % (f[1], f[2], f[0], f[3]) for f in unlisted))
    check(not grew, "no allowed long function grew past its length in tests/long_functions.txt",
          "\n".join("%s:%d: %s is %d lines, pinned at %d" % (f[1], f[2], f[0], f[3], allowed[(f[1], f[0])])
                    for f in grew))
    check(not stale, "every function in tests/long_functions.txt is still over %d lines (the list only shrinks)"
          % MAX_LINES, "\n".join("%s %s: now %s - remove its line" % (k[0], k[1], "gone or renamed" if not any(
              f[1] == k[0] and f[0] == k[1] for f in funcs) else "within %d lines" % MAX_LINES) for k in stale))


def kernelsig_check():
    if not os.access(KERNELSIG, os.X_OK):
        check(False, "build/tools/kernelsig is built (make)")
        return
    real = os.path.join(ROOT, "compiler", "kernels.def")
    hdr = os.path.join(ROOT, "runtime", "kernels.h")
    r = subprocess.run([KERNELSIG, real, hdr], capture_output=True, text=True)
    check(r.returncode == 0, "kernelsig: compiler/kernels.def matches the kernels' prototypes",
          r.stdout + r.stderr)
    with open(real) as fh:
        text = fh.read()
    lines = re.findall(r'^KERNEL\(\w+, "(\w+)", "(\w*)"\)$', text, re.M)
    check(len(lines) > 20, "compiler/kernels.def: %d KERNEL lines read" % len(lines))
    if not lines:
        return

    def first(letter):  # the first kernel with that letter, and the letter's index
        for name, letters in lines:
            if letter in letters:
                return name, letters, letters.index(letter)
        return lines[0][0], lines[0][1], None

    def line_of(name, letters):
        return '"%s", "%s")' % (name, letters)

    plants = []
    for frm, to, what in (("R", "i", "a buffer-or-NULL made an integer"), ("r", "w", "a const buffer made written"),
                          ("s", "c", "a runtime symbol made a shape"), ("c", "f", "a shape made a float"),
                          ("u", "r", "a mask read made a float buffer read")):
        name, letters, k = first(frm)
        if k is None:
            check(False, "compiler/kernels.def has a kernel with the letter '%s' to plant a mismatch in" % frm)
            continue
        plants.append(("one letter changed, %s (%s's argument %d)" % (what, name, k + 1), line_of(name, letters),
                       line_of(name, letters[:k] + to + letters[k + 1:]),
                       "%s argument %d: kernels.def has '%s'" % (name, k + 1, to)))
    for name, letters in lines:  # &pr_rand: an 's' after the first argument (Dropout's)
        k = letters.find("s", 1)
        if k > 0:
            plants.append(("one letter changed, the random context made a shape (%s's argument %d)" % (name, k + 1),
                           line_of(name, letters), line_of(name, letters[:k] + "c" + letters[k + 1:]),
                           "%s argument %d: kernels.def has 'c'" % (name, k + 1)))
            break
    else:
        check(False, "compiler/kernels.def has a kernel taking &pr_rand (an 's' after its first argument)")
    name, letters = lines[0]
    plants.append(("an extra argument (%s)" % name, line_of(name, letters), line_of(name, letters + "i"),
                   "%s: kernels.def has %d arguments" % (name, len(letters) + 1)))
    name, letters = lines[-1]
    plants.append(("an argument missing (%s)" % name, line_of(name, letters), line_of(name, letters[:-1]),
                   "%s: kernels.def has %d arguments" % (name, len(letters) - 1)))
    name, letters = lines[len(lines) // 2]
    plants.append(("a kernel with no prototype (%s renamed)" % name, line_of(name, letters),
                   line_of(name + "_nope", letters), "%s_nope: no prototype" % name))
    with tempfile.TemporaryDirectory() as t:
        for what, old, new, want in plants:
            p = os.path.join(t, "kernels.def")
            with open(p, "w") as fh:
                fh.write(text.replace(old, new))
            r = subprocess.run([KERNELSIG, p, hdr], capture_output=True, text=True)
            lines = [l for l in r.stderr.splitlines() if "error:" in l]
            check(r.returncode == 1 and len(lines) == 1 and want in lines[0],
                  "kernelsig planted: %s fails, naming the kernel" % what, r.stdout + r.stderr)
            if lines:
                print("  " + lines[0])


def main():
    planted()
    cycles_check()
    functions_check()
    kernelsig_check()
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
