/* profile.c - reads a node-time profile (profile.h) for the cost model. */
#include "profile.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "plan.h"

void profile_key(const Graph *g, int node, char *out, size_t len) {
  const Node *n = &g->n[node];
  int k = 0;
  for (int j = 0; j < node; j++) k += !g->n[j].folded;
  int w = snprintf(out, len, "%d %s ", k, n->op ? n->op : "?");
  if (w < 0 || (size_t)w >= len) return;
  const char *name = n->name && *n->name ? n->name : "(unnamed)";
  size_t i = (size_t)w;
  for (const unsigned char *c = (const unsigned char *)name; *c && i + 1 < len; c++) out[i++] = *c >= 0x20 && *c < 0x7f ? (char)*c : '?';
  out[i] = 0;
}

/* A finite, non-negative number filling the whole token. */
static int number(const char *s, double *x) {
  char *end;
  errno = 0;
  *x = strtod(s, &end);
  return end == s || *end || errno || !isfinite(*x) || *x < 0 ? -1 : 0;
}

/* The next space-separated token of *p (NULL at the end of the line). */
static char *token(char **p) {
  while (**p == ' ') (*p)++;
  if (!**p) return NULL;
  char *t = *p;
  while (**p && **p != ' ') (*p)++;
  if (**p) *(*p)++ = 0;
  return t;
}

enum { MAX_PROFILE = 64 << 20, MAX_LINE = 8192 };

static int parse(Costs *c, const char *path, char *text, const Plan *p, char *seen) {
  const Graph *g = &p->g;
  double upd_s = 0, upd_params = 0, jit_sum = 0;
  int jit_n = 0;
  int lineno = 0, header = 0, have_mb = 0;
  for (char *line = text, *nl; line; line = nl) {
    nl = strchr(line, '\n');
    if (nl) *nl++ = 0;
    size_t len = strlen(line);
    if (len && line[len - 1] == '\r') line[len - 1] = 0; /* a file that went through Windows */
    lineno++;
    if (strlen(line) > MAX_LINE) return err_set("--costs %s:%d: line longer than %d bytes", path, lineno, MAX_LINE);
    char *q = line, *what = token(&q);
    if (!what || what[0] == '#') continue;
    if (!header) {
      char *v = token(&q);
      if (strcmp(what, "pipecc-profile") || !v) return err_set("--costs %s:%d: not a pipecc profile (run.sh --profile FILE writes one)", path, lineno);
      if (strcmp(v, "1")) return err_set("--costs %s:%d: profile format %s; this pipecc reads format 1", path, lineno, v);
      header = 1;
      continue;
    }
    double x[3];
    if (!strcmp(what, "mb") || !strcmp(what, "rate") || !strcmp(what, "load") || !strcmp(what, "loss")) {
      char *v = token(&q);
      if (!v || number(v, &x[0]) || token(&q)) return err_set("--costs %s:%d: '%s' takes one non-negative number", path, lineno, what);
      if (what[0] == 'm') {
        if (x[0] < 1 || x[0] != floor(x[0]) || x[0] > 1e12) return err_set("--costs %s:%d: bad micro-batch size", path, lineno);
        c->profile_mb = (int64_t)x[0], have_mb = 1;
      } else if (what[0] == 'r') {
        if (x[0] <= 0) return err_set("--costs %s:%d: the rate must be positive", path, lineno);
        c->rate = x[0];
      } else if (!strcmp(what, "load")) {
        c->load += x[0];
      } else {
        c->loss += x[0];
      }
    } else if (!strcmp(what, "threads")) {
      char *v = token(&q);
      if (!v || number(v, &x[0]) || x[0] < 1 || x[0] > 256 || x[0] != floor(x[0]) || token(&q))
        return err_set("--costs %s:%d: 'threads' takes a whole number from 1 to 256", path, lineno);
      c->threads = (int)x[0];
    } else if (!strcmp(what, "jitter")) {
      char *v = token(&q);
      if (!v || number(v, &x[0]) || x[0] > 10 || token(&q)) return err_set("--costs %s:%d: 'jitter' takes one number from 0 to 10", path, lineno);
      jit_sum += x[0], jit_n++;
    } else if (!strcmp(what, "conv")) {
      char *v = token(&q);
      int impl = !v ? 0 : !strcmp(v, "im2col") ? 1 : !strcmp(v, "onednn") ? 2 : 0;
      if (!impl || token(&q)) return err_set("--costs %s:%d: 'conv' takes im2col or onednn", path, lineno);
      if (c->conv && c->conv != impl) return err_set("--costs %s:%d: the ranks' 'conv' lines disagree", path, lineno);
      c->conv = impl;
    } else if (!strcmp(what, "update")) {
      char *a = token(&q), *b = token(&q);
      if (!a || !b || number(a, &x[0]) || number(b, &x[1]) || token(&q))
        return err_set("--costs %s:%d: 'update' takes a parameter count and seconds", path, lineno);
      upd_params += x[0], upd_s += x[1];
    } else if (!strcmp(what, "node")) {
      char *ks = token(&q), *op = token(&q), *t[3];
      for (int i = 0; i < 3; i++) t[i] = token(&q);
      char *name = q;
      double kd;
      if (!ks || !op || !t[2] || !*name || number(ks, &kd) || kd != floor(kd) || number(t[0], &x[0]) || number(t[1], &x[1]) ||
          number(t[2], &x[2]))
        return err_set("--costs %s:%d: expected 'node K OP FORWARD BACKWARD_INPUT BACKWARD_WEIGHT NAME'", path, lineno);
      if (kd >= p->N)
        return err_set("--costs %s:%d: node %.0f, but %s has %d compute nodes: a profile of another model", path, lineno, kd, g->path, p->N);
      int k = (int)kd;
      char key[PROFILE_KEY_MAX], mine[PROFILE_KEY_MAX];
      snprintf(key, sizeof key, "%d %s %s", k, op, name);
      profile_key(g, p->node[k], mine, sizeof mine);
      if (strcmp(key, mine))
        return err_set("--costs %s:%d: node %d is '%s' there but '%s' in %s: a profile of another model (or of another version of it)",
                       path, lineno, k, key, mine, g->path);
      if (seen[k]) return err_set("--costs %s:%d: node %d appears twice", path, lineno, k);
      seen[k] = 1;
      c->fwd[k] = x[0], c->bwd_input[k] = x[1], c->bwd_weight[k] = x[2];
    } else {
      return err_set("--costs %s:%d: unknown entry '%s' (expected node, mb, rate, threads, load, loss, update, conv or jitter)", path, lineno, what);
    }
  }
  if (!header) return err_set("--costs %s: not a pipecc profile (it is empty)", path);
  if (!have_mb || c->rate <= 0) return err_set("--costs %s: the 'mb' or 'rate' line is missing", path);
  for (int k = 0; k < p->N; k++)
    if (!seen[k]) {
      char mine[PROFILE_KEY_MAX];
      profile_key(g, p->node[k], mine, sizeof mine);
      return err_set("--costs %s: no time for node '%s' (a profile of part of the model?)", path, mine);
    }
  c->update_per_param = upd_params > 0 ? upd_s / upd_params : 0;
  c->jitter = jit_n ? jit_sum / jit_n : 0;
  /* A profile taken at another micro-batch size: per-sample work scales linearly. */
  double scale = (double)p->mb_size / (double)c->profile_mb;
  for (int k = 0; k < p->N; k++) c->fwd[k] *= scale, c->bwd_input[k] *= scale, c->bwd_weight[k] *= scale;
  c->load *= scale, c->loss *= scale;
  return 0;
}

