"""tests/tally.py - the one tally every Python suite shares (tests/check.h is the C tests' copy).

A suite counts four things:
  passed   check(cond, ...) that held                       "ok - WHAT"
  failed   check(cond, ...) that did not hold               "not ok - WHAT"
  skipped  skip(what, why): a check not run, and why        "skip - WHAT: WHY"
  refused  refused(what, reason): a refusal the suite pins  "refused (pinned) - WHAT: REASON"
           (a refusal that is not pinned, or refused for another reason
           than the pinned one, is a failure: pinned_refusal() decides)

finish() prints the last line, "N passed, M failed, K skipped, R refused", which
tests/run.sh adds up, and returns the exit status: 1 on any failure, and 1 when
nothing passed (a suite that passes nothing tested nothing).  Suites end with
`return tally.finish()` in main() and `sys.exit(main())`.

One tally per process: a suite that imports another (test_dropout imports
test_parity, test_pin imports test_trace) counts into the same numbers, so
nothing is counted twice and nothing is left out of the last line.  Every
suite imports this module by the name `tally` (tests/ on sys.path), never by
file location, so there is one copy in sys.modules.

Thread-safe: test_gradcheck counts from worker threads.
"""
import sys
import threading

passed = failed = skipped = refused_pinned = 0
_lock = threading.RLock()


def _say(line):
    print(line, flush=True)


def count(ok):
    """Count a pass or a failure without printing (suites with their own ok/not ok lines)."""
    global passed, failed
    with _lock:
        if ok:
            passed += 1
        else:
            failed += 1
    return ok


def check(cond, what, detail=""):
    """Count cond and print "ok - WHAT[: DETAIL]" or "not ok - WHAT[: DETAIL]"; returns cond."""
    with _lock:
        count(bool(cond))
        _say(("ok - " if cond else "not ok - ") + str(what) + (": " + str(detail) if detail else ""))
    return cond


def fail(what, detail=""):
    """A failure: check(False, ...)."""
    return check(False, what, detail)


def skip(what, why):
    """A check not run: counted as skipped and printed with its reason (a reason is required)."""
    global skipped
    if not str(why).strip():
        raise ValueError(f"tally.skip({what!r}): a skip needs a reason")
    with _lock:
        skipped += 1
        _say(f"skip - {what}: {why}")


def refused(what, reason):
    """A refusal the suite pins (expects): counted as refused, never as passed."""
    global refused_pinned
    if not str(reason).strip():
        raise ValueError(f"tally.refused({what!r}): a pinned refusal needs its reason")
    with _lock:
        refused_pinned += 1
        _say(f"refused (pinned) - {what}: {reason}")


def pinned_refusal(what, message, pin):
    """Something was refused with `message`.  pin: the text the suite's pin table says the
    refusal must contain (None when the case is not pinned).  Counted as a pinned refusal
    when the message contains the pin, as a failure otherwise.  Returns True when pinned."""
    if pin is None:
        fail(what, f"refused, and not pinned: {message}")
        return False
    if pin not in message:
        fail(what, f"refused for another reason than the pinned one ({pin!r}): {message}")
        return False
    refused(what, message)
    return True


def nonempty(items, what):
    """For a check over a list that must not be empty (all() over nothing holds vacuously):
    an empty list is a failure named `what`.  Returns True when items is non-empty."""
    if len(items) == 0:
        fail(what, "nothing to check: the list is empty")
        return False
    return True


def line():
    return f"{passed} passed, {failed} failed, {skipped} skipped, {refused_pinned} refused"


def finish():
    """Print the last line and return the exit status (0 only if nothing failed and something passed)."""
    with _lock:
        if passed == 0 and failed == 0:   # (with failures already counted, the status is 1 anyway)
            fail("the suite passed nothing", f"{failed} failed, {skipped} skipped, {refused_pinned} refused")
        _say(line())
        return 1 if failed else 0


