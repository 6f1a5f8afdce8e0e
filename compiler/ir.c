/* ir.c - construction and queries of the graph IR. */
#include "ir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint32_t hash_str(const char *s) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

static void hash_insert(Graph *g, int idx) {
  uint32_t m = (uint32_t)g->hcap - 1;
  for (uint32_t h = hash_str(g->t[idx].name) & m;; h = (h + 1) & m)
    if (g->hash[h] < 0) {
      g->hash[h] = idx;
      return;
    }
}

static void hash_grow(Graph *g) {
  free(g->hash);
  g->hcap = g->hcap ? g->hcap * 2 : 1024;
  g->hash = malloc((size_t)g->hcap * sizeof *g->hash);
  if (!g->hash) abort();
  memset(g->hash, 0xff, (size_t)g->hcap * sizeof *g->hash);
  for (int i = 0; i < g->nt; i++) hash_insert(g, i);
}

int ir_add_tensor(Graph *g, const char *name) {
  if (g->nt == g->capt) {
    g->capt = g->capt ? 2 * g->capt : 256;
    g->t = pool_realloc(&g->pool, g->t, (size_t)g->capt * sizeof *g->t);
  }
  Tensor *t = &g->t[g->nt];
  memset(t, 0, sizeof *t);
  t->name = pool_strdup(&g->pool, name);
  t->rank = -1;
  t->declared_rank = -1;
  t->producer = -1;
  int idx = g->nt++;
  if (2 * g->nt > g->hcap) hash_grow(g);
  else hash_insert(g, idx);
  return idx;
}

int ir_find_tensor(const Graph *g, const char *name) {
  if (!g->hcap) return -1;
  uint32_t m = (uint32_t)g->hcap - 1;
  for (uint32_t h = hash_str(name) & m; g->hash[h] >= 0; h = (h + 1) & m)
    if (!strcmp(g->t[g->hash[h]].name, name)) return g->hash[h];
  return -1;
}

int ir_add_node(Graph *g, const char *name, const char *op) {
  if (g->nn == g->capn) {
    g->capn = g->capn ? 2 * g->capn : 256;
    g->n = pool_realloc(&g->pool, g->n, (size_t)g->capn * sizeof *g->n);
  }
  Node *n = &g->n[g->nn];
  memset(n, 0, sizeof *n);
  n->name = pool_strdup(&g->pool, name);
  n->op = pool_strdup(&g->pool, op);
  return g->nn++;
}

void ir_free(Graph *g) {
  if (g->proto && g->proto_free) g->proto_free(g->proto);
  free(g->hash);
  pool_free(&g->pool);
  memset(g, 0, sizeof *g);
}

int64_t ir_numel(const Tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= t->dims[i];
  return n;
}

int dtype_size(int dt) {
  switch (dt) {
  case DT_FLOAT: case DT_INT32: case DT_UINT32: return 4;
  case DT_INT64: case DT_DOUBLE: case DT_UINT64: return 8;
  case DT_UINT8: case DT_INT8: case DT_BOOL: return 1;
  case DT_UINT16: case DT_INT16: case DT_FLOAT16: return 2;
  default: return 0;
  }
}

const char *dtype_name(int dt) {
  switch (dt) {
  case DT_FLOAT: return "float32";
  case DT_UINT8: return "uint8";
  case DT_INT8: return "int8";
  case DT_UINT16: return "uint16";
  case DT_INT16: return "int16";
  case DT_INT32: return "int32";
  case DT_INT64: return "int64";
  case DT_STRING: return "string";
  case DT_BOOL: return "bool";
  case DT_FLOAT16: return "float16";
  case DT_DOUBLE: return "float64";
  case DT_UINT32: return "uint32";
  case DT_UINT64: return "uint64";
  default: return "undefined";
  }
}

int dtype_is_float(int dt) { return dt == DT_FLOAT || dt == DT_DOUBLE || dt == DT_FLOAT16; }

int64_t tensor_bytes(const Tensor *t) { return ir_numel(t) * dtype_size(t->dtype); }

const char *shape_str(const Tensor *t) {
  static char bufs[8][128];
  static int k;
  char *s = bufs[k++ & 7];
  if (t->rank < 0) return strcpy(s, "[?]");
  int len = snprintf(s, 128, "[");
  for (int i = 0; i < t->rank && len < 100; i++)
    len += snprintf(s + len, (size_t)(128 - len), "%s%lld", i ? "," : "", (long long)t->dims[i]);
  snprintf(s + len, (size_t)(128 - len), "]");
  return s;
}

const Attr *node_attr(const Node *n, const char *name) {
  for (int i = 0; i < n->nattrs; i++)
    if (!strcmp(n->attrs[i].name, name)) return &n->attrs[i];
  return NULL;
}

int64_t attr_int(const Node *n, const char *name, int64_t def) {
  const Attr *a = node_attr(n, name);
  return a && a->type == ATTR_INT ? a->i : def;
}

float attr_float(const Node *n, const char *name, float def) {
  const Attr *a = node_attr(n, name);
  return a && a->type == ATTR_FLOAT ? a->f : def;
}

const char *attr_str(const Node *n, const char *name, const char *def) {
  const Attr *a = node_attr(n, name);
  return a && a->type == ATTR_STRING ? a->s : def;
}

