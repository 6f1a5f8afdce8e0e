/* cost.c - per-node costs and the machine description.
 *
 * The time model is deliberately simple and stated in the listing: a node
 * takes flops / rank_rate + traffic / memory_bandwidth, where the rate comes
 * from a GEMM probe (matrix ops dominate) and memory-bound ops (elementwise,
 * normalisation, reshapes) are charged by the bytes they move.  Backward
 * costs twice the forward FLOPs for ops with weights (grad input + grad
 * weight) and about the same traffic again. */
#include "cost.h"

#include <cblas.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ops.h"

static const char *cache_path(char *buf, size_t len);

static double numel_d(const Tensor *t) { return t ? (double)ir_numel(t) : 0; }

/* Forward FLOPs of one node: its operator's own rule (compiler/ops/). */
static double node_flops(Graph *g, const Node *n) { return n->def->flops ? n->def->flops(g, n) : 0; }

static void mark_stashed(Graph *g, char *stashed) {
  for (int j = 0; j < g->nn; j++) {
    Node *n = &g->n[j];
    if (n->folded) continue;
    const OpDef *d = n->def;
    if (d->stash & STASH_INPUTS)
      for (int k = 0; k < n->nin; k++) {
        Tensor *t = node_in(g, n, k);
        if (t && !t->data) stashed[n->in[k]] = 1;
      }
    if (d->stash & STASH_OUTPUT) stashed[n->out[0]] = 1;
  }
}

void cost_nodes(Graph *g, NodeCost *c) {
  char *stashed = calloc((size_t)g->nt + 1, 1);
  if (!stashed) abort();
  mark_stashed(g, stashed);
  for (int j = 0; j < g->nn; j++) {
    Node *n = &g->n[j];
    NodeCost *nc = &c[j];
    memset(nc, 0, sizeof *nc);
    if (n->folded) continue;
    nc->fwd_flops = node_flops(g, n);
    nc->bwd_flops = n->def->weighted ? 2 * nc->fwd_flops : nc->fwd_flops;
    for (int k = 0; k < n->nin; k++) {
      Tensor *t = node_in(g, n, k);
      if (!t) continue;
      if (t->is_param) {
        /* A weight read by two nodes is counted once, at its first reader. */
        int first = 1;
        for (int i = 0; i < j && first; i++)
          for (int q = 0; q < g->n[i].nin; q++)
            if (!g->n[i].folded && g->n[i].in[q] == n->in[k]) first = 0;
        if (first) nc->param_count += numel_d(t), nc->param_bytes += (double)tensor_bytes(t);
      } else if (!n->def->weighted) {
        nc->traffic_bytes += (double)tensor_bytes(t);
      }
    }
    for (int k = 0; k < n->nout; k++) {
      Tensor *t = node_out(g, n, k);
      if (!t) continue;
      nc->out_bytes += (double)tensor_bytes(t);
      if (!n->def->weighted) nc->traffic_bytes += (double)tensor_bytes(t);
      if (stashed[n->out[k]]) nc->stash_bytes += (double)tensor_bytes(t);
    }
    /* Graph inputs a node keeps for backward are charged to that node. */
    for (int k = 0; k < n->nin; k++)
      if (n->in[k] >= 0 && g->t[n->in[k]].is_input && stashed[n->in[k]]) {
        nc->stash_bytes += (double)tensor_bytes(&g->t[n->in[k]]);
        stashed[n->in[k]] = 0;
      }
    /* Bound on what the arena holds for this node besides rings: its outputs as
     * temporaries and their gradients, im2col workspaces (forward and backward),
     * the constants it reads, and alignment. */
    for (int k = 0; k < n->nout; k++) {
      Tensor *t = node_out(g, n, k);
      if (t) nc->work_bytes += 2.0 * (double)tensor_bytes(t) + 128;
    }
    for (int k = 0; k < n->nin; k++) {
      Tensor *t = node_in(g, n, k);
      if (t && t->data && !t->is_param) nc->work_bytes += (double)tensor_bytes(t) + 64;
      if (t && !t->data && !t->is_param) nc->work_bytes += (double)tensor_bytes(t) + 64; /* a gradient for a value received */
      if (t && t->is_param) nc->work_bytes += 3 * 64; /* alignment of its gradient and optimizer slots */
    }
    /* Workspace such as im2col columns, forward and backward. */
    if (n->def->workspace) nc->work_bytes += 2 * ((double)n->def->workspace(g, n) + 64);
  }
  free(stashed);
}

