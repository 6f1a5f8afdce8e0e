/* data.c - training data for libpiperun: see data.h for the formats and the sample order. */
#include "data.h"
#include "failmsg.h"
#include "npy.h"

#include <dirent.h>
#include <float.h>
#include <math.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CIFAR_MAX_BATCHES 5
#define CIFAR_RECORD 3073
#define LLMC_MAGIC 20240520
#define LLMC_MODEL_MAGIC 20240326
#define LLMC_HEADER_BYTES 1024

typedef struct Mapped {
  uint8_t *p;
  size_t len;
  char path[4096]; /* for data_mapped_file's messages */
} Mapped;

struct DataPriv {
  char path[4096];       /* what data_open was given */
  char labels_file[4096]; /* MNIST labels, for messages */
  Mapped maps[2];
  uint8_t *own_images, *own_labels;
  uint16_t *own_tokens;
  /* CIFAR: sample ranges per batch file, for messages */
  int nbatch;
  int64_t batch_first[CIFAR_MAX_BATCHES + 1];
  int batch_no[CIFAR_MAX_BATCHES];
  /* What the checks before the first step passed (0: not checked): every token id below id_limit, every
   * label below label_limit.  A mapped file rewritten in place shows its new bytes through the mapping,
   * so the loaders check each id and label they hand out against these (one compare each). */
  int64_t id_limit;
  int label_limit;
  /* the permutation of the last shuffled epoch */
  int64_t *perm, perm_epoch;
  uint64_t perm_seed;
  int perm_valid;
  /* NumPy arrays (DATA_ARRAYS): x and y where they lie in maps[0] (an .npz, or x.npy) and maps[1] (y.npy) */
  NpyArray ax, ay;
  int64_t y_row; /* y's values per sample: 1 (a class), or a token model's sequence length */
};

