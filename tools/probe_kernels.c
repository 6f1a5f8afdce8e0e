/* probe_kernels.c - pipecc-probe --kernels: fills pipecc's kernel-time cache.
 *
 *   pipecc-probe --kernels MODEL.onnx [-n N] [--steps S] [--runs R] [--data PATH] [--keep DIR] [pipecc flags...]
 *
 * Times pipecc's own kernels at the shapes of MODEL's plan: compiles a
 * --profile build (pipecc -n N, N = this machine's cores by default: the
 * times are then taken with every core busy, as the pipelines that use them
 * run; docs/cost.md), builds it with make, trains it S steps on synthetic
 * data (bin/piperun-data: MNIST, CIFAR-10 or tokens, whichever the model
 * accepts) with run.sh --profile R times, keeps the fastest run's profile
 * (on a shared machine a whole run can be 20-50% slow: the medians inside
 * one run do not see that), and plans it once with --costs, which
 * merges every node's time into the cache under its shape key (kcache.c).
 * The pipecc flags (--batch, --microbatches, --optimizer, --frozen ...) are
 * those of the plans that should use the times: the key holds the
 * micro-batch's shapes.  Runs outside MPI (mpirun is its child). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int probe_kernels(int argc, char **argv);

static char bindir[4096];

/* Runs argv; stdout to /dev/null unless show; the exit status (-1: could not run). */
static int run(char *const *argv, int show) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (!pid) {
    if (!show) {
      int fd = open("/dev/null", O_WRONLY);
      if (fd >= 0) dup2(fd, 1), close(fd);
    }
    execvp(argv[0], argv);
    fprintf(stderr, "pipecc-probe: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *tool(const char *name) {
  static char buf[4][4200];
  static int i;
  char *b = buf[i++ % 4];
  snprintf(b, sizeof buf[0], "%s/%s", bindir, name);
  return b;
}

static void rm_rf(const char *dir) {
  char *argv[] = {"rm", "-rf", (char *)dir, NULL};
  run(argv, 0);
}

/* A profile's seconds: every node's three parts, the loader, the loss and
 * the updates, summed over its ranks' lines (to rank runs of one build);
 * a negative value if it cannot be read. */
static double profile_total(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[8192];
  double t = 0, a, b, c;
  long long k;
  while (fgets(line, sizeof line, f)) {
    char op[256];
    if (sscanf(line, "node %lld %255s %lf %lf %lf", &k, op, &a, &b, &c) == 5) t += a + b + c;
    else if (sscanf(line, "load %lf", &a) == 1 || sscanf(line, "loss %lf", &a) == 1) t += a;
    else if (sscanf(line, "update %lld %lf", &k, &a) == 2) t += a;
  }
  fclose(f);
  return t;
}

static int usage(void) {
  fprintf(stderr, "usage: pipecc-probe --kernels MODEL.onnx [-n N] [--steps S] [--runs R] [--data PATH] [--keep DIR] [pipecc flags: --batch B "
                  "--microbatches M ...]\n");
  return 2;
}

/* One --kernels run: its flags and the files it works in. */
typedef struct Probe {
  const char *model, *data, *keep, *steps;
  int runs, n, nextra;
  char **extra, **cmd;
  char dir[4096], pipe_dir[4200], prof[4200], merge_dir[4200], nbuf[16], runsh[4300], dpath[4300];
} Probe;

/* The flags after the model; -1 to go on, else the exit status. */
static int probe_args(Probe *p, int argc, char **argv) {
  for (int i = 3; i < argc; i++) {
    const char *a = argv[i];
    if ((!strcmp(a, "-n") || !strcmp(a, "--steps") || !strcmp(a, "--runs") || !strcmp(a, "--data") || !strcmp(a, "--keep")) && i + 1 >= argc) {
      fprintf(stderr, "pipecc-probe: %s needs a value\n", a);
      return 2;
    }
    char *end;
    if (!strcmp(a, "-n")) {
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 1024) return fprintf(stderr, "pipecc-probe: bad -n '%s'\n", argv[i]), 2;
      p->n = (int)v;
    } else if (!strcmp(a, "--steps")) {
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 2 || v > 100000) return fprintf(stderr, "pipecc-probe: --steps takes 2 or more (the first quarter only warms up)\n"), 2;
      p->steps = argv[i];
    } else if (!strcmp(a, "--runs")) {
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 100) return fprintf(stderr, "pipecc-probe: --runs takes 1 to 100, not '%s'\n", argv[i]), 2;
      p->runs = (int)v;
    } else if (!strcmp(a, "--data")) {
      p->data = argv[++i];
    } else if (!strcmp(a, "--keep")) {
      p->keep = argv[++i];
    } else if (!strcmp(a, "-o") || !strcmp(a, "--devices") || !strcmp(a, "--costs") || !strcmp(a, "--profile") ||
               !strcmp(a, "--plan-only") || !strcmp(a, "--forward-only") || !strcmp(a, "--listing")) {
      fprintf(stderr, "pipecc-probe: %s is not for --kernels (it times this machine's kernels for a plan of this machine)\n", a);
      return 2;
    } else {
      p->extra[p->nextra++] = argv[i];
    }
  }
  return -1;
}

