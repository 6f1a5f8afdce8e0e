/* edges.c - the values between compute nodes: who makes each, who reads it,
 * and the spans a stage may skip (the partitioner's pricing of direct sends). */
#include "edges.h"

/* Per edge, the positions of its readers, ascending; and the gaps between
 * its producer (node 0 for the loader's) and readers (the loss at N-1)
 * that a stage may fall into and skip. */
static void collect_readers(Plan *p, const int *pos) {
  Graph *g = &p->g;
  Pool *pool = &g->pool;
  int *edge_of = pool_alloc(pool, sizeof(int) * (size_t)g->nt);
  for (int t = 0; t < g->nt; t++) edge_of[t] = -1;
  for (int q = 0; q < p->nedges; q++) edge_of[p->edge_tensor[q]] = q;
  p->ereaders = pool_alloc(pool, sizeof(int *) * (size_t)(p->nedges + 1));
  p->nereaders = pool_alloc(pool, sizeof(int) * (size_t)(p->nedges + 1));
  for (int q = 0; q < p->nedges; q++) p->ereaders[q] = pool_alloc(pool, sizeof(int) * (size_t)(p->nreaders[p->edge_tensor[q]] + 1));
  for (int k = 0; k < p->N; k++) {
    const Node *n = &g->n[p->node[k]];
    for (int r = 0; r < n->nin; r++) {
      int q = n->in[r] >= 0 ? edge_of[n->in[r]] : -1;
      if (q < 0 || (p->nereaders[q] && p->ereaders[q][p->nereaders[q] - 1] == k)) continue;
      p->ereaders[q][p->nereaders[q]++] = k;
    }
  }
  (void)pos;
  p->gaps = pool_alloc(pool, sizeof(PartGap) * (size_t)(p->nedges * 2 + g->nn + 1));
  p->ngaps = 0;
  for (int q = 0; q < p->nedges; q++) {
    const PartEdge *e = &p->edges[q];
    int prev = e->from >= 0 ? e->from : 0;
    for (int r = 0; r <= p->nereaders[q]; r++) {
      int at = r < p->nereaders[q] ? p->ereaders[q][r] : e->to >= p->N ? p->N - 1 : -1;
      if (at < 0) break;
      if (at - prev >= 2) p->gaps[p->ngaps++] = (PartGap){prev, at, e->bytes, e->grad_bytes};
      if (at > prev) prev = at;
    }
  }
}

/* Values that flow between compute nodes (or from the loader, or to the loss). */
void plan_edges(Plan *p) {
  Graph *g = &p->g;
  int *pos = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nn);
  for (int j = 0; j < g->nn; j++) pos[j] = -1;
  for (int k = 0; k < p->N; k++) pos[p->node[k]] = k;
  int *from = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nt), *to = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nt);
  for (int i = 0; i < g->nt; i++) {
    Tensor *t = &g->t[i];
    from[i] = t->producer >= 0 ? pos[t->producer] : -1;
    to[i] = t->is_output ? p->N : -2;
  }
  for (int k = 0; k < p->N; k++) {
    Node *n = &g->n[p->node[k]];
    for (int q = 0; q < n->nin; q++)
      if (n->in[q] >= 0 && to[n->in[q]] < k && to[n->in[q]] != p->N) to[n->in[q]] = k;
  }
  p->first_read = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nt);
  p->last_read = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nt);
  p->nreaders = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nt);
  for (int i = 0; i < g->nt; i++) p->first_read[i] = p->last_read[i] = -1;
  for (int k = p->N - 1; k >= 0; k--) {
    Node *n = &g->n[p->node[k]];
    for (int q = 0; q < n->nin; q++)
      if (n->in[q] >= 0) {
        if (p->first_read[n->in[q]] != k) p->nreaders[n->in[q]]++; /* a node reading it twice counts once */
        p->first_read[n->in[q]] = k;
        if (p->last_read[n->in[q]] < 0) p->last_read[n->in[q]] = k;
      }
  }
  p->edges = pool_alloc(&g->pool, sizeof(PartEdge) * (size_t)g->nt);
  p->edge_tensor = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nt);
  p->nedges = 0;
  for (int i = 0; i < g->nt; i++) {
    Tensor *t = &g->t[i];
    if (t->data || to[i] < 0 || (t->producer >= 0 && from[i] < 0 && !t->is_input)) continue;
    PartEdge *e = &p->edges[p->nedges];
    e->from = from[i];
    e->to = to[i];
    e->bytes = (double)tensor_bytes(t);
    e->grad_bytes = dtype_is_float(t->dtype) && !t->is_input ? e->bytes : 0;
    p->edge_tensor[p->nedges++] = i;
  }
  collect_readers(p, pos);
}

