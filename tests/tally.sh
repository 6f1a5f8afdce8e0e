# tests/tally.sh - the shell suites' copy of tests/tally.py's tally (source it):
#   t_ok WHAT                 a pass: "ok - WHAT"
#   t_pass                    a pass, printed by the caller's own summary line (or not at all)
#   t_notok WHAT [WHY]        a failure: "not ok - WHAT[: WHY]"
#   t_skip WHAT WHY           a check not run: "skip - WHAT: WHY" (a reason is required)
#   t_refused WHAT REASON     a refusal the suite expects: "refused (pinned) - WHAT: REASON", never a pass
#   t_finish                  prints "N passed, M failed, K skipped, R refused" and returns 1 on any
#                             failure, and when nothing passed (a suite that passes nothing fails)
T_PASS=0 T_FAIL=0 T_SKIP=0 T_REFUSED=0
t_pass() { T_PASS=$((T_PASS + 1)); }
t_ok() { echo "ok - $1"; T_PASS=$((T_PASS + 1)); }
t_notok() { echo "not ok - $1${2:+: $2}"; T_FAIL=$((T_FAIL + 1)); }
t_skip() {
  [ -n "${2:-}" ] || { t_notok "$1" "skipped without a reason (tests/tally.sh)"; return; }
  echo "skip - $1: $2"; T_SKIP=$((T_SKIP + 1))
}
t_refused() {
  [ -n "${2:-}" ] || { t_notok "$1" "a pinned refusal without its reason (tests/tally.sh)"; return; }
  echo "refused (pinned) - $1: $2"; T_REFUSED=$((T_REFUSED + 1))
}
t_finish() {
  [ "$T_PASS" = 0 ] && [ "$T_FAIL" = 0 ] && t_notok "the suite passed nothing" "$T_FAIL failed, $T_SKIP skipped, $T_REFUSED refused"
  echo "$T_PASS passed, $T_FAIL failed, $T_SKIP skipped, $T_REFUSED refused"
  [ "$T_FAIL" = 0 ]
}
