/* price.c - pricing candidate stages by their arena: each candidate's
 * program is built and laid out as the emitted one will be, and the price
 * kept by (first node, end, ring sizes of both zb1 layouts). */
#include "price.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "memplan.h"
#include "planq.h"
#include "stash.h"

/* Exact prices already computed, by (first node, end, ring sizes): open
 * addressing, doubled when half full. */
typedef struct PriceKey {
  int i, j;
  RingSizes r;
} PriceKey;
struct PriceMemo {
  PriceKey *key;
  double *val;
  size_t cap, n;
};

static size_t price_hash(PriceKey k, size_t cap) {
  uint64_t h = (uint64_t)k.i * 0x9E3779B97F4A7C15ull ^ (uint64_t)k.j * 0xC2B2AE3D27D4EB4Full ^
               (uint64_t)k.r.slots * 0x165667B19E3779F9ull ^ (uint64_t)k.r.gslots * 0x27D4EB2F165667C5ull ^
               (uint64_t)k.r.wslots * 0x85EBCA77C2B2AE63ull ^ (uint64_t)k.r.hslots * 0x9E3779B185EBCA87ull;
  return (size_t)(h ^ h >> 29) & (cap - 1);
}

static double *memo_slot(struct PriceMemo *m, PriceKey k, int *found) {
  if (2 * (m->n + 1) > m->cap) { /* grow */
    struct PriceMemo g = {calloc(m->cap ? 2 * m->cap : 1024, sizeof(PriceKey)), NULL, m->cap ? 2 * m->cap : 1024, 0};
    g.val = malloc(sizeof(double) * g.cap);
    if (!g.key || !g.val) abort();
    for (size_t a = 0; a < m->cap; a++)
      if (m->key[a].j) {
        int f;
        *memo_slot(&g, m->key[a], &f) = m->val[a];
      }
    free(m->key), free(m->val);
    *m = g;
  }
  size_t a = price_hash(k, m->cap);
  while (m->key[a].j && memcmp(&m->key[a], &k, sizeof k)) a = (a + 1) & (m->cap - 1);
  *found = m->key[a].j != 0; /* j >= 1 for every stage, so j = 0 marks an empty entry */
  if (!*found) m->key[a] = k, m->n++;
  return &m->val[a];
}

struct PriceMemo *price_memo_new(void) {
  struct PriceMemo *m = calloc(1, sizeof *m);
  if (!m) abort();
  return m;
}

void price_memo_free(struct PriceMemo *m) {
  if (m) free(m->key), free(m->val), free(m);
}

double plan_price_role(Plan *p, int role, int i, int j) {
  if (!p->memo) {
    p->memo = price_memo_new();
  }
  PriceKey k = {i, j, {-100 - role, 0, 0, 0}};
  int found;
  double *v = memo_slot(p->memo, k, &found);
  if (found) return *v;
  Pool tmp = {0};
  StageProg sp;
  if (stage_build(p, &sp, 0, i, j, 0, &tmp)) {
    err_clear();
    *v = INFINITY;
  } else {
    int two = p->opt.microbatches < 2 ? p->opt.microbatches : 2;
    memplan_as(p, &sp, (RingSizes){two, two, role == ROLE_FWD ? 1 : 2, 0}, role);
    *v = (double)sp.arena_bytes + plan_lib_bytes(p, i, j);
  }
  pool_free(&tmp);
  return *v;
}

double price_stage(void *ctx, int s, int i, int j) {
  Plan *p = ctx;
  PriceKey k = {i, j, sched_rings(&p->slots, s)};
  if (p->floor_pricing) k.r.slots = -1 - s; /* a floor price is per stage */
  int found;
  double *v = memo_slot(p->memo, k, &found);
  if (found) return *v;
  if (p->floor_pricing) return *v = stash_floor(p, s, i, j) + plan_lib_bytes(p, i, j);
  Pool tmp = {0};
  StageProg sp;
  if (stage_build(p, &sp, s, i, j, 0, &tmp)) {
    err_clear();
    *v = INFINITY;
  } else {
    memplan(p, &sp, k.r);
    *v = (double)sp.arena_bytes + plan_lib_bytes(p, i, j);
  }
  pool_free(&tmp);
  return *v;
}
