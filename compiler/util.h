/* util.h - errors, an allocation pool and small helpers shared by every pass. */
#ifndef PIPECC_UTIL_H
#define PIPECC_UTIL_H
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* One version for `pipecc --version` and the generated files' headers. */
#define PIPECC_VERSION "0.3.0"

/* Every pass reports a user-facing problem with err_set() and returns -1;
 * the driver prints err_msg() once and exits with status 2.  Passes never
 * exit on their own, so the loader can be fuzzed and leak-checked. */
int err_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *err_msg(void);
void err_clear(void);

/* A pool owns every allocation of one compilation; pool_free releases all. */
typedef struct Pool {
  void **ptrs;
  size_t n, cap;
} Pool;

void *pool_alloc(Pool *p, size_t size);             /* zeroed; aborts on OOM */
void *pool_realloc(Pool *p, void *old, size_t size); /* old must come from p */
char *pool_strdup(Pool *p, const char *s);
char *pool_printf(Pool *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *pool_vprintf(Pool *p, const char *fmt, va_list ap);
void pool_free(Pool *p);

/* A growable string for the listing and JSON writers. */
typedef struct Buf {
  char *s;
  size_t len, cap;
} Buf;
void buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_free(Buf *b);

/* "4G", "512M", "1.5GiB", "100000" -> bytes; -1 on a malformed size. */
double parse_size(const char *s);
/* Human-readable bytes: "12.3 MiB"; returns a static rotating buffer. */
const char *fmt_bytes(double bytes);
const char *fmt_count(double n); /* 1.2M, 34.5K */
const char *fmt_time(double seconds);

double now_seconds(void);
#endif
