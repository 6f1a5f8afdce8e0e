/* failmsg.h - a refusal's one-line message, written into the caller's buffer: fail(err, errlen,
 * fmt, ...) returns -1, so a check reads `return fail(err, errlen, "data %s: ...", path)` (data.c,
 * npy.c).  err may be NULL (nothing is written). */
#ifndef PIPERUN_FAILMSG_H
#define PIPERUN_FAILMSG_H
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

__attribute__((format(printf, 3, 4))) static inline int fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

#endif
