/* test_dagpart.c - the downset DP (dagpart.c) against brute force, and the
 * compiler's two partitioners on the sample models.
 *
 * (a) Random DAGs of 6-9 nodes (values read by several later nodes, kept
 * orders, heterogeneous ranks and links, memory limits that sometimes cannot
 * be met), 2-4 stages: the DP's optimum equals the best of every assignment
 * of nodes to stages that is monotone along edges (exactly the chains of
 * downsets), each stage evaluated straight from the node and value lists.
 * The order it returns must be topological, keep the kept orders, and its
 * ranges must reach that optimum.  On chains it equals partition_solve.
 * (b) Every sample model at n = 2, 4, 8: --partition dag's slowest stage and
 * predicted step are never worse than --partition chain's, and the new
 * planner (dag, direct sends) never worse than today's (chain, relays).
 * (c) The new planner is strictly better on the branchy graphs: the
 * Inception-style model at n = 4, the DenseNet-style one at n = 8. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dagpart.h"
#include "driver.h"

#include "check.h"

static unsigned rng = 4242;
static double rnd(void) {
  rng = rng * 1103515245u + 12345u;
  return (double)((rng >> 8) & 0xffff) / 65536.0;
}

enum { MAXN = 9, MAXE = 24, MAXU = 64 };

typedef struct Inst {
  int N;
  double fwd[MAXN], bwd[MAXN], traffic[MAXN], param[MAXN], stash[MAXN], work[MAXN];
  PartEdge edges[MAXE];
  int nedges;
  int use_edge[MAXU], use_node[MAXU], nuse;
  int keep_a[MAXN], keep_b[MAXN], nkeep;
  Machine machine;
  PartProblem p;
  DagProblem d;
} Inst;

/* Each node (and the loader) makes one or two values, read by 1-3 later
 * nodes (or the loss); a few kept orders between unrelated nodes. */
static void random_instance(Inst *in, int chain) {
  memset(in, 0, sizeof *in);
  int N = in->N = 6 + (int)(rnd() * 4);
  for (int k = 0; k < N; k++) {
    in->fwd[k] = 1e6 * (0.1 + rnd() * 10);
    in->bwd[k] = in->fwd[k] * (1 + rnd());
    in->traffic[k] = rnd() < 0.5 ? 0 : 1e5 * rnd();
    in->param[k] = rnd() < 0.4 ? 0 : 1e5 * rnd();
    in->stash[k] = 1e5 * rnd();
    in->work[k] = rnd() < 0.7 ? 0 : 1e5 * rnd();
  }
  for (int k = -1; k < N; k++) {
    int outs = chain ? 1 : 1 + (rnd() < 0.3);
    for (int o = 0; o < outs && in->nedges < MAXE; o++) {
      PartEdge *e = &in->edges[in->nedges];
      e->from = k, e->to = -1, e->bytes = 1e4 * (0.1 + rnd() * 50), e->grad_bytes = k < 0 ? 0 : e->bytes;
      int nr = chain ? 1 : 1 + (int)(rnd() * 3);
      for (int r = 0; r < nr; r++) {
        int to = chain ? k + 1 : k + 1 + (int)(rnd() * (rnd() < 0.3 ? 5 : 2.5));
        if (to >= N) {
          e->to = N; /* the loss reads it */
          continue;
        }
        int dup = 0;
        for (int u = 0; u < in->nuse; u++) dup |= in->use_edge[u] == in->nedges && in->use_node[u] == to;
        if (dup) continue;
        in->use_edge[in->nuse] = in->nedges, in->use_node[in->nuse++] = to;
        if (to > e->to) e->to = to;
      }
      in->nedges++;
    }
  }
  for (int q = 0; !chain && q < 2; q++) {
    int a = (int)(rnd() * (N - 1)), b = a + 1 + (int)(rnd() * (N - 1 - a));
    if (rnd() < 0.5) in->keep_a[in->nkeep] = a, in->keep_b[in->nkeep++] = b;
  }
  int n = 2 + (int)(rnd() * 3);
  in->machine.nranks = n;
  in->machine.memcpy_bw = 5e9 + 5e9 * rnd();
  for (int s = 0; s < n; s++) {
    in->machine.dev[s].flops = 1e9 * (1 + 3 * rnd());
    in->machine.link[s].bandwidth = 1e8 * (1 + 20 * rnd());
    in->machine.link[s].latency = 1e-5 * rnd();
  }
  PartProblem *p = &in->p;
  p->N = N;
  p->fwd_flops = in->fwd, p->bwd_flops = in->bwd, p->traffic = in->traffic;
  p->param_bytes = in->param, p->stash_bytes = in->stash, p->work_bytes = in->work;
  p->edges = in->edges, p->nedges = in->nedges;
  p->nstages = n, p->microbatches = 1 + (int)(rnd() * 8), p->schedule = rnd() < 0.5 ? SCHED_GPIPE : SCHED_1F1B;
  p->opt_state_per_param = (int)(rnd() * 3);
  p->machine = &in->machine;
  p->mem_limit = rnd() < 0.5 ? 0 : 3e5 + 4e6 * rnd();
  in->d = (DagProblem){p, in->use_edge, in->use_node, in->nuse, in->keep_a, in->keep_b, in->nkeep, 0};
}