def _self_test():
    """python3 tests/tally.py --self-test: the tally's own behaviour (and tests/check.h's and tests/tally.sh's),
    each case in a fresh process, planted failures, skips, refusals and empty suites among them."""
    import subprocess
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    cases = [
        # (script, expected last line, expected exit status)
        ("tally.check(True, 'a'); tally.check(1 == 1, 'b')", "2 passed, 0 failed, 0 skipped, 0 refused", 0),
        ("tally.check(True, 'a'); tally.check(False, 'planted')", "1 passed, 1 failed, 0 skipped, 0 refused", 1),
        ("tally.check(True, 'a'); tally.skip('b', 'no netns')", "1 passed, 0 failed, 1 skipped, 0 refused", 0),
        ("tally.skip('b', 'no netns')", "0 passed, 1 failed, 1 skipped, 0 refused", 1),
        ("pass", "0 passed, 1 failed, 0 skipped, 0 refused", 1),
        ("tally.check(True, 'a'); tally.refused('r', 'no plan fits')", "1 passed, 0 failed, 0 skipped, 1 refused", 0),
        ("tally.check(True, 'a'); tally.pinned_refusal('r', 'error: no plan fits', 'no plan')",
         "1 passed, 0 failed, 0 skipped, 1 refused", 0),
        ("tally.check(True, 'a'); tally.pinned_refusal('r', 'error: out of memory', 'no plan')",
         "1 passed, 1 failed, 0 skipped, 0 refused", 1),
        ("tally.check(True, 'a'); tally.pinned_refusal('r', 'error: no plan', None)", "1 passed, 1 failed, 0 skipped, 0 refused", 1),
        ("tally.check(True, 'a'); tally.nonempty([], 'xs') and tally.check(all(x for x in []), 'all xs')",
         "1 passed, 1 failed, 0 skipped, 0 refused", 1),
        ("tally.check(True, 'a'); tally.count(False)", "1 passed, 1 failed, 0 skipped, 0 refused", 1),
        ("tally.check(False, 'planted')", "0 passed, 1 failed, 0 skipped, 0 refused", 1),
        # a second module importing tally shares the counts
        ("import importlib; t2 = importlib.import_module('tally'); t2.check(True, 'x'); tally.check(True, 'y')",
         "2 passed, 0 failed, 0 skipped, 0 refused", 0),
    ]
    bad = 0
    for script, want, rc in cases:
        prog = f"import sys; sys.path.insert(0, {here!r}); import tally\n{script}\nsys.exit(tally.finish())"
        r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True)
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        ok = last == want and r.returncode == rc
        bad += not ok
        print(("ok - " if ok else "not ok - ") + f"{script!r}: last line {last!r}, exit {r.returncode}"
              + ("" if ok else f" (want {want!r}, exit {rc}; stderr {r.stderr.strip()[-300:]!r})"))
    for what, call in [("skip without a reason", "tally.skip('x', '')"), ("refused without a reason", "tally.refused('x', ' ')")]:
        prog = f"import sys; sys.path.insert(0, {here!r}); import tally\n{call}"
        r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True)
        ok = r.returncode != 0 and "needs" in r.stderr
        bad += not ok
        print(("ok - " if ok else "not ok - ") + what + " raises")
    # tests/check.h, the C tests' copy: the same line and exit status.
    import tempfile
    c_cases = [
        ("CHECK(1, \"a\\n\"); CHECK(2 > 1, \"b\\n\");", "2 passed, 0 failed, 0 skipped, 0 refused", 0),
        ("CHECK(1, \"a\\n\"); CHECK(0, \"planted %d\\n\", 7);", "1 passed, 1 failed, 0 skipped, 0 refused", 1),
        ("CHECK(1, \"a\\n\"); SKIP(\"b\", \"no %s\", \"netns\"); PINNED(\"r\", \"no plan\");",
         "1 passed, 0 failed, 1 skipped, 1 refused", 0),
        ("SKIP(\"b\", \"why\");", "0 passed, 1 failed, 1 skipped, 0 refused", 1),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for body, want, rc in c_cases:
            src, exe = os.path.join(tmp, "t.c"), os.path.join(tmp, "t")
            with open(src, "w") as f:
                f.write(f'#include "check.h"\nint main(void) {{ {body} return check_finish(); }}\n')
            b = subprocess.run(["cc", "-Wall", "-Wextra", "-Werror", "-I" + here, src, "-o", exe], capture_output=True, text=True)
            r = subprocess.run([exe], capture_output=True, text=True) if b.returncode == 0 else None
            last = r.stdout.strip().splitlines()[-1] if r and r.stdout.strip() else ""
            ok = r is not None and last == want and r.returncode == rc
            bad += not ok
            print(("ok - " if ok else "not ok - ") + f"check.h: {body}: last line {last!r}, exit {r.returncode if r else None}"
                  + ("" if ok else f" (want {want!r}, exit {rc}; {b.stderr.strip()[-300:]})"))
    # tests/tally.sh, the shell suites' copy.
    sh_cases = [
        ("t_ok a; t_pass", "2 passed, 0 failed, 0 skipped, 0 refused", 0),
        ("t_ok a; t_notok planted why", "1 passed, 1 failed, 0 skipped, 0 refused", 1),
        ("t_ok a; t_skip b 'no netns'; t_refused r 'no plan'", "1 passed, 0 failed, 1 skipped, 1 refused", 0),
        ("t_skip b 'no netns'", "0 passed, 1 failed, 1 skipped, 0 refused", 1),
        ("t_ok a; t_skip b ''", "1 passed, 1 failed, 0 skipped, 0 refused", 1),
    ]
    for script, want, rc in sh_cases:
        r = subprocess.run(["bash", "-c", f". {os.path.join(here, 'tally.sh')!r}; {script}; t_finish"], capture_output=True, text=True)
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        ok = last == want and r.returncode == rc
        bad += not ok
        print(("ok - " if ok else "not ok - ") + f"tally.sh: {script}: last line {last!r}, exit {r.returncode}"
              + ("" if ok else f" (want {want!r}, exit {rc}; stderr {r.stderr.strip()[-300:]!r})"))
    total = len(cases) + 2 + len(c_cases) + len(sh_cases)
    print(f"{total - bad} passed, {bad} failed, 0 skipped, 0 refused")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(_self_test())
    print("usage: python3 tests/tally.py --self-test", file=sys.stderr)
    sys.exit(2)
