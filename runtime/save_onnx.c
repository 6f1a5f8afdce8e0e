/* save_onnx.c - writing the trained model back as ONNX.
 *
 * pipecc put the model's graph next to the stage programs (model.onnx: the
 * initializers the stages hold have no data there, so the weights are on disk
 * once) and a manifest of which stage holds which initializer
 * (weights/manifest.txt).  Every stage sends its weights to stage 0, which
 * fills in those initializers' data (as raw_data) and writes the file under a
 * temporary name, renamed into place when complete (write_model). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "onnx.pb-c.h"
#include "piperun.h"

static void fail(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "piperun: stage 0: error: --save: ");
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, "\n");
  MPI_Abort(MPI_COMM_WORLD, 2);
}

static uint8_t *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = n > 0 ? malloc((size_t)n) : NULL;
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) free(buf), buf = NULL;
  fclose(f);
  *len = (size_t)n;
  return buf;
}

/* The manifest writes a name's space, '%' and non-ASCII bytes as %XX, so a
 * name holding a newline stays on its line.  Decodes in place. */
static int unescape_name(char *s) {
  char *o = s;
  for (; *s; s++) {
    unsigned v;
    if (*s != '%') *o++ = *s;
    else if (sscanf(s + 1, "%2X", &v) == 1 && isxdigit((unsigned char)s[1]) && isxdigit((unsigned char)s[2]) && v)
      *o++ = (char)v, s += 2;
    else return -1;
  }
  *o = 0;
  return 0;
}

/* The packed model to path, by path.tmp-PID (O_EXCL: this process's own, never
 * a file of the user's) and a rename once it is synced.  A path that is there
 * must be a regular file: the rename would replace a device node, a FIFO or a
 * symbolic link (run.sh checked before step 1; the run may have been days).
 * On any failure (a full disk, a file size limit) the temporary file goes. */
static void write_model(const char *path, const uint8_t *out, size_t n) {
  struct stat sb;
  if (lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) fail("%s exists and is not a regular file%s; nothing written", path, "");
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666), err = fd < 0 ? errno : 0;
  for (size_t done = 0; !err && done < n;) {
    ssize_t k = write(fd, out + done, n - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) err = k < 0 ? errno : EIO;
    else done += (size_t)k;
  }
  if (fd >= 0 && !err && fsync(fd)) err = errno;
  if (fd >= 0 && close(fd) && !err) err = errno;
  if (!err && rename(tmp, path)) err = errno;
  if (!err) return;
  if (fd >= 0) unlink(tmp);
  fail("cannot write %s: %s", path, strerror(err));
}

void pr_save_onnx(const PrStage *st, const char *path, const char *dir) {
  int64_t bytes = st->weights_bytes;
  if (st->stage != 0) {
    MPI_Send(&bytes, 1, MPI_INT64_T, 0, 9001, MPI_COMM_WORLD);
    MPI_Send(st->arena, (int)bytes, MPI_BYTE, 0, 9002, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    return;
  }
  unsigned char **w = calloc((size_t)st->nstages, sizeof *w);
  w[0] = st->arena;
  for (int s = 1; s < st->nstages; s++) {
    int64_t n;
    MPI_Recv(&n, 1, MPI_INT64_T, s, 9001, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    w[s] = malloc((size_t)n + 1);
    MPI_Recv(w[s], (int)n, MPI_BYTE, s, 9002, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  char mpath[4096];
  snprintf(mpath, sizeof mpath, "%s/model.onnx", dir);
  size_t len;
  uint8_t *buf = read_all(mpath, &len);
  if (!buf) fail("cannot read %s%s", mpath, "");
  Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, buf);
  free(buf);
  if (!m || !m->graph) fail("%s is not a valid ONNX model%s", mpath, "");
  snprintf(mpath, sizeof mpath, "%s/weights/manifest.txt", dir);
  FILE *man = fopen(mpath, "r");
  if (!man) fail("cannot read %s: %s", mpath, strerror(errno));
  char line[4096];
  int replaced = 0;
  while (fgets(line, sizeof line, man)) {
    int stage;
    long long off, cnt;
    char name[3000];
    if (line[0] == '#' || sscanf(line, "%d %lld %lld %2999[^\n]", &stage, &off, &cnt, name) != 4) continue;
    if (stage < 0 || stage >= st->nstages) fail("bad stage in %s%s", mpath, "");
    if (unescape_name(name)) fail("bad initializer name in %s%s", mpath, "");
    Onnx__TensorProto *t = NULL;
    for (size_t i = 0; i < m->graph->n_initializer; i++)
      if (m->graph->initializer[i]->name && !strcmp(m->graph->initializer[i]->name, name)) t = m->graph->initializer[i];
    if (!t) fail("initializer '%s' is not in %s", name, "model.onnx");
    /* Replace the value: raw little-endian float32, no typed or external fields. */
    free(t->float_data);
    t->float_data = NULL, t->n_float_data = 0;
    for (size_t k = 0; k < t->n_external_data; k++) {
      free(t->external_data[k]->key), free(t->external_data[k]->value), free(t->external_data[k]);
    }
    free(t->external_data);
    t->external_data = NULL, t->n_external_data = 0;
    t->has_data_location = 0;
    free(t->raw_data.data);
    t->raw_data.data = malloc((size_t)cnt * 4);
    memcpy(t->raw_data.data, w[stage] + off, (size_t)cnt * 4);
    t->raw_data.len = (size_t)cnt * 4;
    t->has_raw_data = 1;
    replaced++;
  }
  fclose(man);
  size_t out_len = onnx__model_proto__get_packed_size(m);
  uint8_t *out = malloc(out_len);
  onnx__model_proto__pack(m, out);
  onnx__model_proto__free_unpacked(m, NULL);
  write_model(path, out, out_len);
  free(out);
  for (int s = 1; s < st->nstages; s++) free(w[s]);
  free(w);
  (void)replaced;
  MPI_Barrier(MPI_COMM_WORLD);
}
