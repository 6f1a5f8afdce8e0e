/* datagen.c - piperun-data: small synthetic training sets that a model can actually learn, in
 * the real formats, so that pipecc's training runs (and their tests) need no downloads.
 *
 *   piperun-data mnist  DIR  [--n 6000]   [--seed 1] [--noise 0.1]
 *       DIR/train-images-idx3-ubyte + DIR/train-labels-idx1-ubyte (IDX, big-endian headers).
 *       10 classes; class k is a fixed template of three random blobs (disks of radius 4..6 drawn
 *       from the seed, redrawn while its cosine similarity to an earlier class exceeds 0.5), each sample that template shifted by up to 2 pixels, at a random
 *       brightness 0.7..1, plus per-pixel noise (sd 0.1).  LeNet-5 from PyTorch's default init
 *       goes from loss 2.3 to below 0.05 in 150 plain SGD steps (lr 0.05, batch 64).
 *       --noise SD sets the per-pixel noise (0..4; 0.1 by default): at 0.6 and above a class is
 *       no longer plain to see in one sample, and models take thousands of steps to learn it
 *       (the freezing bench uses it, where the default set is learnt too fast to measure).
 *       --test writes the held-out files instead (t10k-images-idx3-ubyte + t10k-labels-idx1-ubyte,
 *       or CIFAR-10's test_batch.bin; default n 1000): the same classes as the training set of that
 *       seed, other samples.  run.sh --val DIR reads them.
 *   piperun-data cifar  DIR  [--n 5000]   [--seed 1] [--noise 0.1]
 *       DIR/data_batch_1.bin (CIFAR-10 binary: per record 1 label byte + 3x32x32 pixels, CHW).
 *       The same idea with a per-class colour on a noisy random-coloured background.
 *   piperun-data tokens FILE [--n 200000] [--vocab 64] [--seed 1] [--llmc]
 *       n uint16 tokens, raw little-endian, or with llm.c's 1024-byte header (--llmc).  A fixed
 *       random second-order Markov chain: with probability 0.85 the next token is
 *       succ[prev][bit[prev2]] (two successors per token, the one before picks which), else uniform.
 *       With the defaults the next token's entropy is about 1.35 nats given one token and about
 *       0.95 given two (uniform: ln 64 = 4.16), so a bigram model learns most of it and
 *       attention has the rest to find.
 *
 * Deterministic for a given seed (splitmix64, data.c).  Files are written under a temporary name
 * and renamed into place, so a failure leaves no half-written file.  A file that is already there
 * is replaced only with --force, and only if it is a regular file: the rename would put the data in
 * place of a device node, a FIFO or a symbolic link (as root, `tokens /dev/null` replaced the
 * system's /dev/null).  Every file is checked before any is written.  Bad arguments: usage on
 * stderr, exit 2; I/O failure or a file in the way: a message, exit 1. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../runtime/data.h" /* the loader the stage programs use: the files it writes are the ones they read */

static const char *USAGE =
    "usage: piperun-data mnist  DIR  [--n N] [--seed S] [--noise SD] [--test]   (default n 6000, noise 0.1)\n"
    "       piperun-data cifar  DIR  [--n N] [--seed S] [--noise SD] [--test]   (default n 5000, noise 0.1)\n"
    "       piperun-data tokens FILE [--n N] [--vocab V] [--seed S] [--llmc]   (default n 200000, vocab 64)\n"
    "       --force: replace files that are there (regular files only)\n"
    "writes a learnable synthetic data set in the MNIST IDX, CIFAR-10 binary or uint16 token format\n";

static void usage(const char *why) {
  if (why) fprintf(stderr, "piperun-data: error: %s\n", why);
  fputs(USAGE, stderr);
  exit(2);
}

/* ---- PRNG ---- */
typedef struct Rng {
  uint64_t s;
} Rng;
static Rng rng_new(uint64_t seed, uint64_t stream) { return (Rng){data_mix64(seed ^ data_mix64(stream + 0x632BE59BD9B4E019ull))}; }
static uint64_t next(Rng *r) { return data_splitmix64(&r->s); }
static double unif(Rng *r) { return (double)(next(r) >> 11) * (1.0 / 9007199254740992.0); }
static int below(Rng *r, int n) { return (int)(next(r) % (uint64_t)n); }
static double noise(Rng *r) { return (unif(r) + unif(r) + unif(r) - 1.5); } /* sd 0.5 */

/* ---- files: temp name, rename ---- */
typedef struct Out {
  char final[4096], tmp[4200];
  FILE *f;
} Out;

