/* emit.c - writing the generated directory: each stage's source (its spec,
 * spec.c, printed by the target's renderer, render.h), weights, the
 * manifest, model.onnx, the Makefile and run.sh. */
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctext.h"
#include "onnx_load.h"
#include "outdir.h"
#include "render.h"
#include "rtpath.h"
#include "templates.h"


/* s as one word of a bash script: single-quoted, each ' as '\''. */
static void shell_word(Buf *o, const char *s) {
  buf_printf(o, "'");
  for (; *s; s++)
    if (*s == '\'') buf_printf(o, "'\\''");
    else buf_printf(o, "%c", *s);
  buf_printf(o, "'");
}

/* Path of `to` relative to directory `from` (both made absolute). */
static void relpath(const char *from, const char *to, char *out, size_t len) {
  char a[PATH_MAX], b[PATH_MAX];
  if (!realpath(from, a) || !realpath(to, b)) {
    size_t k = strlen(to) < len - 1 ? strlen(to) : len - 1;
    memcpy(out, to, k);
    out[k] = 0;
    return;
  }
  size_t i = 0, common = 0;
  while (a[i] && a[i] == b[i]) {
    if (a[i] == '/') common = i;
    i++;
  }
  if (!a[i] && (b[i] == '/' || !b[i])) common = i;
  else if (!b[i] && a[i] == '/') common = i;
  out[0] = 0;
  for (const char *p = a + common; *p; p++)
    if (*p == '/') strncat(out, "../", len - strlen(out) - 1);
  const char *rest = b + common + (b[common] == '/');
  strncat(out, *rest ? rest : ".", len - strlen(out) - 1);
}

/* The renderer of the plan's target (args.c accepts only targets render.c has). */
static const Renderer *target_renderer(const Plan *p) {
  const Renderer *r = renderer_for(p->opt.target ? p->opt.target : "cpu");
  return r ? r : &RENDER_C;
}

/* What the Makefile and run.sh name outside DIR. */
typedef struct OutPaths {
  char parent[PATH_MAX];       /* DIR's parent, which the relative paths start from */
  char runtime[PATH_MAX + 8];  /* the Makefile's PIPERUN */
  const char *gen;             /* its PIPECC_GEN: where onnx.pb-c.h is */
  const char *prebuilt;        /* its lines that link an installed runtime's library ("" for a checkout's) */
} OutPaths;

/* A checkout's runtime and pipecc are named relative to DIR's parent, so that the tree (generated/
 * beside runtime/) moves as a whole and its text does not depend on where it was checked out; an
 * installed one by its absolute path, which stays put wherever DIR goes.  -1 with err_set. */
static int out_paths(const Plan *p, const OutDir *d, OutPaths *o, Buf *bin) {
  RtPath rt;
  if (rtpath_find(target_renderer(p)->target, &rt)) return -1;
  /* The final directory does not exist yet: resolve against its parent. */
  snprintf(o->parent, sizeof o->parent, "%s", d->final);
  char *slash = strrchr(o->parent, '/');
  if (slash) *slash = 0;
  else strcpy(o->parent, ".");
  char rel[PATH_MAX];
  if (rt.installed) {
    snprintf(o->runtime, sizeof o->runtime, "%s", rt.dir);
    o->gen = "$(PIPERUN)";
    o->prebuilt = "# An installed runtime (pipecc's make install): the library built there replaces the objects above, and\n"
                  "# this file checks that this machine still gives the flags it was built with.\n"
                  "include $(PIPERUN)/prebuilt-$(DEVICE).mk";
    shell_word(bin, rt.exe[0] ? rt.exe : "pipecc"); /* no /proc/self/exe: the one on PATH */
  } else {
    relpath(o->parent, rt.dir, rel, sizeof rel);
    snprintf(o->runtime, sizeof o->runtime, "../%s", rel);
    o->gen = "$(PIPERUN)/../build/gen";
    o->prebuilt = "";
    relpath(o->parent, rt.exe[0] ? rt.exe : "pipecc", rel, sizeof rel);
    buf_printf(bin, "\"$here/../\"");
    shell_word(bin, rel);
  }
  /* make passes PIPERUN to the shell unquoted (and '%' is its pattern
   * character): a space or a shell character in the path from the output to
   * the runtime would split it or run as a command.  The Makefile names no
   * other path outside DIR, so DIR's own path may hold anything. */
  for (const unsigned char *c = (const unsigned char *)o->runtime; *c; c++)
    if (!(isalnum(*c) || strchr("/._+-", *c) || *c >= 0x80))
      return err_set("-o %s: the generated Makefile reaches pipecc's runtime by the path %s, and '%c' in it would "
                     "break make's commands; install pipecc (or set PIPECC_RUNTIME) where the path has no spaces or "
                     "shell characters", d->final, o->runtime, *c);
  return 0;
}