/* The working directory (--keep's, or a temporary one) and the paths in it; 0, or 1. */
static int probe_dir(Probe *p) {
  char tmpl[] = "/tmp/pipecc-kernels.XXXXXX";
  if (p->keep) {
    if (mkdir(p->keep, 0755) && errno != EEXIST) return fprintf(stderr, "pipecc-probe: --keep %s: %s\n", p->keep, strerror(errno)), 1;
    snprintf(p->dir, sizeof p->dir, "%s", p->keep);
  } else {
    const char *t = mkdtemp(tmpl);
    if (!t) return fprintf(stderr, "pipecc-probe: cannot make a temporary directory: %s\n", strerror(errno)), 1;
    snprintf(p->dir, sizeof p->dir, "%s", t);
  }
  snprintf(p->pipe_dir, sizeof p->pipe_dir, "%s/profile.pipe", p->dir);
  snprintf(p->prof, sizeof p->prof, "%s/kernels.profile", p->dir);
  snprintf(p->merge_dir, sizeof p->merge_dir, "%s/merge.pipe", p->dir);
  snprintf(p->runsh, sizeof p->runsh, "%s/run.sh", p->pipe_dir);
  return 0;
}

/* pipecc MODEL -n N FLAGS TAIL... into p->cmd. */
static void pipecc_cmd(Probe *p, const char *const *tail, int ntail) {
  int c = 0;
  snprintf(p->nbuf, sizeof p->nbuf, "%d", p->n);
  p->cmd[c++] = tool("pipecc"), p->cmd[c++] = (char *)p->model, p->cmd[c++] = "-n", p->cmd[c++] = p->nbuf;
  for (int i = 0; i < p->nextra; i++) p->cmd[c++] = p->extra[i];
  for (int i = 0; i < ntail; i++) p->cmd[c++] = (char *)tail[i];
  p->cmd[c] = NULL;
}

/* pipecc MODEL -n N FLAGS --profile -o DIR (at n = 1 if the model has fewer compute nodes than N), and
 * make; 0, or -1 (said). */
static int probe_build(Probe *p) {
  for (int attempt = 0; attempt < 2; attempt++) {
    const char *tail[] = {"--profile", "-o", p->pipe_dir};
    pipecc_cmd(p, tail, 3);
    rm_rf(p->pipe_dir);
    if (!run(p->cmd, 0)) break;
    if (p->n == 1 || attempt) return fprintf(stderr, "pipecc-probe: pipecc could not compile the profile build of %s\n", p->model), -1;
    fprintf(stderr, "pipecc-probe: retrying at -n 1\n");
    p->n = 1;
  }
  char *mk[] = {"make", "-s", "-C", p->pipe_dir, "-j", p->nbuf, NULL};
  if (run(mk, 0)) return fprintf(stderr, "pipecc-probe: the profile build of %s did not build (make -C %s)\n", p->model, p->pipe_dir), -1;
  return 0;
}

