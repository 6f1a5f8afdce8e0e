/* onnx_load.c - reading an ONNX model with protobuf-c into the IR.
 *
 * Everything the file says is checked before it is trusted: sizes of
 * initializers against their dims, attribute types, references to tensors
 * that no node produces, external-data paths that would leave the model's
 * folder.  A problem is reported with the file and node it is in. */
#include "onnx_load.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "onnx.pb-c.h"
#include "onnx_wire.h"

#define MAX_FILE_BYTES ((size_t)1 << 40)

/* Copies a TensorProto's value into t->data, from raw_data, the typed
 * fields or an external file. */
static int load_tensor_data(Graph *g, Tensor *t, const Onnx__TensorProto *tp, const char *dir);

static int set_dims(Tensor *t, const Onnx__TensorProto *tp, const char *what) {
  if (tp->n_dims > MAX_RANK)
    return err_set("%s: tensor '%s' has rank %zu; pipecc supports at most %d", what, t->name,
                   tp->n_dims, MAX_RANK);
  t->rank = (int)tp->n_dims;
  int64_t numel = 1;
  for (size_t i = 0; i < tp->n_dims; i++) {
    if (tp->dims[i] < 0 || (tp->dims[i] > 0 && numel > INT64_MAX / 4 / tp->dims[i]))
      return err_set("%s: tensor '%s' has an invalid dimension %lld", what, t->name,
                     (long long)tp->dims[i]);
    t->dims[i] = tp->dims[i];
    numel *= tp->dims[i];
  }
  return 0;
}

static int tensor_from_proto(Graph *g, Tensor *t, const Onnx__TensorProto *tp, const char *dir,
                             const char *what) {
  if (!tp->has_data_type || dtype_size(tp->data_type) == 0)
    return err_set("%s: tensor '%s' has unsupported element type %d", what, t->name,
                   tp->has_data_type ? tp->data_type : 0);
  if (tp->segment) return err_set("%s: tensor '%s' is segmented, which pipecc does not support", what, t->name);
  t->dtype = tp->data_type;
  if (set_dims(t, tp, what)) return -1;
  return load_tensor_data(g, t, tp, dir);
}

static const char *ext_entry(const Onnx__TensorProto *tp, const char *key) {
  for (size_t i = 0; i < tp->n_external_data; i++)
    if (tp->external_data[i]->key && !strcmp(tp->external_data[i]->key, key))
      return tp->external_data[i]->value;
  return NULL;
}

/* Opens `path` for reading only if it is a regular file: a FIFO or a device
 * would block pipecc or feed it endless bytes.  O_NONBLOCK keeps open() of a
 * FIFO from waiting for a writer.  Returns the fd, or -1 with *why set. */
static int open_regular(const char *path, struct stat *st, const char **why) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return *why = strerror(errno), -1;
  if (fstat(fd, st) || !S_ISREG(st->st_mode)) {
    close(fd);
    return *why = "not a regular file", -1;
  }
  return fd;
}

/* The real path of dir/loc, only if it stays inside dir's real path: a
 * symlink (to a file or a folder) must not pull in a file from elsewhere. */
static char *confined_path(Graph *g, const Tensor *t, const char *dir, const char *loc) {
  char root[PATH_MAX], real[PATH_MAX];
  if (!realpath(dir, root)) return err_set("initializer '%s': cannot resolve the model's folder: %s", t->name, strerror(errno)), NULL;
  char *joined = pool_printf(&g->pool, "%s/%s", dir, loc);
  if (!realpath(joined, real))
    return err_set("initializer '%s': cannot open external data '%s': %s", t->name, joined, strerror(errno)), NULL;
  size_t n = strlen(root);
  if (strncmp(real, root, n) || (real[n] != '/' && strcmp(root, "/")))
    return err_set("initializer '%s': external data location '%s' resolves to '%s', outside the model's folder '%s'",
                   t->name, loc, real, root), NULL;
  return pool_strdup(&g->pool, real);
}

/* Reads exactly `bytes` at `off` (checked against the file's size without
 * overflow: off and len come from the model). */
