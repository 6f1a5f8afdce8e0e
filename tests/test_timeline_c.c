/* test_timeline_c.c - timeline_svg called directly (built with ASan/UBSan).
 *
 *   bin/test_timeline            C-level checks; prints "N passed, M failed, K skipped, R refused"
 *   bin/test_timeline --svg CASE prints one case's SVG (tests/test_timeline.py
 *                                parses it): planned | empty | hostile
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "timeline.h"

#include "check.h"

static void check(int cond, const char *what) {
  passed += !!cond;
  failed += !cond;
  printf("%s - %s\n", cond ? "ok" : "not ok", what);
}

static size_t count(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* A 1F1B schedule over 4 ranks and 8 micro-batches with unit-ish times, plus
 * zero-width SEND/RECV posts, a wait and an update per rank: the shape the
 * compiler's planned schedule has. */
static int planned(TlSpan *s, int cap) {
  const int P = 4, M = 8;
  double tf = 1e-3, tb = 2e-3;
  int n = 0;
  for (int r = 0; r < P; r++) {
    double t = r * tf;
    int warm = P - 1 - r, f = 0, b = 0;
    for (int k = 0; k < warm && f < M; k++, f++) {
      s[n++] = (TlSpan){r, TL_F, f, 0, t, t + tf};
      if (r + 1 < P && n < cap) s[n++] = (TlSpan){r, TL_SEND, f, 0, t + tf, t + tf};
      t += tf;
    }
    if (r > 0) s[n++] = (TlSpan){r, TL_WAIT, -1, 0, t, t + 0.4e-3}, t += 0.4e-3;
    while (b < M) {
      if (f < M) {
        if (r > 0) s[n++] = (TlSpan){r, TL_RECV, f, 0, t, t};
        s[n++] = (TlSpan){r, TL_F, f, 0, t, t + tf};
        t += tf;
        f++;
      }
      s[n++] = (TlSpan){r, TL_B, b, 0, t, t + tb};
      if (r > 0) s[n++] = (TlSpan){r, TL_SEND_GRAD, b, 0, t + tb, t + tb + 0.3e-3};
      t += tb;
      b++;
    }
    s[n++] = (TlSpan){r, TL_UPDATE, -1, 0, t, t + 1.5e-3};
  }
  return n;
}