/* ---- the machine ---- */

const char *machine_cache_path(char *buf, size_t len) { return cache_path(buf, len); }

const char *cache_beside(const char *env_name, const char *name, char *buf, size_t len) {
  const char *env = getenv(env_name);
  if (env && !strcmp(env, "off")) return NULL;
  if (env && *env) {
    snprintf(buf, len, "%s", env);
    return buf;
  }
  char mbuf[1024];
  const char *m = machine_cache_path(mbuf, sizeof mbuf);
  const char *slash = strrchr(m, '/');
  if (slash) snprintf(buf, len, "%.*s/%s.txt", (int)(slash - m), m, name);
  else snprintf(buf, len, "%s.txt", name);
  if (!strcmp(buf, m)) snprintf(buf, len, "%s.%s", m, name); /* PIPECC_CACHE named NAME.txt itself */
  return buf;
}

static const char *cache_path(char *buf, size_t len) {
  const char *env = getenv("PIPECC_CACHE");
  if (env && *env) return env;
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  if (xdg && *xdg) snprintf(buf, len, "%s/pipecc/machine.txt", xdg);
  else snprintf(buf, len, "%s/.cache/pipecc/machine.txt", home && *home ? home : "/tmp");
  return buf;
}

void machine_probe(Machine *m) {
  /* One core per rank: time a single-threaded SGEMM the size of a layer. */
  openblas_set_num_threads(1);
  enum { N = 384 };
  float *a = malloc(sizeof(float) * N * N), *b = malloc(sizeof(float) * N * N), *c = malloc(sizeof(float) * N * N);
  if (!a || !b || !c) abort();
  for (int i = 0; i < N * N; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
  double best = 1e30;
  for (int r = 0; r < 5; r++) {
    double t0 = now_seconds();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
    double t = now_seconds() - t0;
    if (t < best) best = t;
  }
  free(a), free(b), free(c);
  double flops = 2.0 * N * N * N / (best > 0 ? best : 1e-9);
  /* memcpy bandwidth on buffers larger than the caches. */
  size_t bytes = (size_t)32 << 20;
  char *src = malloc(bytes), *dst = malloc(bytes);
  if (!src || !dst) abort();
  memset(src, 1, bytes);
  memset(dst, 0, bytes);
  double bt = 1e30;
  for (int r = 0; r < 3; r++) {
    double t0 = now_seconds();
    memcpy(dst, src, bytes);
    /* dst is never read: without this the compiler may drop the copy and time nothing (the probe
     * once reported 1.2 PB/s, and memory-bound ops were then costed as free). */
    __asm__ volatile("" : : "r"(dst) : "memory");
    double t = now_seconds() - t0;
    if (t < bt) bt = t;
  }
  free(src), free(dst);
  m->nranks = 1;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  m->cores = cores > 0 && cores < (1 << 20) ? (int)cores : 0;
  m->dev[0].flops = flops;
  m->dev[0].mem_bytes = 0;
  m->memcpy_bw = (double)bytes / (bt > 0 ? bt : 1e-9);
  /* Without a measured MPI figure: shared-memory MPI copies each message
   * twice (into and out of the segment). */
  m->link[0].bandwidth = m->memcpy_bw / 2;
  m->link[0].latency = 2e-6;
}

/* Runs pipecc-probe (next to this binary) on two local MPI ranks for the
 * link's bandwidth and latency.  Returns 1 if it measured them. */
static int probe_link(Link *l) {
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 32);
  if (len <= 0) return 0;
  exe[len] = 0;
  char *slash = strrchr(exe, '/');
  if (!slash) return 0;
  strcpy(slash + 1, "pipecc-probe");
  if (access(exe, X_OK)) return 0;
  char cmd[8192];
  snprintf(cmd, sizeof cmd,
           "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 mpirun --oversubscribe -n 2 '%s' 2>/dev/null",
           exe);
  FILE *p = popen(cmd, "r");
  if (!p) return 0;
  char line[256] = "";
  int got = fgets(line, sizeof line, p) != NULL;
  pclose(p);
  Machine m;
  char text[512];
  snprintf(text, sizeof text, "rank * flops=1G\n%s", line);
  if (!got || machine_parse(&m, 2, text, "pipecc-probe")) {
    err_clear();
    return 0;
  }
  *l = m.link[0];
  return 1;
}

