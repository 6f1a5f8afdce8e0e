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

int probe_kernels(int argc, char **argv) {
  ssize_t len = readlink("/proc/self/exe", bindir, sizeof bindir - 1);
  if (len <= 0) return fprintf(stderr, "pipecc-probe: cannot find its own directory\n"), 1;
  bindir[len] = 0;
  *strrchr(bindir, '/') = 0;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  if (argc < 3) return usage();
  const char *model = argv[2], *data = NULL, *keep = NULL, *steps = "16";
  int runs = 3;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int n = cores > 0 && cores <= 64 ? (int)cores : 1;
  char **extra = calloc((size_t)argc + 1, sizeof *extra);
  if (!extra) return 1;
  int nextra = 0;
  for (int i = 3; i < argc; i++) {
    const char *a = argv[i];
    if ((!strcmp(a, "-n") || !strcmp(a, "--steps") || !strcmp(a, "--runs") || !strcmp(a, "--data") || !strcmp(a, "--keep")) && i + 1 >= argc) {
      fprintf(stderr, "pipecc-probe: %s needs a value\n", a);
      return 2;
    }
    if (!strcmp(a, "-n")) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 1024) return fprintf(stderr, "pipecc-probe: bad -n '%s'\n", argv[i]), 2;
      n = (int)v;
    } else if (!strcmp(a, "--steps")) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 2 || v > 100000) return fprintf(stderr, "pipecc-probe: --steps takes 2 or more (the first quarter only warms up)\n"), 2;
      steps = argv[i];
    } else if (!strcmp(a, "--runs")) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 100) return fprintf(stderr, "pipecc-probe: --runs takes 1 to 100, not '%s'\n", argv[i]), 2;
      runs = (int)v;
    } else if (!strcmp(a, "--data")) {
      data = argv[++i];
    } else if (!strcmp(a, "--keep")) {
      keep = argv[++i];
    } else if (!strcmp(a, "-o") || !strcmp(a, "--devices") || !strcmp(a, "--costs") || !strcmp(a, "--profile") ||
               !strcmp(a, "--plan-only") || !strcmp(a, "--forward-only") || !strcmp(a, "--listing")) {
      fprintf(stderr, "pipecc-probe: %s is not for --kernels (it times this machine's kernels for a plan of this machine)\n", a);
      return 2;
    } else {
      extra[nextra++] = argv[i];
    }
  }
  char tmpl[] = "/tmp/pipecc-kernels.XXXXXX";
  char dir[4096];
  if (keep) {
    if (mkdir(keep, 0755) && errno != EEXIST) return fprintf(stderr, "pipecc-probe: --keep %s: %s\n", keep, strerror(errno)), 1;
    snprintf(dir, sizeof dir, "%s", keep);
  } else {
    const char *t = mkdtemp(tmpl);
    if (!t) return fprintf(stderr, "pipecc-probe: cannot make a temporary directory: %s\n", strerror(errno)), 1;
    snprintf(dir, sizeof dir, "%s", t);
  }
  char pipe_dir[4200], prof[4200], merge_dir[4200], nbuf[16];
  snprintf(pipe_dir, sizeof pipe_dir, "%s/profile.pipe", dir);
  snprintf(prof, sizeof prof, "%s/kernels.profile", dir);
  snprintf(merge_dir, sizeof merge_dir, "%s/merge.pipe", dir);
  int rc = 1;
  /* pipecc MODEL -n N FLAGS --profile -o DIR (at n = 1 if the model has fewer compute nodes than N). */
  char **cmd = calloc((size_t)nextra + 16, sizeof *cmd);
  if (!cmd) return 1;
  for (int attempt = 0; attempt < 2; attempt++) {
    int c = 0;
    snprintf(nbuf, sizeof nbuf, "%d", n);
    cmd[c++] = tool("pipecc"), cmd[c++] = (char *)model, cmd[c++] = "-n", cmd[c++] = nbuf;
    for (int i = 0; i < nextra; i++) cmd[c++] = extra[i];
    cmd[c++] = "--profile", cmd[c++] = "-o", cmd[c++] = pipe_dir, cmd[c] = NULL;
    rm_rf(pipe_dir);
    if (!run(cmd, 0)) break;
    if (n == 1 || attempt) {
      fprintf(stderr, "pipecc-probe: pipecc could not compile the profile build of %s\n", model);
      goto out;
    }
    fprintf(stderr, "pipecc-probe: retrying at -n 1\n");
    n = 1;
  }
  char *mk[] = {"make", "-s", "-C", pipe_dir, "-j", nbuf, NULL};
  if (run(mk, 0)) {
    fprintf(stderr, "pipecc-probe: the profile build of %s did not build (make -C %s)\n", model, pipe_dir);
    goto out;
  }
  char runsh[4300], dpath[4300];
  snprintf(runsh, sizeof runsh, "%s/run.sh", pipe_dir);
  static const char *kinds[] = {"mnist", "cifar", "tokens"};
  int trained = 0;
  for (int kd = 0; kd < (data ? 1 : 3) && !trained; kd++) {
    if (data) {
      snprintf(dpath, sizeof dpath, "%s", data);
    } else {
      snprintf(dpath, sizeof dpath, "%s/data.%s", dir, kinds[kd]);
      char *gen[] = {tool("piperun-data"), (char *)kinds[kd], dpath, NULL};
      if (run(gen, 0)) continue;
    }
    char *train[] = {runsh, "--data", dpath, "--steps", (char *)steps, "--quiet", "--profile", prof, NULL};
    unlink(prof);
    /* A data set that does not fit the model is refused before the first step: the next kind. */
    int saved = dup(2), fd = data ? -1 : open("/dev/null", O_WRONLY);
    if (fd >= 0) dup2(fd, 2), close(fd);
    int r = run(train, 0);
    if (saved >= 0) dup2(saved, 2), close(saved);
    trained = !r && access(prof, R_OK) == 0;
  }
  if (!trained) {
    fprintf(stderr, "pipecc-probe: the profile build of %s did not train on %s (try --data PATH)\n", model,
            data ? data : "synthetic MNIST, CIFAR-10 or token data");
    goto out;
  }
  /* The other runs, on the data that trained: the fastest profile is kept in prof. */
  char again[4300];
  snprintf(again, sizeof again, "%s.again", prof);
  for (int k = 1; k < runs; k++) {
    char *train[] = {runsh, "--data", dpath, "--steps", (char *)steps, "--quiet", "--profile", again, NULL};
    unlink(again);
    if (run(train, 0)) {
      fprintf(stderr, "pipecc-probe: run %d of the profile build of %s failed\n", k + 1, model);
      goto out;
    }
    double best = profile_total(prof), t = profile_total(again);
    if (t >= 0 && (best < 0 || t < best) && rename(again, prof)) {
      fprintf(stderr, "pipecc-probe: cannot keep %s: %s\n", again, strerror(errno));
      goto out;
    }
  }
  /* pipecc MODEL -n N FLAGS --costs PROFILE --plan-only: merges it into the cache. */
  int c = 0;
  cmd[c++] = tool("pipecc"), cmd[c++] = (char *)model, cmd[c++] = "-n", cmd[c++] = nbuf;
  for (int i = 0; i < nextra; i++) cmd[c++] = extra[i];
  cmd[c++] = "--costs", cmd[c++] = prof, cmd[c++] = "--plan-only", cmd[c++] = "-o", cmd[c++] = merge_dir, cmd[c] = NULL;
  rm_rf(merge_dir);
  if (run(cmd, 0)) {
    fprintf(stderr, "pipecc-probe: pipecc --costs %s failed\n", prof);
    goto out;
  }
  char listing[4300], line[8192];
  snprintf(listing, sizeof listing, "%s/schedule.txt", merge_dir);
  FILE *f = fopen(listing, "r");
  int merged = 0;
  while (f && fgets(line, sizeof line, f)) {
    char *s = strstr(line, "merged into the kernel cache");
    if (s) {
      merged = !strstr(line, "not merged");
      if (merged) printf("pipecc-probe: %s at -n %d: %s", model, n, s);
      else fprintf(stderr, "pipecc-probe: %s at -n %d: %s", model, n, line + strspn(line, " "));
      break;
    }
  }
  if (f) fclose(f);
  if (!merged) fprintf(stderr, "pipecc-probe: the profile was not merged (see %s)\n", listing);
  rc = merged ? 0 : 1;
out:
  if (!keep) rm_rf(dir);
  free(cmd), free(extra);
  return rc;
}
