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

extern MPI_Comm g_pipe; /* replica.c: this replica's stages (MPI_COMM_WORLD with one replica) */

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

/* One line of weights/manifest.txt: stage `stage` holds initializer `t`'s cnt floats at byte off. */
typedef struct ManEntry {
  int stage;
  long long off, cnt;
  Onnx__TensorProto *t;
} ManEntry;

/* The element count of t from its dims; -1 for a negative dim or one past 2^40 elements in all. */
static long long elements(const Onnx__TensorProto *t) {
  long long n = 1;
  for (size_t d = 0; d < t->n_dims; d++) {
    if (t->dims[d] < 0 || (t->dims[d] && n > (1LL << 40) / t->dims[d])) return -1;
    n *= t->dims[d];
  }
  return n;
}

static int has_data(const Onnx__TensorProto *t) {
  return t->raw_data.len || t->n_float_data || t->n_int32_data || t->n_int64_data || t->n_double_data || t->n_uint64_data ||
         t->n_string_data || t->n_external_data || elements(t) == 0;
}

static Onnx__ModelProto *load_model(const char *dir, char *msg, size_t len) {
  char path[4200];
  snprintf(path, sizeof path, "%s/model.onnx", dir);
  size_t n;
  uint8_t *buf = read_all(path, &n);
  if (!buf) return snprintf(msg, len, "cannot read %s", path), NULL;
  Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, n, buf);
  free(buf);
  if (!m || !m->graph) {
    if (m) onnx__model_proto__free_unpacked(m, NULL);
    return snprintf(msg, len, "%s is not a valid ONNX model", path), NULL;
  }
  return m;
}

/* Does e[0..n) list t for stage already?  (A tied weight kept on several stages has a line for each.) */
static int listed_for(const ManEntry *e, int n, const Onnx__TensorProto *t, int stage) {
  for (int i = 0; i < n; i++)
    if (e[i].t == t && e[i].stage == stage) return 1;
  return 0;
}

/* dir/weights/manifest.txt against model.onnx (m) and the stages' weights sizes (wbytes): every line
 * parses, names a float32 initializer of m (once per stage) with its element count, within its stage's weights;
 * every initializer model.onnx keeps without data is listed.  A damaged manifest made --save read past
 * a stage's weights (a segfault) or write an initializer with no data (malformed ONNX).  The entries
 * (*out, *nout; free *out), or -1 with msg. */
