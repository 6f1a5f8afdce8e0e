/* pipecc_trace.c - bin/pipecc-trace: a measured pipeline schedule as an SVG.
 *
 *   pipecc-trace FILE.json [-o FILE.svg] [--step K]
 *
 * Reads the Chrome trace-event JSON the runtime writes
 *   {"otherData": {"pipecc_trace_version": 2},
 *    "traceEvents": [{"name": "F3", "cat": "F", "ph": "X", "ts": 1234.5, "dur": 10.0,
 *                     "pid": 0, "tid": 2, "args": {"step": 0, "mb": 3, "kind": "F", "slot": 1,
 *                                                  "chunk": 0, "stage": 2}},
 *                    {"name": "thread_name", "ph": "M", "pid": 0, "tid": 2,
 *                     "args": {"name": "rank 2 (stage 2)"}}, ...],
 *   "displayTimeUnit": "ms"}
 * (ts and dur in microseconds, cat an action kind or "wait", tid the rank,
 * chunk and stage those of pipecc --chunks) and draws it with timeline_svg.
 * A trace without a version is version 1, from before chunks: it has no chunk
 * or stage, and is drawn as it always was; a newer version is refused.  The
 * file is untrusted: the JSON parser is strict
 * (RFC 8259, valid UTF-8, bounded depth and size), every field is checked for
 * presence, type and range, and any problem is one line
 *   pipecc-trace: error: FILE: byte N: ...     (or: event I (byte N): ...)
 * with exit status 2 and no output file (the SVG is written to a temporary
 * file that is renamed into place only when complete). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "timeline.h"

#define MAX_FILE (256u << 20) /* bytes */
#define MAX_DEPTH 64
#define MAX_NODES (4u << 20) /* JSON values in one event (or one other top-level member) */
#define MAX_RANK 4095
#define MAX_TS 1e16  /* us: 317 years (Unix-epoch timestamps fit) */
#define MAX_DUR 1e12 /* us: 11.6 days */
#define MAX_STEP 1000000000.0
#define MAX_STAGE 65535
#define TRACE_VERSION 2 /* the newest trace format this reads (runtime/trace.h's PR_TRACE_VERSION) */

static const char *g_file = "";

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "pipecc-trace: error: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(2);
}

/* ---- A strict JSON parser into a flat node array ---- */

enum { J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ };
static const char *JTYPE[] = {"null", "false", "true", "a number", "a string", "an array", "an object"};

typedef struct JNode {
  int type;
  size_t off;        /* byte offset of the value in the file */
  double num;        /* J_NUM */
  size_t str, slen;  /* J_STR: decoded bytes in sb */
  size_t key, klen;  /* a member of an object: its key in sb */
  long first, next;  /* children (array elements / object members), siblings */
} JNode;

typedef struct JP {
  const unsigned char *s;
  size_t len, pos;
  JNode *nodes;
  size_t nn, cap;
  char *sb;
  size_t sblen, sbcap;
  char err[512];
} JP;

static int jerr(JP *p, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int jerr(JP *p, size_t off, const char *fmt, ...) {
  if (p->err[0]) return -1;
  int k = snprintf(p->err, sizeof p->err, "byte %zu: ", off);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->err + k, sizeof p->err - (size_t)k, fmt, ap);
  va_end(ap);
  return -1;
}

/* A description of the byte at pos, for messages. */
static const char *at(JP *p, size_t pos) {
  static char b[32];
  if (pos >= p->len) return "the end of the file";
  unsigned c = p->s[pos];
  if (c >= 0x21 && c < 0x7f && c != '\'') snprintf(b, sizeof b, "'%c'", (char)c);
  else snprintf(b, sizeof b, "byte 0x%02x", c);
  return b;
}

static void ws(JP *p) {
  while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
    p->pos++;
}