/* A file about to be written: new, or (--force) a regular file; else a message and exit 1. */
static int g_force; /* --force */
static void check_dest(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return;
  if (!S_ISREG(st.st_mode)) {
    const char *what = S_ISDIR(st.st_mode) ? "a directory" : S_ISLNK(st.st_mode) ? "a symbolic link" :
                       S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a socket";
    fprintf(stderr, "piperun-data: error: %s exists and is not a regular file (%s); not replacing it\n", path, what);
    exit(1);
  }
  if (!g_force) {
    fprintf(stderr, "piperun-data: error: %s exists; add --force to replace it\n", path);
    exit(1);
  }
}

static void out_open(Out *o, const char *path) {
  snprintf(o->final, sizeof o->final, "%s", path);
  snprintf(o->tmp, sizeof o->tmp, "%s.tmp-%ld", path, (long)getpid());
  o->f = fopen(o->tmp, "wb");
  if (!o->f) {
    fprintf(stderr, "piperun-data: error: cannot write %s: %s\n", o->tmp, strerror(errno));
    exit(1);
  }
}
static void out_abort(Out *o) {
  if (o->f) fclose(o->f);
  o->f = NULL;
  unlink(o->tmp);
}
/* Closes; on any write error removes the temp file and every other in outs, and exits 1. */
static void out_close(Out *o, Out *others, int nothers) {
  int bad = ferror(o->f);
  if (fclose(o->f) != 0) bad = 1;
  o->f = NULL;
  if (bad) {
    fprintf(stderr, "piperun-data: error: writing %s failed: %s\n", o->tmp, strerror(errno));
    unlink(o->tmp);
    for (int i = 0; i < nothers; i++) out_abort(&others[i]), unlink(others[i].tmp);
    exit(1);
  }
}
static void out_rename(Out *o) {
  if (rename(o->tmp, o->final) != 0) {
    fprintf(stderr, "piperun-data: error: cannot rename %s to %s: %s\n", o->tmp, o->final, strerror(errno));
    unlink(o->tmp);
    exit(1);
  }
}
static void put_be32(FILE *f, uint32_t v) {
  unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
  fwrite(b, 1, 4, f);
}
static void put_le32(FILE *f, uint32_t v) {
  unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
  fwrite(b, 1, 4, f);
}

static void ensure_dir(const char *dir) {
  struct stat st;
  if (stat(dir, &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      fprintf(stderr, "piperun-data: error: %s exists and is not a directory\n", dir);
      exit(1);
    }
    return;
  }
  char tmp[4096]; /* like mkdir -p */
  snprintf(tmp, sizeof tmp, "%s", dir);
  for (char *q = tmp + 1; *q; q++)
    if (*q == '/') {
      *q = 0;
      if (mkdir(tmp, 0777) != 0 && errno != EEXIST) break;
      *q = '/';
    }
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "piperun-data: error: cannot create directory %s: %s\n", dir, strerror(errno));
    exit(1);
  }
}

/* ---- image templates ---- */
#define MAXS 32 /* the largest image side */

/* A template: three anti-aliased disks of radius 4..6 with centres in the middle 5/7 of the
   image, intensities in [0,1].  (Large blobs: deep ReLU nets at PyTorch's default init leave
   their initial plateau within ~100 SGD steps at lr 0.05; thin strokes take several times longer.) */
static void make_template(float *t, int side, Rng *r) {
  memset(t, 0, sizeof(float) * (size_t)side * side);
  double lo = side / 7.0, hi = side - side / 7.0;
  for (int k = 0; k < 3; k++) {
    double cx = lo + unif(r) * (hi - lo), cy = lo + unif(r) * (hi - lo), rad = 4.0 + 2.0 * unif(r);
    for (int y = 0; y < side; y++)
      for (int x = 0; x < side; x++) {
        double dist = sqrt((x - cx) * (x - cx) + (y - cy) * (y - cy));
        double v = dist <= rad ? 1.0 : dist <= rad + 1 ? rad + 1 - dist : 0.0; /* anti-aliased edge */
        float *p = &t[y * side + x];
        if (v > *p) *p = (float)v;
      }
  }
}

/* One sample of class k: template shifted by (dx, dy) in [-2, 2], brightness, noise; into
   out[plane * h * w] for each of the nc channels (colour per channel). */
