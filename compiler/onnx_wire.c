/* onnx_wire.c - splitting the graph initializers' payloads out of an ONNX
 * protobuf (onnx_wire.h says why).
 *
 * The wire format is a list of fields, each a varint tag (field number << 3
 * | wire type) then its value: a varint (type 0), 8 bytes (1), a varint
 * length and that many bytes (2), or 4 bytes (5).  Messages nest as type 2.
 * The walk copies every field as it is, except ModelProto.graph (7),
 * GraphProto.initializer (5) and TensorProto.raw_data (9): the first two are
 * rewritten with their new lengths, the last is left out and noted.  The
 * input is untrusted: every length is checked against what is left, and
 * anything unexpected makes the walk give up (the caller unpacks the whole
 * file instead). */
#include "onnx_wire.h"

#include <stdlib.h>
#include <string.h>

typedef struct Out {
  uint8_t *p;
  size_t len, cap;
} Out;

static void put(Out *o, const void *src, size_t n) {
  if (o->len + n > o->cap) {
    size_t cap = o->cap ? o->cap : 256;
    while (cap < o->len + n) cap *= 2;
    uint8_t *q = realloc(o->p, cap);
    if (!q) abort();
    o->p = q, o->cap = cap;
  }
  if (n) memcpy(o->p + o->len, src, n);
  o->len += n;
}

static void put_varint(Out *o, uint64_t v) {
  uint8_t b[10];
  int n = 0;
  do {
    b[n] = (uint8_t)(v & 0x7f);
    v >>= 7;
    if (v) b[n] |= 0x80;
    n++;
  } while (v);
  put(o, b, (size_t)n);
}

/* Reads a varint at *p (below end); 0 on success. */
static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*p >= end) return -1;
    uint8_t b = *(*p)++;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return 0;
  }
  return -1;
}

/* One field at *p: its number and wire type, and its value's bytes [*val, *val_end); *p moves past it. */
static int get_field(const uint8_t **p, const uint8_t *end, uint64_t *num, int *type, const uint8_t **val, const uint8_t **val_end) {
  uint64_t tag, n;
  if (get_varint(p, end, &tag)) return -1;
  *num = tag >> 3, *type = (int)(tag & 7);
  if (*num == 0) return -1;
  *val = *p;
  switch (*type) {
  case 0: if (get_varint(p, end, &n)) return -1; break;
  case 1: if ((size_t)(end - *p) < 8) return -1; *p += 8; break;
  case 5: if ((size_t)(end - *p) < 4) return -1; *p += 4; break;
  case 2:
    if (get_varint(p, end, &n) || n > (uint64_t)(end - *p)) return -1;
    *val = *p; /* the payload, without its length */
    *p += n;
    break;
  default: return -1; /* groups (3, 4) and reserved types */
  }
  *val_end = *p;
  return 0;
}

/* Appends a length-delimited field: tag, length, bytes. */
static void put_message(Out *o, uint64_t num, const Out *body) {
  put_varint(o, num << 3 | 2);
  put_varint(o, body->len);
  put(o, body->p, body->len);
}

typedef struct Walk {
  const uint8_t *base;
  WireSplit *w;
  size_t cap;
} Walk;

/* TensorProto: every field but raw_data (9), whose payload's place is noted. */
static int walk_tensor(Walk *k, const uint8_t *p, const uint8_t *end, Out *o) {
  WireSplit *w = k->w;
  if (w->ninit == k->cap) {
    k->cap = k->cap ? 2 * k->cap : 64;
    w->off = realloc(w->off, sizeof *w->off * k->cap), w->plen = realloc(w->plen, sizeof *w->plen * k->cap);
    w->has = realloc(w->has, k->cap);
    if (!w->off || !w->plen || !w->has) abort();
  }
  size_t i = w->ninit++;
  w->has[i] = 0, w->off[i] = w->plen[i] = 0;
  while (p < end) {
    const uint8_t *start = p, *v, *ve;
    uint64_t num;
    int type;
    if (get_field(&p, end, &num, &type, &v, &ve)) return -1;
    if (num == 9) {
      if (type != 2 || w->has[i]) return -1; /* raw_data twice: protobuf keeps the last; leave it to the full parse */
      w->has[i] = 1, w->off[i] = (size_t)(v - k->base), w->plen[i] = (size_t)(ve - v);
    } else {
      put(o, start, (size_t)(p - start));
    }
  }
  return 0;
}

/* GraphProto: initializers (5) rewritten, the rest as it is. */
static int walk_graph(Walk *k, const uint8_t *p, const uint8_t *end, Out *o) {
  while (p < end) {
    const uint8_t *start = p, *v, *ve;
    uint64_t num;
    int type;
    if (get_field(&p, end, &num, &type, &v, &ve)) return -1;
    if (num == 5) {
      if (type != 2) return -1;
      Out t = {0};
      int rc = walk_tensor(k, v, ve, &t);
      if (!rc) put_message(o, 5, &t);
      free(t.p);
      if (rc) return -1;
    } else {
      put(o, start, (size_t)(p - start));
    }
  }
  return 0;
}

int wire_split(const uint8_t *buf, size_t len, WireSplit *w) {
  memset(w, 0, sizeof *w);
  Walk k = {buf, w, 0};
  Out o = {0};
  const uint8_t *p = buf, *end = buf + len;
  int graphs = 0;
  while (p < end) {
    const uint8_t *start = p, *v, *ve;
    uint64_t num;
    int type;
    if (get_field(&p, end, &num, &type, &v, &ve)) goto fail;
    if (num == 7) {
      if (type != 2 || graphs++) goto fail; /* two graphs merge in protobuf: leave it to the full parse */
      Out g = {0};
      int rc = walk_graph(&k, v, ve, &g);
      if (!rc) put_message(&o, 7, &g);
      free(g.p);
      if (rc) goto fail;
    } else {
      put(&o, start, (size_t)(p - start));
    }
  }
  put(&o, "", 0);
  w->skeleton = o.p ? o.p : malloc(1), w->len = o.len;
  if (!w->skeleton) abort();
  return 0;
fail:
  free(o.p);
  wire_free(w);
  return -1;
}

void wire_free(WireSplit *w) {
  free(w->skeleton), free(w->off), free(w->plen), free(w->has);
  memset(w, 0, sizeof *w);
}