int costs_load(Costs *c, const char *path, const Plan *p, Pool *pool) {
  memset(c, 0, sizeof *c);
  c->path = path;
  struct stat st;
  if (stat(path, &st)) return err_set("--costs %s: cannot read: %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode)) return err_set("--costs %s: not a regular file", path);
  if (st.st_size > MAX_PROFILE) return err_set("--costs %s: %lld bytes; a profile is at most %d", path, (long long)st.st_size, MAX_PROFILE);
  FILE *f = fopen(path, "rb");
  if (!f) return err_set("--costs %s: cannot read: %s", path, strerror(errno));
  char *text = malloc((size_t)st.st_size + 1);
  char *seen = calloc((size_t)p->N + 1, 1);
  if (!text || !seen) abort();
  size_t got = fread(text, 1, (size_t)st.st_size, f);
  fclose(f);
  text[got] = 0;
  int rc = 0;
  if (memchr(text, 0, got)) rc = err_set("--costs %s: a NUL byte: not a text profile", path);
  c->fwd = pool_alloc(pool, sizeof(double) * (size_t)(p->N + 1));
  c->bwd_input = pool_alloc(pool, sizeof(double) * (size_t)(p->N + 1));
  c->bwd_weight = pool_alloc(pool, sizeof(double) * (size_t)(p->N + 1));
  if (!rc) rc = parse(c, path, text, p, seen);
  free(text), free(seen);
  return rc;
}