static double parse_time(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || !(v >= 0) || !isfinite(v)) return -1;
  if (!*end || !strcmp(end, "s")) return v;
  if (!strcmp(end, "ms")) return v * 1e-3;
  if (!strcmp(end, "us")) return v * 1e-6;
  if (!strcmp(end, "ns")) return v * 1e-9;
  return -1;
}

/* Decimal rates: "40G" FLOP/s or bytes/s means 40e9. */
static double parse_rate(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || !(v > 0) || !isfinite(v)) return -1;
  switch (toupper((unsigned char)*end)) {
  case 0: return v;
  case 'K': v *= 1e3; break;
  case 'M': v *= 1e6; break;
  case 'G': v *= 1e9; break;
  case 'T': v *= 1e12; break;
  default: return -1;
  }
  return end[1] && strcmp(end + 1, "B/s") && strcmp(end + 1, "/s") ? -1 : v;
}

/* The sane range of a devices file's figure (key, its value x in FLOP/s, bytes/s, seconds or bytes), or
 * NULL when x is in it.  A rank of 1e-300 FLOP/s predicted a step of 1e309 s, and the stages' watchdog
 * (100 steps) never fired; NaN and Inf wrote a plan.json that is not JSON. */
static const char *figure_out_of_range(const char *k, double x) {
  if (!strcmp(k, "flops")) return x >= 1e6 && x <= 1e18 ? NULL : "expected 1M to 1000000T FLOP/s (e.g. flops=40G)";
  if (!strcmp(k, "bandwidth")) return x >= 1e3 && x <= 1e15 ? NULL : "expected 1K to 1000T bytes/s (e.g. bandwidth=10G)";
  if (!strcmp(k, "latency")) return x <= 10 ? NULL : "expected 0 to 10 s (e.g. latency=2us)";
  if (!strcmp(k, "mem")) return x <= 1125899906842624.0 ? NULL : "expected at most 1024T bytes (e.g. mem=16G)";
  return NULL;
}

