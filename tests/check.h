/* check.h - the TAP-style counting the C tests share: CHECK(cond, fmt, ...)
 * counts a pass, or prints "not ok - <message>  (file:line)" and counts a
 * failure.  Each test prints "N passed, M failed" and exits non-zero on any
 * failure. */
#ifndef PIPECC_TEST_CHECK_H
#define PIPECC_TEST_CHECK_H
#include <stdio.h>

static int passed, failed;
#define CHECK(cond, ...)                         \
  do {                                           \
    if (cond) passed++;                          \
    else {                                       \
      failed++;                                  \
      printf("not ok - " __VA_ARGS__);           \
      printf("  (%s:%d)\n", __FILE__, __LINE__); \
    }                                            \
  } while (0)

#endif
