/* kcache.c - the kernel-time cache (kcache.h, docs/cost.md). */
#include "kcache.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "opcost.h"
#include "partition.h"
#include "ops/conv.h"
#include "plan.h"
#include "planq.h"

enum { KC_MAX_FILE = 64 << 20, KC_MAX_LINE = 8192, KC_MAX_KEY = 4096 };

const char *kcache_path(char *buf, size_t len) { return cache_beside("PIPECC_KERNEL_CACHE", "kernels", buf, len); }

/* ---- keys ---- */

typedef struct KB {
  char s[KC_MAX_KEY];
  size_t w;
  int over;
} KB;

static void kb_add(KB *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void kb_add(KB *k, const char *fmt, ...) {
  if (k->over) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(k->s + k->w, sizeof k->s - k->w, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof k->s - k->w) k->over = 1;
  else k->w += (size_t)n;
}

/* A name or string attribute as key text: printable ASCII without the key's separators. */
static void kb_str(KB *k, const char *s) {
  for (const unsigned char *c = (const unsigned char *)(s ? s : ""); *c && !k->over; c++)
    kb_add(k, "%c", *c > 0x20 && *c < 0x7f && !strchr("|,=[]", *c) ? (char)*c : '?');
}

static void kb_tensor(KB *k, const Tensor *t, char flag) {
  kb_str(k, dtype_name(t->dtype));
  kb_add(k, "[");
  for (int d = 0; d < t->rank; d++) kb_add(k, "%s%lld", d ? "," : "", (long long)t->dims[d]);
  kb_add(k, "]%c", flag);
}

static int attr_cmp(const void *a, const void *b) {
  const Attr *x = *(const Attr *const *)a, *y = *(const Attr *const *)b;
  return strcmp(x->name ? x->name : "", y->name ? y->name : "");
}

/* The op (a convolution's with the implementation that runs it: oneDNN's and
 * im2col + GEMM take different times for the same work), its attributes by
 * name, each input's and output's dtype and shape (at the micro-batch size)
 * and role: w a trained weight, f a frozen one, c a constant, g a value that
 * gets a gradient, n one that does not, - absent.  0, or -1 when the key
 * would be longer than KC_MAX_KEY (never cached). */
static int node_key(const Plan *p, const char *need, int node, KB *k) {
  const Graph *g = &p->g;
  const Node *n = &g->n[node];
  k->w = 0, k->over = 0, k->s[0] = 0;
  kb_str(k, n->op);
  const char *impl = conv_cache_key(g, n);
  if (impl) kb_add(k, "@%s", impl);
  const Attr **as = malloc(sizeof(Attr *) * (size_t)(n->nattrs + 1));
  if (!as) abort();
  for (int i = 0; i < n->nattrs; i++) as[i] = &n->attrs[i];
  qsort(as, (size_t)n->nattrs, sizeof *as, attr_cmp);
  for (int i = 0; i < n->nattrs && !k->over; i++) {
    const Attr *a = as[i];
    kb_add(k, "|");
    kb_str(k, a->name);
    kb_add(k, "=");
    switch (a->type) {
    case ATTR_INT: kb_add(k, "%lld", (long long)a->i); break;
    case ATTR_FLOAT: kb_add(k, "%.9g", (double)a->f); break;
    case ATTR_STRING: kb_str(k, a->s); break;
    case ATTR_INTS:
      for (int j = 0; j < a->n; j++) kb_add(k, "%s%lld", j ? "," : "", (long long)a->ints[j]);
      break;
    case ATTR_FLOATS:
      for (int j = 0; j < a->n; j++) kb_add(k, "%s%.9g", j ? "," : "", (double)a->floats[j]);
      break;
    case ATTR_STRINGS:
      for (int j = 0; j < a->n; j++) {
        if (j) kb_add(k, ",");
        kb_str(k, a->strs[j]);
      }
      break;
    case ATTR_TENSOR:
      if (a->tensor >= 0 && a->tensor < g->nt) kb_tensor(k, &g->t[a->tensor], 'c');
      break;
    default: kb_add(k, "?%d", a->type);
    }
  }
  free(as);
  kb_add(k, "|in=");
  for (int q = 0; q < n->nin; q++) {
    if (q) kb_add(k, ",");
    int t = n->in[q];
    if (t < 0) {
      kb_add(k, "-");
      continue;
    }
    const Tensor *x = &g->t[t];
    char flag = x->is_param ? (need[t] ? 'w' : 'f') : x->data || x->is_initializer ? 'c' : need[t] ? 'g' : 'n';
    kb_tensor(k, x, flag);
  }
  kb_add(k, "|out=");
  for (int q = 0; q < n->nout; q++) {
    if (q) kb_add(k, ",");
    int t = n->out[q];
    if (t < 0) kb_add(k, "-");
    else kb_tensor(k, &g->t[t], need[t] ? 'g' : 'n');
  }
  return k->over ? -1 : 0;
}

/* The actions' relative spread on this machine (a profile's `jitter`): the latest measured. */
#define JITTER_KEY "jitter"

/* The loader's, the loss's and the optimizer's keys: what their work depends on. */
enum { AUX_LOAD, AUX_LOSS, AUX_UPDATE, NAUX };
static int aux_key(const Plan *p, int which, KB *k) {
  const Graph *g = &p->g;
  k->w = 0, k->over = 0, k->s[0] = 0;
  if (which == AUX_UPDATE) {
    kb_add(k, "update|optimizer=");
    kb_str(k, p->opt.optimizer ? p->opt.optimizer : "sgd");
    kb_add(k, "|slots=%d", (int)p->opt_slots);
    return k->over ? -1 : 0;
  }
  kb_add(k, which == AUX_LOAD ? "load|in=" : p->opt.loss_mse ? "loss|mse|out=" : "loss|xent|out=");
  int first = 1;
  for (int t = 0; t < g->nt; t++)
    if (which == AUX_LOAD ? g->t[t].is_input : g->t[t].is_output) {
      if (!first) kb_add(k, ",");
      kb_tensor(k, &g->t[t], 'n');
      first = 0;
    }
  return k->over ? -1 : 0;
}

/* ---- the file ---- */

typedef struct Entry {
  char *key;
  double t[3];
  int order; /* line order: the later of two equal keys wins */
} Entry;

typedef struct Cache {
  Entry *e;
  int n, cap;
  char **other; /* other machines' sections, line by line as read */
  int nother, ocap;
  int seq;      /* entries put so far: their order */
  int usable;   /* the header was read (or the file is absent): entries may be merged into it */
  int bad, bad_line;
  char bad_why[160];
} Cache;

static void cache_free(Cache *c) {
  for (int i = 0; i < c->n; i++) free(c->e[i].key);
  for (int i = 0; i < c->nother; i++) free(c->other[i]);
  free(c->e), free(c->other);
  memset(c, 0, sizeof *c);
}

static char *xstrdup(const char *s) {
  char *d = strdup(s);
  if (!d) abort();
  return d;
}

static void cache_put(Cache *c, const char *key, const double t[3]) {
  if (c->n == c->cap) {
    c->cap = c->cap ? 2 * c->cap : 64;
    c->e = realloc(c->e, sizeof *c->e * (size_t)c->cap);
    if (!c->e) abort();
  }
  c->e[c->n] = (Entry){xstrdup(key), {t[0], t[1], t[2]}, c->seq++};
  c->n++;
}

static void other_put(Cache *c, const char *line) {
  if (c->nother == c->ocap) {
    c->ocap = c->ocap ? 2 * c->ocap : 64;
    c->other = realloc(c->other, sizeof *c->other * (size_t)c->ocap);
    if (!c->other) abort();
  }
  c->other[c->nother++] = xstrdup(line);
}

static void bad(Cache *c, int line, const char *why) {
  if (!c->bad++) c->bad_line = line, snprintf(c->bad_why, sizeof c->bad_why, "%s", why);
}

/* A finite, non-negative number filling the whole token. */
static int number(const char *s, double *x) {
  char *end;
  errno = 0;
  *x = strtod(s, &end);
  return end == s || *end || errno || !isfinite(*x) || *x < 0 ? -1 : 0;
}

static int entry_cmp(const void *a, const void *b) {
  const Entry *x = a, *y = b;
  int r = strcmp(x->key, y->key);
  return r ? r : (x->order > y->order) - (x->order < y->order);
}

/* Sorted by key, the last of equal keys kept. */
static void cache_sort(Cache *c) {
  if (c->n < 2) return; /* (qsort of a NULL array is undefined even for 0 entries) */
  qsort(c->e, (size_t)c->n, sizeof *c->e, entry_cmp);
  int w = 0;
  for (int i = 0; i < c->n; i++) {
    if (i + 1 < c->n && !strcmp(c->e[i].key, c->e[i + 1].key)) {
      free(c->e[i].key);
      continue;
    }
    c->e[w++] = c->e[i];
  }
  c->n = w;
}

static const Entry *cache_find(const Cache *c, const char *key) {
  int lo = 0, hi = c->n;
  while (lo < hi) {
    int mid = (lo + hi) / 2, r = strcmp(c->e[mid].key, key);
    if (!r) return &c->e[mid];
    if (r < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}

/* Reads path: this machine's (id) entries into c->e, other sections' lines
 * into c->other.  A missing file is an empty cache. */
static void cache_load(Cache *c, const char *path, const char *id) {
  memset(c, 0, sizeof *c);
  struct stat st;
  if (stat(path, &st)) {
    c->usable = errno == ENOENT;
    if (!c->usable) bad(c, 0, strerror(errno));
    return;
  }
  FILE *f = NULL;
  if (!S_ISREG(st.st_mode)) bad(c, 0, "not a regular file");
  else if (st.st_size > KC_MAX_FILE) bad(c, 0, "over 64 MiB");
  else if (!(f = fopen(path, "rb"))) bad(c, 0, strerror(errno));
  if (!f) return;
  char *text = malloc((size_t)st.st_size + 1);
  if (!text) abort();
  size_t got = fread(text, 1, (size_t)st.st_size, f);
  fclose(f);
  text[got] = 0;
  int lineno = 0, header = 0, mine = 0, section = 0;
  for (size_t at = 0; at < got;) {
    char *line = text + at;
    char *nl = memchr(line, '\n', got - at);
    size_t len = nl ? (size_t)(nl - line) : got - at;
    at += len + 1;
    lineno++;
    line[len] = 0;
    if (len && line[len - 1] == '\r') line[--len] = 0;
    if (len > KC_MAX_LINE) {
      bad(c, lineno, "line longer than 8192 bytes");
      continue;
    }
    int text_ok = strlen(line) == len;
    for (size_t i = 0; i < len && text_ok; i++) text_ok = (unsigned char)line[i] >= 0x20 && (unsigned char)line[i] < 0x7f;
    if (!text_ok) {
      bad(c, lineno, "a byte that is not printable ASCII");
      if (!header) break;
      continue;
    }
    char *s = line + strspn(line, " ");
    if (!*s || *s == '#') continue;
    if (!header) {
      if (strcmp(s, "pipecc-kernels 1")) {
        bad(c, lineno, strncmp(s, "pipecc-kernels ", 15) ? "not a pipecc kernel cache" : "another format version (this pipecc reads 1)");
        break;
      }
      header = 1;
      continue;
    }
    if (!strncmp(s, "machine ", 8)) {
      const char *m = s + 8;
      if (!*m || strchr(m, ' ')) {
        bad(c, lineno, "a machine line takes one identity");
        section = 0, mine = 0;
        continue;
      }
      section = 1, mine = !strcmp(m, id);
      if (!mine) other_put(c, s);
      continue;
    }
    if (!section) {
      bad(c, lineno, "an entry before any 'machine' line");
      continue;
    }
    if (!mine) {
      if (!strncmp(s, "k ", 2)) other_put(c, s);
      else bad(c, lineno, "unknown entry (expected 'machine ID' or 'k FWD BWD_INPUT BWD_WEIGHT KEY')");
      continue;
    }
    char *tok[5], *q = s;
    int nt = 0;
    while (nt < 5) {
      while (*q == ' ') q++;
      if (!*q) break;
      tok[nt++] = q;
      if (nt == 5) break;
      while (*q && *q != ' ') q++;
      if (*q) *q++ = 0;
    }
    double t[3];
    if (nt < 5 || strcmp(tok[0], "k") || number(tok[1], &t[0]) || number(tok[2], &t[1]) || number(tok[3], &t[2]) || strchr(tok[4], ' ') ||
        strlen(tok[4]) >= KC_MAX_KEY) {
      bad(c, lineno, "expected 'k FWD BWD_INPUT BWD_WEIGHT KEY' (three non-negative numbers, a key without spaces)");
      continue;
    }
    if (t[0] > 1e6 || t[1] > 1e6 || t[2] > 1e6) {
      bad(c, lineno, "a time over 10^6 s");
      continue;
    }
    cache_put(c, tok[4], t);
  }
  free(text);
  if (!header) {
    if (!c->bad) bad(c, lineno, "not a pipecc kernel cache (it is empty)");
    for (int i = 0; i < c->n; i++) free(c->e[i].key);
    c->n = 0;
    return;
  }
  c->usable = 1;
  cache_sort(c);
}

/* Printable, for a message. */
static void shown(const char *s, char *out, size_t len) {
  size_t i = 0;
  for (; s[i] && i + 1 < len; i++) out[i] = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f ? s[i] : '?';
  out[i] = 0;
}

static void warn_bad(const Cache *c, const char *path, const char *then) {
  if (!c->bad) return;
  char p[1024];
  shown(path, p, sizeof p);
  if (c->bad_line)
    fprintf(stderr, "pipecc: warning: kernel cache %s:%d: %s; %d bad line%s ignored%s\n", p, c->bad_line, c->bad_why, c->bad,
            c->bad == 1 ? "" : "s", then);
  else
    fprintf(stderr, "pipecc: warning: kernel cache %s: %s; %s\n", p, c->bad_why, c->usable ? "ignored" : "not used");
}

/* ---- using it ---- */

/* The cache section of p's plans: the machine's identity, and the threads per rank when more than one
 * (times at T threads are other times).  *flops: the rate the plan takes for that machine (driver.c
 * scales the probe's by T).  NULL when there is no cached probe. */
static const char *section_id(const Plan *p, Pool *pool, double *flops) {
  const char *id = machine_identity(pool, flops);
  int t = p->opt.threads;
  if (!id || t <= 1) return id;
  *flops *= t;
  return pool_printf(pool, "%s;threads=%d", id, t);
}

void kcache_flop_node(const PartProblem *pr, int q, double rate, double mbw, double *fwd, double *bwd_input, double *bwd_weight) {
  double b = pr->bwd_flops[q] / rate + 2 * pr->traffic[q] / mbw;
  *fwd = pr->fwd_flops[q] / rate + pr->traffic[q] / mbw;
  *bwd_input = b / 2, *bwd_weight = b / 2;
}

/* The bytes a stage's step cycles through between two uses of a weight, for the memory's rate that the
 * op probe's times are held to: weights, gradients and optimizer slots, and the activations of the
 * micro-batches in flight, of the whole model shared among the stages (node costs are found before the
 * cuts; the partitioner balances the stages). */
static double stage_working_set(const Plan *p, const PartProblem *pr) {
  double params = 0, stash = 0;
  for (int q = 0; q < pr->N; q++) params += pr->param_bytes[q], stash += pr->stash_bytes[q];
  int n = pr->nstages > 0 ? pr->nstages : 1, inflight = pr->microbatches < n ? pr->microbatches : n;
  return (params * (2 + p->opt_slots) + stash * inflight) / n;
}

void kcache_apply(Plan *p, PartProblem *pr) {
  const Options *o = &p->opt;
  if (o->costs || o->devices || o->forward_only) return;
  char buf[1024];
  const char *path = kcache_path(buf, sizeof buf);
  const OpTable *ops = opcost_table(p); /* the op probe's grid: nodes the cache does not have */
  Graph *g = &p->g;
  double flops;
  const char *id = path ? section_id(p, &g->pool, &flops) : NULL;
  Cache c;
  memset(&c, 0, sizeof c);
  if (id) {
    cache_load(&c, path, id);
    warn_bad(&c, path, " (their nodes are costed from FLOPs)");
  }
  if (!c.n && !ops) {
    cache_free(&c);
    return;
  }
  const char *need = plan_needs(p);
  double ws = ops ? stage_working_set(p, pr) : 0;
  int N = p->N, hits = 0, probed = 0;
  Costs *k = pool_alloc(&g->pool, sizeof *k);
  k->fwd = pool_alloc(&g->pool, sizeof(double) * (size_t)(N + 1));
  k->bwd_input = pool_alloc(&g->pool, sizeof(double) * (size_t)(N + 1));
  k->bwd_weight = pool_alloc(&g->pool, sizeof(double) * (size_t)(N + 1));
  k->src = pool_alloc(&g->pool, (size_t)(N + 1));
  const Machine *m = &p->machine;
  double rate = m->dev[0].flops, mbw = m->memcpy_bw;
  KB *key = malloc(sizeof *key);
  if (!key) abort();
  for (int q = 0; q < N; q++) {
    const Entry *e = !c.n || node_key(p, need, p->node[q], key) ? NULL : cache_find(&c, key->s);
    double t[3];
    if (e) {
      k->fwd[q] = e->t[0], k->bwd_input[q] = e->t[1], k->bwd_weight[q] = e->t[2], k->src[q] = 1, hits++;
    } else if (ops && !opcost_node(ops, g, need, p->node[q], ws, t)) {
      k->fwd[q] = t[0], k->bwd_input[q] = t[1], k->bwd_weight[q] = t[2], k->src[q] = 2, probed++;
    } else {
      kcache_flop_node(pr, q, rate, mbw, &k->fwd[q], &k->bwd_input[q], &k->bwd_weight[q]);
    }
  }
  if (!hits && !probed) {
    free(key);
    cache_free(&c);
    return;
  }
  const Entry *aux[NAUX];
  for (int a = 0; a < NAUX; a++) aux[a] = aux_key(p, a, key) ? NULL : cache_find(&c, key->s), k->aux += aux[a] != NULL;
  free(key);
  /* The cache's (a profile's), else the op probe's, else the FLOP model's: the loader and the loss nothing,
   * the update its weight, gradient and each slot read, weight and slots written. */
  double upd = ops && !aux[AUX_UPDATE] ? opcost_update(ops, p, ws) : -1, loss = ops && !aux[AUX_LOSS] ? opcost_loss(ops, p) : -1;
  k->load = aux[AUX_LOAD] ? aux[AUX_LOAD]->t[0] : 0;
  k->loss = aux[AUX_LOSS] ? aux[AUX_LOSS]->t[0] : loss > 0 ? loss : 0;
  k->update_per_param = aux[AUX_UPDATE] ? aux[AUX_UPDATE]->t[0] : upd > 0 ? upd : (3 + 2 * (double)p->opt_slots) * 4 / mbw;
  k->aux_probed = (upd > 0) + (loss > 0);
  const Entry *jit = cache_find(&c, JITTER_KEY);
  k->jitter = jit ? jit->t[0] : 0;
  k->rate = rate, k->profile_mb = p->mb_size;
  k->ncached = hits, k->cache_path = path ? pool_strdup(&g->pool, path) : NULL;
  k->nprobed = probed, k->ops_path = ops ? pool_strdup(&g->pool, opcost_source(ops, NULL)) : NULL;
  cache_free(&c);
  p->costs = k;
  pr->fwd_s = k->fwd, pr->bwdi_s = k->bwd_input, pr->bwdw_s = k->bwd_weight;
  pr->time_rate = k->rate, pr->load_s = k->load, pr->loss_s = k->loss, pr->update_per_byte = k->update_per_param / 4;
}

/* ---- filling it ---- */

static void mkdirs_for(const char *path) {
  char tmp[1024];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *s = tmp + 1; *s; s++)
    if (*s == '/') {
      *s = 0;
      mkdir(tmp, 0755);
      *s = '/';
    }
}

static int cache_write(const Cache *c, const char *path, const char *id) {
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return -1;
  fprintf(f, "pipecc-kernels 1\n# pipecc's kernel-time cache (docs/cost.md): seconds per micro-batch of each node's forward,\n"
             "# backward input-gradient and weight-gradient parts, keyed by op, attributes, dtypes and shapes;\n"
             "# one section per machine (its probe's identity).  Filled by pipecc --costs and pipecc-probe --kernels.\n");
  for (int i = 0; i < c->nother; i++) fprintf(f, "%s\n", c->other[i]);
  fprintf(f, "machine %s\n", id);
  for (int i = 0; i < c->n; i++) fprintf(f, "k %.17g %.17g %.17g %s\n", c->e[i].t[0], c->e[i].t[1], c->e[i].t[2], c->e[i].key);
  int rc = ferror(f) ? -1 : 0;
  if (fflush(f) || fsync(fileno(f))) rc = -1;
  if (fclose(f)) rc = -1;
  if (!rc && rename(tmp, path)) rc = -1;
  if (rc) unlink(tmp);
  return rc;
}

void kcache_merge(Plan *p, Costs *c) {
  Graph *g = &p->g;
  char buf[1024];
  const char *path = kcache_path(buf, sizeof buf);
  double flops = 0;
  const char *id = path ? section_id(p, &g->pool, &flops) : NULL;
  int threads = p->opt.threads > 1 ? p->opt.threads : 1, measured = c->threads > 1 ? c->threads : 1;
  if (!path) c->merge_note = "the kernel cache is off (PIPECC_KERNEL_CACHE=off)";
  else if (p->opt.forward_only) c->merge_note = "a --forward-only plan has no backward to key";
  else if (c->profile_mb != p->mb_size)
    c->merge_note = pool_printf(&g->pool, "measured at micro-batch %lld, not the plan's %lld", (long long)c->profile_mb, (long long)p->mb_size);
  else if (!id) c->merge_note = "this machine has no cached probe (plan once without --devices)";
  else if (measured != threads)
    c->merge_note = pool_printf(&g->pool, "measured on %d thread%s per rank, not the plan's %d (--threads)", measured, measured == 1 ? "" : "s", threads);
  else if (c->rate / flops > 2 || c->rate / flops < 0.5) /* re-probes under load here measured 128-168 GFLOP/s within minutes */
    c->merge_note = pool_printf(&g->pool, "planned for %.1f GFLOP/s, not this machine's probed %.1f (taken elsewhere, or with --devices)",
                                c->rate / 1e9, flops / 1e9);
  if (c->merge_note) return;
  c->cache_path = pool_strdup(&g->pool, path);
  mkdirs_for(path);
  char lock[1100];
  snprintf(lock, sizeof lock, "%s.lock", path);
  int lfd = open(lock, O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lfd >= 0) flock(lfd, LOCK_EX);
  Cache cache;
  cache_load(&cache, path, id);
  warn_bad(&cache, path, cache.usable ? " (the merge drops them)" : "");
  if (!cache.usable) {
    c->merge_note = "the cache file is not a pipecc kernel cache (left as it is)";
  } else {
    const char *need = plan_needs(p);
    KB *key = malloc(sizeof *key);
    if (!key) abort();
    /* Seconds on this machine, as measured (not scaled by a re-probe's rate). */
    double k = 1;
    Cache add;
    memset(&add, 0, sizeof add);
    for (int q = 0; q < p->N; q++)
      if (!(c->conv_mismatch && conv_by_impl(g, &g->n[p->node[q]])) && !node_key(p, need, p->node[q], key))
        cache_put(&add, key->s, (double[3]){c->fwd[q] * k, c->bwd_input[q] * k, c->bwd_weight[q] * k}), c->merged++;
    double aux[NAUX] = {c->load * k, c->loss * k, c->update_per_param * k};
    for (int a = 0; a < NAUX; a++)
      if (!aux_key(p, a, key) && (a != AUX_UPDATE || p->params > 0)) cache_put(&add, key->s, (double[3]){aux[a], 0, 0});
    if (c->jitter > 0) cache_put(&add, JITTER_KEY, (double[3]){c->jitter, 0, 0});
    free(key);
    /* Nodes of one shape (a transformer's blocks): their mean, which replaces the cache's. */
    if (add.n > 1) qsort(add.e, (size_t)add.n, sizeof *add.e, entry_cmp);
    for (int i = 0, j; i < add.n; i = j) {
      double t[3] = {0, 0, 0};
      for (j = i; j < add.n && !strcmp(add.e[j].key, add.e[i].key); j++)
        for (int x = 0; x < 3; x++) t[x] += add.e[j].t[x];
      for (int x = 0; x < 3; x++) t[x] /= j - i;
      cache_put(&cache, add.e[i].key, t);
    }
    cache_free(&add);
    cache_sort(&cache);
    if (cache_write(&cache, path, id)) {
      c->merge_note = pool_printf(&g->pool, "cannot write it: %s", strerror(errno));
      c->merged = 0;
    }
  }
  cache_free(&cache);
  if (lfd >= 0) close(lfd); /* releases the lock */
}
