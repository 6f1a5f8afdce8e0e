/* util.c - error reporting, the allocation pool, formatting helpers. */
#include "util.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char g_err[1024];

/* Names in a message come from the model: a newline or an escape sequence
 * in one must not forge a second line or drive the terminal, so control
 * bytes are written as \n, \t or \xNN. */
static void escape_controls(const char *in, char *out, size_t cap) {
  size_t k = 0;
  for (const unsigned char *c = (const unsigned char *)in; *c && k + 5 < cap; c++) {
    if (*c == '\n') out[k++] = '\\', out[k++] = 'n';
    else if (*c == '\t') out[k++] = '\\', out[k++] = 't';
    else if (*c < 0x20 || *c == 0x7f) k += (size_t)snprintf(out + k, cap - k, "\\x%02x", *c);
    else out[k++] = (char)*c;
  }
  out[k] = 0;
}

int err_set(const char *fmt, ...) {
  /* Keep the first error: it is the one nearest the cause. */
  if (g_err[0]) return -1;
  char raw[sizeof g_err];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(raw, sizeof raw, fmt, ap);
  va_end(ap);
  escape_controls(raw, g_err, sizeof g_err);
  return -1;
}
const char *err_msg(void) { return g_err[0] ? g_err : "unknown error"; }
void err_clear(void) { g_err[0] = 0; }

static void oom(void) {
  fputs("pipecc: out of memory\n", stderr);
  abort();
}

static void pool_track(Pool *p, void *ptr) {
  if (p->n == p->cap) {
    p->cap = p->cap ? 2 * p->cap : 256;
    void **np = realloc(p->ptrs, p->cap * sizeof *np);
    if (!np) oom();
    p->ptrs = np;
  }
  p->ptrs[p->n++] = ptr;
}

void *pool_alloc(Pool *p, size_t size) {
  void *ptr = calloc(1, size ? size : 1);
  if (!ptr) oom();
  pool_track(p, ptr);
  return ptr;
}

void *pool_realloc(Pool *p, void *old, size_t size) {
  if (!old) return pool_alloc(p, size);
  void *ptr = realloc(old, size ? size : 1);
  if (!ptr) oom();
  /* Replace the old entry; search from the end, where recent blocks are. */
  for (size_t i = p->n; i-- > 0;)
    if (p->ptrs[i] == old) {
      p->ptrs[i] = ptr;
      return ptr;
    }
  abort(); /* not from this pool: a programming error */
}

char *pool_strdup(Pool *p, const char *s) {
  size_t n = strlen(s);
  char *d = pool_alloc(p, n + 1);
  memcpy(d, s, n);
  return d;
}

char *pool_vprintf(Pool *p, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  char *s = pool_alloc(p, (size_t)n + 1);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  return s;
}

char *pool_printf(Pool *p, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = pool_vprintf(p, fmt, ap);
  va_end(ap);
  return s;
}

void pool_free(Pool *p) {
  for (size_t i = 0; i < p->n; i++) free(p->ptrs[i]);
  free(p->ptrs);
  p->ptrs = NULL;
  p->n = p->cap = 0;
}

void buf_printf(Buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (b->len + (size_t)n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + (size_t)n + 1) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) oom();
    b->s = s;
    b->cap = cap;
  }
  va_start(ap, fmt);
  vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

void buf_free(Buf *b) {
  free(b->s);
  b->s = NULL;
  b->len = b->cap = 0;
}

double parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || !(v >= 0) || !isfinite(v)) return -1; /* inf wrote "inf" into plan.json, which is not JSON */
  while (isspace((unsigned char)*end)) end++;
  double mul = 1;
  switch (toupper((unsigned char)*end)) {
  case 0: return v;
  case 'K': mul = 1024.0; break;
  case 'M': mul = 1024.0 * 1024; break;
  case 'G': mul = 1024.0 * 1024 * 1024; break;
  case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
  case 'B': return end[1] ? -1 : v;
  default: return -1;
  }
  end++;
  if (!strcmp(end, "") || !strcasecmp(end, "B") || !strcasecmp(end, "iB")) return isfinite(v * mul) ? v * mul : -1;
  return -1;
}

static char *rotating(void) {
  static char bufs[8][32];
  static int k;
  return bufs[k++ & 7];
}

const char *fmt_bytes(double b) {
  char *s = rotating();
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, u++;
  snprintf(s, 32, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
  return s;
}

const char *fmt_count(double n) {
  char *s = rotating();
  if (n >= 1e9) snprintf(s, 32, "%.2fG", n / 1e9);
  else if (n >= 1e6) snprintf(s, 32, "%.2fM", n / 1e6);
  else if (n >= 1e3) snprintf(s, 32, "%.1fK", n / 1e3);
  else snprintf(s, 32, "%.0f", n);
  return s;
}

const char *fmt_time(double t) {
  char *s = rotating();
  if (t >= 1) snprintf(s, 32, "%.3f s", t);
  else if (t >= 1e-3) snprintf(s, 32, "%.3f ms", t * 1e3);
  else snprintf(s, 32, "%.1f us", t * 1e6);
  return s;
}

double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