/* The plan's slowest stage and sum of squares, straight from the lists:
 * a value crosses the cut before stage c when its producer's stage is below
 * c and some reader's (the loss: stage n) is at least c.  INFINITY when a
 * stage is empty or over its memory limit. */
static double evaluate(const Inst *in, const int *stage, double *sumsq) {
  const PartProblem *p = &in->p;
  const Machine *m = &in->machine;
  int n = p->nstages;
  double mx = 0;
  *sumsq = 0;
  for (int s = 0; s < n; s++) {
    double f = 0, b = 0, params = 0, stash = 0, work = 0;
    int count = 0;
    for (int k = 0; k < in->N; k++)
      if (stage[k] == s) {
        f += in->fwd[k] / m->dev[s].flops + in->traffic[k] / m->memcpy_bw;
        b += in->bwd[k] / m->dev[s].flops + 2 * in->traffic[k] / m->memcpy_bw;
        params += in->param[k], stash += in->stash[k], work += in->work[k], count++;
      }
    if (!count) return INFINITY;
    double cb[2] = {0, 0}, cg[2] = {0, 0}, cn[2] = {0, 0};
    for (int e = 0; e < in->nedges; e++) {
      const PartEdge *ed = &in->edges[e];
      int lo = ed->from < 0 ? -1 : stage[ed->from], hi = ed->to >= in->N ? n : -1;
      for (int u = 0; u < in->nuse; u++)
        if (in->use_edge[u] == e && stage[in->use_node[u]] > hi) hi = stage[in->use_node[u]];
      for (int side = 0; side < 2; side++) {
        int c = s + side; /* the cut before stage c */
        if (lo < c && c <= hi) cb[side] += ed->bytes, cg[side] += c > 0 && c < n ? ed->grad_bytes : 0, cn[side]++;
      }
    }
    double comm = 0;
    if (s > 0 && cn[0]) comm += (cb[0] + cg[0]) / m->link[s - 1].bandwidth + 2 * cn[0] * m->link[s - 1].latency;
    if (s + 1 < n && cn[1]) comm += (cb[1] + cg[1]) / m->link[s].bandwidth + 2 * cn[1] * m->link[s].latency;
    double t = f + b + comm;
    int copies = stage_copies(p->schedule, s, n, p->microbatches);
    double last = s == n - 1 ? cb[1] : 0;
    double mem = params * (2 + p->opt_state_per_param) + copies * (stash + cb[0] + cb[1] + last) + last + 2 * (cg[0] + cg[1]) + work;
    if (p->mem_limit > 0 && mem > p->mem_limit) return INFINITY;
    mx = fmax(mx, t), *sumsq += t * t;
  }
  return mx;
}