void emit_stage(const Plan *p, const StageProg *progs, int s, Buf *o) {
  const Renderer *r = target_renderer(p);
  if (p->specs && (progs == p->progs || progs == p->rprogs)) {
    r->stage(&p->specs[s], o);
    return;
  }
  Pool pool = {0};
  StageSpec spec;
  spec_build(p, progs, s, &spec, &pool);
  r->stage(&spec, o);
  pool_free(&pool);
}

/* The Makefile and run.sh: the templates filled with the plan's stages and the paths outside DIR. */
static int emit_scripts(const Plan *p, const StageProg *progs, OutDir *d) {
  int n = opt_ranks(&p->opt);
  Buf bin = {0};
  OutPaths op;
  if (out_paths(p, d, &op, &bin)) return buf_free(&bin), -1;
  /* The model's path goes into comments of run.sh and the Makefile: one line, escaped. */
  Buf model = {0};
  put_comment(&model, p->g.path);
  Buf stages = {0}, mpmd = {0}, large = {0};
  buf_printf(&large, "%s", "");
  for (int s = 0; s < n; s++) {
    buf_printf(&stages, " stage_%d", s);
    if (progs[s].arena_bytes >= (int64_t)1 << 30) buf_printf(&large, " stage_%d", s); /* the Makefile's LARGE_STAGES */
  }
  /* --replicas R: world rank k x n + s runs stage s of replica k (runtime/replica.c). */
  for (int k = 0; k < (p->opt.replicas > 1 ? p->opt.replicas : 1); k++)
    for (int s = 0; s < n; s++) buf_printf(&mpmd, " %s-n 1 \"$here/stage_%d\" ${prog[@]+\"${prog[@]}\"}", k || s ? ": " : "", s);
  char nst[16];
  snprintf(nst, sizeof nst, "%d", n);
  /* For a freeze event's re-plan: the directory pipecc ran in (relative to DIR, so that the directory
   * can move with its tree) and its flags, each as one shell word. */
  Buf args = {0}, cwd = {0};
  char here[PATH_MAX], r2[PATH_MAX];
  relpath(op.parent, getcwd(here, sizeof here) ? here : ".", r2, sizeof r2);
  shell_word(&cwd, r2);
  buf_printf(&args, "%s", "");
  for (int i = 0; i < p->opt.nargs; i++) {
    if (i) buf_printf(&args, " ");
    shell_word(&args, p->opt.args[i]);
  }
  const char *keys[] = {"NSTAGES", "MODEL", "RUNTIME", "STAGE_LIST", "MPMD", "PIPECC_BIN", "PIPECC_ARGS", "PLAN_CWD", "THREADS", "DEVICE",
                        "LARGE_STAGES", "PIPECC_GEN", "PREBUILT"};
  char threads[16];
  snprintf(threads, sizeof threads, "%d", p->opt.threads > 1 ? p->opt.threads : 1);
  const char *vals[] = {nst, model.s, op.runtime, stages.s, mpmd.s, bin.s, args.s, cwd.s, threads, target_renderer(p)->target, large.s,
                        op.gen, op.prebuilt};
  Buf mk = {0}, sh = {0};
  tmpl_fill(&mk, TMPL_MAKEFILE, keys, vals, 13);
  tmpl_fill(&sh, TMPL_RUN_SH, keys, vals, 13);
  int rc = outdir_write(d, "Makefile", mk.s, mk.len) || outdir_write(d, "run.sh", sh.s, sh.len) ? -1 : 0;
  buf_free(&mk), buf_free(&sh), buf_free(&stages), buf_free(&mpmd), buf_free(&model), buf_free(&bin), buf_free(&args), buf_free(&cwd);
  buf_free(&large);
  if (rc) return -1;
  return outdir_chmod(d, "run.sh", 0755);
}