/* The first profile: on --data, or on the first synthetic kind the model takes (p->dpath); 0, or -1. */
static int probe_first(Probe *p) {
  static const char *kinds[] = {"mnist", "cifar", "tokens"};
  int trained = 0;
  for (int kd = 0; kd < (p->data ? 1 : 3) && !trained; kd++) {
    if (p->data) {
      snprintf(p->dpath, sizeof p->dpath, "%s", p->data);
    } else {
      snprintf(p->dpath, sizeof p->dpath, "%s/data.%s", p->dir, kinds[kd]);
      char *gen[] = {tool("piperun-data"), (char *)kinds[kd], p->dpath, NULL};
      if (run(gen, 0)) continue;
    }
    char *train[] = {p->runsh, "--data", p->dpath, "--steps", (char *)p->steps, "--quiet", "--profile", p->prof, NULL};
    unlink(p->prof);
    /* A data set that does not fit the model is refused before the first step: the next kind. */
    int saved = dup(2), fd = p->data ? -1 : open("/dev/null", O_WRONLY);
    if (fd >= 0) dup2(fd, 2), close(fd);
    int r = run(train, 0);
    if (saved >= 0) dup2(saved, 2), close(saved);
    trained = !r && access(p->prof, R_OK) == 0;
  }
  if (!trained)
    return fprintf(stderr, "pipecc-probe: the profile build of %s did not train on %s (try --data PATH)\n", p->model,
                   p->data ? p->data : "synthetic MNIST, CIFAR-10 or token data"), -1;
  return 0;
}

/* The other runs, on the data that trained: the fastest profile is kept in p->prof; 0, or -1. */
static int probe_again(Probe *p) {
  char again[4300];
  snprintf(again, sizeof again, "%s.again", p->prof);
  for (int k = 1; k < p->runs; k++) {
    char *train[] = {p->runsh, "--data", p->dpath, "--steps", (char *)p->steps, "--quiet", "--profile", again, NULL};
    unlink(again);
    if (run(train, 0)) return fprintf(stderr, "pipecc-probe: run %d of the profile build of %s failed\n", k + 1, p->model), -1;
    double best = profile_total(p->prof), t = profile_total(again);
    if (t >= 0 && (best < 0 || t < best) && rename(again, p->prof))
      return fprintf(stderr, "pipecc-probe: cannot keep %s: %s\n", again, strerror(errno)), -1;
  }
  return 0;
}

/* pipecc MODEL -n N FLAGS --costs PROFILE --plan-only merges the profile into the cache; its listing says
 * whether it did.  0 merged, 1 not. */
static int probe_merge(Probe *p) {
  const char *tail[] = {"--costs", p->prof, "--plan-only", "-o", p->merge_dir};
  pipecc_cmd(p, tail, 5);
  rm_rf(p->merge_dir);
  if (run(p->cmd, 0)) return fprintf(stderr, "pipecc-probe: pipecc --costs %s failed\n", p->prof), 1;
  char listing[4300], line[8192];
  snprintf(listing, sizeof listing, "%s/schedule.txt", p->merge_dir);
  FILE *f = fopen(listing, "r");
  int merged = 0;
  while (f && fgets(line, sizeof line, f)) {
    char *s = strstr(line, "merged into the kernel cache");
    if (s) {
      merged = !strstr(line, "not merged");
      if (merged) printf("pipecc-probe: %s at -n %d: %s", p->model, p->n, s);
      else fprintf(stderr, "pipecc-probe: %s at -n %d: %s", p->model, p->n, line + strspn(line, " "));
      break;
    }
  }
  if (f) fclose(f);
  if (!merged) fprintf(stderr, "pipecc-probe: the profile was not merged (see %s)\n", listing);
  return merged ? 0 : 1;
}

int probe_kernels(int argc, char **argv) {
  ssize_t len = readlink("/proc/self/exe", bindir, sizeof bindir - 1);
  if (len <= 0) return fprintf(stderr, "pipecc-probe: cannot find its own directory\n"), 1;
  bindir[len] = 0;
  *strrchr(bindir, '/') = 0;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  if (argc < 3) return usage();
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  Probe p = {.model = argv[2], .steps = "16", .runs = 3, .n = cores > 0 && cores <= 64 ? (int)cores : 1};
  p.extra = calloc((size_t)argc + 1, sizeof *p.extra);
  p.cmd = calloc((size_t)argc + 16, sizeof *p.cmd);
  if (!p.extra || !p.cmd) return free(p.extra), free(p.cmd), 1;
  int rc = probe_args(&p, argc, argv);
  if (rc < 0) {
    rc = probe_dir(&p);
    if (!rc) {
      rc = probe_build(&p) || probe_first(&p) || probe_again(&p) ? 1 : probe_merge(&p);
      if (!p.keep) rm_rf(p.dir);
    }
  }
  free(p.cmd), free(p.extra);
  return rc;
}