static long new_node(JP *p, int type, size_t off) {
  if (p->nn >= MAX_NODES) return jerr(p, off, "too many JSON values in one event (more than %u)", MAX_NODES);
  if (p->nn == p->cap) {
    p->cap = p->cap ? 2 * p->cap : 256;
    JNode *n = realloc(p->nodes, p->cap * sizeof *n);
    if (!n) abort();
    p->nodes = n;
  }
  JNode *n = &p->nodes[p->nn];
  memset(n, 0, sizeof *n);
  n->type = type;
  n->off = off;
  n->first = n->next = -1;
  return (long)p->nn++;
}

static void sb_put(JP *p, const void *b, size_t n) {
  if (p->sblen + n > p->sbcap) {
    size_t cap = p->sbcap ? p->sbcap : 1024;
    while (cap < p->sblen + n) cap *= 2;
    char *s = realloc(p->sb, cap);
    if (!s) abort();
    p->sb = s;
    p->sbcap = cap;
  }
  memcpy(p->sb + p->sblen, b, n);
  p->sblen += n;
}

static void sb_utf8(JP *p, unsigned cp) {
  unsigned char b[4];
  size_t n;
  if (cp < 0x80) b[0] = (unsigned char)cp, n = 1;
  else if (cp < 0x800) b[0] = (unsigned char)(0xc0 | cp >> 6), b[1] = (unsigned char)(0x80 | (cp & 0x3f)), n = 2;
  else if (cp < 0x10000)
    b[0] = (unsigned char)(0xe0 | cp >> 12), b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)),
    b[2] = (unsigned char)(0x80 | (cp & 0x3f)), n = 3;
  else
    b[0] = (unsigned char)(0xf0 | cp >> 18), b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f)),
    b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)), b[3] = (unsigned char)(0x80 | (cp & 0x3f)), n = 4;
  sb_put(p, b, n);
}

static int hex4(JP *p, size_t pos, unsigned *out) {
  if (pos + 4 > p->len) return jerr(p, pos, "truncated \\u escape");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned c = p->s[pos + (size_t)i], d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return jerr(p, pos + (size_t)i, "bad hex digit %s in a \\u escape", at(p, pos + (size_t)i));
    v = v * 16 + d;
  }
  *out = v;
  return 0;
}

