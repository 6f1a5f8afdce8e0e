/* stageprog.c - calls as data: checking a call against its kernel's
 * signature and deriving which buffers it reads and writes.
 *
 * The rules that build calls (compiler/ops/) say only which kernel and which
 * arguments; everything a later pass needs - lifetimes for the memory plan,
 * what backward keeps, which phase touches what - is derived here from
 * kernels.def, so no access can be forgotten or dropped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stageprog.h"

const KernelSig KERNELS[K_NKERNELS] = {
#define KERNEL(id, name, sig) [id] = {name, sig},
#include "kernels.def"
#undef KERNEL
};

/* A call that does not match its signature is a bug in an operator rule,
 * not bad input: stop loudly. */
static void bad_call(int kernel, const char *why, int arg) {
  fprintf(stderr, "pipecc: internal error: call of %s: %s (argument %d)\n", KERNELS[kernel].name, why, arg);
  abort();
}

static void add_unique(int *list, int *n, int id) {
  for (int i = 0; i < *n; i++)
    if (list[i] == id) return;
  list[(*n)++] = id;
}

static int is_buffer_code(char c) { return strchr("rRwWaAuMU", c) != NULL; }

/* Fills k with a call checked against its kernel's signature, deriving its accesses. */
static void call_fill(StageProg *sp, Pool *pool, Call *k, int phase, int kernel, int node, const char *comment, const Arg *args,
                      int nargs) {
  const char *sig = KERNELS[kernel].sig;
  if ((int)strlen(sig) != nargs) bad_call(kernel, "wrong number of arguments", nargs);
  memset(k, 0, sizeof *k);
  k->kernel = kernel, k->phase = phase, k->node = node, k->comment = comment, k->nargs = nargs;
  k->args = pool_alloc(pool, sizeof(Arg) * (size_t)(nargs ? nargs : 1));
  k->reads = pool_alloc(pool, sizeof(int) * (size_t)(nargs ? nargs : 1)); /* at most one access per argument */
  k->writes = pool_alloc(pool, sizeof(int) * (size_t)(nargs ? nargs : 1));
  for (int a = 0; a < nargs; a++) {
    Arg x = args[a];
    char code = sig[a];
    if (is_buffer_code(code)) {
      if (x.kind != ARG_BUF) bad_call(kernel, "expected a buffer", a);
      if (x.buf < 0) {
        if (code != 'R' && code != 'W' && code != 'A' && code != 'M') bad_call(kernel, "a required buffer is missing", a);
        x.kind = ARG_NULL;
      } else if (x.buf >= sp->nbufs) {
        bad_call(kernel, "no such buffer", a);
      } else {
        if (strchr("rRaAu", code)) add_unique(k->reads, &k->nreads, x.buf);
        if (strchr("wWaAMU", code)) add_unique(k->writes, &k->nwrites, x.buf);
      }
    } else if ((code == 'i' && x.kind != ARG_INT) || (code == 'f' && x.kind != ARG_FLOAT) ||
               (code == 'c' && (x.kind != ARG_CONST || x.i < 0 || x.i >= sp->nshapes)) || ((code == 's' || code == 'L') && x.kind != ARG_SYM) ||
               (code == 'n' && (x.kind != ARG_STR || !x.sym))) {
      bad_call(kernel, "argument of the wrong kind", a);
    }
    k->args[a] = x;
  }
}

Call *call_add(StageProg *sp, Pool *pool, int phase, int kernel, int node, const char *comment, const Arg *args, int nargs) {
  int step = phase >= PH_ZERO;
  Call **list = step ? &sp->step : phase == PH_FWD ? &sp->fwd : &sp->bwd;
  int *n = step ? &sp->nstep : phase == PH_FWD ? &sp->nfwd : &sp->nbwd;
  int *cap = step ? &sp->capstep : phase == PH_FWD ? &sp->capfwd : &sp->capbwd;
  if (*n == *cap) {
    *cap = *cap ? 2 * *cap : 64;
    *list = pool_realloc(pool, *list, sizeof(Call) * (size_t)*cap);
  }
  Call *k = &(*list)[(*n)++];
  call_fill(sp, pool, k, phase, kernel, node, comment, args, nargs);
  return k;
}

Call *call_new(StageProg *sp, Pool *pool, int phase, int kernel, int node, const char *comment, const Arg *args, int nargs) {
  Call *k = pool_alloc(pool, sizeof *k);
  call_fill(sp, pool, k, phase, kernel, node, comment, args, nargs);
  return k;
}

/* The memory plan lays buffers out by the call's accesses, so a variant may touch only what the call does. */
void call_variant(StageProg *sp, Pool *pool, Call *of, int which, int kernel, const Arg *args, int nargs) {
  Call *v = pool_alloc(pool, sizeof *v);
  call_fill(sp, pool, v, of->phase, kernel, of->node, of->comment, args, nargs);
  for (int i = 0; i < v->nreads; i++) {
    int found = 0;
    for (int j = 0; j < of->nreads && !found; j++) found = of->reads[j] == v->reads[i];
    for (int j = 0; j < of->nwrites && !found; j++) found = of->writes[j] == v->reads[i];
    if (!found) bad_call(kernel, "a variant reads a buffer its call does not", i);
  }
  for (int i = 0; i < v->nwrites; i++) {
    int found = 0;
    for (int j = 0; j < of->nwrites && !found; j++) found = of->writes[j] == v->writes[i];
    if (!found) bad_call(kernel, "a variant writes a buffer its call does not", i);
  }
  if (which == VAR_EVAL) of->eval = v;
  else of->recompute = v;
}

int shape_add(StageProg *sp, Pool *pool, const char *type, const char *name, const Arg *fields, int nfields) {
  if (sp->nshapes == sp->capshapes) {
    sp->capshapes = sp->capshapes ? 2 * sp->capshapes : 32;
    sp->shapes = pool_realloc(pool, sp->shapes, sizeof(ShapeConst) * (size_t)sp->capshapes);
  }
  ShapeConst *c = &sp->shapes[sp->nshapes];
  c->type = type, c->name = pool_strdup(pool, name), c->nfields = nfields;
  c->fields = pool_alloc(pool, sizeof(Arg) * (size_t)(nfields ? nfields : 1));
  for (int i = 0; i < nfields; i++) {
    c->fields[i] = fields[i];
    if (fields[i].kind == ARG_INTS) { /* own a copy: callers pass arrays on their stack */
      int64_t *v = pool_alloc(pool, sizeof(int64_t) * (size_t)(fields[i].i ? fields[i].i : 1));
      memcpy(v, fields[i].ints, sizeof(int64_t) * (size_t)fields[i].i);
      c->fields[i].ints = v;
    }
  }
  return sp->nshapes++;
}

int shape_find(const StageProg *sp, const char *name) {
  for (int i = 0; i < sp->nshapes; i++)
    if (!strcmp(sp->shapes[i].name, name)) return i;
  return -1;
}

int buf_add(StageProg *sp, Pool *pool, const char *name, int kind, int64_t bytes) {
  if (sp->nbufs == sp->capbufs) {
    sp->capbufs = sp->capbufs ? 2 * sp->capbufs : 64;
    sp->bufs = pool_realloc(pool, sp->bufs, sizeof(Buffer) * (size_t)sp->capbufs);
  }
  Buffer *b = &sp->bufs[sp->nbufs];
  memset(b, 0, sizeof *b);
  b->name = name, b->tensor = -1, b->kind = kind, b->bytes = bytes, b->dtype = DT_FLOAT;
  b->first = b->last = -1, b->offset = -1;
  return sp->nbufs++;
}