static void render_case(const char *name, Buf *o) {
  TlSpan s[256];
  if (!strcmp(name, "planned")) {
    int n = planned(s, 256);
    timeline_svg(o, s, n, 4, "lenet.pipe: planned 1F1B, 4 stages, 8 micro-batches");
  } else if (!strcmp(name, "empty")) {
    timeline_svg(o, NULL, 0, 2, NULL);
  } else {
    /* Out-of-range ranks and kinds, NaN/Inf times, end < start, a negative
     * mb, a huge mb, and a title with markup, control bytes and bad UTF-8. */
    TlSpan h[] = {
        {0, TL_F, 0, 0, 0, 1},           {1, TL_B, 123456789, 0, 1, 1.02},{5, TL_F, 1, 0, 0, 1},
        {-1, TL_F, 1, 0, 0, 1},          {0, 99, 1, 0, 0, 1},            {0, TL_I, 2, 0, NAN, 1},
        {0, TL_W, 2, 0, 0, INFINITY},    {1, TL_RECV_GRAD, 3, 0, 2, 1.5}, {0, TL_WAIT, -7, 1, 3, 3.5},
        {1, TL_I, 4, 1, 3.5, 3.5 + 1e-9}, {0, TL_W, 5, 1, 3.5, 4},
    };
    timeline_svg(o, h, (int)(sizeof h / sizeof h[0]), 2,
                 "<script>&\"x'\x01\x7f \xff\xfe \xc3\xa9 \xed\xa0\x80 \xe2\x80\x93 \xf0\x9f\x98\x80 \xef\xbf\xbf");
  }
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--svg")) {
    Buf o = {0};
    render_case(argv[2], &o);
    fwrite(o.s, 1, o.len, stdout);
    buf_free(&o);
    return 0;
  }

  /* Kind names round-trip; unknown names and kinds are refused. */
  int rt = 1;
  for (int k = 0; k < TL_NKINDS; k++) rt &= tl_kind_from_name(tl_kind_name(k)) == k;
  check(rt, "tl_kind_from_name(tl_kind_name(k)) == k for every kind");
  check(!strcmp(tl_kind_name(TL_WAIT), "wait") && !strcmp(tl_kind_name(TL_SEND_GRAD), "SEND_GRAD") &&
            !strcmp(tl_kind_name(TL_F), "F"),
        "kind names as specified (F ... SEND_GRAD ... wait)");
  check(tl_kind_from_name("f") < 0 && tl_kind_from_name("WAIT") < 0 && tl_kind_from_name("") < 0 &&
            tl_kind_from_name(NULL) < 0 && tl_kind_from_name("F ") < 0,
        "tl_kind_from_name: -1 for unknown, wrong case, empty, NULL");
  check(!strcmp(tl_kind_name(-1), "?") && !strcmp(tl_kind_name(TL_NKINDS), "?"), "tl_kind_name out of range: \"?\"");

  /* Deterministic, and appends (does not overwrite) the buffer. */
  Buf a = {0}, b = {0};
  buf_printf(&b, "PREFIX");
  render_case("planned", &a);
  render_case("planned", &b);
  check(b.len == a.len + 6 && !memcmp(b.s, "PREFIX", 6) && !memcmp(b.s + 6, a.s, a.len),
        "same input, same bytes; output is appended to the buffer");
  TlSpan s[256];
  int n = planned(s, 256);
  int ticks = 0;
  for (int i = 0; i < n; i++) ticks += s[i].end == s[i].start;
  check(count(a.s, "class=\"span\"") + count(a.s, "class=\"tick\"") == (size_t)n,
        "planned: one box or tick per span");
  check(count(a.s, "class=\"tick\"") == (size_t)ticks && ticks > 0, "planned: zero-width posts are ticks");
  check(count(a.s, ">rank ") == 4 && strstr(a.s, ">rank 3<"), "planned: four rank rows labelled");
  check(strstr(a.s, "time (ms)") != NULL, "planned: the axis is in ms");
  check(strstr(a.s, "<script") == NULL, "no scripts");
  buf_free(&a);
  buf_free(&b);

  Buf h = {0};
  render_case("hostile", &h);
  check(strstr(h.s, "&lt;script&gt;&amp;&quot;x&apos;??") != NULL, "title: markup escaped, control bytes replaced");
  check(strstr(h.s, "\xc3\xa9") && strstr(h.s, "\xe2\x80\x93") && strstr(h.s, "\xf0\x9f\x98\x80") &&
            !strstr(h.s, "\xff") && !strstr(h.s, "\xed\xa0\x80") && !strstr(h.s, "\xef\xbf\xbf"),
        "title: valid UTF-8 kept, invalid bytes, surrogates and U+FFFF replaced");
  check(count(h.s, "class=\"span\"") + count(h.s, "class=\"tick\"") == 6,
        "hostile: bad rank, kind, NaN and Inf spans skipped; the other 6 drawn");
  check(strstr(h.s, ">123456789<") == NULL, "hostile: a number too wide for its box is not written");
  buf_free(&h);

  Buf e = {0};
  render_case("empty", &e);
  check(strstr(e.s, "no actions") && count(e.s, ">rank ") == 2 && strstr(e.s, "</svg>"),
        "empty: two empty rows and 'no actions'");
  buf_free(&e);

  Buf z = {0};
  timeline_svg(&z, s, n, 0, "x");
  check(count(z.s, "class=\"span\"") == 0 && strstr(z.s, "</svg>"), "nranks 0: nothing drawn, still a document");
  buf_free(&z);

  return check_finish();
}