/* Whether stage[] is monotone along every value and kept order. */
static int monotone(const Inst *in, const int *stage) {
  for (int u = 0; u < in->nuse; u++) {
    int from = in->edges[in->use_edge[u]].from;
    if (from >= 0 && stage[from] > stage[in->use_node[u]]) return 0;
  }
  for (int q = 0; q < in->nkeep; q++)
    if (stage[in->keep_a[q]] > stage[in->keep_b[q]]) return 0;
  return 1;
}

/* Every assignment of nodes to stages (n^N of them), the monotone ones scored. */
static double brute(const Inst *in, double *best_sq) {
  int N = in->N, n = in->p.nstages, stage[MAXN] = {0};
  double best = INFINITY;
  *best_sq = INFINITY;
  for (int pass = 0; pass < 2; pass++) {
    memset(stage, 0, sizeof stage);
    for (;;) {
      double sq, t = monotone(in, stage) ? evaluate(in, stage, &sq) : INFINITY;
      if (pass == 0 && t < best) best = t;
      if (pass == 1 && t <= best * (1 + 1e-9) && sq < *best_sq) *best_sq = sq;
      int k = 0;
      while (k < N && stage[k] == n - 1) stage[k++] = 0;
      if (k == N) break;
      stage[k]++;
    }
    if (best == INFINITY) break;
  }
  return best;
}

/* The DP's result as stages; 0 unless its order is a permutation that is
 * topological, keeps the kept orders and keeps each stage's nodes in order. */
static int result_stages(const Inst *in, const DagResult *r, int *stage) {
  int N = in->N, pos[MAXN], seen[MAXN] = {0};
  for (int s = 0; s < in->p.nstages; s++)
    for (int q = r->start[s]; q < r->start[s + 1]; q++) {
      int k = r->order[q];
      if (k < 0 || k >= N || seen[k]++) return 0;
      if (q > r->start[s] && r->order[q - 1] > k) return 0;
      stage[k] = s, pos[k] = q;
    }
  for (int k = 0; k < N; k++)
    if (!seen[k]) return 0;
  for (int u = 0; u < in->nuse; u++) {
    int from = in->edges[in->use_edge[u]].from;
    if (from >= 0 && pos[from] > pos[in->use_node[u]]) return 0;
  }
  for (int q = 0; q < in->nkeep; q++)
    if (pos[in->keep_a[q]] > pos[in->keep_b[q]]) return 0;
  return 1;
}

static void test_random(int count) {
  int agree = 0, infeasible = 0, better = 0, f0 = failed;
  for (int it = 0; it < count; it++) {
    Inst in;
    random_instance(&in, 0);
    Pool pool = {0};
    DagResult r;
    int rc = dagpart_solve(&in.d, &r, &pool);
    double sq, opt = brute(&in, &sq);
    CHECK(rc == 0 && r.ok, "instance %d: the DP gave up (%s)\n", it, rc ? err_msg() : "bound");
    if (rc || !r.ok) {
      pool_free(&pool);
      continue;
    }
    if (opt == INFINITY) {
      infeasible++;
      CHECK(r.max_time == INFINITY, "instance %d: brute force finds no fit but the DP found %.9g\n", it, r.max_time);
    } else {
      int stage[MAXN];
      double rsq = 0, got = INFINITY;
      int valid = r.max_time < INFINITY && result_stages(&in, &r, stage);
      if (valid) got = evaluate(&in, stage, &rsq);
      int same = valid && fabs(r.max_time - opt) <= 1e-9 * opt && fabs(got - opt) <= 1e-9 * opt && fabs(rsq - sq) <= 1e-9 * sq;
      agree += same;
      CHECK(same, "instance %d (N=%d, n=%d): DP %.12g (its plan: %.12g, sumsq %.12g%s), brute force %.12g / %.12g\n", it, in.N,
            in.p.nstages, r.max_time, got, rsq, valid ? "" : ", not a valid order", opt, sq);
      /* The loaded order's ranges are among the chains: never better. */
      Partition pt;
      if (partition_solve(&in.p, &pt, &pool) == 0) {
        CHECK(r.max_time <= pt.max_time * (1 + 1e-9), "instance %d: DAG %.12g worse than the order's %.12g\n", it, r.max_time,
              pt.max_time);
        better += r.max_time < pt.max_time * (1 - 1e-9);
      } else {
        better++;
      }
    }
    err_clear();
    pool_free(&pool);
  }
  if (failed == f0)
    printf("ok - downset DP equals brute force over all monotone assignments on %d random DAGs (%d agreed, %d infeasible; "
           "better than the fixed order on %d)\n", count, agree, infeasible, better);
  CHECK(better > count / 10, "the DAG beat the fixed order on only %d of %d instances: the test does not test\n", better, count);
}

