/* test_timeline_c.c - timeline_svg called directly (built with ASan/UBSan).
 *
 *   bin/test_timeline            C-level checks; prints "N passed, M failed, K skipped, R refused"
 *   bin/test_timeline --svg CASE prints one case's SVG (tests/test_timeline.py
 *                                parses it): planned | empty | hostile | chunked
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
      s[n++] = (TlSpan){r, TL_F, f, 0, t, t + tf, 0, -1};
      if (r + 1 < P && n < cap) s[n++] = (TlSpan){r, TL_SEND, f, 0, t + tf, t + tf, 0, -1};
      t += tf;
    }
    if (r > 0) s[n++] = (TlSpan){r, TL_WAIT, -1, 0, t, t + 0.4e-3, 0, -1}, t += 0.4e-3;
    while (b < M) {
      if (f < M) {
        if (r > 0) s[n++] = (TlSpan){r, TL_RECV, f, 0, t, t, 0, -1};
        s[n++] = (TlSpan){r, TL_F, f, 0, t, t + tf, 0, -1};
        t += tf;
        f++;
      }
      s[n++] = (TlSpan){r, TL_B, b, 0, t, t + tb, 0, -1};
      if (r > 0) s[n++] = (TlSpan){r, TL_SEND_GRAD, b, 0, t + tb, t + tb + 0.3e-3, 0, -1};
      t += tb;
      b++;
    }
    s[n++] = (TlSpan){r, TL_UPDATE, -1, 0, t, t + 1.5e-3, 0, -1};
  }
  return n;
}

/* Interleaved over 2 ranks of 2 chunks (pipecc --chunks 2): rank r runs stages r and r + 2; per
 * micro-batch F and B of each chunk, a RECV of chunk 1, a wait inside chunk 1's F, and each rank's
 * UPDATE, the whole rank's (chunk -1).  A span of chunk TL_MAX_CHUNKS is out of range. */
static int chunked(TlSpan *s) {
  int n = 0;
  for (int r = 0; r < 2; r++) {
    double t = r * 1e-3;
    for (int mb = 0; mb < 4; mb++)
      for (int c = 0; c < 2; c++) {
        if (c) s[n++] = (TlSpan){r, TL_RECV, mb, 0, t, t, c, r + 2 * c};
        if (c && mb == 1) s[n++] = (TlSpan){r, TL_WAIT, mb, 0, t, t + 0.2e-3, c, r + 2 * c}, t += 0.2e-3;
        s[n++] = (TlSpan){r, TL_F, mb, 0, t, t + 1e-3, c, r + 2 * c}, t += 1e-3;
        s[n++] = (TlSpan){r, TL_B, mb, 0, t, t + 2e-3, c, r + 2 * c}, t += 2e-3;
      }
    s[n++] = (TlSpan){r, TL_UPDATE, -1, 0, t, t + 1e-3, -1, -1};
  }
  s[n++] = (TlSpan){0, TL_F, 9, 0, 0, 1e-3, TL_MAX_CHUNKS, 0};
  return n;
}