int machine_parse(Machine *m, int n, const char *text, const char *name) {
  Device dflt_dev = {0, 0}, dev[MAX_RANKS];
  Link dflt_link = {0, 0}, link[MAX_RANKS];
  char have_dev[MAX_RANKS] = {0}, have_link[MAX_RANKS] = {0};
  int have_dd = 0, have_dl = 0;
  double memcpy_bw = 0, cores = 0;
  memset(dev, 0, sizeof dev);
  memset(link, 0, sizeof link);
  int lineno = 0;
  const char *p = text;
  while (*p) {
    char line[512];
    size_t len = strcspn(p, "\n");
    lineno++;
    if (len >= sizeof line) return err_set("%s:%d: line too long", name, lineno);
    memcpy(line, p, len);
    line[len] = 0;
    p += len + (p[len] == '\n');
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char *tok[16];
    int nt = 0;
    for (char *s = strtok(line, " \t\r"); s && nt < 16; s = strtok(NULL, " \t\r")) tok[nt++] = s;
    if (!nt) continue;
    int is_rank = !strcmp(tok[0], "rank"), is_link = !strcmp(tok[0], "link"), is_mem = !strcmp(tok[0], "memcpy");
    int is_host = !strcmp(tok[0], "host");
    if (!is_rank && !is_link && !is_mem && !is_host)
      return err_set("%s:%d: unknown entry '%s' (expected rank, link, memcpy or host)", name, lineno, tok[0]);
    int first = 1, idx = -1;
    if (!is_mem && !is_host) {
      if (nt < 2) return err_set("%s:%d: '%s' needs an index or '*'", name, lineno, tok[0]);
      if (strcmp(tok[1], "*")) {
        char *end;
        long v = strtol(tok[1], &end, 10);
        if (*end || v < 0 || v >= MAX_RANKS) return err_set("%s:%d: bad index '%s'", name, lineno, tok[1]);
        idx = (int)v;
      }
      first = 2;
    }
    Device d = idx >= 0 ? dev[idx] : dflt_dev;
    Link l = idx >= 0 ? link[idx] : dflt_link;
    for (int i = first; i < nt; i++) {
      char *eq = strchr(tok[i], '=');
      if (!eq) return err_set("%s:%d: expected key=value, got '%s'", name, lineno, tok[i]);
      *eq = 0;
      const char *k = tok[i], *v = eq + 1;
      double x;
      if (is_rank && !strcmp(k, "flops")) x = parse_rate(v), d.flops = x;
      else if (is_rank && !strcmp(k, "mem")) x = parse_size(v), d.mem_bytes = x;
      else if (is_link && !strcmp(k, "bandwidth")) x = parse_rate(v), l.bandwidth = x;
      else if (is_link && !strcmp(k, "latency")) x = parse_time(v), l.latency = x;
      else if (is_mem && !strcmp(k, "bandwidth")) x = parse_rate(v), memcpy_bw = x;
      else if (is_host && !strcmp(k, "cores")) {
        char *end;
        long c = strtol(v, &end, 10);
        x = *end || end == v || c < 1 || c > (1 << 20) ? -1 : (double)c, cores = x;
      }
      else return err_set("%s:%d: unknown key '%s' for %s", name, lineno, k, tok[0]);
      if (x < 0) return err_set("%s:%d: bad value '%s' for %s", name, lineno, v, k);
      if (figure_out_of_range(k, x)) return err_set("%s:%d: %s=%s is out of range: %s", name, lineno, k, v, figure_out_of_range(k, x));
    }
    if (is_rank && d.flops <= 0) return err_set("%s:%d: rank needs flops=RATE (e.g. flops=40G)", name, lineno);
    if (is_link && l.bandwidth <= 0) return err_set("%s:%d: link needs bandwidth=RATE (e.g. bandwidth=10G)", name, lineno);
    if (is_rank && idx < 0) dflt_dev = d, have_dd = 1;
    else if (is_rank) dev[idx] = d, have_dev[idx] = 1;
    else if (is_link && idx < 0) dflt_link = l, have_dl = 1;
    else if (is_link) link[idx] = l, have_link[idx] = 1;
  }
  for (int s = 0; s < n; s++) {
    if (!have_dev[s] && !have_dd) return err_set("%s: rank %d has no figures (add 'rank %d flops=...' or 'rank * ...')", name, s, s);
    m->dev[s] = have_dev[s] ? dev[s] : dflt_dev;
    if (s + 1 < n) {
      if (!have_link[s] && !have_dl) return err_set("%s: link %d (rank %d to %d) has no figures (add 'link * bandwidth=...')", name, s, s, s + 1);
      m->link[s] = have_link[s] ? link[s] : dflt_link;
    }
  }
  m->nranks = n;
  m->memcpy_bw = memcpy_bw > 0 ? memcpy_bw : 10e9;
  m->cores = cores > 0 ? (int)cores : 0;
  return 0;
}