/* A string at p->pos (on the opening quote): decoded into sb. */
static int parse_string(JP *p, size_t *str, size_t *slen) {
  size_t start = p->pos++;
  *str = p->sblen;
  for (;;) {
    if (p->pos >= p->len) return jerr(p, start, "unterminated string");
    unsigned c = p->s[p->pos];
    if (c == '"') {
      p->pos++;
      break;
    }
    if (c < 0x20) return jerr(p, p->pos, "control character 0x%02x in a string (escape it)", c);
    if (c == '\\') {
      if (p->pos + 1 >= p->len) return jerr(p, start, "unterminated string");
      unsigned e = p->s[p->pos + 1];
      const char *simple = strchr("\"\\/bfnrt", (int)e);
      if (e && simple) {
        static const char rep[] = "\"\\/\b\f\n\r\t";
        sb_put(p, &rep[simple - "\"\\/bfnrt"], 1);
        p->pos += 2;
        continue;
      }
      if (e != 'u') return jerr(p, p->pos, "bad escape in a string: backslash then %s", at(p, p->pos + 1));
      unsigned cp;
      if (hex4(p, p->pos + 2, &cp)) return -1;
      size_t esc = p->pos;
      p->pos += 6;
      if (cp >= 0xd800 && cp <= 0xdbff) {
        unsigned lo;
        if (p->pos + 1 >= p->len || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
          return jerr(p, esc, "unpaired surrogate \\u%04x in a string", cp);
        if (hex4(p, p->pos + 2, &lo)) return -1;
        if (lo < 0xdc00 || lo > 0xdfff) return jerr(p, esc, "unpaired surrogate \\u%04x in a string", cp);
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        p->pos += 6;
      } else if (cp >= 0xdc00 && cp <= 0xdfff) {
        return jerr(p, esc, "unpaired surrogate \\u%04x in a string", cp);
      }
      sb_utf8(p, cp);
      continue;
    }
    if (c < 0x80) {
      sb_put(p, &p->s[p->pos], 1);
      p->pos++;
      continue;
    }
    /* Raw UTF-8: well formed, no overlongs, surrogates or > U+10FFFF. */
    size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    int ok = n && p->pos + n <= p->len;
    for (size_t i = 1; ok && i < n; i++) ok = (p->s[p->pos + i] & 0xc0) == 0x80;
    if (ok && c == 0xe0) ok = p->s[p->pos + 1] >= 0xa0;
    if (ok && c == 0xed) ok = p->s[p->pos + 1] < 0xa0;
    if (ok && c == 0xf0) ok = p->s[p->pos + 1] >= 0x90;
    if (ok && c == 0xf4) ok = p->s[p->pos + 1] < 0x90;
    if (!ok) return jerr(p, p->pos, "invalid UTF-8 in a string");
    sb_put(p, &p->s[p->pos], n);
    p->pos += n;
  }
  *slen = p->sblen - *str;
  return 0;
}

static int is_digit(JP *p, size_t i) { return i < p->len && p->s[i] >= '0' && p->s[i] <= '9'; }

static int parse_number(JP *p, double *out) {
  size_t start = p->pos, i = p->pos;
  if (i < p->len && p->s[i] == '-') i++;
  if (!is_digit(p, i)) return jerr(p, start, "bad number (expected a digit at byte %zu)", i);
  if (p->s[i] == '0') {
    i++;
    if (is_digit(p, i)) return jerr(p, start, "bad number (leading zero)");
  } else
    while (is_digit(p, i)) i++;
  if (i < p->len && p->s[i] == '.') {
    i++;
    if (!is_digit(p, i)) return jerr(p, start, "bad number (expected a digit after '.')");
    while (is_digit(p, i)) i++;
  }
  if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
    i++;
    if (i < p->len && (p->s[i] == '+' || p->s[i] == '-')) i++;
    if (!is_digit(p, i)) return jerr(p, start, "bad number (expected a digit in the exponent)");
    while (is_digit(p, i)) i++;
  }
  size_t n = i - start;
  if (n > 400) return jerr(p, start, "number too long (%zu characters)", n);
  char buf[416];
  memcpy(buf, p->s + start, n);
  buf[n] = 0;
  errno = 0;
  double v = strtod(buf, NULL);
  if (!isfinite(v)) return jerr(p, start, "number out of range: %.40s%s", buf, n > 40 ? "..." : "");
  *out = v;
  p->pos = i;
  return 0;
}

static long parse_value(JP *p, int depth);

static long parse_container(JP *p, int depth, int obj) {
  size_t start = p->pos;
  if (depth >= MAX_DEPTH) return jerr(p, start, "nesting deeper than %d", MAX_DEPTH);
  long me = new_node(p, obj ? J_OBJ : J_ARR, start);
  if (me < 0) return -1;
  p->pos++;
  ws(p);
  char close = obj ? '}' : ']';
  if (p->pos < p->len && p->s[p->pos] == close) {
    p->pos++;
    return me;
  }
  long last = -1;
  for (;;) {
    size_t key = 0, klen = 0;
    if (obj) {
      ws(p);
      if (p->pos >= p->len || p->s[p->pos] != '"')
        return jerr(p, p->pos, "expected a string key in an object, found %s", at(p, p->pos));
      if (parse_string(p, &key, &klen)) return -1;
      ws(p);
      if (p->pos >= p->len || p->s[p->pos] != ':')
        return jerr(p, p->pos, "expected ':' after an object key, found %s", at(p, p->pos));
      p->pos++;
    }
    long child = parse_value(p, depth + 1);
    if (child < 0) return -1;
    p->nodes[child].key = key;
    p->nodes[child].klen = klen;
    if (last < 0) p->nodes[me].first = child;
    else p->nodes[last].next = child;
    last = child;
    ws(p);
    if (p->pos < p->len && p->s[p->pos] == ',') {
      p->pos++;
      continue;
    }
    if (p->pos < p->len && p->s[p->pos] == close) {
      p->pos++;
      return me;
    }
    return jerr(p, p->pos, "expected ',' or '%c' in %s, found %s", close, obj ? "an object" : "an array",
                at(p, p->pos));
  }
}