int emit_all(Plan *p, StageProg *progs, OutDir *d) {
  /* One program per rank: with --chunks V, its stages' joined (chunks.c). */
  if (p->rprogs) progs = p->rprogs;
  int n = opt_ranks(&p->opt);
  for (int s = 0; s < n; s++) {
    Buf src = {0};
    emit_stage(p, progs, s, &src);
    char name[64];
    snprintf(name, sizeof name, target_renderer(p)->stage_file, s);
    int rc = outdir_write(d, name, src.s, src.len);
    buf_free(&src);
    if (rc) return -1;
    /* Weights: the stage's parameters, in order, as raw float32. */
    char *w = calloc(1, (size_t)progs[s].weights_bytes + 1);
    for (int i = 0; i < progs[s].nbufs; i++) {
      const Buffer *b = &progs[s].bufs[i];
      if (b->kind == BUF_PARAM) memcpy(w + b->offset, p->g.t[b->tensor].data, (size_t)b->bytes);
    }
    snprintf(name, sizeof name, "weights/stage_%d.bin", s);
    rc = outdir_write(d, name, w, (size_t)progs[s].weights_bytes);
    free(w);
    if (rc) return -1;
  }
  /* Which stage holds which initializer, for --save. */
  Buf man = {0};
  char *strip = calloc((size_t)p->g.nt + 1, 1); /* the initializers weights/ holds: model.onnx keeps no copy */
  if (!strip) abort();
  buf_printf(&man, "# stage byte_offset float_count initializer (%%XX for a space, '%%', or a byte outside ASCII 0x21..0x7e)\n");
  for (int s = 0; s < n; s++)
    for (int i = 0; i < progs[s].nbufs; i++) {
      const Buffer *b = &progs[s].bufs[i];
      const Tensor *t = b->tensor >= 0 ? &p->g.t[b->tensor] : NULL;
      /* Trained weights and float state that is an initializer (running statistics). */
      if (b->kind == BUF_PARAM && t->is_initializer && t->dtype == DT_FLOAT && p->role[s] != ROLE_BWD)
      {
        buf_printf(&man, "%d %lld %lld ", s, (long long)b->offset, (long long)(b->bytes / 4));
        strip[b->tensor] = 1;
        for (const unsigned char *c = (const unsigned char *)t->name; *c; c++)
          buf_printf(&man, *c <= 0x20 || *c >= 0x7f || *c == '%' ? "%%%02X" : "%c", *c);
        buf_printf(&man, "\n");
      }
    }
  int rc0 = outdir_write(d, "weights/manifest.txt", man.s, man.len);
  buf_free(&man);
  if (rc0) return free(strip), -1;
  /* model.onnx: the graph --save writes the trained model from (with --untie's copies, so that it
   * writes each one back), without the data of what weights/ holds: the weights are on disk once. */
  uint8_t *bytes;
  size_t blen;
  int prc = onnx_pack_model(&p->g, strip, &bytes, &blen);
  free(strip);
  if (prc) return -1;
  int wrc = outdir_write(d, "model.onnx", (const char *)bytes, blen);
  free(bytes);
  if (wrc) return -1;
  return emit_scripts(p, progs, d);
}