/* On a chain there is one order: the same optimum as partition_solve. */
static void test_chains(int count) {
  int f0 = failed;
  for (int it = 0; it < count; it++) {
    Inst in;
    random_instance(&in, 1);
    Pool pool = {0};
    DagResult r;
    Partition pt;
    int a = dagpart_solve(&in.d, &r, &pool), b = partition_solve(&in.p, &pt, &pool);
    double want = b ? INFINITY : pt.max_time;
    CHECK(a == 0 && r.ok && r.states == in.N + 1 && (want == INFINITY ? r.max_time == INFINITY : fabs(r.max_time - want) <= 1e-9 * want),
          "chain %d: %d downsets, DP %.12g, partition_solve %.12g\n", it, r.states, r.max_time, want);
    err_clear();
    pool_free(&pool);
  }
  if (failed == f0) printf("ok - on %d random chains the downset DP has N + 1 states and partition_solve's optimum\n", count);
}

/* k parallel chains of length L between a source and a sink: (L+1)^k + 2
 * downsets; with the chains contracted, k + 2 units and 2^k + 2 downsets. */
typedef struct Fan {
  double z[64], one[64];
  PartEdge e[72];
  int ue[80], un[80];
  Machine m;
  PartProblem p;
  DagProblem d;
} Fan;

static void fan(Fan *f, int K, int L) {
  memset(f, 0, sizeof *f);
  int N = K * L + 2, ne = 0, nu = 0;
  for (int k = 0; k < N; k++) f->one[k] = 1e6;
  f->e[ne++] = (PartEdge){-1, 0, 100, 0};
  f->ue[nu] = 0, f->un[nu++] = 0;
  f->e[ne++] = (PartEdge){0, N - 2 - L + 1, 100, 100}; /* the source's value, read by each chain's head */
  for (int c = 0; c < K; c++) f->ue[nu] = 1, f->un[nu++] = 1 + c * L;
  for (int c = 0; c < K; c++) { /* chain c: nodes 1 + cL .. cL + L, its tail read by the sink */
    for (int q = 0; q + 1 < L; q++) {
      f->e[ne] = (PartEdge){1 + c * L + q, 2 + c * L + q, 100, 100};
      f->ue[nu] = ne++, f->un[nu++] = 2 + c * L + q;
    }
    f->e[ne] = (PartEdge){c * L + L, N - 1, 100, 100};
    f->ue[nu] = ne++, f->un[nu++] = N - 1;
  }
  f->e[ne++] = (PartEdge){N - 1, N, 100, 0};
  f->m = (Machine){.nranks = 4, .memcpy_bw = 1e10};
  for (int s = 0; s < 4; s++) f->m.dev[s].flops = 1e9, f->m.link[s] = (Link){1e9, 1e-6};
  f->p = (PartProblem){.N = N, .fwd_flops = f->one, .bwd_flops = f->one, .traffic = f->z, .param_bytes = f->z,
                       .stash_bytes = f->z, .work_bytes = f->z, .edges = f->e, .nedges = ne, .nstages = 4,
                       .microbatches = 8, .schedule = SCHED_1F1B, .machine = &f->m};
  f->d = (DagProblem){&f->p, f->ue, f->un, nu, NULL, NULL, 0, 0};
}

