/* untie.c - --untie: give each use of a merged weight its own copy.
 *
 * torch.onnx in eval mode with constant folding merges initializers whose
 * values are equal: every LayerNorm's weight (all ones) becomes one
 * initializer, read through Identity nodes by all of them.  Trained as the
 * file says, that is one tied weight, which the model never had.  Where
 * nodes of one kind share a weight (the mark of such merging: planq.c's
 * plan_tie_readers), --untie keeps the first reader on it and gives every
 * later reader a copy of its own, named "<name>.untied<k>".  The generated
 * model.onnx carries the copies (onnx_pack_untied), so --save writes each
 * trained copy back. */
#include <stdio.h>
#include <string.h>

#include "untie.h"

#include "ops.h"

/* Distinct compute nodes reading tensor t, in graph order, into js. */
static int readers(const Graph *g, int t, int *js) {
  int n = 0;
  for (int j = 0; j < g->nn; j++) {
    if (g->n[j].folded) continue;
    for (int q = 0; q < g->n[j].nin; q++)
      if (g->n[j].in[q] == t) {
        js[n++] = j;
        break;
      }
  }
  return n;
}

static int same_kind(const Graph *g, const int *js, int n) {
  for (int a = 0; a < n; a++)
    for (int b = a + 1; b < n; b++)
      if (g->n[js[a]].def == g->n[js[b]].def && !(g->n[js[a]].def->flags & OPF_READS_PART)) return 1; /* slices: not a merge */
  return 0;
}

/* A new tensor holding the same initial value as t, under a free name. */
static int copy_of(Graph *g, int t, int k) {
  char name[4200];
  for (int v = 0;; v++) {
    snprintf(name, sizeof name, v ? "%s.untied%d_%d" : "%s.untied%d", g->t[t].name, k, v);
    if (ir_find_tensor(g, name) < 0) break;
  }
  int c = ir_add_tensor(g, name);
  const char *keep = g->t[c].name;
  g->t[c] = g->t[t]; /* g->t may have moved: index, never a pointer held across ir_add_tensor */
  g->t[c].name = keep;
  g->t[c].nuses = 0;
  return c;
}

int untie_merged(Graph *g) {
  int *js = pool_alloc(&g->pool, sizeof(int) * (size_t)(g->nn + 1));
  int nt = g->nt;
  for (int t = 0; t < nt; t++) {
    if (!g->t[t].is_param) continue;
    int n = readers(g, t, js);
    if (n < 2 || !same_kind(g, js, n)) continue;
    for (int r = 1; r < n; r++) {
      int c = copy_of(g, t, r);
      Node *nd = &g->n[js[r]];
      for (int q = 0; q < nd->nin; q++)
        if (nd->in[q] == t) nd->in[q] = c, g->t[t].nuses--, g->t[c].nuses++;
      if (g->nuntied == g->capuntied) {
        g->capuntied = g->capuntied ? 2 * g->capuntied : 16;
        g->untied = pool_realloc(&g->pool, g->untied, sizeof *g->untied * (size_t)g->capuntied);
      }
      g->untied[g->nuntied++] = (struct Untied){t, c, js[r]};
    }
  }
  return 0;
}
