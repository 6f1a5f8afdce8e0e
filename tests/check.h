/* check.h - the tally the C tests share, the same one tests/tally.py keeps for
 * the Python suites:
 *   CHECK(cond, fmt, ...)        counts a pass, or prints "not ok - <message>  (file:line)"
 *                                and counts a failure;
 *   SKIP(what, fmt, ...)         a check not run: prints "skip - <what>: <why>" and counts it;
 *   PINNED(what, fmt, ...)       a refusal the test expects: prints
 *                                "refused (pinned) - <what>: <reason>" and counts it (never a pass);
 *   check_finish()               prints "N passed, M failed, K skipped, R refused" and returns
 *                                the exit status: 1 on any failure, and 1 when nothing passed.
 * Messages passed to CHECK end with "\n"; SKIP's and PINNED's add their own. */
#ifndef PIPECC_TEST_CHECK_H
#define PIPECC_TEST_CHECK_H
#include <stdio.h>

static int passed, failed, skipped, refused_pinned;
#define CHECK(cond, ...)                         \
  do {                                           \
    if (cond) passed++;                          \
    else {                                       \
      failed++;                                  \
      printf("not ok - " __VA_ARGS__);           \
      printf("  (%s:%d)\n", __FILE__, __LINE__); \
    }                                            \
  } while (0)

#define SKIP(what, ...)                  \
  do {                                   \
    skipped++;                           \
    printf("skip - %s: ", (what));       \
    printf(__VA_ARGS__);                 \
    printf("\n");                        \
  } while (0)

#define PINNED(what, ...)                          \
  do {                                             \
    refused_pinned++;                              \
    printf("refused (pinned) - %s: ", (what));     \
    printf(__VA_ARGS__);                           \
    printf("\n");                                  \
  } while (0)

static inline int check_finish(void) {
  if (passed == 0 && failed == 0) { /* with failures already counted, the status is 1 anyway */
    failed++;
    printf("not ok - the test passed nothing\n");
  }
  printf("%d passed, %d failed, %d skipped, %d refused\n", passed, failed, skipped, refused_pinned);
  fflush(stdout);
  return failed != 0;
}

#endif