static int read_at(int fd, const struct stat *st, long long off, size_t bytes, void *out) {
  if (off > (long long)st->st_size || (long long)bytes > (long long)st->st_size - off) return -1;
  for (size_t got = 0; got < bytes;) {
    ssize_t r = pread(fd, (char *)out + got, bytes - got, (off_t)(off + (long long)got));
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

static int load_external(Graph *g, Tensor *t, const Onnx__TensorProto *tp, const char *dir,
                         size_t bytes) {
  const char *loc = ext_entry(tp, "location");
  if (!loc || !*loc) return err_set("initializer '%s': external data without a location", t->name);
  if (!dir) return err_set("initializer '%s': external data is not allowed here", t->name);
  if (loc[0] == '/' || strstr(loc, ".."))
    return err_set("initializer '%s': external data location '%s' leaves the model's folder", t->name, loc);
  const char *off_s = ext_entry(tp, "offset"), *len_s = ext_entry(tp, "length");
  char *end;
  errno = 0;
  long long off = off_s ? strtoll(off_s, &end, 10) : 0;
  if (off_s && (*end || off < 0 || errno)) return err_set("initializer '%s': bad external offset '%s'", t->name, off_s);
  long long len = len_s ? strtoll(len_s, &end, 10) : (long long)bytes;
  if (len_s && (*end || len < 0 || errno)) return err_set("initializer '%s': bad external length '%s'", t->name, len_s);
  if ((unsigned long long)len != bytes)
    return err_set("initializer '%s': external length %lld does not match %zu bytes of %s%s", t->name,
                   len, bytes, dtype_name(t->dtype), shape_str(t));
  char *path = confined_path(g, t, dir, loc);
  if (!path) return -1;
  struct stat st;
  const char *why;
  int fd = open_regular(path, &st, &why);
  if (fd < 0) return err_set("initializer '%s': cannot use external data '%s': %s", t->name, path, why);
  t->data = pool_alloc(&g->pool, bytes ? bytes : 1);
  int rc = read_at(fd, &st, off, bytes, t->data);
  close(fd);
  if (rc)
    return err_set("initializer '%s': external data '%s' (%lld bytes) is shorter than offset %lld + length %lld",
                   t->name, path, (long long)st.st_size, off, len);
  return 0;
}

static int load_tensor_data(Graph *g, Tensor *t, const Onnx__TensorProto *tp, const char *dir) {
  int64_t numel = ir_numel(t);
  size_t esz = (size_t)dtype_size(t->dtype);
  size_t bytes = (size_t)numel * esz;
  if (bytes > MAX_FILE_BYTES) return err_set("tensor '%s' is too large (%lld elements)", t->name, (long long)numel);
  if (tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
    return load_external(g, t, tp, dir, bytes);
  if (tp->has_raw_data) {
    if (tp->raw_data.len != bytes)
      return err_set("tensor '%s': raw_data has %zu bytes but %s%s needs %zu", t->name, tp->raw_data.len,
                     dtype_name(t->dtype), shape_str(t), bytes);
    if (bytes) {
      t->data = tp->raw_data.data; /* owned by the unpacked model, which the graph keeps */
    } else {
      t->data = pool_alloc(&g->pool, 1);
    }
    return 0;
  }
  /* Typed fields: which one holds the values depends on the element type. */
  size_t have;
  switch (t->dtype) {
  case DT_FLOAT: have = tp->n_float_data; break;
  case DT_DOUBLE: have = tp->n_double_data; break;
  case DT_INT64: have = tp->n_int64_data; break;
  case DT_UINT32: case DT_UINT64: have = tp->n_uint64_data; break;
  default: have = tp->n_int32_data; break; /* int32, int16, int8, uint8, bool, float16 bits */
  }
  if (have != (size_t)numel)
    return err_set("tensor '%s' holds %zu values but its shape %s needs %lld", t->name, have,
                   shape_str(t), (long long)numel);
  t->data = pool_alloc(&g->pool, bytes);
  for (int64_t i = 0; i < numel; i++) {
    switch (t->dtype) {
    case DT_FLOAT: ((float *)t->data)[i] = tp->float_data[i]; break;
    case DT_DOUBLE: ((double *)t->data)[i] = tp->double_data[i]; break;
    case DT_INT64: ((int64_t *)t->data)[i] = tp->int64_data[i]; break;
    case DT_UINT32: case DT_UINT64: const_set_i64(t, i, (int64_t)tp->uint64_data[i]); break;
    case DT_FLOAT16: ((uint16_t *)t->data)[i] = (uint16_t)tp->int32_data[i]; break;
    default: const_set_i64(t, i, tp->int32_data[i]); break;
    }
  }
  return 0;
}

/* Declared type/shape of a graph input/output or value_info entry. */
static int read_value_info(Graph *g, const Onnx__ValueInfoProto *vi, int idx, const char *what) {
  Tensor *t = &g->t[idx];
  const Onnx__TypeProto *tp = vi->type;
  if (!tp) return 0;
  if (tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
    return err_set("%s '%s' is not a tensor (sequences, maps and optionals are not supported)", what, t->name);
  const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
  if (tt->has_elem_type && !t->dtype) t->dtype = tt->elem_type;
  if (!tt->shape) return 0;
  if (tt->shape->n_dim > MAX_RANK)
    return err_set("%s '%s' has rank %zu; pipecc supports at most %d", what, t->name, tt->shape->n_dim, MAX_RANK);
  t->declared_rank = (int)tt->shape->n_dim;
  for (size_t i = 0; i < tt->shape->n_dim; i++) {
    const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[i];
    t->declared_dims[i] = -1;
    t->declared_params[i] = NULL;
    if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
      if (d->dim_value < 0) return err_set("%s '%s' has a negative dimension", what, t->name);
      t->declared_dims[i] = d->dim_value;
    } else if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM) {
      t->declared_params[i] = pool_strdup(&g->pool, d->dim_param);
    }
  }
  return 0;
}

/* A NaN or infinite attribute (a Gemm alpha of NaN) has no meaning to train
 * with, and would print as no valid C literal in the stage program. */
static int bad_float(const Node *n, const char *attr, float v) {
  return err_set("node '%s' (%s): attribute '%s' is %s; pipecc refuses non-finite attribute values", n->name, n->op, attr,
                 isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf");
}

static int read_attr(Graph *g, Node *n, Attr *a, const Onnx__AttributeProto *ap, const char *dir) {
  a->name = pool_strdup(&g->pool, ap->name ? ap->name : "");
  a->type = ap->has_type ? (int)ap->type : 0;
  if (ap->ref_attr_name) return err_set("node '%s' (%s): attribute references are not supported", n->name, n->op);
  switch (a->type) {
  case ATTR_FLOAT:
    a->f = ap->f;
    if (!isfinite(a->f)) return bad_float(n, a->name, a->f);
    break;
  case ATTR_INT: a->i = ap->i; break;
  case ATTR_STRING: {
    char *s = pool_alloc(&g->pool, ap->s.len + 1);
    if (ap->s.len) memcpy(s, ap->s.data, ap->s.len);
    a->s = s;
    break;
  }
  case ATTR_INTS:
    a->n = (int)ap->n_ints;
    a->ints = pool_alloc(&g->pool, ap->n_ints * sizeof(int64_t));
    if (ap->n_ints) memcpy(a->ints, ap->ints, ap->n_ints * sizeof(int64_t));
    break;
  case ATTR_FLOATS:
    a->n = (int)ap->n_floats;
    a->floats = pool_alloc(&g->pool, ap->n_floats * sizeof(float));
    if (ap->n_floats) memcpy(a->floats, ap->floats, ap->n_floats * sizeof(float));
    for (int k = 0; k < a->n; k++)
      if (!isfinite(a->floats[k])) return bad_float(n, a->name, a->floats[k]);
    break;
  case ATTR_TENSOR: {
    if (!ap->t) return err_set("node '%s' (%s): attribute '%s' has no tensor", n->name, n->op, a->name);
    a->tensor = ir_add_tensor(g, pool_printf(&g->pool, "%s::%s", n->name, a->name));
    char *what = pool_printf(&g->pool, "node '%s' (%s)", n->name, n->op);
    if (tensor_from_proto(g, &g->t[a->tensor], ap->t, dir, what)) return -1;
    break;
  }
  case ATTR_STRINGS: /* the recurrent ops' activations */
    a->n = (int)ap->n_strings;
    a->strs = pool_alloc(&g->pool, (ap->n_strings + 1) * sizeof(char *));
    for (size_t k = 0; k < ap->n_strings; k++) {
      char *s = pool_alloc(&g->pool, ap->strings[k].len + 1);
      if (ap->strings[k].len) memcpy(s, ap->strings[k].data, ap->strings[k].len);
      a->strs[k] = s;
    }
    break;
  default:
    return err_set("node '%s' (%s): attribute '%s' has a type pipecc does not support (%d)", n->name, n->op,
                   a->name, a->type);
  }
  return 0;
}

/* Resolves a tensor name used as a node input; it must already exist. */
static int input_ref(Graph *g, const char *name, const Node *n) {
  if (!name[0]) return -1;
  int idx = ir_find_tensor(g, name);
  if (idx < 0) {
    err_set("node '%s' (%s) reads '%s', which no earlier node, input or initializer defines "
            "(the graph is not in topological order or is incomplete)", n->name, n->op, name);
    return -2;
  }
  return idx;
}

static int read_node(Graph *g, const Onnx__NodeProto *np, int k, const char *dir) {
  const char *op = np->op_type ? np->op_type : "";
  if (np->domain && np->domain[0] && strcmp(np->domain, "ai.onnx"))
    return err_set("node '%s' (%s) is in domain '%s'; pipecc supports only the default ONNX domain",
                   np->name && np->name[0] ? np->name : "?", op, np->domain);
  const char *name = np->name && np->name[0] ? np->name : pool_printf(&g->pool, "%s_%d", op, k);
  int ni = ir_add_node(g, name, op);
  Node *n = &g->n[ni];
  n->nin = (int)np->n_input;
  n->in = pool_alloc(&g->pool, np->n_input * sizeof(int));
  for (size_t i = 0; i < np->n_input; i++) {
    int r = input_ref(g, np->input[i] ? np->input[i] : "", n);
    if (r == -2) return -1;
    n->in[i] = r;
  }
  n->nattrs = (int)np->n_attribute;
  n->attrs = pool_alloc(&g->pool, np->n_attribute * sizeof(Attr));
  for (size_t i = 0; i < np->n_attribute; i++) {
    /* Attributes may add tensors (and move g->n); re-fetch the node after. */
    if (read_attr(g, &g->n[ni], &g->n[ni].attrs[i], np->attribute[i], dir)) return -1;
  }
  n = &g->n[ni];
  n->nout = (int)np->n_output;
  n->out = pool_alloc(&g->pool, np->n_output * sizeof(int));
  for (size_t i = 0; i < np->n_output; i++) {
    const char *oname = np->output[i] ? np->output[i] : "";
    if (!oname[0]) {
      n->out[i] = -1;
      continue;
    }
    if (ir_find_tensor(g, oname) >= 0)
      return err_set("node '%s' (%s) writes '%s', which is already defined (ONNX tensors are assigned once)",
                     n->name, n->op, oname);
    int t = ir_add_tensor(g, oname);
    g->t[t].producer = ni;
    g->n[ni].out[i] = t;
  }
  return 0;
}

static int read_graph(Graph *g, const Onnx__GraphProto *gp, const char *dir) {
  /* Initializers first: graph inputs may repeat them (older exporters). */
  for (size_t i = 0; i < gp->n_initializer; i++) {
    const Onnx__TensorProto *tp = gp->initializer[i];
    const char *name = tp->name ? tp->name : "";
    if (!name[0]) return err_set("initializer %zu has no name", i);
    if (ir_find_tensor(g, name) >= 0) return err_set("initializer '%s' is defined twice", name);
    int t = ir_add_tensor(g, name);
    g->t[t].is_initializer = 1;
    if (tensor_from_proto(g, &g->t[t], tp, dir, "initializer")) return -1;
  }
  if (gp->n_sparse_initializer) return err_set("sparse initializers are not supported");
  g->inputs = pool_alloc(&g->pool, gp->n_input * sizeof(int));
  for (size_t i = 0; i < gp->n_input; i++) {
    const char *name = gp->input[i]->name ? gp->input[i]->name : "";
    int t = ir_find_tensor(g, name);
    if (t >= 0) {
      if (!g->t[t].is_initializer) return err_set("graph input '%s' is listed twice", name);
      continue; /* an initializer that is also listed as an input: a constant */
    }
    if (!name[0]) return err_set("graph input %zu has no name", i);
    t = ir_add_tensor(g, name);
    g->t[t].is_input = 1;
    if (read_value_info(g, gp->input[i], t, "graph input")) return -1;
    g->inputs[g->ninputs++] = t;
  }
  for (size_t i = 0; i < gp->n_node; i++)
    if (read_node(g, gp->node[i], (int)i, dir)) return -1;
  for (size_t i = 0; i < gp->n_value_info; i++) {
    int t = ir_find_tensor(g, gp->value_info[i]->name ? gp->value_info[i]->name : "");
    if (t >= 0 && read_value_info(g, gp->value_info[i], t, "value_info")) return -1;
  }
  g->outputs = pool_alloc(&g->pool, gp->n_output * sizeof(int));
  for (size_t i = 0; i < gp->n_output; i++) {
    const char *name = gp->output[i]->name ? gp->output[i]->name : "";
    int t = ir_find_tensor(g, name);
    if (t < 0) return err_set("graph output '%s' is not produced by any node", name);
    g->t[t].is_output = 1;
    if (read_value_info(g, gp->output[i], t, "graph output")) return -1;
    g->outputs[g->noutputs++] = t;
  }
  if (!g->nn) return err_set("the graph has no nodes");
  if (!g->noutputs) return err_set("the graph has no outputs");
  return 0;
}

static void free_model(void *m) { onnx__model_proto__free_unpacked(m, NULL); }

/* The graph of an unpacked model m (which g then owns). */
static int load_unpacked(Onnx__ModelProto *m, const char *name, const char *dir, Graph *g) {
  memset(g, 0, sizeof *g);
  g->path = pool_strdup(&g->pool, name);
  if (!m) {
    ir_free(g);
    return err_set("%s: not a valid ONNX model (the protobuf does not parse: truncated or another format)", name);
  }
  int rc = 0;
  if (!m->graph) rc = err_set("%s: the model has no graph", name);
  g->opset = -1;
  for (size_t i = 0; !rc && i < m->n_opset_import; i++) {
    const Onnx__OperatorSetIdProto *os = m->opset_import[i];
    if ((!os->domain || !os->domain[0] || !strcmp(os->domain, "ai.onnx")) && os->has_version)
      g->opset = os->version;
  }
  if (!rc && g->opset < 0) rc = err_set("%s: the model imports no default-domain opset", name);
  if (!rc && (g->opset < 7 || g->opset > 21))
    rc = err_set("%s: opset %lld is outside the range pipecc supports (7..21)", name, (long long)g->opset);
  if (!rc) rc = read_graph(g, m->graph, dir);
  g->proto = m;
  g->proto_free = free_model;
  if (rc) {
    /* Prefix the file name once, so every message says where it came from. */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", err_msg());
    err_clear();
    if (strncmp(msg, name, strlen(name))) err_set("%s: %s", name, msg);
    else err_set("%s", msg);
    ir_free(g);
    return -1;
  }
  return 0;
}

/* The model in the mapped file map[0, len): its skeleton (onnx_wire.c) unpacked, then each
 * initializer's raw_data copied from the map in chunks, each chunk's whole pages dropped from this
 * process once copied, so the weights are held once.  NULL where the walk or the skeleton's
 * unpacking fails: the caller unpacks the whole file, which names the problem.  drop: map is a
 * mapping of the file whose pages may be dropped (not memory of the caller's). */
static Onnx__ModelProto *unpack_split(const uint8_t *map, size_t len, int drop) {
  WireSplit w;
  if (wire_split(map, len, &w)) return NULL;
  Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, w.len, w.skeleton);
  if (!m || !m->graph || m->graph->n_initializer != w.ninit) {
    if (m) onnx__model_proto__free_unpacked(m, NULL);
    wire_free(&w);
    return NULL;
  }
  size_t page = (size_t)sysconf(_SC_PAGESIZE), chunk = (size_t)8 << 20;
  for (size_t i = 0; i < w.ninit; i++) {
    if (!w.has[i]) continue;
    Onnx__TensorProto *tp = m->graph->initializer[i];
    uint8_t *data = w.plen[i] ? malloc(w.plen[i]) : NULL;
    if (w.plen[i] && !data) abort();
    for (size_t at = 0; at < w.plen[i]; at += chunk) {
      size_t n = w.plen[i] - at < chunk ? w.plen[i] - at : chunk, a = w.off[i] + at;
      memcpy(data + at, map + a, n);
      size_t lo = (a + page - 1) / page * page, hi = (a + n) / page * page; /* pages wholly inside the copied bytes */
      if (drop && hi > lo) madvise((void *)(map + lo), hi - lo, MADV_DONTNEED);
    }
    tp->raw_data.data = data, tp->raw_data.len = w.plen[i], tp->has_raw_data = 1;
  }
  wire_free(&w);
  return m;
}

int onnx_load_buffer(const uint8_t *data, size_t len, const char *name, const char *dir, Graph *g) {
  Onnx__ModelProto *m = unpack_split(data, len, 0);
  return load_unpacked(m ? m : onnx__model_proto__unpack(NULL, len, data), name, dir, g);
}

int onnx_load_file(const char *path, Graph *g) {
  struct stat st;
  const char *why;
  int fd = open_regular(path, &st, &why);
  if (fd < 0) return err_set("%s: cannot open: %s", path, why);
  size_t len = (size_t)st.st_size;
  if (len == 0) {
    close(fd);
    return err_set("%s: the file is empty, not an ONNX model", path);
  }
  if (len > MAX_FILE_BYTES) {
    close(fd);
    return err_set("%s: too large to read (%zu bytes)", path, len);
  }
  /* Mapped, not read: the weights are copied once, into their tensors (unpack_split). */
  uint8_t *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return err_set("%s: cannot map it: %s", path, strerror(errno));
  char *dir = strdup(path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = 0;
  else strcpy(dir, ".");
  /* A file that shrinks under the map would fault: the data comes from the map only through
   * unpack_split's copies and protobuf-c's own reads, both over the length stat gave; a
   * truncation while pipecc runs is the one race left (as with any reader). */
  Onnx__ModelProto *m = unpack_split(map, len, 1);
  if (!m) m = onnx__model_proto__unpack(NULL, len, map);
  munmap(map, len);
  int rc = load_unpacked(m, path, dir, g);
  free(dir);
  return rc;
}

/* What a stripped initializer held, to put back after packing. */
typedef struct Held {
  Onnx__TensorProto *tp;
  ProtobufCBinaryData raw;
  protobuf_c_boolean has_raw, has_loc;
  int loc;
  size_t nfloat, next;
  float *floats;
  Onnx__StringStringEntryProto **ext;
} Held;

static void strip_data(Onnx__TensorProto *tp, Held *h) {
  *h = (Held){tp, tp->raw_data, tp->has_raw_data, tp->has_data_location, tp->data_location, tp->n_float_data, tp->n_external_data,
              tp->float_data, tp->external_data};
  tp->raw_data = (ProtobufCBinaryData){0, NULL}, tp->has_raw_data = 0;
  tp->has_data_location = 0, tp->n_float_data = 0, tp->float_data = NULL, tp->n_external_data = 0, tp->external_data = NULL;
}

static void restore_data(const Held *h) {
  Onnx__TensorProto *tp = h->tp;
  tp->raw_data = h->raw, tp->has_raw_data = h->has_raw, tp->has_data_location = h->has_loc, tp->data_location = h->loc;
  tp->n_float_data = h->nfloat, tp->float_data = h->floats, tp->n_external_data = h->next, tp->external_data = h->ext;
}

/* The model as the generated directory keeps it: with --untie's copies (g->untied), each a new float
 * initializer holding the original's initial value, read by its node instead of the original; and
 * without the data of the initializers strip[t] marks (the weights the stages hold: --save writes
 * them back from the stages, so they are on disk once, in weights/).  The unpacked model is edited
 * for the packing and restored after, so the graph's data (which points into it) is untouched.
 * Returns the bytes (malloc'd) in *out; -1 with err_set if g has no model. */
int onnx_pack_model(const Graph *g, const char *strip, uint8_t **out, size_t *len) {
  Onnx__ModelProto *m = g->proto;
  if (!m || !m->graph) return err_set("internal error: no model to write");
  Onnx__GraphProto *gp = m->graph;
  int nu = g->nuntied;
  /* The graph's node j is the model's node j (read_graph adds one per node, in order); a node that
   * fuse.c gave other nodes' work runs another op than the file's. */
  for (int u = 0; u < nu; u++) {
    int j = g->untied[u].node;
    if ((size_t)j >= gp->n_node || !gp->node[j]->op_type || (!g->n[j].fusion && strcmp(gp->node[j]->op_type, g->n[j].op)))
      return err_set("internal error: node %d of the model is not the graph's '%s'", j, g->n[j].name);
  }
  Onnx__TensorProto *tp = calloc((size_t)nu + 1, sizeof *tp);
  Onnx__TensorProto **inits = calloc(gp->n_initializer + (size_t)nu + 1, sizeof *inits);
  char ***saved = calloc((size_t)nu + 1, sizeof *saved); /* each renamed node's input array */
  int64_t *dims = calloc((size_t)nu * MAX_RANK + 1, sizeof *dims);
  if (!tp || !inits || !saved || !dims) abort();
  memcpy(inits, gp->initializer, gp->n_initializer * sizeof *inits);
  for (int u = 0; u < nu; u++) {
    const Tensor *c = &g->t[g->untied[u].copy];
    onnx__tensor_proto__init(&tp[u]);
    tp[u].name = (char *)c->name;
    tp[u].data_type = c->dtype, tp[u].has_data_type = 1;
    for (int i = 0; i < c->rank; i++) dims[u * MAX_RANK + i] = c->dims[i];
    tp[u].n_dims = (size_t)c->rank, tp[u].dims = &dims[u * MAX_RANK];
    if (!strip || !strip[g->untied[u].copy])
      tp[u].has_raw_data = 1, tp[u].raw_data.len = (size_t)tensor_bytes(c), tp[u].raw_data.data = c->data;
    inits[gp->n_initializer + (size_t)u] = &tp[u];
    /* The node reads the copy: a new input array, the old one kept to restore. */
    Onnx__NodeProto *np = gp->node[g->untied[u].node];
    char **in = calloc(np->n_input + 1, sizeof *in);
    if (!in) abort();
    for (size_t q = 0; q < np->n_input; q++)
      in[q] = np->input[q] && !strcmp(np->input[q], g->t[g->untied[u].from].name) ? (char *)c->name : np->input[q];
    saved[u] = np->input;
    np->input = in;
  }
  Held *held = calloc(gp->n_initializer + 1, sizeof *held);
  if (!held) abort();
  size_t nheld = 0;
  for (size_t i = 0; strip && i < gp->n_initializer; i++) {
    int t = gp->initializer[i]->name ? ir_find_tensor(g, gp->initializer[i]->name) : -1;
    if (t >= 0 && strip[t]) strip_data(gp->initializer[i], &held[nheld++]);
  }
  Onnx__TensorProto **old = gp->initializer;
  size_t nold = gp->n_initializer;
  gp->initializer = inits, gp->n_initializer = nold + (size_t)nu;
  *len = onnx__model_proto__get_packed_size(m);
  *out = malloc(*len + 1);
  if (!*out) abort();
  onnx__model_proto__pack(m, *out);
  gp->initializer = old, gp->n_initializer = nold;
  while (nheld) restore_data(&held[--nheld]);
  free(held);
  for (int u = nu - 1; u >= 0; u--) { /* a node untied twice is restored in reverse */
    Onnx__NodeProto *np = gp->node[g->untied[u].node];
    free(np->input);
    np->input = saved[u];
  }
  free(tp), free(inits), free(saved), free(dims);
  return 0;
}