static int read_manifest(const char *dir, Onnx__ModelProto *m, int nstages, const int64_t *wbytes, ManEntry **out, int *nout, char *msg,
                         size_t len) {
  char path[4200], line[4096];
  snprintf(path, sizeof path, "%s/weights/manifest.txt", dir);
  FILE *man = fopen(path, "r");
  if (!man) return snprintf(msg, len, "cannot read %s: %s", path, strerror(errno)), -1;
  size_t ninit = m->graph->n_initializer;
  ManEntry *e = NULL;
  char *seen = calloc(ninit + 1, 1);
  int n = 0, cap = 0, lineno = 0, rc = 0;
  while (!rc && fgets(line, sizeof line, man)) {
    lineno++;
    int stage, used = -1;
    long long off, cnt, want = 0;
    char name[3000];
    size_t ll = strlen(line);
    if (line[0] == '#' || line[strspn(line, " \t\r\n")] == 0) continue;
    if (ll == sizeof line - 1 && line[ll - 1] != '\n') rc = -1;
    else if (sscanf(line, "%d %lld %lld %2999s %n", &stage, &off, &cnt, name, &used) != 4 || used < 0 || line[used]) rc = -1;
    if (rc) {
      snprintf(msg, len, "%s:%d: expected 'STAGE BYTE_OFFSET FLOAT_COUNT NAME' (damaged? regenerate it with pipecc)", path, lineno);
      break;
    }
    int bad_name = unescape_name(name);
    size_t k = 0;
    while (!bad_name && k < ninit && !(m->graph->initializer[k]->name && !strcmp(m->graph->initializer[k]->name, name))) k++;
    Onnx__TensorProto *t = !bad_name && k < ninit ? m->graph->initializer[k] : NULL;
    if (stage < 0 || stage >= nstages) rc = snprintf(msg, len, "%s:%d: stage %d, but there are %d stages", path, lineno, stage, nstages);
    else if (bad_name) rc = snprintf(msg, len, "%s:%d: a bad %%XX escape in the initializer's name", path, lineno);
    else if (!t) rc = snprintf(msg, len, "%s:%d: initializer '%s' is not in %s/model.onnx", path, lineno, name, dir);
    else if (listed_for(e, n, t, stage))
      rc = snprintf(msg, len, "%s:%d: initializer '%s' is listed twice for stage %d", path, lineno, name, stage);
    else if (t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
      rc = snprintf(msg, len, "%s:%d: initializer '%s' is not float32 in model.onnx", path, lineno, name);
    else if ((want = elements(t)) != cnt)
      rc = snprintf(msg, len, "%s:%d: initializer '%s' has %lld elements in model.onnx, the manifest says %lld", path, lineno, name, want, cnt);
    else if (off < 0 || off % 4 || cnt < 0 || off > wbytes[stage] || cnt > (wbytes[stage] - off) / 4)
      rc = snprintf(msg, len, "%s:%d: '%s' at byte %lld, %lld floats, is outside stage %d's %lld bytes of weights", path, lineno, name,
                    off, cnt, stage, (long long)wbytes[stage]);
    if (rc) break;
    if (n == cap && !(e = realloc(e, sizeof *e * (size_t)(cap = cap ? 2 * cap : 64)))) abort();
    seen[k] = 1;
    e[n++] = (ManEntry){stage, off, cnt, t};
  }
  if (!rc && ferror(man)) rc = snprintf(msg, len, "cannot read %s", path);
  fclose(man);
  for (size_t k = 0; !rc && k < ninit; k++)
    if (!seen[k] && !has_data(m->graph->initializer[k]))
      rc = snprintf(msg, len, "%s: initializer '%s' has no data in model.onnx and no line here (damaged? regenerate it with pipecc)", path,
                    m->graph->initializer[k]->name ? m->graph->initializer[k]->name : "");
  free(seen);
  if (rc) return free(e), -1;
  *out = e, *nout = n;
  return 0;
}

int pr_check_manifest(const PrStage *st, const char *dir, char *msg, size_t len) {
  int64_t *wb = st->stage == 0 ? calloc((size_t)st->nstages, sizeof *wb) : NULL;
  MPI_Gather(&st->weights_bytes, 1, MPI_INT64_T, wb, 1, MPI_INT64_T, 0, g_pipe);
  if (st->stage != 0) return 0;
  ManEntry *e = NULL;
  int n = 0, rc = -1;
  Onnx__ModelProto *m = load_model(dir, msg, len);
  if (m) rc = read_manifest(dir, m, st->nstages, wb, &e, &n, msg, len);
  if (m) onnx__model_proto__free_unpacked(m, NULL);
  free(e), free(wb);
  return rc;
}

void pr_save_onnx(const PrStage *st, const char *path, const char *dir) {
  int64_t bytes = st->weights_bytes;
  if (st->stage != 0) {
    MPI_Send(&bytes, 1, MPI_INT64_T, 0, 9001, g_pipe);
    MPI_Send(st->arena, (int)bytes, MPI_BYTE, 0, 9002, g_pipe);
    MPI_Barrier(g_pipe);
    return;
  }
  unsigned char **w = calloc((size_t)st->nstages, sizeof *w);
  int64_t *wb = calloc((size_t)st->nstages, sizeof *wb);
  w[0] = st->arena, wb[0] = bytes;
  for (int s = 1; s < st->nstages; s++) {
    MPI_Recv(&wb[s], 1, MPI_INT64_T, s, 9001, g_pipe, MPI_STATUS_IGNORE);
    w[s] = malloc((size_t)wb[s] + 1);
    MPI_Recv(w[s], (int)wb[s], MPI_BYTE, s, 9002, g_pipe, MPI_STATUS_IGNORE);
  }
  char msg[4400];
  Onnx__ModelProto *m = load_model(dir, msg, sizeof msg);
  if (!m) fail("%s%s", msg, "");
  ManEntry *e;
  int n;
  if (read_manifest(dir, m, st->nstages, wb, &e, &n, msg, sizeof msg)) fail("%s%s", msg, "");
  for (int i = 0; i < n; i++) {
    Onnx__TensorProto *t = e[i].t;
    long long cnt = e[i].cnt;
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
    t->raw_data.data = malloc((size_t)cnt * 4 + 1);
    memcpy(t->raw_data.data, w[e[i].stage] + e[i].off, (size_t)cnt * 4);
    t->raw_data.len = (size_t)cnt * 4;
    t->has_raw_data = 1;
  }
  free(e), free(wb);
  size_t out_len = onnx__model_proto__get_packed_size(m);
  uint8_t *out = malloc(out_len);
  onnx__model_proto__pack(m, out);
  onnx__model_proto__free_unpacked(m, NULL);
  write_model(path, out, out_len);
  free(out);
  for (int s = 1; s < st->nstages; s++) free(w[s]);
  free(w);
  MPI_Barrier(g_pipe);
}