static void test_bound(void) {
  static Fan f;
  Pool pool = {0};
  DagResult r;
  fan(&f, 3, 6);
  int rc = dagpart_solve(&f.d, &r, &pool);
  CHECK(rc == 0 && r.ok && !r.coarse && r.states == 7 * 7 * 7 + 2, "3 chains of 6: ok %d coarse %d, %d downsets\n", r.ok, r.coarse,
        r.states);
  fan(&f, 6, 6); /* 7^6 + 2 = 117651 downsets */
  rc = dagpart_solve(&f.d, &r, &pool);
  CHECK(rc == 0 && r.ok && r.coarse && r.states == (1 << 6) + 2, "6 chains of 6: ok %d coarse %d, %d downsets\n", r.ok, r.coarse,
        r.states);
  f.d.max_states = 30; /* below even the contracted graph's */
  rc = dagpart_solve(&f.d, &r, &pool);
  CHECK(rc == 0 && !r.ok, "a bound of 30 downsets: the DP should give up\n");
  pool_free(&pool);
  printf("ok - downsets counted; past its bound the DP contracts chains, and past that gives up\n");
}

/* The compiler end to end on one model: today's DP (--partition chain
 * --route relay: ranges of the loaded order, values relayed through every
 * rank between) against the new one (--partition dag --route direct), and
 * the downset DP alone (dag against chain, both with direct sends). */
static int plan_one(const char *model, int n, int partition, int relay, double *slowest, double *step) {
  Options o = {.model = model, .nstages = n, .plan_only = 1, .partition = partition, .relay = relay,
               .schedule = SCHED_1F1B, .devices = "tests/devices_equal.txt"};
  Plan p;
  int rc = plan_build(&p, &o);
  if (rc) CHECK(0, "%s -n %d: %s\n", model, n, err_msg());
  else *slowest = p.part.max_time, *step = p.sched.step_time;
  plan_free(&p);
  return rc;
}

static void test_models(void) {
  static const char *models[] = {"mlp", "lenet", "resnet", "gpt", "gpt_opset17", "inception", "densenet"};
  for (size_t i = 0; i < sizeof models / sizeof *models; i++)
    for (int n = 2; n <= 8; n *= 2) {
      char path[256];
      snprintf(path, sizeof path, "onnx_models/%s.onnx", models[i]);
      double old, olds, c, cs, d, ds;
      if (plan_one(path, n, PARTITION_CHAIN, 1, &old, &olds) || plan_one(path, n, PARTITION_CHAIN, 0, &c, &cs) ||
          plan_one(path, n, PARTITION_DAG, 0, &d, &ds))
        continue;
      CHECK(d <= c * (1 + 1e-9) && ds <= cs * (1 + 1e-9), "%s -n %d: dag %.9g (step %.9g) worse than chain %.9g (step %.9g)\n",
            models[i], n, d, ds, c, cs);
      CHECK(d <= old * (1 + 1e-9), "%s -n %d: the new DP's slowest stage %.9g is worse than today's %.9g\n", models[i], n, d, old);
      printf("ok - %-12s n=%d  slowest stage: today's DP (chain, relay) %.4g ms, chain + direct %.4g ms, downset DP + direct %.4g ms; "
             "predicted step: today's %.4g ms, new %.4g ms\n", models[i], n, 1e3 * old, 1e3 * c, 1e3 * d, 1e3 * olds, 1e3 * ds);
      /* The branchy graphs: the parallel branches let the downset DP rebalance the Inception blocks; DenseNet's
       * order is its only one, but a stage holding only a layer's conv skips the block's earlier outputs. */
      if ((!strcmp(models[i], "inception") && n == 4) || (!strcmp(models[i], "densenet") && n == 8))
        CHECK(d < old * (1 - 1e-6) && ds < olds, "%s -n %d: the new DP should beat today's (%.9g vs %.9g)\n", models[i], n, d, old);
    }
}

int main(void) {
  test_random(400);
  test_chains(200);
  test_bound();
  test_models();
  return check_finish();
}