static void render_case(const char *name, Buf *o) {
  TlSpan s[256];
  if (!strcmp(name, "chunked")) {
    int n = chunked(s);
    timeline_svg(o, s, n, 2, "lenet.pipe: planned interleaved, 4 stages on 2 ranks");
  } else if (!strcmp(name, "planned")) {
    int n = planned(s, 256);
    timeline_svg(o, s, n, 4, "lenet.pipe: planned 1F1B, 4 stages, 8 micro-batches");
  } else if (!strcmp(name, "empty")) {
    timeline_svg(o, NULL, 0, 2, NULL);
  } else {
    /* Out-of-range ranks and kinds, NaN/Inf times, end < start, a negative
     * mb, a huge mb, and a title with markup, control bytes and bad UTF-8. */
    TlSpan h[] = {
        {0, TL_F, 0, 0, 0, 1, 0, -1},             {1, TL_B, 123456789, 0, 1, 1.02, 0, -1}, {5, TL_F, 1, 0, 0, 1, 0, -1},
        {-1, TL_F, 1, 0, 0, 1, 0, -1},            {0, 99, 1, 0, 0, 1, 0, -1},              {0, TL_I, 2, 0, NAN, 1, 0, -1},
        {0, TL_W, 2, 0, 0, INFINITY, 0, -1},      {1, TL_RECV_GRAD, 3, 0, 2, 1.5, 0, -1},  {0, TL_WAIT, -7, 1, 3, 3.5, 0, -1},
        {1, TL_I, 4, 1, 3.5, 3.5 + 1e-9, 0, -1},  {0, TL_W, 5, 1, 3.5, 4, 0, -1},
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

  /* Chunks: a later chunk's boxes lighter (F's #4e79a7 55% towards white), labelled 3@1, tagged with
   * their chunk and stage; the key says which stages each rank runs; the whole rank's UPDATE untagged;
   * a chunk past TL_MAX_CHUNKS skipped.  Unchunked charts have none of it. */
  Buf c = {0}, ct = {0};
  render_case("chunked", &c);
  TlSpan cs[256];
  int cn = chunked(cs);
  check(count(c.s, "class=\"span\"") + count(c.s, "class=\"tick\"") == (size_t)cn - 1, "chunked: the span of chunk 64 skipped");
  check(count(c.s, "data-chunk=\"1\" data-stage=\"2\"") == 13 && count(c.s, "data-chunk=\"1\" data-stage=\"3\"") == 13 &&
            count(c.s, "data-chunk=\"0\" data-stage=\"0\"") == 8 && count(c.s, "data-chunk=") == (size_t)cn - 3 + 2 /* the key's swatches */,
        "chunked: every span but the UPDATEs tagged with its chunk and stage");
  check(strstr(c.s, "fill=\"#afc3d7\"") && strstr(c.s, "fill=\"#4e79a7\""), "chunked: chunk 1's forwards lighter than chunk 0's");
  check(strstr(c.s, ">3@1<") && strstr(c.s, ">3<") && !strstr(c.s, "@0<"), "chunked: boxes labelled 3@1 (chunk 1) and 3 (chunk 0)");
  check(strstr(c.s, "chunk 1 (stage 3), step 0, rank 1") != NULL, "chunked: tooltips name the chunk and its stage");
  check(strstr(c.s, ">rank 0 runs stages 0 and 2;<") && strstr(c.s, ">rank 1 runs stages 1 and 3<") && strstr(c.s, ">chunk 1<"),
        "chunked: the key names each chunk's shade and each rank's stages");
  check(timeline_chunks_text(&ct, cs, cn, 2) == 2 && !strcmp(ct.s, "rank 0 runs stages 0 and 2; rank 1 runs stages 1 and 3"),
        "timeline_chunks_text: 2 chunks, each rank's stages");
  Buf pl = {0}, pt = {0};
  render_case("planned", &pl);
  check(!strstr(pl.s, "data-chunk") && !strstr(pl.s, "id=\"chunks\"") && timeline_chunks_text(&pt, s, n, 4) == 0 && pt.len == 0,
        "unchunked: no chunk tags, no key, timeline_chunks_text 0 and nothing");
  int st[3] = {0, 4, -1};
  Buf l = {0};
  timeline_stage_list(&l, st, 1);
  buf_printf(&l, "|");
  timeline_stage_list(&l, st, 3);
  check(!strcmp(l.s, "0|0, 4 and ?"), "timeline_stage_list: \"0\", \"0, 4 and ?\"");
  buf_free(&c), buf_free(&ct), buf_free(&pl), buf_free(&pt), buf_free(&l);

  Buf z = {0};
  timeline_svg(&z, s, n, 0, "x");
  check(count(z.s, "class=\"span\"") == 0 && strstr(z.s, "</svg>"), "nranks 0: nothing drawn, still a document");
  buf_free(&z);

  return check_finish();
}