static long parse_value(JP *p, int depth) {
  ws(p);
  size_t start = p->pos;
  if (p->pos >= p->len) return jerr(p, p->pos, "unexpected end of the file, expected a value");
  unsigned c = p->s[p->pos];
  if (c == '{' || c == '[') return parse_container(p, depth, c == '{');
  if (c == '"') {
    long n = new_node(p, J_STR, start);
    if (n < 0) return -1;
    size_t str, slen;
    if (parse_string(p, &str, &slen)) return -1;
    p->nodes[n].str = str;
    p->nodes[n].slen = slen;
    return n;
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    double v;
    if (parse_number(p, &v)) return -1;
    long n = new_node(p, J_NUM, start);
    if (n >= 0) p->nodes[n].num = v;
    return n;
  }
  static const struct {
    const char *w;
    int t;
  } lit[] = {{"null", J_NULL}, {"false", J_FALSE}, {"true", J_TRUE}};
  for (int k = 0; k < 3; k++) {
    size_t l = strlen(lit[k].w);
    if (p->len - p->pos >= l && !memcmp(p->s + p->pos, lit[k].w, l)) {
      p->pos += l;
      return new_node(p, lit[k].t, start);
    }
  }
  return jerr(p, start, "expected a JSON value, found %s", at(p, start));
}

/* ---- The trace format ---- */

typedef struct Ctx {
  JP *p;
  long ev;       /* event index, -1 outside traceEvents */
  size_t evoff;  /* its byte offset */
} Ctx;

static void fail(Ctx *c, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));
static void fail(Ctx *c, size_t off, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c->ev >= 0) die("%s: event %ld (byte %zu): %s", g_file, c->ev, off, msg);
  die("%s: byte %zu: %s", g_file, off, msg);
}

