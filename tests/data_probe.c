/* data_probe.c - drives runtime/data.c from the command line for tests/test_data.py.
 *
 *   data_probe open PATH [HINT]                       kind/n/shape, or the error
 *   data_probe check-images PATH HINT C H W NCLASSES
 *   data_probe check-tokens PATH HINT VOCAB NEED
 *   data_probe indices PATH B SHUFFLE SEED STEP...    one line of B indices per step
 *   data_probe images PATH OUT IDX...                 OUT: count*c*h*w float32 then count int64 labels
 *   data_probe tokens PATH STEP B T FIRST NSEQ        "start S", then the x line and the y line
 *   data_probe arrays IDS CLASSES PER DIMS PATH...    NumPy arrays: each PATH opened, checked against an input of
 *                                                     dims DIMS (comma-separated, the batch first; IDS 1: token ids
 *                                                     below CLASSES) and labels (PER a sample, below CLASSES), and every
 *                                                     sample read: a line "ok N" or "error: MESSAGE" each, exit 0
 *   data_probe heap PATH...                           npy.c alone on an exact-size heap copy of each file (ASan sees
 *                                                     a read past its end, which a mapping's last page hides): an .npz's
 *                                                     x.npy and y.npy, or the .npy itself; "ok" or "error: MESSAGE" each
 *   data_probe rewritten PATH LIMIT FILE OFFSET       checks PATH (token ids, or labels, below LIMIT), writes the
 *                                                     byte 0xff at OFFSET of FILE in place (the mapped file changes
 *                                                     under the loader), then loads every token or label: "ok", or the error
 *
 * Errors: "error: MESSAGE" on stderr, exit 1.  Bad usage: exit 2. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "npy.h"

static int usage(void) {
  fprintf(stderr, "usage: data_probe open|check-images|check-tokens|indices|images|tokens|arrays|heap|rewritten PATH ...\n");
  return 2;
}

static long long num(const char *s) {
  char *end;
  long long v = strtoll(s, &end, 0);
  if (!*s || *end) {
    fprintf(stderr, "data_probe: bad number '%s'\n", s);
    exit(2);
  }
  return v;
}

/* The rewritten command (above): 0 when every load passed, 1 with the error. */
static int rewritten(DataSet *d, char **argv) {
  char err[512];
  int limit = (int)num(argv[3]);
  int rc = d->kind == DATA_TOKENS ? data_check_tokens(d, limit, 1, err, sizeof err)
                                  : data_check_images(d, d->c, d->h, d->w, limit, err, sizeof err);
  if (rc) return fprintf(stderr, "error: before the rewrite: %s\n", err), 1;
  int fd = open(argv[4], O_WRONLY);
  unsigned char ff = 0xff;
  if (fd < 0 || pwrite(fd, &ff, 1, (off_t)num(argv[5])) != 1 || close(fd)) return fprintf(stderr, "error: cannot write %s\n", argv[4]), 1;
  int64_t n = d->n, *a = malloc(sizeof(int64_t) * (size_t)(n + 1)), *b = malloc(sizeof(int64_t) * (size_t)(n + 1));
  for (int64_t i = 0; i < n; i++) a[i] = i;
  if (d->kind == DATA_TOKENS) rc = data_tokens(d, 0, 1, (int)(n - 1), 0, 1, a, b, err, sizeof err);
  else rc = data_images(d, a, (int)n, NULL, b, err, sizeof err);
  free(a), free(b);
  if (rc) return fprintf(stderr, "error: %s\n", err), 1;
  printf("ok\n");
  return 0;
}

/* The heap command (above): one file. */
static void heap_one(const char *path) {
  FILE *f = fopen(path, "rb");
  long len = -1;
  if (!f || fseek(f, 0, SEEK_END) || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
    printf("error: cannot read %s\n", path);
    if (f) fclose(f);
    return;
  }
  uint8_t *b = malloc((size_t)len + !len); /* exactly the file: a byte past it is ASan's */
  size_t got = fread(b, 1, (size_t)len, f);
  fclose(f);
  char err[1024] = "";
  NpyArray a;
  int rc = got != (size_t)len;
  if (!rc && len >= 4 && !memcmp(b, "PK\3\4", 4)) {
    const char *names[2] = {"x.npy", "y.npy"};
    for (int i = 0; i < 2 && !rc; i++) {
      const uint8_t *m;
      size_t n;
      rc = npz_member(b, (size_t)len, path, names[i], &m, &n, err, sizeof err) || npy_parse(m, n, names[i], &a, err, sizeof err);
    }
  } else if (!rc) {
    rc = npy_parse(b, (size_t)len, path, &a, err, sizeof err);
  }
  if (rc) printf("error: %s\n", err);
  else printf("ok\n");
  free(b);
}