static double g_noise_sd = 0.1; /* --noise */
static void render(const float *tmpl, int h, int w, int nc, const double *colour, const double *bg, Rng *r, unsigned char *out) {
  int dx = below(r, 5) - 2, dy = below(r, 5) - 2;
  double bright = 0.7 + 0.3 * unif(r);
  for (int ch = 0; ch < nc; ch++)
    for (int y = 0; y < h; y++)
      for (int x = 0; x < w; x++) {
        int sy = y - dy, sx = x - dx;
        double t = sy >= 0 && sy < h && sx >= 0 && sx < w ? tmpl[sy * w + sx] : 0.0;
        double v = bg[ch] * (1 - t) + colour[ch] * bright * t + 2 * g_noise_sd * noise(r);
        v = v < 0 ? 0 : v > 1 ? 1 : v;
        out[(size_t)ch * h * w + (size_t)y * w + x] = (unsigned char)lrint(v * 255.0);
      }
}

/* test: the held-out files (MNIST t10k-*, CIFAR-10 test_batch.bin): the same classes (templates and
 * colours come from the seed), other samples (a random stream of their own). */
static void gen_images(const char *dir, int64_t n, uint64_t seed, int cifar, int test) {
  char p[4096], q[4096]; /* the files: MNIST's images and labels, or CIFAR-10's one */
  if (!cifar) {
    snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", dir, test ? "t10k" : "train");
    snprintf(q, sizeof q, "%s/%s-labels-idx1-ubyte", dir, test ? "t10k" : "train");
    check_dest(p), check_dest(q); /* both before either is written */
  } else {
    snprintf(p, sizeof p, "%s/%s.bin", dir, test ? "test_batch" : "data_batch_1");
    check_dest(p);
  }
  int nc = cifar ? 3 : 1, h = cifar ? 32 : 28, w = h;
  size_t chw = (size_t)nc * h * w;
  static float tmpl[10][MAXS * MAXS];
  double colour[10][3];
  Rng tr = rng_new(seed, 1);
  const double maxcos = 0.5;
  for (int k = 0; k < 10; k++) {
    /* redraw a template too like an earlier one (cosine similarity above maxcos) */
    for (int tries = 0; tries < 1000; tries++) {
      make_template(tmpl[k], h, &tr);
      double worst = 0;
      for (int j = 0; j < k; j++) {
        double ab = 0, aa = 0, bb = 0;
        for (int i = 0; i < h * w; i++) ab += tmpl[k][i] * tmpl[j][i], aa += tmpl[k][i] * tmpl[k][i], bb += tmpl[j][i] * tmpl[j][i];
        double c = ab / sqrt(aa * bb);
        if (c > worst) worst = c;
      }
      if (worst <= maxcos) break;
    }
    for (int ch = 0; ch < 3; ch++) colour[k][ch] = cifar ? 0.45 + 0.55 * unif(&tr) : 1.0;
    if (cifar) colour[k][k % 3] = 1.0; /* each class bright in some channel */
  }
  ensure_dir(dir);
  unsigned char *img = malloc(chw);
  if (!img) exit(1);
  Rng sr = rng_new(seed, test ? 3 : 2);
  if (!cifar) {
    Out o[2];
    out_open(&o[0], p);
    out_open(&o[1], q);
    put_be32(o[0].f, 0x803), put_be32(o[0].f, (uint32_t)n), put_be32(o[0].f, 28), put_be32(o[0].f, 28);
    put_be32(o[1].f, 0x801), put_be32(o[1].f, (uint32_t)n);
    double bg[1] = {0.0};
    for (int64_t i = 0; i < n; i++) {
      int k = below(&sr, 10);
      render(tmpl[k], h, w, 1, colour[k], bg, &sr, img);
      fwrite(img, 1, chw, o[0].f);
      fputc(k, o[1].f);
    }
    out_close(&o[0], &o[1], 1);
    out_close(&o[1], &o[0], 1);
    out_rename(&o[0]);
    if (rename(o[1].tmp, o[1].final) != 0) { /* keep the pair consistent */
      unlink(o[0].final);
      out_rename(&o[1]);
    }
  } else {
    Out o;
    out_open(&o, p);
    for (int64_t i = 0; i < n; i++) {
      int k = below(&sr, 10);
      double bg[3];
      for (int ch = 0; ch < 3; ch++) bg[ch] = 0.35 * unif(&sr);
      render(tmpl[k], h, w, 3, colour[k], bg, &sr, img);
      fputc(k, o.f);
      fwrite(img, 1, chw, o.f);
    }
    out_close(&o, NULL, 0);
    out_rename(&o);
  }
  free(img);
}