static int key_is(JP *p, const JNode *n, const char *k) {
  return n->klen == strlen(k) && !memcmp(p->sb + n->key, k, n->klen);
}
static int str_is(JP *p, const JNode *n, const char *s) {
  return n->type == J_STR && n->slen == strlen(s) && !memcmp(p->sb + n->str, s, n->slen);
}
/* The string's bytes, quoted and shortened, for a message. */
static const char *show(JP *p, const JNode *n) {
  static char b[80];
  size_t k = 0;
  b[k++] = '"';
  for (size_t i = 0; i < n->slen && k < 60; i++) {
    unsigned char ch = (unsigned char)p->sb[n->str + i];
    b[k++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
  }
  if (n->slen > 58) b[k++] = '.', b[k++] = '.', b[k++] = '.';
  b[k++] = '"';
  b[k] = 0;
  return b;
}

/* The member `key` of object `obj`, or NULL; a repeated key is an error. */
static const JNode *member(Ctx *c, const JNode *obj, const char *key) {
  const JNode *found = NULL;
  for (long i = obj->first; i >= 0; i = c->p->nodes[i].next) {
    const JNode *m = &c->p->nodes[i];
    if (!key_is(c->p, m, key)) continue;
    if (found) fail(c, m->off, "duplicate key \"%s\"", key);
    found = m;
  }
  return found;
}

static const JNode *need(Ctx *c, const JNode *obj, const char *what, const char *key, int type) {
  const JNode *m = member(c, obj, key);
  if (!m) fail(c, obj->off, "missing \"%s\"%s", key, what);
  if (m->type != type) fail(c, m->off, "\"%s\" is %s, expected %s", key, JTYPE[m->type], JTYPE[type]);
  return m;
}

static double need_num(Ctx *c, const JNode *obj, const char *what, const char *key, double lo, double hi, int integer) {
  const JNode *m = need(c, obj, what, key, J_NUM);
  if (integer && m->num != floor(m->num)) fail(c, m->off, "\"%s\" is %g, expected an integer", key, m->num);
  if (m->num < lo)
    fail(c, m->off, "\"%s\" is %s (%.10g), expected at least %g", key, m->num < 0 ? "negative" : "too small",
         m->num, lo);
  if (m->num > hi) fail(c, m->off, "\"%s\" is too large (%.10g), expected at most %g", key, m->num, hi);
  return m->num;
}

typedef struct Trace {
  TlSpan *s;
  int n, cap;
  int nranks;
  int have_events;
  size_t events_off; /* byte offset of the traceEvents array */
} Trace;

static void event(Ctx *c, const JNode *e, Trace *t) {
  if (e->type != J_OBJ) fail(c, e->off, "an event is %s, expected an object", JTYPE[e->type]);
  const JNode *ph = need(c, e, "", "ph", J_STR);
  if (str_is(c->p, ph, "M")) {
    const JNode *name = need(c, e, " in a metadata event", "name", J_STR);
    const JNode *tid = member(c, e, "tid");
    if (str_is(c->p, name, "thread_name")) {
      int rank = (int)need_num(c, e, " in a thread_name event", "tid", 0, MAX_RANK, 1);
      const JNode *args = need(c, e, " in a thread_name event", "args", J_OBJ);
      need(c, args, " in a thread_name event's args", "name", J_STR);
      if (rank + 1 > t->nranks) t->nranks = rank + 1;
    } else if (tid && tid->type != J_NUM) {
      fail(c, tid->off, "\"tid\" is %s, expected a number", JTYPE[tid->type]);
    }
    return;
  }
  if (!str_is(c->p, ph, "X"))
    fail(c, ph->off, "unsupported \"ph\" %s (this trace format has only \"X\" and \"M\" events)", show(c->p, ph));
  const char *w = " in an \"X\" event";
  need(c, e, w, "name", J_STR);
  const JNode *cat = need(c, e, w, "cat", J_STR);
  int kind = cat->slen < 32 && memchr(c->p->sb + cat->str, 0, cat->slen) == NULL ? -1 : -2;
  if (kind == -1) {
    char k[32];
    memcpy(k, c->p->sb + cat->str, cat->slen);
    k[cat->slen] = 0;
    kind = tl_kind_from_name(k);
  }
  if (kind < 0)
    fail(c, cat->off,
         "unknown \"cat\" %s (expected F, B, I, W, SEND, RECV, SEND_GRAD, RECV_GRAD, UPDATE or wait)",
         show(c->p, cat));
  double ts = need_num(c, e, w, "ts", 0, MAX_TS, 0);
  double dur = need_num(c, e, w, "dur", 0, MAX_DUR, 0);
  need_num(c, e, w, "pid", 0, INT_MAX, 1);
  int rank = (int)need_num(c, e, w, "tid", 0, MAX_RANK, 1);
  const JNode *args = need(c, e, w, "args", J_OBJ);
  const char *wa = " in the event's args";
  int step = (int)need_num(c, args, wa, "step", 0, MAX_STEP, 1);
  int mb = -1;
  /* UPDATE and wait need not belong to a micro-batch. */
  if (kind == TL_UPDATE || kind == TL_WAIT) {
    const JNode *m = member(c, args, "mb");
    if (m) mb = (int)need_num(c, args, wa, "mb", -1, MAX_STEP, 1);
  } else {
    mb = (int)need_num(c, args, wa, "mb", -1, MAX_STEP, 1);
  }
  const JNode *k = member(c, args, "kind");
  if (k && k->type != J_STR) fail(c, k->off, "\"kind\" is %s, expected a string", JTYPE[k->type]);
  if (k && !(k->slen == cat->slen && !memcmp(c->p->sb + k->str, c->p->sb + cat->str, k->slen)))
    fail(c, k->off, "args \"kind\" %s differs from \"cat\"", show(c->p, k));
  if (member(c, args, "slot")) need_num(c, args, wa, "slot", -1, MAX_STEP, 1);
  /* Version 2: the rank's chunk the span ran (-1: the whole rank's) and its stage (-1: none); a version 1
   * trace has neither, one stage per rank. */
  int chunk = member(c, args, "chunk") ? (int)need_num(c, args, wa, "chunk", -1, TL_MAX_CHUNKS - 1, 1) : 0;
  int stage = member(c, args, "stage") ? (int)need_num(c, args, wa, "stage", -1, MAX_STAGE, 1) : -1;

  if (t->n == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 1024;
    TlSpan *s = realloc(t->s, (size_t)t->cap * sizeof *s);
    if (!s) abort();
    t->s = s;
  }
  t->s[t->n++] = (TlSpan){rank, kind, mb, step, ts * 1e-6, (ts + dur) * 1e-6, chunk, stage};
  if (rank + 1 > t->nranks) t->nranks = rank + 1;
  t->have_events = 1;
}

/* "otherData": {"pipecc_trace_version": V}: a trace of a newer format than this reads is refused, not drawn
 * wrong.  Other otherData (Chrome's metadata) is left alone. */
static void other_data(JP *p, long v) {
  const JNode *o = &p->nodes[v];
  Ctx c = {p, -1, 0};
  const JNode *ver = o->type == J_OBJ ? member(&c, o, "pipecc_trace_version") : NULL;
  if (!ver) return;
  double x = need_num(&c, o, "", "pipecc_trace_version", 1, INT_MAX, 1);
  if (x > TRACE_VERSION)
    fail(&c, ver->off, "trace format version %.0f is newer than this pipecc-trace reads (1 to %d); draw it with the pipecc that wrote it",
         x, TRACE_VERSION);
}

static void jp_check(JP *p) {
  if (p->err[0]) die("%s: %s", g_file, p->err);
}

/* The whole file: {"traceEvents": [...], other members ignored}. */
static void parse_trace(JP *p, Trace *t) {
  Ctx c = {p, -1, 0};
  ws(p);
  if (p->pos >= p->len) die("%s: byte 0: empty file, expected a JSON object", g_file);
  if (p->s[p->pos] != '{')
    die("%s: byte %zu: expected '{' (a JSON trace object), found %s", g_file, p->pos, at(p, p->pos));
  p->pos++;
  int seen = 0, first = 1;
  for (;;) {
    ws(p);
    if (first && p->pos < p->len && p->s[p->pos] == '}') {
      p->pos++;
      break;
    }
    first = 0;
    if (p->pos >= p->len || p->s[p->pos] != '"')
      die("%s: byte %zu: expected a string key in the top-level object, found %s", g_file, p->pos, at(p, p->pos));
    size_t koff = p->pos, key, klen;
    p->sblen = 0;
    if (parse_string(p, &key, &klen)) jp_check(p);
    int is_events = klen == 11 && !memcmp(p->sb + key, "traceEvents", 11);
    ws(p);
    if (p->pos >= p->len || p->s[p->pos] != ':')
      die("%s: byte %zu: expected ':' after a key, found %s", g_file, p->pos, at(p, p->pos));
    p->pos++;
    ws(p);
    if (!is_events) {
      int other = klen == 9 && !memcmp(p->sb + key, "otherData", 9);
      p->nn = 0;
      p->sblen = 0;
      long v = parse_value(p, 1);
      if (v < 0) jp_check(p);
      if (other) other_data(p, v);
    } else {
      if (seen) die("%s: byte %zu: duplicate key \"traceEvents\"", g_file, koff);
      seen = 1;
      if (p->pos >= p->len || p->s[p->pos] != '[') {
        p->nn = 0;
        long v = parse_value(p, 1);
        if (v < 0) jp_check(p);
        die("%s: byte %zu: \"traceEvents\" is %s, expected an array", g_file, p->nodes[v].off,
            JTYPE[p->nodes[v].type]);
      }
      t->events_off = p->pos++;
      ws(p);
      if (p->pos < p->len && p->s[p->pos] == ']') p->pos++;
      else
        for (long i = 0;; i++) {
          /* One event at a time: memory stays proportional to one event. */
          p->nn = 0;
          p->sblen = 0;
          long v = parse_value(p, 2);
          if (v < 0) jp_check(p);
          c.ev = i;
          c.evoff = p->nodes[v].off;
          event(&c, &p->nodes[v], t);
          c.ev = -1;
          ws(p);
          if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
          }
          if (p->pos < p->len && p->s[p->pos] == ']') {
            p->pos++;
            break;
          }
          die("%s: byte %zu: expected ',' or ']' after event %ld, found %s", g_file, p->pos, i, at(p, p->pos));
        }
    }
    ws(p);
    if (p->pos < p->len && p->s[p->pos] == ',') {
      p->pos++;
      continue;
    }
    if (p->pos < p->len && p->s[p->pos] == '}') {
      p->pos++;
      break;
    }
    die("%s: byte %zu: expected ',' or '}' in the top-level object, found %s", g_file, p->pos, at(p, p->pos));
  }
  ws(p);
  if (p->pos < p->len) die("%s: byte %zu: trailing data after the JSON object (%s)", g_file, p->pos, at(p, p->pos));
  if (!seen) die("%s: byte 0: no \"traceEvents\" array", g_file);
}