/* The arrays command (above). */
static int arrays(int argc, char **argv) {
  int ids = (int)num(argv[2]), classes = (int)num(argv[3]), rank = 0;
  int64_t per = num(argv[4]), dims[8];
  for (char *p = argv[5], *end; *p && rank < 8; p = *end ? end + 1 : end) dims[rank++] = strtoll(p, &end, 10);
  int64_t row = 1;
  for (int i = 1; i < rank; i++) row *= dims[i];
  for (int a = 6; a < argc; a++) {
    DataSet d;
    char err[1024];
    int rc = data_open(&d, argv[a], 0, err, sizeof err);
    if (!rc) rc = data_check_arrays(&d, ids, rank, dims, ids ? classes : 0, err, sizeof err);
    if (!rc) rc = data_check_array_labels(&d, per, classes, err, sizeof err);
    int64_t *idx = malloc(sizeof(int64_t) * 2), *xi = malloc(sizeof(int64_t) * (size_t)(row + 1)), *y = malloc(sizeof(int64_t) * (size_t)(per + 1));
    float *xf = malloc(sizeof(float) * (size_t)(row + 1));
    for (int64_t s = 0; !rc && s < d.n; s++) {
      idx[0] = s;
      rc = data_rows(&d, idx, 1, ids ? NULL : xf, ids ? xi : NULL, y, err, sizeof err);
    }
    if (rc) printf("error: %s\n", err);
    else printf("ok %lld\n", (long long)d.n);
    free(idx), free(xi), free(y), free(xf);
    data_close(&d);
  }
  return 0;
}

static int open_or_fail(DataSet *d, const char *path, int hint) {
  char err[512];
  if (data_open(d, path, hint, err, sizeof err) != 0) {
    fprintf(stderr, "error: %s\n", err);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) return usage();
  if (!strcmp(argv[1], "arrays") && argc >= 7) return arrays(argc, argv);
  if (!strcmp(argv[1], "heap")) {
    for (int a = 2; a < argc; a++) heap_one(argv[a]);
    return 0;
  }
  const char *cmd = argv[1], *path = argv[2];
  DataSet d;
  char err[512];
  int rc = 0;
  if (!strcmp(cmd, "open")) {
    if (open_or_fail(&d, path, argc > 3 ? (int)num(argv[3]) : 0)) return 1;
    printf("kind %d n %lld c %d h %d w %d nclasses %d\n", d.kind, (long long)d.n, d.c, d.h, d.w, d.nclasses);
  } else if (!strcmp(cmd, "check-images") && argc == 8) {
    if (open_or_fail(&d, path, (int)num(argv[3]))) return 1;
    if (data_check_images(&d, (int)num(argv[4]), (int)num(argv[5]), (int)num(argv[6]), (int)num(argv[7]), err, sizeof err))
      fprintf(stderr, "error: %s\n", err), rc = 1;
    else
      printf("ok\n");
  } else if (!strcmp(cmd, "check-tokens") && argc == 6) {
    if (open_or_fail(&d, path, (int)num(argv[3]))) return 1;
    if (data_check_tokens(&d, (int)num(argv[4]), num(argv[5]), err, sizeof err))
      fprintf(stderr, "error: %s\n", err), rc = 1;
    else
      printf("ok\n");
  } else if (!strcmp(cmd, "indices") && argc >= 7) {
    if (open_or_fail(&d, path, 0)) return 1;
    int B = (int)num(argv[3]), shuffle = (int)num(argv[4]);
    uint64_t seed = (uint64_t)num(argv[5]);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)B);
    for (int a = 6; a < argc; a++) {
      data_batch_indices(&d, num(argv[a]), B, seed, shuffle, idx);
      for (int i = 0; i < B; i++) printf(i ? " %lld" : "%lld", (long long)idx[i]);
      printf("\n");
    }
    free(idx);
  } else if (!strcmp(cmd, "images") && argc >= 4) {
    if (open_or_fail(&d, path, 0)) return 1;
    int count = argc - 4;
    size_t chw = (size_t)d.c * d.h * d.w;
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(count + 1));
    float *x = malloc(sizeof(float) * chw * (size_t)(count + 1));
    int64_t *lab = malloc(sizeof(int64_t) * (size_t)(count + 1));
    for (int i = 0; i < count; i++) idx[i] = num(argv[4 + i]);
    if (data_images(&d, idx, count, x, lab, err, sizeof err)) {
      fprintf(stderr, "error: %s\n", err);
      rc = 1;
    }
    FILE *f = fopen(argv[3], "wb");
    if (!f || fwrite(x, sizeof(float), chw * (size_t)count, f) != chw * (size_t)count ||
        fwrite(lab, sizeof(int64_t), (size_t)count, f) != (size_t)count || fclose(f) != 0) {
      fprintf(stderr, "error: cannot write %s\n", argv[3]);
      rc = 1;
    }
    free(idx), free(x), free(lab);
  } else if (!strcmp(cmd, "rewritten") && argc == 6) {
    if (open_or_fail(&d, path, 0)) return 1;
    rc = rewritten(&d, argv);
  } else if (!strcmp(cmd, "tokens") && argc == 8) {
    if (open_or_fail(&d, path, 0)) return 1;
    int64_t step = num(argv[3]);
    int B = (int)num(argv[4]), T = (int)num(argv[5]), first = (int)num(argv[6]), nseq = (int)num(argv[7]);
    size_t cnt = (size_t)nseq * T;
    int64_t *x = malloc(sizeof(int64_t) * (cnt + 1)), *y = malloc(sizeof(int64_t) * (cnt + 1));
    if (data_tokens(&d, step, B, T, first, nseq, x, y, err, sizeof err)) {
      fprintf(stderr, "error: %s\n", err);
      rc = 1;
    }
    printf("start %lld\n", (long long)data_tokens_start(&d, step, B, T));
    for (size_t i = 0; i < cnt; i++) printf(i ? " %lld" : "%lld", (long long)x[i]);
    printf("\n");
    for (size_t i = 0; i < cnt; i++) printf(i ? " %lld" : "%lld", (long long)y[i]);
    printf("\n");
    free(x), free(y);
  } else {
    return usage();
  }
  data_close(&d);
  data_close(&d); /* closing twice is harmless */
  return rc;
}