static char *read_text(const char *path) {
  struct stat st;
  if (stat(path, &st)) return NULL;
  if (!S_ISREG(st.st_mode)) {
    errno = EISDIR;
    return NULL;
  }
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  char *buf = NULL;
  size_t len = 0, cap = 0;
  int c;
  while ((c = fgetc(f)) != EOF) {
    if (len + 2 > cap) {
      cap = cap ? cap * 2 : 1024;
      char *nb = realloc(buf, cap);
      if (!nb) abort();
      buf = nb;
    }
    buf[len++] = (char)c;
    if (len > (1 << 20)) break;
  }
  fclose(f);
  if (!buf) buf = calloc(1, 1);
  else buf[len] = 0;
  return buf;
}

static void mkdirs_for(const char *path) {
  char tmp[1024];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(tmp, 0755);
      *p = '/';
    }
}

/* The cache's line naming the BLAS kernels its figures were measured with (blas_core.h). */
static const char *blas_kernels_line(char *buf, size_t len) {
  const char *core = getenv("OPENBLAS_CORETYPE");
  snprintf(buf, len, "# blas kernels: %s\n", core && *core ? core : "OpenBLAS's choice");
  return buf;
}

/* The probe's cached figures into m (n ranks), when the cache at `path` holds figures measured with the
 * BLAS kernels this process runs and the host's cores: 0, else -1. */
static int cached_machine(Machine *m, int n, const char *path) {
  char blas_line[96];
  blas_kernels_line(blas_line, sizeof blas_line);
  char *text = read_text(path);
  int ok = text && strstr(text, blas_line) && strstr(text, "\nhost cores=") && !machine_parse(m, n, text, path);
  free(text);
  return ok ? 0 : -1;
}

const char *machine_identity(Pool *pool, double *flops) {
  char buf[1024];
  const char *path = cache_path(buf, sizeof buf);
  const char *core = getenv("OPENBLAS_CORETYPE");
  Machine m;
  int ok = cached_machine(&m, 1, path) == 0;
  err_clear();
  if (!ok) return NULL;
  char cpu[256] = "unknown";
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f) {
    char line[1024];
    while (fgets(line, sizeof line, f))
      if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
        const char *v = strchr(line, ':') + 1;
        while (*v == ' ' || *v == '\t') v++;
        snprintf(cpu, sizeof cpu, "%s", v);
        cpu[strcspn(cpu, "\r\n")] = 0;
        break;
      }
    fclose(f);
  }
  /* Not the rate: a re-probe of the same machine measures another one (noise,
   * load), and its kernels are no faster for it. */
  char *id = pool_printf(pool, "cpu=%s;cores=%d;blas=%s", cpu, m.cores, core && *core ? core : "default");
  /* One token of printable ASCII. */
  for (char *c = id; *c; c++)
    if (*c == ' ' || *c == '\t') *c = '_';
    else if ((unsigned char)*c < 0x21 || (unsigned char)*c > 0x7e) *c = '?';
  size_t len = strlen(id);
  while (len && id[len - 1] == '_') id[--len] = 0;
  *flops = m.dev[0].flops;
  return id;
}

void machine_spread(Machine *m, const int *rank_of, int S, int V) {
  static Machine r; /* the ranks' figures (large: not on the stack) */
  r = *m;
  for (int s = 0; s < S; s++) {
    m->dev[s] = r.dev[rank_of[s]];
    if (m->dev[s].mem_bytes > 0) m->dev[s].mem_bytes /= V;
  }
  for (int s = 0; s + 1 < S; s++) {
    int a = rank_of[s] < rank_of[s + 1] ? rank_of[s] : rank_of[s + 1], b = rank_of[s] + rank_of[s + 1] - a;
    if (a == b) {
      m->link[s] = (Link){m->memcpy_bw, 0};
      continue;
    }
    m->link[s] = r.link[a];
    for (int k = a + 1; k < b; k++) {
      if (r.link[k].bandwidth < m->link[s].bandwidth) m->link[s].bandwidth = r.link[k].bandwidth;
      if (r.link[k].latency > m->link[s].latency) m->link[s].latency = r.link[k].latency;
    }
  }
  m->nranks = S;
}