/* ---- Files ---- */

static unsigned char *read_file(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) die("%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) < 0) die("%s: cannot stat: %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode)) die("%s: not a regular file", path);
  if ((unsigned long long)st.st_size > MAX_FILE)
    die("%s: byte 0: file too large (%lld bytes; at most %u)", path, (long long)st.st_size, MAX_FILE);
  size_t n = (size_t)st.st_size;
  unsigned char *b = malloc(n ? n : 1);
  if (!b) abort();
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, b + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) die("%s: cannot read: %s", path, strerror(errno));
    if (r == 0) break;
    got += (size_t)r;
  }
  close(fd);
  *len = got;
  return b;
}

static char *g_tmp; /* removed if we die before the rename */
static void cleanup(void) {
  if (g_tmp) unlink(g_tmp);
}

static void write_atomic(const char *path, const char *data, size_t n) {
  size_t l = strlen(path);
  g_tmp = malloc(l + 16);
  if (!g_tmp) abort();
  snprintf(g_tmp, l + 16, "%s.tmp.XXXXXX", path);
  int fd = mkstemp(g_tmp);
  if (fd < 0) {
    free(g_tmp);
    g_tmp = NULL;
    die("%s: cannot write: %s", path, strerror(errno));
  }
  fchmod(fd, 0644);
  size_t done = 0;
  while (done < n) {
    ssize_t w = write(fd, data + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die("%s: cannot write: %s", path, strerror(errno));
    done += (size_t)w;
  }
  if (close(fd) < 0) die("%s: cannot write: %s", path, strerror(errno));
  if (rename(g_tmp, path) < 0) die("%s: cannot write: %s", path, strerror(errno));
  free(g_tmp);
  g_tmp = NULL;
}

static void usage(FILE *f) {
  fputs("usage: pipecc-trace TRACE.json [-o OUT.svg] [--step K]\n"
        "\n"
        "Draws a pipeline run's trace (the runtime's Chrome trace-event JSON) as an SVG\n"
        "Gantt chart: one row per rank, one box per action (docs/timeline.md).\n"
        "\n"
        "  -o FILE      the SVG to write (default: TRACE with .json replaced by .svg)\n"
        "  --step K     draw only optimizer step K (default: every step in the trace)\n"
        "  -h, --help   this text\n",
        f);
}

int main(int argc, char **argv) {
  const char *in = NULL, *out = NULL;
  long step = -1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "-o") || !strcmp(a, "--step")) {
      if (i + 1 >= argc) die("%s needs a value (see pipecc-trace --help)", a);
      const char *v = argv[++i];
      if (!strcmp(a, "-o")) {
        if (out) die("-o given twice");
        if (!*v) die("-o: empty file name");
        out = v;
      } else {
        char *end;
        errno = 0;
        step = strtol(v, &end, 10);
        if (errno || end == v || *end || step < 0 || step > (long)MAX_STEP)
          die("--step: '%s' is not a step number (0 to %.0f)", v, MAX_STEP);
      }
    } else if (a[0] == '-' && a[1]) {
      die("unknown option '%s' (see pipecc-trace --help)", a);
    } else {
      if (in) die("more than one trace file ('%s', '%s')", in, a);
      in = a;
    }
  }
  if (!in) {
    usage(stderr);
    return 2;
  }
  char *out_owned = NULL;
  if (!out) {
    size_t l = strlen(in);
    if (l > 5 && !strcmp(in + l - 5, ".json")) l -= 5;
    out_owned = malloc(l + 5);
    if (!out_owned) abort();
    memcpy(out_owned, in, l);
    strcpy(out_owned + l, ".svg");
    out = out_owned;
  }
  g_file = in;
  atexit(cleanup);

  JP p = {0};
  p.s = read_file(in, &p.len);
  Trace t = {0};
  parse_trace(&p, &t);
  free(p.nodes);
  free(p.sb);
  free((void *)p.s);
  if (!t.have_events) die("%s: byte %zu: no \"X\" (complete) events in \"traceEvents\"", in, t.events_off);

  int lo = t.s[0].step, hi = t.s[0].step;
  for (int i = 0; i < t.n; i++) {
    if (t.s[i].step < lo) lo = t.s[i].step;
    if (t.s[i].step > hi) hi = t.s[i].step;
  }
  if (step >= 0) {
    int m = 0;
    for (int i = 0; i < t.n; i++)
      if (t.s[i].step == step) t.s[m++] = t.s[i];
    if (!m) die("%s: byte %zu: no events for step %ld in \"traceEvents\" (the trace has steps %d to %d)", in,
                 t.events_off, step, lo, hi);
    t.n = m;
    lo = hi = (int)step;
  }
  /* The file name without its directory, in the title. */
  const char *base = strrchr(in, '/');
  base = base && base[1] ? base + 1 : in;
  /* pipecc --chunks: which stages each rank ran, in the title and below the summary line. */
  Buf chunks = {0};
  int nchunks = timeline_chunks_text(&chunks, t.s, t.n, t.nranks);
  char title[600], each[48] = "";
  if (nchunks) snprintf(each, sizeof each, ", %d chunks a rank", nchunks);
  if (lo == hi) snprintf(title, sizeof title, "%.500s: measured, step %d%s", base, lo, each);
  else snprintf(title, sizeof title, "%.500s: measured, steps %d to %d%s", base, lo, hi, each);

  Buf o = {0};
  timeline_svg(&o, t.s, t.n, t.nranks, title);
  write_atomic(out, o.s, o.len);
  if (lo == hi) printf("pipecc-trace: wrote %s: %d actions on %d ranks, step %d\n", out, t.n, t.nranks, lo);
  else printf("pipecc-trace: wrote %s: %d actions on %d ranks, steps %d to %d\n", out, t.n, t.nranks, lo, hi);
  if (nchunks) printf("pipecc-trace: %d chunks a rank: %s\n", nchunks, chunks.s);
  buf_free(&chunks);
  buf_free(&o);
  free(t.s);
  free(out_owned);
  return 0;
}
