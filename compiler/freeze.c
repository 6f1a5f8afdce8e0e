/* freeze.c - frozen layers (FreezePipe): `pipecc --frozen FILE`.
 *
 * A parameterised layer is a compute node that reads a trained weight; the
 * layers are taken in topological order.  Freezing the first N turns their
 * weights into constants of the stage programs: they never change again,
 * need no gradient and no optimizer state.  Their forward is unchanged (a
 * frozen BatchNorm still normalises with the batch's statistics and moves
 * its running statistics, as PyTorch does with requires_grad=False in train
 * mode).  Gradients then stop where nothing before needs one: a node whose
 * outputs need no gradient gets no backward and keeps no stash.  The costs
 * follow: such a node's backward costs nothing, and a weighted node with a
 * frozen weight pays only its input-gradient half.
 *
 * FILE is untrusted text:
 *     pipecc-frozen 1
 *     layers N
 * (blank lines and # comments allowed).  The run writes it at a freeze event
 * (run.sh --freeze-at, --freeze auto); N counts the layers of the model as
 * loaded, so the same FILE means the same layers in the re-planned model. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "freeze.h"

#include "planq.h"

/* The layers in order: compute nodes reading a trained weight. */
int freeze_layers(const Plan *p, int *layers) {
  const Graph *g = &p->g;
  int n = 0;
  for (int k = 0; k < p->N; k++) {
    const Node *nd = &g->n[p->node[k]];
    int reads = 0;
    for (int q = 0; q < nd->nin; q++) reads |= nd->in[q] >= 0 && g->t[nd->in[q]].is_param;
    if (reads) layers[n++] = k;
  }
  return n;
}

static int parse(const char *path, int *count) {
  /* A regular file only: fopen of a FIFO (as FILE, or as a freeze checkpoint's frozen.txt that run.sh
   * re-plans with) waited for a writer with no time limit.  O_NONBLOCK keeps open() from waiting. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return err_set("--frozen %s: cannot read it: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    close(fd);
    return err_set("--frozen %s: not a regular file (a FIFO, socket, device or directory)", path);
  }
  FILE *f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    return err_set("--frozen %s: cannot read it: %s", path, strerror(errno));
  }
  char line[256];
  int lineno = 0, have_head = 0, have_n = 0, rc = 0, c, col = 0;
  /* Text only: a NUL or a control byte anywhere is refused with its line. */
  for (int ln = 1; (c = fgetc(f)) != EOF && !rc; col++) {
    if (c == '\n') ln++, col = -1;
    else if (c == 0 || (c < 0x20 && c != '\t' && c != '\r') || c == 0x7f)
      rc = err_set("--frozen %s:%d: byte 0x%02x is not text (a pipecc-frozen file is 'pipecc-frozen 1' then 'layers N')", path, ln, c);
  }
  rewind(f);
  while (!rc && fgets(line, sizeof line, f)) {
    lineno++;
    size_t len = strlen(line);
    if (len == sizeof line - 1 && line[len - 1] != '\n') rc = err_set("--frozen %s:%d: line too long", path, lineno);
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
    char *s = line + strspn(line, " \t");
    if (rc || !*s || *s == '#') continue;
    long long v;
    char extra;
    if (!have_head) {
      if (strcmp(s, "pipecc-frozen 1")) rc = err_set("--frozen %s:%d: expected the header 'pipecc-frozen 1'", path, lineno);
      have_head = 1;
    } else if (sscanf(s, "layers %lld %c", &v, &extra) == 1 && !have_n) {
      if (v < 0 || v > 1 << 24) rc = err_set("--frozen %s:%d: layers %lld is out of range", path, lineno, v);
      *count = (int)v, have_n = 1;
    } else {
      rc = err_set("--frozen %s:%d: expected 'layers N' once", path, lineno);
    }
  }
  if (!rc && ferror(f)) rc = err_set("--frozen %s: read error", path);
  fclose(f);
  if (!rc && !have_n) rc = err_set("--frozen %s: no 'layers N' line", path);
  return rc;
}

int freeze_apply(Plan *p) {
  Graph *g = &p->g;
  int n = 0;
  /* The layers as loaded (before any freezing), for the listing and the run's layer numbers. */
  int *layers = pool_alloc(&g->pool, sizeof(int) * (size_t)(p->N + 1));
  int total = freeze_layers(p, layers);
  for (int i = 0; i < total; i++) layers[i] = p->node[layers[i]]; /* graph node ids: the DAG planner may reorder positions */
  p->frozen_layers = layers, p->nlayers = total;
  if (!p->opt.frozen) return 0;
  if (parse(p->opt.frozen, &n)) return -1;
  if (n > total)
    return err_set("--frozen %s: %d layers to freeze, but %s has %d parameterised layers (nodes reading a trained weight)",
                   p->opt.frozen, n, g->path, total);
  p->nfrozen = n;
  /* Their weights become constants (a weight a later layer also reads is frozen with them, as in PyTorch). */
  for (int i = 0; i < n; i++) {
    const Node *nd = &g->n[layers[i]];
    for (int q = 0; q < nd->nin; q++) {
      Tensor *w = nd->in[q] >= 0 ? &g->t[nd->in[q]] : NULL;
      if (w && w->is_param) w->is_param = 0, w->kept_const = KEPT_FROZEN, p->frozen_params++;
    }
  }
  /* Every trained weight frozen: nothing to train.  The run's freeze event never asks for that. */
  int left = 0;
  for (int t = 0; t < g->nt; t++) left |= g->t[t].is_param;
  if (!left) return err_set("--frozen %s: freezing %d layers leaves no trained weight in %s", p->opt.frozen, n, g->path);
  return 0;
}

/* Seconds or FLOPs of node k's backward halves, as frozen weights leave
 * them: none where no output needs a gradient; a weighted node drops its
 * weight-gradient half when its weights are frozen, and its input-gradient
 * half when its input needs no gradient. */
void freeze_costs(Plan *p, double *bwd_flops, double *bwdi, double *bwdw) {
  const Graph *g = &p->g;
  const char *need = plan_needs(p);
  for (int k = 0; k < p->N; k++) {
    const Node *nd = &g->n[p->node[k]];
    int out = 0, in = 0, w = 0, weighted = 0;
    for (int q = 0; q < nd->nout; q++) out |= nd->out[q] >= 0 && need[nd->out[q]];
    for (int q = 0; q < nd->nin; q++) {
      int t = nd->in[q];
      if (t < 0) continue;
      const Tensor *x = &g->t[t];
      if (x->is_initializer && x->dtype == DT_FLOAT && ir_numel(x) > 1) weighted = 1, w |= need[t];
      else in |= need[t];
    }
    if (!out) { /* no backward at all */
      bwd_flops[k] = 0;
      if (bwdi) bwdi[k] = bwdw[k] = 0;
      continue;
    }
    if (!weighted) continue;
    if (!w) {
      bwd_flops[k] *= 0.5;
      if (bwdw) bwdw[k] = 0;
    }
    if (!in) {
      bwd_flops[k] *= w ? 0.5 : 1;
      if (bwdi) bwdi[k] = 0;
    }
  }
}

/* The layer (from 0, in the loaded order, frozen ones counted) of weight tensor t: its first reader's. */
int freeze_layer_of(const Plan *p, int t) {
  const Graph *g = &p->g;
  for (int i = 0; i < p->nlayers; i++) {
    const Node *nd = &g->n[p->frozen_layers[i]];
    for (int q = 0; q < nd->nin; q++)
      if (nd->in[q] == t) return i;
  }
  return -1;
}