int attr_ints(const Node *n, const char *name, int64_t *out, int max) {
  const Attr *a = node_attr(n, name);
  if (!a || a->type != ATTR_INTS) return -1;
  int k = a->n < max ? a->n : max;
  for (int i = 0; i < k; i++) out[i] = a->ints[i];
  return a->n;
}

/* IEEE half to double, exactly (every half is a double): subnormals, infinities, NaN. */
static double half_to_double(uint16_t h) {
  int e = h >> 10 & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m | 0x400, e - 25);
  return h >> 15 ? -v : v;
}

/* The half nearest v, ties to even (numpy's astype(float16), ONNX's Cast): past 65520 infinity, below 2^-14 a
 * subnormal.  Each step is exact in double: v scaled by a power of two, and 2f - 1 for f in [0.5, 1). */
static uint16_t half_from_double(double v) {
  uint16_t sign = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  if (isnan(v)) return sign | 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;
  if (a < 0x1p-14) return sign | (uint16_t)nearbyint(a * 0x1p24); /* 1024 rounds up into the smallest normal: its bits */
  int e;
  double f = frexp(a, &e);
  /* The mantissa may round up to 1024, which carries into the exponent: the next binade's bits, as it should. */
  return sign | (uint16_t)(((uint32_t)(e + 14) << 10) + (uint32_t)nearbyint((2 * f - 1) * 1024));
}

double const_f64(const Tensor *t, int64_t i) {
  const void *d = t->data;
  switch (t->dtype) {
  case DT_FLOAT: return ((const float *)d)[i];
  case DT_DOUBLE: return ((const double *)d)[i];
  case DT_INT64: return (double)((const int64_t *)d)[i];
  case DT_INT32: return ((const int32_t *)d)[i];
  case DT_UINT32: return ((const uint32_t *)d)[i];
  case DT_UINT64: return (double)((const uint64_t *)d)[i];
  case DT_INT16: return ((const int16_t *)d)[i];
  case DT_UINT16: return ((const uint16_t *)d)[i];
  case DT_INT8: return ((const int8_t *)d)[i];
  case DT_UINT8: case DT_BOOL: return ((const uint8_t *)d)[i];
  case DT_FLOAT16: return half_to_double(((const uint16_t *)d)[i]);
  default: return 0;
  }
}

int64_t const_i64(const Tensor *t, int64_t i) {
  const void *d = t->data;
  switch (t->dtype) {
  case DT_INT64: return ((const int64_t *)d)[i];
  case DT_UINT64: return (int64_t)((const uint64_t *)d)[i];
  case DT_FLOAT: case DT_DOUBLE: case DT_FLOAT16: {
    double v = const_f64(t, i);
    if (v != v) return 0;
    if (v >= 9.2e18) return INT64_MAX;
    if (v <= -9.2e18) return INT64_MIN;
    return (int64_t)v;
  }
  default: return (int64_t)const_f64(t, i);
  }
}

void const_set_f64(Tensor *t, int64_t i, double v) {
  void *d = t->data;
  switch (t->dtype) {
  case DT_FLOAT: ((float *)d)[i] = (float)v; break;
  case DT_DOUBLE: ((double *)d)[i] = v; break;
  case DT_BOOL: ((uint8_t *)d)[i] = v != 0; break;
  case DT_FLOAT16: ((uint16_t *)d)[i] = half_from_double(v); break;
  default: const_set_i64(t, i, v != v ? 0 : v >= 9.2e18 ? INT64_MAX : v <= -9.2e18 ? INT64_MIN : (int64_t)v);
  }
}

void const_set_i64(Tensor *t, int64_t i, int64_t v) {
  void *d = t->data;
  switch (t->dtype) {
  case DT_INT64: ((int64_t *)d)[i] = v; break;
  case DT_UINT64: ((uint64_t *)d)[i] = (uint64_t)v; break;
  case DT_INT32: ((int32_t *)d)[i] = (int32_t)v; break;
  case DT_UINT32: ((uint32_t *)d)[i] = (uint32_t)v; break;
  case DT_INT16: ((int16_t *)d)[i] = (int16_t)v; break;
  case DT_UINT16: ((uint16_t *)d)[i] = (uint16_t)v; break;
  case DT_INT8: ((int8_t *)d)[i] = (int8_t)v; break;
  case DT_UINT8: ((uint8_t *)d)[i] = (uint8_t)v; break;
  case DT_BOOL: ((uint8_t *)d)[i] = v != 0; break;
  case DT_FLOAT: ((float *)d)[i] = (float)v; break;
  case DT_DOUBLE: ((double *)d)[i] = (double)v; break;
  case DT_FLOAT16: ((uint16_t *)d)[i] = half_from_double((double)v); break;
  default: break;
  }
}

int64_t const_first_nonfinite(const Tensor *t) {
  if (!t->data || !dtype_is_float(t->dtype)) return -1;
  const float *f = t->dtype == DT_FLOAT ? t->data : NULL; /* every weight: the common case, without the switch */
  for (int64_t i = 0, n = ir_numel(t); i < n; i++)
    if (f ? !isfinite(f[i]) : !isfinite(const_f64(t, i))) return i;
  return -1;
}

Tensor *node_in(Graph *g, const Node *n, int k) {
  return k < n->nin && n->in[k] >= 0 ? &g->t[n->in[k]] : NULL;
}

Tensor *node_out(Graph *g, const Node *n, int k) {
  return k < n->nout && n->out[k] >= 0 ? &g->t[n->out[k]] : NULL;
}