uint64_t data_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t data_splitmix64(uint64_t *state) {
  *state += 0x9E3779B97F4A7C15ull;
  return data_mix64(*state);
}

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static int32_t le32(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

static int is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Maps a whole regular file read-only; an empty file gives p = NULL, len = 0. */
static int map_file(const char *path, Mapped *m, char *err, size_t errlen) {
  m->p = NULL, m->len = 0;
  snprintf(m->path, sizeof m->path, "%s", path);
  /* O_NONBLOCK: a FIFO's open would wait for a writer (the run hung with no time limit); fstat refuses it below. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return fail(err, errlen, "data %s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return fail(err, errlen, "data %s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return fail(err, errlen, "data %s: not a regular file (a FIFO, socket or device)", path);
  }
  if (st.st_size > 0) {
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      close(fd);
      return fail(err, errlen, "data %s: cannot map %lld bytes: %s", path, (long long)st.st_size, strerror(e));
    }
    m->p = p, m->len = (size_t)st.st_size;
  }
  close(fd);
  return 0;
}

static void unmap(Mapped *m) {
  if (m->p) munmap(m->p, m->len);
  m->p = NULL, m->len = 0;
}

static void join(char *out, size_t n, const char *dir, const char *name) {
  size_t l = strlen(dir);
  snprintf(out, n, "%s%s%s", dir, l && dir[l - 1] == '/' ? "" : "/", name);
}

/* Says which exists of dir/name and dir/name.gz: 1 plain, 2 only compressed, 0 neither. */
static int find_plain(char *out, size_t n, const char *dir, const char *name) {
  join(out, n, dir, name);
  if (is_file(out)) return 1;
  char gz[4200];
  snprintf(gz, sizeof gz, "%s.gz", out);
  return is_file(gz) ? 2 : 0;
}

/* ---- MNIST IDX ---- */

static const char *const IMG_NAMES[] = {"train-images-idx3-ubyte", "train-images.idx3-ubyte"};
static const char *const LBL_NAMES[] = {"train-labels-idx1-ubyte", "train-labels.idx1-ubyte"};
static const char *const TEST_IMG_NAMES[] = {"t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"};
static const char *const TEST_LBL_NAMES[] = {"t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"};

/* 1 found (out = the path), 2 only a .gz copy (out = the .gz-less path), 0 none (out = names[0]). */
static int find_any(char *out, size_t n, const char *dir, const char *const names[2]) {
  int r0 = find_plain(out, n, dir, names[0]);
  if (r0 == 1) return 1;
  int r1 = find_plain(out, n, dir, names[1]);
  if (r1 == 1) return 1;
  join(out, n, dir, names[r0 != 2 && r1 == 2 ? 1 : 0]);
  return r0 == 2 || r1 == 2 ? 2 : 0;
}

static int idx_header(const Mapped *m, const char *path, int ndims, uint32_t *dims, char *err, size_t errlen) {
  size_t hdr = 4 + 4 * (size_t)ndims;
  if (m->len < hdr)
    return fail(err, errlen, "data %s: truncated: %zu bytes, shorter than the %zu-byte IDX header", path, m->len, hdr);
  uint32_t magic = be32(m->p), want = 0x0800u | (uint32_t)ndims;
  if (magic != want)
    return fail(err, errlen, "data %s: bad magic 0x%08x (expected 0x%08x: IDX unsigned bytes, %d-D)", path, magic, want, ndims);
  for (int i = 0; i < ndims; i++) dims[i] = be32(m->p + 4 + 4 * i);
  return 0;
}

/* test: the t10k files (a held-out set), else the training files. */
static int open_mnist(DataSet *d, const char *dir, int test, char *err, size_t errlen) {
  struct DataPriv *pv = d->priv;
  char ipath[4096], lpath[4096];
  int ri = find_any(ipath, sizeof ipath, dir, test ? TEST_IMG_NAMES : IMG_NAMES);
  int rl = find_any(lpath, sizeof lpath, dir, test ? TEST_LBL_NAMES : LBL_NAMES);
  if (ri != 1)
    return fail(err, errlen, ri == 2 ? "data %s: only the compressed %s.gz is there; gunzip it (the loader reads uncompressed IDX files)"
                                     : "data %s: missing file (MNIST needs train-images-idx3-ubyte and train-labels-idx1-ubyte)%s",
                ipath, ri == 2 ? ipath : "");
  if (rl != 1)
    return fail(err, errlen, rl == 2 ? "data %s: only the compressed %s.gz is there; gunzip it (the loader reads uncompressed IDX files)"
                                     : "data %s: missing file (MNIST needs %s next to %s)",
                lpath, rl == 2 ? lpath : test ? TEST_LBL_NAMES[0] : LBL_NAMES[0], rl == 2 ? "" : ipath);
  snprintf(pv->labels_file, sizeof pv->labels_file, "%s", lpath);
  if (map_file(ipath, &pv->maps[0], err, errlen) || map_file(lpath, &pv->maps[1], err, errlen)) return -1;
  uint32_t id[3], ld[1];
  if (idx_header(&pv->maps[0], ipath, 3, id, err, errlen) || idx_header(&pv->maps[1], lpath, 1, ld, err, errlen)) return -1;
  if (id[1] == 0 || id[2] == 0 || id[1] > 65536 || id[2] > 65536)
    return fail(err, errlen, "data %s: wrong dims %u x %u x %u (images must be at least 1x1 and at most 65536 on a side)", ipath, id[0],
                id[1], id[2]);
  uint64_t want = 16 + (uint64_t)id[0] * id[1] * id[2]; /* < 2^32 * 2^32: no overflow */
  if (pv->maps[0].len < want)
    return fail(err, errlen, "data %s: truncated: %zu bytes, but %u images of %ux%u need %llu", ipath, pv->maps[0].len, id[0], id[1], id[2],
                (unsigned long long)want);
  if (pv->maps[0].len > want)
    return fail(err, errlen, "data %s: %zu bytes, but %u images of %ux%u take %llu: %llu bytes left over", ipath, pv->maps[0].len, id[0], id[1],
                id[2], (unsigned long long)want, (unsigned long long)(pv->maps[0].len - want));
  if ((uint64_t)pv->maps[1].len < 8 + (uint64_t)ld[0])
    return fail(err, errlen, "data %s: truncated: %zu bytes, but %u labels need %llu", lpath, pv->maps[1].len, ld[0],
                (unsigned long long)(8 + (uint64_t)ld[0]));
  if ((uint64_t)pv->maps[1].len > 8 + (uint64_t)ld[0])
    return fail(err, errlen, "data %s: %zu bytes, but %u labels take %llu: extra bytes at the end", lpath, pv->maps[1].len, ld[0],
                (unsigned long long)(8 + (uint64_t)ld[0]));
  if (id[0] != ld[0])
    return fail(err, errlen, "data %s: %u labels, but %s has %u images (the counts must match)", lpath, ld[0], ipath, id[0]);
  if (id[0] == 0) return fail(err, errlen, "data %s: no images", ipath);
  d->kind = DATA_MNIST;
  d->n = id[0];
  d->c = 1, d->h = (int)id[1], d->w = (int)id[2];
  d->nclasses = 10;
  d->images = pv->maps[0].p + 16;
  d->labels = pv->maps[1].p + 8;
  return 0;
}

/* ---- CIFAR-10 ---- */

static int cifar_present(const char *dir, int *which, int *ngz) {
  int n = 0;
  *ngz = 0;
  for (int b = 1; b <= CIFAR_MAX_BATCHES; b++) {
    char name[32], p[4096];
    snprintf(name, sizeof name, "data_batch_%d.bin", b);
    int r = find_plain(p, sizeof p, dir, name);
    if (r == 1) which[n++] = b;
    if (r == 2) ++*ngz;
  }
  return n;
}

/* CIFAR-10's file of batch b: data_batch_<b>.bin, or test_batch.bin for b = 0. */
static void cifar_name(char *name, size_t n, int b) {
  if (b) snprintf(name, n, "data_batch_%d.bin", b);
  else snprintf(name, n, "test_batch.bin");
}

/* test: test_batch.bin alone (a held-out set), else the training batches. */
static int open_cifar(DataSet *d, const char *dir, int test, char *err, size_t errlen) {
  struct DataPriv *pv = d->priv;
  int which[CIFAR_MAX_BATCHES], ngz = 0, nb = 1;
  if (test) which[0] = 0;
  else nb = cifar_present(dir, which, &ngz);
  if (nb == 0) {
    char p[4096];
    join(p, sizeof p, dir, "data_batch_1.bin");
    return fail(err, errlen, "data %s: missing file (CIFAR-10 needs data_batch_1.bin .. data_batch_5.bin, any of them)%s", p,
                ngz ? "; only compressed .gz copies are there, gunzip them" : "");
  }
  int64_t total = 0;
  size_t lens[CIFAR_MAX_BATCHES];
  char paths[CIFAR_MAX_BATCHES][4096];
  for (int i = 0; i < nb; i++) {
    char name[32];
    cifar_name(name, sizeof name, which[i]);
    join(paths[i], sizeof paths[i], dir, name);
    struct stat st;
    if (stat(paths[i], &st) != 0) return fail(err, errlen, "data %s: cannot stat: %s", paths[i], strerror(errno));
    lens[i] = (size_t)st.st_size;
    if (lens[i] == 0) return fail(err, errlen, "data %s: empty file", paths[i]);
    if (lens[i] % CIFAR_RECORD)
      return fail(err, errlen, "data %s: truncated: %zu bytes is not a whole number of %d-byte records (1 label + 3x32x32 pixels); %zu bytes left over",
                  paths[i], lens[i], CIFAR_RECORD, lens[i] % CIFAR_RECORD);
    pv->batch_first[i] = total;
    pv->batch_no[i] = which[i];
    total += (int64_t)(lens[i] / CIFAR_RECORD);
  }
  pv->batch_first[nb] = total;
  pv->nbatch = nb;
  pv->own_images = malloc((size_t)total * (CIFAR_RECORD - 1));
  pv->own_labels = malloc((size_t)total);
  if (!pv->own_images || !pv->own_labels) return fail(err, errlen, "data %s: out of memory for %lld images", dir, (long long)total);
  for (int i = 0; i < nb; i++) {
    Mapped m;
    if (map_file(paths[i], &m, err, errlen)) return -1;
    if (m.len != lens[i]) {
      unmap(&m);
      return fail(err, errlen, "data %s: changed size while being read", paths[i]);
    }
    int64_t cnt = (int64_t)(m.len / CIFAR_RECORD), first = pv->batch_first[i];
    for (int64_t r = 0; r < cnt; r++) {
      const uint8_t *rec = m.p + r * CIFAR_RECORD;
      pv->own_labels[first + r] = rec[0];
      memcpy(pv->own_images + (first + r) * (CIFAR_RECORD - 1), rec + 1, CIFAR_RECORD - 1);
    }
    unmap(&m);
  }
  d->kind = DATA_CIFAR10;
  d->n = total;
  d->c = 3, d->h = 32, d->w = 32;
  d->nclasses = 10;
  d->images = pv->own_images;
  d->labels = pv->own_labels;
  return 0;
}

/* ---- tokens ---- */

static int open_tokens(DataSet *d, const char *path, int forced, char *err, size_t errlen) {
  struct DataPriv *pv = d->priv;
  Mapped *m = &pv->maps[0];
  if (map_file(path, m, err, errlen)) return -1;
  if (m->len == 0) return fail(err, errlen, "data %s: empty file (no tokens)", path);
  size_t off = 0;
  int64_t count;
  int32_t magic = m->len >= 4 ? le32(m->p) : 0;
  if (magic == LLMC_MAGIC) {
    if (m->len < LLMC_HEADER_BYTES)
      return fail(err, errlen, "data %s: truncated: %zu bytes, shorter than llm.c's 1024-byte header", path, m->len);
    int32_t version = le32(m->p + 4), cnt = le32(m->p + 8);
    if (version != 1)
      return fail(err, errlen, "data %s: llm.c token file version %d; only version 1 (uint16 tokens) is supported", path, version);
    if (cnt < 0) return fail(err, errlen, "data %s: llm.c header gives a negative token count %d", path, cnt);
    uint64_t want = LLMC_HEADER_BYTES + 2 * (uint64_t)cnt;
    if (m->len < want)
      return fail(err, errlen, "data %s: truncated: the header says %d tokens (%llu bytes), the file has %zu bytes", path, cnt,
                  (unsigned long long)want, m->len);
    if (m->len > want)
      return fail(err, errlen, "data %s: count mismatch: the header says %d tokens (%llu bytes), the file has %zu bytes", path, cnt,
                  (unsigned long long)want, m->len);
    if (cnt == 0) return fail(err, errlen, "data %s: no tokens (llm.c header count 0)", path);
    off = LLMC_HEADER_BYTES;
    count = cnt;
  } else {
    if (!forced) {
      if (magic == LLMC_MODEL_MAGIC) return fail(err, errlen, "data %s: an llm.c model checkpoint (magic 20240326), not a token file", path);
      if (m->len >= 4 && (be32(m->p) == 0x803 || be32(m->p) == 0x801))
        return fail(err, errlen, "data %s: an MNIST IDX file; give the directory that holds it", path);
      if (m->len >= 2 && m->p[0] == 0x1f && m->p[1] == 0x8b) return fail(err, errlen, "data %s: gzip-compressed; gunzip it", path);
    }
    if (m->len % 2) return fail(err, errlen, "data %s: truncated: %zu bytes is an odd size for uint16 tokens", path, m->len);
    count = (int64_t)(m->len / 2);
  }
  d->kind = DATA_TOKENS;
  d->n = count;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  d->tokens = (uint16_t *)(void *)(m->p + off); /* page-aligned map + even offset */
#else
  pv->own_tokens = malloc((size_t)count * 2);
  if (!pv->own_tokens) return fail(err, errlen, "data %s: out of memory for %lld tokens", path, (long long)count);
  for (int64_t i = 0; i < count; i++) pv->own_tokens[i] = (uint16_t)(m->p[off + 2 * i] | m->p[off + 2 * i + 1] << 8);
  d->tokens = pv->own_tokens;
#endif
  return 0;
}

/* ---- NumPy arrays: an .npz, or a directory of NAME.npy files ---- */

/* One array of the set: the .npz's member NAME.npy (zip mapped in maps[0]), or DIR/NAME.npy mapped into m. */
static int open_array(struct DataPriv *pv, const char *path, int npz, const char *name, int named, Mapped *m, NpyArray *a, char *err,
                      size_t errlen) {
  char file[4200], where[4300];
  snprintf(file, sizeof file, "%s.npy", name);
  if (npz) {
    const uint8_t *p;
    size_t n;
    int rc = npz_member(pv->maps[0].p, pv->maps[0].len, path, file, &p, &n, err, errlen);
    if (rc == 1 && !named && err && errlen) {
      size_t k = strlen(err);
      snprintf(err + k, errlen - k, "; name the arrays with --data-x and --data-y");
    }
    if (rc) return -1;
    snprintf(where, sizeof where, "%s: array '%s'", path, name);
    return npy_parse(p, n, where, a, err, errlen);
  }
  char full[4300];
  join(full, sizeof full, path, file);
  if (!is_file(full)) return fail(err, errlen, "data %s: missing file (NumPy data is x.npy and y.npy, or the names --data-x and --data-y give)", full);
  if (map_file(full, m, err, errlen)) return -1;
  return npy_parse(m->p, m->len, full, a, err, errlen);
}

static int open_arrays(DataSet *d, const char *path, int npz, const char *xname, const char *yname, int named, char *err, size_t errlen) {
  struct DataPriv *pv = d->priv;
  if (npz && map_file(path, &pv->maps[0], err, errlen)) return -1;
  if (open_array(pv, path, npz, xname, named, &pv->maps[0], &pv->ax, err, errlen) ||
      open_array(pv, path, npz, yname, named, &pv->maps[1], &pv->ay, err, errlen))
    return -1;
  if (pv->ax.rank < 1 || pv->ay.rank < 1)
    return fail(err, errlen, "data %s: a scalar array; x and y need a first dimension of samples", pv->ax.rank < 1 ? pv->ax.where : pv->ay.where);
  if (pv->ax.shape[0] != pv->ay.shape[0])
    return fail(err, errlen, "data %s: %lld samples, but %s has %lld (the first dimensions must match)", pv->ay.where, (long long)pv->ay.shape[0],
                pv->ax.where, (long long)pv->ax.shape[0]);
  if (pv->ax.shape[0] == 0) return fail(err, errlen, "data %s: no samples", pv->ax.where);
  d->kind = DATA_ARRAYS;
  d->n = pv->ax.shape[0];
  return 0;
}

/* ---- open / close ---- */

/* The first bytes of a file: an .npz is a zip ("PK\3\4"), an .npy starts "\x93NUMPY". */
static int starts_with(const char *path, const char *magic, size_t n) {
  char head[8] = {0};
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t got = read(fd, head, n);
  close(fd);
  return got == (ssize_t)n && !memcmp(head, magic, n);
}

/* A directory: NumPy arrays where x.npy is there (or names were given), else MNIST or CIFAR-10. */
static int open_dir(DataSet *d, const char *path, int kind_hint, int held_out, const char *xname, const char *yname, int named, char *err,
                    size_t errlen) {
  char p[4096];
  int which[CIFAR_MAX_BATCHES], ngz;
  if (kind_hint == DATA_TOKENS) return fail(err, errlen, "data %s: a directory, but token data is one file of uint16 tokens", path);
  join(p, sizeof p, path, "x.npy");
  if (named || (!kind_hint && is_file(p))) return open_arrays(d, path, 0, xname, yname, named, err, errlen);
  /* A held-out set: the directory's test files where it has them. */
  int tm = held_out && kind_hint != DATA_CIFAR10 && find_any(p, sizeof p, path, TEST_IMG_NAMES) == 1;
  int tc = held_out && kind_hint != DATA_MNIST && find_plain(p, sizeof p, path, "test_batch.bin") == 1;
  if (kind_hint == DATA_MNIST || tm) return open_mnist(d, path, tm, err, errlen);
  if (kind_hint == DATA_CIFAR10 || tc) return open_cifar(d, path, tc, err, errlen);
  if (find_any(p, sizeof p, path, IMG_NAMES) || find_any(p, sizeof p, path, LBL_NAMES)) return open_mnist(d, path, 0, err, errlen);
  if (cifar_present(path, which, &ngz) || ngz) return open_cifar(d, path, 0, err, errlen);
  return fail(err, errlen,
              "data %s: no training data here (NumPy: x.npy + y.npy; MNIST: train-images-idx3-ubyte + train-labels-idx1-ubyte; CIFAR-10: "
              "data_batch_1.bin .. data_batch_5.bin)",
              path);
}

/* A file: an .npz, or tokens; a lone .npy is one array of the two a data set needs. */
static int open_file(DataSet *d, const char *path, int kind_hint, const char *xname, const char *yname, int named, char *err, size_t errlen) {
  if (kind_hint == DATA_MNIST || kind_hint == DATA_CIFAR10)
    return fail(err, errlen, "data %s: a file, but %s data is a directory (%s)", path, kind_hint == DATA_MNIST ? "MNIST" : "CIFAR-10",
                kind_hint == DATA_MNIST ? "train-images-idx3-ubyte + train-labels-idx1-ubyte" : "data_batch_N.bin");
  if (starts_with(path, "PK\3\4", 4)) return open_arrays(d, path, 1, xname, yname, named, err, errlen);
  if (starts_with(path, "\x93NUMPY", 6))
    return fail(err, errlen, "data %s: one NumPy array; give the directory that holds x.npy and y.npy, or an .npz holding both (np.savez)", path);
  size_t l = strlen(path);
  if (named || (l > 4 && !strcmp(path + l - 4, ".npz"))) return fail(err, errlen, "data %s: not an .npz (zip) archive", path);
  return open_tokens(d, path, kind_hint == DATA_TOKENS, err, errlen);
}

int data_open_named(DataSet *d, const char *path, int kind_hint, const char *xname, const char *yname, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  if (err && errlen) err[0] = 0;
  if (!path || !*path) return fail(err, errlen, "data: no path given");
  int held_out = (kind_hint & DATA_HELD_OUT) != 0, named = xname || yname;
  kind_hint &= ~DATA_HELD_OUT;
  if (kind_hint < 0 || kind_hint > DATA_TOKENS) return fail(err, errlen, "data %s: unknown data kind %d", path, kind_hint);
  d->priv = calloc(1, sizeof *d->priv);
  if (!d->priv) return fail(err, errlen, "data %s: out of memory", path);
  snprintf(d->priv->path, sizeof d->priv->path, "%s", path);
  struct stat st;
  int rc;
  if (stat(path, &st) != 0)
    rc = fail(err, errlen, "data %s: missing: %s", path, strerror(errno));
  else if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
    rc = fail(err, errlen, "data %s: not a regular file (token data, .npz) or a directory (images, .npy): a FIFO, socket or device", path);
  else if (S_ISDIR(st.st_mode))
    rc = open_dir(d, path, kind_hint, held_out, xname ? xname : "x", yname ? yname : "y", named, err, errlen);
  else
    rc = open_file(d, path, kind_hint, xname ? xname : "x", yname ? yname : "y", named, err, errlen);
  if (rc) data_close(d);
  return rc;
}

int data_open(DataSet *d, const char *path, int kind_hint, char *err, size_t errlen) {
  return data_open_named(d, path, kind_hint, NULL, NULL, err, errlen);
}

void data_close(DataSet *d) {
  if (!d) return;
  struct DataPriv *pv = d->priv;
  if (pv) {
    unmap(&pv->maps[0]);
    unmap(&pv->maps[1]);
    free(pv->own_images);
    free(pv->own_labels);
    free(pv->own_tokens);
    free(pv->perm);
    free(pv);
  }
  memset(d, 0, sizeof *d);
}

const char *data_mapped_file(const DataSet *d, const void *addr, long long *mapped, long long *now) {
  if (!d->priv) return NULL;
  for (int i = 0; i < 2; i++) {
    const Mapped *m = &d->priv->maps[i];
    const uint8_t *a = addr;
    if (!m->p || a < m->p || a >= m->p + m->len) continue;
    struct stat st;
    *mapped = (long long)m->len;
    *now = stat(m->path, &st) == 0 ? (long long)st.st_size : -1;
    return m->path;
  }
  return NULL;
}

/* ---- checks ---- */

static const char *dname(const DataSet *d) { return d->priv ? d->priv->path : "(not open)"; }

int data_check_images(const DataSet *d, int c, int h, int w, int nclasses, char *err, size_t errlen) {
  if (d->kind != DATA_MNIST && d->kind != DATA_CIFAR10)
    return fail(err, errlen, "data %s: holds %s, but the model takes images", dname(d), d->kind == DATA_TOKENS ? "tokens" : "nothing");
  if (d->c != c || d->h != h || d->w != w)
    return fail(err, errlen, "data %s: images are %dx%dx%d (CxHxW), but the model expects %dx%dx%d", dname(d), d->c, d->h, d->w, c, h, w);
  if (nclasses <= 0) return fail(err, errlen, "data %s: the model has %d classes", dname(d), nclasses);
  if (nclasses > 255) return 0; /* every uint8 label fits */
  for (int64_t i = 0; i < d->n; i++) {
    if (d->labels[i] < nclasses) continue;
    const struct DataPriv *pv = d->priv;
    if (d->kind == DATA_MNIST)
      return fail(err, errlen, "data %s: label %d at sample %lld is out of range for a model with %d classes", pv->labels_file, d->labels[i],
                  (long long)i, nclasses);
    int b = 0;
    while (b + 1 < pv->nbatch && i >= pv->batch_first[b + 1]) b++;
    char p[4096], name[32];
    cifar_name(name, sizeof name, pv->batch_no[b]);
    join(p, sizeof p, pv->path, name);
    return fail(err, errlen, "data %s: label %d at record %lld (sample %lld) is out of range for a model with %d classes", p, d->labels[i],
                (long long)(i - pv->batch_first[b]), (long long)i, nclasses);
  }
  if (!d->priv->label_limit || nclasses < d->priv->label_limit) d->priv->label_limit = nclasses;
  return 0;
}

int data_check_tokens(const DataSet *d, int vocab, int64_t need_tokens, char *err, size_t errlen) {
  if (d->kind != DATA_TOKENS)
    return fail(err, errlen, "data %s: holds %s, but the model takes token ids", dname(d), d->kind ? "images" : "nothing");
  if (d->n < need_tokens)
    return fail(err, errlen, "data %s: %lld tokens, but one batch needs %lld (batch x sequence length + 1)", dname(d), (long long)d->n,
                (long long)need_tokens);
  if (vocab <= 0 || vocab > 65535) return 0;
  for (int64_t i = 0; i < d->n; i++)
    if (d->tokens[i] >= vocab)
      return fail(err, errlen, "data %s: token %d at position %lld is out of range for a model with vocabulary %d", dname(d), d->tokens[i],
                  (long long)i, vocab);
  if (!d->priv->id_limit || vocab < d->priv->id_limit) d->priv->id_limit = vocab;
  return 0;
}

/* A value past what the checks passed: the file changed under its mapping during the run. */
static int changed(const char *file, const char *what, long long value, const char *at, long long pos, long long limit, char *err,
                   size_t errlen) {
  return fail(err, errlen, "data %s changed during the run (rewritten in place?): %s %lld at %s %lld is out of range (below %lld when "
                           "checked at the start)", file, what, value, at, pos, limit);
}

/* ---- NumPy arrays: the checks against the model and the loader ---- */

/* "(1, 28, 28)": a sample's shape (dims past the first), for messages. */
static void sample_shape(char *out, size_t n, int rank, const int64_t *dims) {
  size_t k = (size_t)snprintf(out, n, "(");
  for (int i = 1; i < rank && k < n; i++) k += (size_t)snprintf(out + k, n - k, "%s%lld", i > 1 ? ", " : "", (long long)dims[i]);
  if (k < n) snprintf(out + k, n - k, "%s)", rank == 2 ? "," : "");
}

/* Every element of a (integers) from 0 to below limit. */
static int ints_below(const NpyArray *a, int64_t limit, const char *what, char *err, size_t errlen) {
  for (int64_t i = 0; i < a->count; i++) {
    int64_t v = npy_get_i(a, i);
    if (v < 0 || v >= limit)
      return fail(err, errlen, "data %s: %s %lld at element %lld is out of range for a model with %lld %s", a->where, what, (long long)v,
                  (long long)i, (long long)limit, !strcmp(what, "label") ? "classes" : "ids");
  }
  return 0;
}

/* Every value of a float array finite, and, in float64, within float32's range: a NaN or an infinity in
 * the data would surface as a NaN loss blamed on the learning rate. */
static int floats_finite(const NpyArray *a, char *err, size_t errlen) {
  if (a->type != NPY_F32 && a->type != NPY_F64) return 0;
  for (int64_t i = 0; i < a->count; i++) {
    double v = npy_get_f(a, i);
    if (!isfinite(v) || fabs(v) > FLT_MAX)
      return fail(err, errlen, "data %s: element %lld is %s, which the model cannot train on%s", a->where, (long long)i,
                  isnan(v) ? "NaN" : isinf(v) ? (v > 0 ? "+inf" : "-inf") : "beyond float32's range",
                  isfinite(v) ? " (the inputs are float32)" : "");
  }
  return 0;
}

int data_check_arrays(const DataSet *d, int ids, int rank, const int64_t *dims, int64_t vocab, char *err, size_t errlen) {
  if (d->kind != DATA_ARRAYS) return fail(err, errlen, "data %s: not NumPy arrays", dname(d));
  NpyArray *x = &d->priv->ax;
  if (ids ? !npy_is_integer(x->type) : !(x->type == NPY_F32 || x->type == NPY_F64 || x->type == NPY_U8))
    return fail(err, errlen, "data %s: %s, but the model's input takes %s", x->where, npy_type_name(x->type),
                ids ? "token ids (an integer array: int64, int32, uint16 or uint8)" : "float32 values (float32, float64, or uint8 scaled by 1/255)");
  int same = x->rank == rank;
  for (int i = 1; same && i < rank; i++) same = x->shape[i] == dims[i];
  if (!same) {
    char got[256], want[256];
    sample_shape(got, sizeof got, x->rank, x->shape);
    sample_shape(want, sizeof want, rank, dims);
    return fail(err, errlen, "data %s: samples of shape %s, but the model's input takes %s (x's shape is (samples, ...))", x->where, got, want);
  }
  if (!ids && floats_finite(x, err, errlen)) return -1;
  if (ids && vocab > 0) {
    if (ints_below(x, vocab, "token id", err, errlen)) return -1;
    if (!d->priv->id_limit || vocab < d->priv->id_limit) d->priv->id_limit = vocab;
  }
  return 0;
}

int data_check_array_labels(const DataSet *d, int64_t per_sample, int nclasses, char *err, size_t errlen) {
  if (d->kind != DATA_ARRAYS) return fail(err, errlen, "data %s: not NumPy arrays", dname(d));
  struct DataPriv *pv = d->priv;
  NpyArray *y = &pv->ay;
  if (!npy_is_integer(y->type))
    return fail(err, errlen, "data %s: %s, but labels are class numbers (an integer array: int64, int32, uint16 or uint8)", y->where,
                npy_type_name(y->type));
  int64_t want[2] = {y->shape[0], per_sample};
  int fits = per_sample == 1 ? y->rank == 1 || (y->rank == 2 && y->shape[1] == 1) : y->rank == 2 && y->shape[1] == per_sample;
  if (!fits) {
    char got[256], exp[256];
    sample_shape(got, sizeof got, y->rank, y->shape);
    sample_shape(exp, sizeof exp, per_sample == 1 ? 1 : 2, want);
    return fail(err, errlen, "data %s: labels of shape %s a sample, but the model's loss takes %s (%s)", y->where, got, exp,
                per_sample == 1 ? "one class a sample" : "one class per position: y[i] is x[i] shifted by one");
  }
  if (ints_below(y, nclasses, "label", err, errlen)) return -1;
  if (!pv->label_limit || nclasses < pv->label_limit) pv->label_limit = nclasses;
  pv->y_row = per_sample;
  return 0;
}

int data_rows(const DataSet *d, const int64_t *idx, int count, float *xf, int64_t *xi, int64_t *y, char *err, size_t errlen) {
  const struct DataPriv *pv = d->priv;
  const NpyArray *ax = &pv->ax, *ay = &pv->ay;
  int64_t row = ax->count / ax->shape[0], yrow = pv->y_row ? pv->y_row : 1;
  for (int i = 0; i < count; i++) {
    int64_t s = idx[i];
    if (xf) {
      float *dst = xf + (size_t)i * (size_t)row;
      if (ax->type == NPY_U8) /* pixels, as the image formats give them */
        for (int64_t j = 0; j < row; j++) dst[j] = ax->data[s * row + j] / 255.0f;
      else if (ax->type == NPY_F32) /* already the input's bytes (little-endian, checked finite): one copy */
        memcpy(dst, ax->data + (size_t)(s * row) * 4, (size_t)row * 4);
      else
        for (int64_t j = 0; j < row; j++) dst[j] = (float)npy_get_f(ax, s * row + j);
    }
    for (int64_t j = 0; xi && j < row; j++) {
      xi[(size_t)i * (size_t)row + (size_t)j] = npy_get_i(ax, s * row + j);
      if (pv->id_limit && (xi[i * row + j] < 0 || xi[i * row + j] >= pv->id_limit))
        return changed(ax->where, "token id", (long long)xi[i * row + j], "element", (long long)(s * row + j), pv->id_limit, err, errlen);
    }
    for (int64_t j = 0; y && j < yrow; j++) {
      y[(size_t)i * (size_t)yrow + (size_t)j] = npy_get_i(ay, s * yrow + j);
      if (pv->label_limit && (y[i * yrow + j] < 0 || y[i * yrow + j] >= pv->label_limit))
        return changed(ay->where, "label", (long long)y[i * yrow + j], "element", (long long)(s * yrow + j), pv->label_limit, err, errlen);
    }
  }
  return 0;
}

/* ---- sample order ---- */

static void make_perm(int64_t *p, int64_t n, uint64_t seed, int64_t e) {
  uint64_t x = data_mix64(seed ^ data_mix64((uint64_t)e + 0x9E3779B97F4A7C15ull));
  for (int64_t i = 0; i < n; i++) p[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)(data_splitmix64(&x) % (uint64_t)(i + 1));
    int64_t t = p[i];
    p[i] = p[j], p[j] = t;
  }
}

void data_batch_indices(const DataSet *d, int64_t step, int B, uint64_t seed, int shuffle, int64_t *idx) {
  int64_t n = d->n;
  if (B <= 0 || n <= 0) {
    for (int i = 0; i < B; i++) idx[i] = 0;
    return;
  }
  int64_t bpe = n / B;
  if (bpe == 0) { /* fewer samples than a batch: wrap (callers reject this first) */
    for (int i = 0; i < B; i++) idx[i] = (step * B + i) % n;
    return;
  }
  if (step < 0) step = 0;
  int64_t e = step / bpe, k = step % bpe;
  if (!shuffle) {
    for (int i = 0; i < B; i++) idx[i] = k * B + i;
    return;
  }
  /* The permutation of the last epoch asked for is cached (the DataSet is const to callers,
     the cache lives behind its private pointer). */
  struct DataPriv *pv = d->priv;
  if (pv && !pv->perm) pv->perm = malloc(sizeof(int64_t) * (size_t)n);
  if (pv && pv->perm) {
    if (!pv->perm_valid || pv->perm_epoch != e || pv->perm_seed != seed) {
      make_perm(pv->perm, n, seed, e);
      pv->perm_valid = 1, pv->perm_epoch = e, pv->perm_seed = seed;
    }
    for (int i = 0; i < B; i++) idx[i] = pv->perm[k * B + i];
    return;
  }
  int64_t *p = malloc(sizeof(int64_t) * (size_t)n);
  if (!p) abort();
  make_perm(p, n, seed, e);
  for (int i = 0; i < B; i++) idx[i] = p[k * B + i];
  free(p);
}

int data_images(const DataSet *d, const int64_t *idx, int count, float *x, int64_t *labels, char *err, size_t errlen) {
  size_t chw = (size_t)d->c * d->h * d->w;
  int lim = d->priv ? d->priv->label_limit : 0;
  for (int i = 0; i < count; i++) {
    int64_t s = idx[i];
    if (x) {
      const uint8_t *src = d->images + (size_t)s * chw;
      float *dst = x + (size_t)i * chw;
      for (size_t j = 0; j < chw; j++) dst[j] = src[j] / 255.0f;
    }
    if (labels) labels[i] = d->labels[s];
    if (labels && lim && labels[i] >= lim)
      return changed(d->kind == DATA_MNIST ? d->priv->labels_file : dname(d), "label", (long long)labels[i], "sample", (long long)s, lim,
                     err, errlen);
  }
  return 0;
}

int64_t data_tokens_start(const DataSet *d, int64_t step, int B, int T) {
  int64_t bt = (int64_t)B * T;
  if (bt <= 0 || d->n <= 1) return 0;
  int64_t nb = (d->n - 1) / bt;
  if (nb == 0 || step < 0) return 0;
  return (step % nb) * bt;
}

int data_tokens(const DataSet *d, int64_t step, int B, int T, int first_seq, int nseq, int64_t *x, int64_t *y, char *err, size_t errlen) {
  int64_t start = data_tokens_start(d, step, B, T) + (int64_t)first_seq * T, n = d->n;
  int64_t cnt = (int64_t)nseq * T;
  int64_t lim = n > 1 ? n - 1 : 1; /* positions wrap only when the data is shorter than a batch */
  int64_t vocab = d->priv ? d->priv->id_limit : 0;
  for (int64_t i = 0; i < cnt; i++) {
    int64_t p = start + i;
    if (p + 1 >= n) p %= lim;
    if (x) x[i] = n > 0 ? d->tokens[p] : 0;
    if (y) y[i] = n > 1 ? d->tokens[p + 1] : 0;
    if (vocab && ((x && x[i] >= vocab) || (y && y[i] >= vocab))) {
      int at_y = !(x && x[i] >= vocab);
      return changed(dname(d), "token", (long long)(at_y ? y[i] : x[i]), "position", (long long)(p + at_y), (long long)vocab, err, errlen);
    }
  }
  return 0;
}