int machine_load(Machine *m, int n, const char *devices_file, Pool *pool) {
  memset(m, 0, sizeof *m);
  if (n > MAX_RANKS) return err_set("-n %d: at most %d ranks are supported", n, MAX_RANKS);
  if (devices_file) {
    char *text = read_text(devices_file);
    if (!text) return err_set("--devices %s: cannot read: %s", devices_file, errno == EISDIR ? "not a regular file" : strerror(errno));
    int rc = machine_parse(m, n, text, devices_file);
    free(text);
    m->source = pool_printf(pool, "--devices %s", devices_file);
    return rc;
  }
  char buf[1024];
  const char *path = cache_path(buf, sizeof buf);
  /* A FIFO there: writing the probe's figures into it blocked pipecc until something read it. */
  struct stat cst;
  if (!stat(path, &cst) && !S_ISREG(cst.st_mode))
    return err_set("the machine probe's cache %s is not a regular file (a FIFO, socket, device or directory): remove it, or set "
                   "PIPECC_CACHE to another file", path);
  /* The figures hold for the BLAS kernels they were measured with (blas_core.h). */
  if (cached_machine(m, n, path) == 0) {
    m->source = pool_printf(pool, "probe of this machine, cached in %s", path);
    return 0;
  }
  err_clear(); /* a stale or foreign cache is re-probed, not an error */
  char blas_line[96];
  blas_kernels_line(blas_line, sizeof blas_line);
  Machine probe;
  machine_probe(&probe);
  int mpi = probe_link(&probe.link[0]);
  /* The figures as the cache file holds them (4 digits), and this plan uses
   * them as read back from that text: every later plan reads the file, and a
   * probing plan that kept the unrounded figures would plan another machine
   * (a rate 3e-4 off scales every time of a --costs or kernel-cache plan). */
  char fig[512];
  int nfig = snprintf(fig, sizeof fig, "%s%s%srank * flops=%.4gG\nlink * bandwidth=%.4gG latency=%.3gus\nmemcpy bandwidth=%.4gG\n",
                      "# pipecc machine probe: single-thread OpenBLAS SGEMM rate, memcpy bandwidth,\n",
                      mpi ? "# and the MPI link measured by pipecc-probe (two ranks on this machine).\n"
                          : "# and the link estimated from memcpy (pipecc-probe could not run MPI here).\n",
                      blas_line, probe.dev[0].flops / 1e9, probe.link[0].bandwidth / 1e9, probe.link[0].latency * 1e6, probe.memcpy_bw / 1e9);
  if (probe.cores && nfig > 0 && (size_t)nfig < sizeof fig) snprintf(fig + nfig, sizeof fig - (size_t)nfig, "host cores=%d\n", probe.cores);
  FILE *f = (mkdirs_for(path), fopen(path, "w"));
  if (f) {
    fputs(fig, f);
    fclose(f);
  }
  if (machine_parse(m, n, fig, path)) { /* (cannot fail on its own text; the unrounded figures then) */
    err_clear();
    memset(m, 0, sizeof *m);
    for (int s = 0; s < n; s++) m->dev[s] = probe.dev[0], m->link[s] = probe.link[0];
    m->nranks = n;
    m->memcpy_bw = probe.memcpy_bw;
    m->cores = probe.cores;
  }
  m->source = pool_printf(pool, "probe of this machine (now%s), cached in %s", mpi ? ", MPI link measured" : ", link estimated", path);
  return 0;
}