static void gen_tokens(const char *path, int64_t n, int vocab, uint64_t seed, int llmc) {
  check_dest(path);
  uint16_t *succ = malloc(sizeof(uint16_t) * 2 * (size_t)vocab);
  unsigned char *bit = malloc((size_t)vocab);
  if (!succ || !bit) exit(1);
  Rng tr = rng_new(seed, 3);
  for (int v = 0; v < vocab; v++) {
    succ[2 * v] = (uint16_t)below(&tr, vocab);
    do succ[2 * v + 1] = (uint16_t)below(&tr, vocab);
    while (vocab > 1 && succ[2 * v + 1] == succ[2 * v]);
    bit[v] = (unsigned char)(next(&tr) & 1);
  }
  Out o;
  out_open(&o, path);
  if (llmc) {
    put_le32(o.f, 20240520), put_le32(o.f, 1), put_le32(o.f, (uint32_t)n);
    for (int i = 3; i < 256; i++) put_le32(o.f, 0);
  }
  Rng sr = rng_new(seed, 4);
  int prev2 = below(&sr, vocab), prev = below(&sr, vocab);
  for (int64_t i = 0; i < n; i++) {
    int t;
    if (i == 0) t = prev2;
    else if (i == 1) t = prev;
    else {
      t = unif(&sr) < 0.85 ? succ[2 * prev + bit[prev2]] : below(&sr, vocab);
      prev2 = prev, prev = t;
    }
    fputc(t & 0xff, o.f);
    fputc(t >> 8, o.f);
  }
  out_close(&o, NULL, 0);
  out_rename(&o);
  free(succ);
  free(bit);
}

static int64_t parse_int(const char *flag, const char *s, int64_t lo, int64_t hi) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || errno || v < lo || v > hi) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s wants an integer in [%lld, %lld], got '%s'", flag, (long long)lo, (long long)hi, s);
    usage(msg);
  }
  return v;
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    if (argc >= 2) {
      fputs(USAGE, stdout);
      return 0;
    }
    usage(NULL);
  }
  const char *what = argv[1];
  int kind = !strcmp(what, "mnist") ? DATA_MNIST : !strcmp(what, "cifar") ? DATA_CIFAR10 : !strcmp(what, "tokens") ? DATA_TOKENS : 0;
  if (!kind) {
    char msg[256];
    snprintf(msg, sizeof msg, "unknown data set '%s' (mnist, cifar or tokens)", what);
    usage(msg);
  }
  if (argc < 3 || argv[2][0] == '-') usage(kind == DATA_TOKENS ? "no output FILE given" : "no output DIR given");
  const char *path = argv[2];
  int64_t n = kind == DATA_MNIST ? 6000 : kind == DATA_CIFAR10 ? 5000 : 200000;
  int vocab = 64, llmc = 0, test = 0, have_n = 0;
  uint64_t seed = 1;
  for (int i = 3; i < argc; i++) {
    const char *f = argv[i];
    int more = i + 1 < argc;
    if (!strcmp(f, "--n") && more)
      n = parse_int(f, argv[++i], 1, kind == DATA_TOKENS ? INT32_MAX : 1000000), have_n = 1;
    else if (!strcmp(f, "--test") && kind != DATA_TOKENS)
      test = 1;
    else if (!strcmp(f, "--seed") && more)
      seed = (uint64_t)parse_int(f, argv[++i], 0, INT64_MAX);
    else if (!strcmp(f, "--vocab") && more && kind == DATA_TOKENS)
      vocab = (int)parse_int(f, argv[++i], 2, 65536);
    else if (!strcmp(f, "--noise") && more && kind != DATA_TOKENS) {
      char *end;
      const char *v = argv[++i];
      g_noise_sd = strtod(v, &end);
      if (!*v || *end || !(g_noise_sd >= 0 && g_noise_sd <= 4)) {
        char msg[256];
        snprintf(msg, sizeof msg, "--noise wants a number in [0, 4], got '%s'", v);
        usage(msg);
      }
    } else if (!strcmp(f, "--llmc") && kind == DATA_TOKENS)
      llmc = 1;
    else if (!strcmp(f, "--force"))
      g_force = 1;
    else {
      char msg[256];
      snprintf(msg, sizeof msg, "%s '%s' for %s", (!strcmp(f, "--n") || !strcmp(f, "--seed") || !strcmp(f, "--vocab") || !strcmp(f, "--noise")) && !more
                                                     ? "missing value after" : "unknown argument", f, what);
      usage(msg);
    }
  }
  if (kind == DATA_TOKENS)
    gen_tokens(path, n, vocab, seed, llmc);
  else
    gen_images(path, test && !have_n ? 1000 : n, seed, kind == DATA_CIFAR10, test);
  return 0;
}
