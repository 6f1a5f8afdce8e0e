/* npy.c - NumPy's .npy headers and .npz archives, read in place (npy.h). */
#include "npy.h"
#include "failmsg.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* NumPy's format: "\x93NUMPY", major, minor, the header's length (2 bytes in version 1, 4 after),
 * then the header: a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * padded with spaces to a multiple of 64 bytes, ending in '\n'. */
#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
/* NumPy writes at most a few hundred bytes of header; anything past this is not an array of ours. */
#define NPY_MAX_HEADER 65536

/* Zip's records (APPNOTE.TXT): their signatures and fixed sizes. */
#define ZIP_LOCAL 0x04034b50u
#define ZIP_CENTRAL 0x02014b50u
#define ZIP_END 0x06054b50u
#define ZIP64_END 0x06064b50u
#define ZIP64_LOCATOR 0x07064b50u
#define ZIP_LOCAL_LEN 30
#define ZIP_CENTRAL_LEN 46
#define ZIP_END_LEN 22
#define ZIP64_END_LEN 56
#define ZIP64_LOCATOR_LEN 20
#define ZIP_MAX_COMMENT 65535
#define ZIP64_EXTRA 0x0001

static uint64_t le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

const char *npy_type_name(int type) {
  static const char *const names[] = {"?", "float32", "float64", "uint8", "uint16", "int32", "int64"};
  return type >= NPY_F32 && type <= NPY_I64 ? names[type] : "?";
}

int npy_is_integer(int type) { return type == NPY_U8 || type == NPY_U16 || type == NPY_I32 || type == NPY_I64; }

double npy_get_f(const NpyArray *a, int64_t i) {
  const uint8_t *p = a->data + i * a->itemsize;
  if (a->type == NPY_F32) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  if (a->type == NPY_F64) {
    double d;
    memcpy(&d, p, 8);
    return d;
  }
  return (double)npy_get_i(a, i);
}

int64_t npy_get_i(const NpyArray *a, int64_t i) {
  const uint8_t *p = a->data + i * a->itemsize;
  switch (a->type) {
  case NPY_U8: return p[0];
  case NPY_U16: return (int64_t)le(p, 2);
  case NPY_I32: return (int32_t)(uint32_t)le(p, 4);
  case NPY_I64: return (int64_t)le(p, 8);
  default: return (int64_t)npy_get_f(a, i);
  }
}

/* ---- the header's dict literal ---- */

typedef struct Cursor {
  const char *p, *end;
} Cursor;

static void blank(Cursor *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int eat(Cursor *c, char ch) {
  blank(c);
  if (c->p < c->end && *c->p == ch) return c->p++, 1;
  return 0;
}

/* A quoted string ('...' or "...", no escapes: NumPy's keys and dtypes have none) into out. */
static int quoted(Cursor *c, char *out, size_t n) {
  blank(c);
  if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
  char q = *c->p++;
  size_t k = 0;
  while (c->p < c->end && *c->p != q) {
    /* printable ASCII only: what is quoted here ends up in messages */
    if (k + 1 >= n || *c->p == '\\' || *c->p < 0x20 || *c->p > 0x7e) return 0;
    out[k++] = *c->p++;
  }
  out[k] = 0;
  return c->p < c->end ? (c->p++, 1) : 0;
}

/* (d0, d1, ...) with a trailing comma allowed; () is a scalar. */
static int shape_tuple(Cursor *c, NpyArray *a) {
  if (!eat(c, '(')) return 0;
  a->rank = 0;
  while (!eat(c, ')')) {
    blank(c);
    if (a->rank == NPY_MAX_RANK || c->p >= c->end || !isdigit((unsigned char)*c->p)) return 0;
    int64_t v = 0;
    while (c->p < c->end && isdigit((unsigned char)*c->p)) {
      if (v > (INT64_MAX - 9) / 10) return 0;
      v = v * 10 + (*c->p++ - '0');
    }
    if (c->p < c->end && *c->p == 'L') c->p++; /* Python 2's longs, in files NumPy wrote then */
    a->shape[a->rank++] = v;
    if (!eat(c, ',') && !(blank(c), c->p < c->end && *c->p == ')')) return 0;
  }
  return 1;
}

/* descr: '<f4' and the like.  0, or -1 with the reason for a dtype pipecc does not read. */
static int dtype_of(const char *descr, NpyArray *a, const char *where, char *err, size_t errlen) {
  static const struct {
    char kind;
    int size, type;
  } known[] = {{'f', 4, NPY_F32}, {'f', 8, NPY_F64}, {'u', 1, NPY_U8}, {'u', 2, NPY_U16}, {'i', 4, NPY_I32}, {'i', 8, NPY_I64}};
  const char *d = descr;
  char order = *d == '<' || *d == '>' || *d == '|' || *d == '=' ? *d++ : '=';
  if (*d == 'O')
    return fail(err, errlen, "data %s: an object array (dtype '%s': pickled Python objects); pipecc never unpickles data: save a numeric array",
                where, descr);
  int size = 0;
  if (!*d || sscanf(d + 1, "%d", &size) != 1) size = -1;
  for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
    if (known[k].kind != *d || known[k].size != size) continue;
    char num[16];
    snprintf(num, sizeof num, "%d", size);
    if (strcmp(d + 1, num)) break;
    if (order == '>' && size > 1)
      return fail(err, errlen, "data %s: big-endian %s (dtype '%s'); write it little-endian, e.g. a.astype('<%c%d')", where,
                  npy_type_name(known[k].type), descr, known[k].kind, size);
    a->type = known[k].type, a->itemsize = size;
    return 0;
  }
  return fail(err, errlen, "data %s: dtype '%s' is not read by pipecc (it reads float32, float64, uint8, uint16, int32 and int64)", where, descr);
}

/* The dict: its three keys, in any order, each once. */
static int header_dict(Cursor *c, NpyArray *a, int *fortran, const char *where, char *err, size_t errlen) {
  char key[32], descr[64] = "";
  int seen = 0;
  if (!eat(c, '{')) return fail(err, errlen, "data %s: the .npy header is not a dictionary", where);
  while (!eat(c, '}')) {
    if (!quoted(c, key, sizeof key) || !eat(c, ':')) return fail(err, errlen, "data %s: the .npy header does not parse", where);
    if (!strcmp(key, "descr") && !(seen & 1)) {
      blank(c);
      if (c->p < c->end && *c->p == '[')
        return fail(err, errlen, "data %s: a structured array (a list of fields in its dtype); save a plain numeric array", where);
      if (!quoted(c, descr, sizeof descr)) return fail(err, errlen, "data %s: the .npy header's descr does not parse", where);
      seen |= 1;
    } else if (!strcmp(key, "fortran_order") && !(seen & 2)) {
      blank(c);
      size_t left = (size_t)(c->end - c->p);
      if (left >= 4 && !strncmp(c->p, "True", 4)) *fortran = 1, c->p += 4;
      else if (left >= 5 && !strncmp(c->p, "False", 5)) *fortran = 0, c->p += 5;
      else return fail(err, errlen, "data %s: the .npy header's fortran_order is neither True nor False", where);
      seen |= 2;
    } else if (!strcmp(key, "shape") && !(seen & 4)) {
      if (!shape_tuple(c, a)) return fail(err, errlen, "data %s: the .npy header's shape does not parse (at most %d dimensions)", where, NPY_MAX_RANK);
      seen |= 4;
    } else {
      return fail(err, errlen, "data %s: the .npy header has an unexpected or repeated key '%s'", where, key);
    }
    if (!eat(c, ',') && !(blank(c), c->p < c->end && *c->p == '}')) return fail(err, errlen, "data %s: the .npy header does not parse", where);
  }
  if (seen != 7) return fail(err, errlen, "data %s: the .npy header lacks %s", where, !(seen & 1) ? "descr" : !(seen & 2) ? "fortran_order" : "shape");
  return dtype_of(descr, a, where, err, errlen);
}

static void shape_text(const NpyArray *a, char *out, size_t n) {
  size_t k = (size_t)snprintf(out, n, "(");
  for (int d = 0; d < a->rank && k < n; d++) k += (size_t)snprintf(out + k, n - k, "%s%lld", d ? ", " : "", (long long)a->shape[d]);
  if (k < n) snprintf(out + k, n - k, "%s)", a->rank == 1 ? "," : "");
}

int npy_parse(const uint8_t *p, size_t len, const char *where, NpyArray *a, char *err, size_t errlen) {
  memset(a, 0, sizeof *a);
  snprintf(a->where, sizeof a->where, "%s", where);
  if (len < NPY_MAGIC_LEN + 4 || memcmp(p, NPY_MAGIC, NPY_MAGIC_LEN))
    return fail(err, errlen, "data %s: not a NumPy .npy array (no \\x93NUMPY magic)", where);
  int major = p[6];
  size_t hlen_bytes = major == 1 ? 2 : 4, start = 8 + hlen_bytes;
  if (major < 1 || major > 3) return fail(err, errlen, "data %s: .npy format version %d.%d; pipecc reads versions 1 to 3", where, major, p[7]);
  if (len < start) return fail(err, errlen, "data %s: truncated inside the .npy header", where);
  uint64_t hlen = le(p + 8, (int)hlen_bytes);
  if (hlen > NPY_MAX_HEADER) return fail(err, errlen, "data %s: a .npy header of %llu bytes (NumPy writes a few hundred)", where, (unsigned long long)hlen);
  if (len - start < hlen) return fail(err, errlen, "data %s: truncated inside the .npy header (%zu bytes)", where, len);
  Cursor c = {(const char *)p + start, (const char *)p + start + hlen};
  int fortran = 0;
  if (header_dict(&c, a, &fortran, where, err, errlen)) return -1;
  a->count = 1;
  for (int d = 0; d < a->rank; d++) {
    if (a->shape[d] && a->count > INT64_MAX / 16 / a->shape[d]) return fail(err, errlen, "data %s: a shape too large to address", where);
    a->count *= a->shape[d];
  }
  char shp[256];
  shape_text(a, shp, sizeof shp);
  /* Fortran order changes nothing for a vector (both orders are the same bytes). */
  if (fortran && a->rank > 1)
    return fail(err, errlen, "data %s: a Fortran-ordered %s array of shape %s; write it C-ordered, e.g. np.ascontiguousarray(a)", where,
                npy_type_name(a->type), shp);
  uint64_t want = (uint64_t)a->count * (uint64_t)a->itemsize, have = len - start - hlen;
  if (have < want)
    return fail(err, errlen, "data %s: truncated: shape %s of %s takes %llu bytes, %llu are there", where, shp, npy_type_name(a->type),
                (unsigned long long)want, (unsigned long long)have);
  if (have > want)
    return fail(err, errlen, "data %s: shape %s of %s takes %llu bytes, but %llu follow the header", where, shp, npy_type_name(a->type),
                (unsigned long long)want, (unsigned long long)have);
  a->data = p + start + hlen;
  return 0;
}

/* ---- .npz: the zip's central directory ---- */

typedef struct ZipDir {
  uint64_t offset, entries; /* the central directory's offset and entry count */
} ZipDir;

/* The end record (its comment may follow it: searched back from the end), and ZIP64's where it is used. */
/* The shortest zip that holds a member: a local header, its central entry and the end record.  Every
 * len - X below is taken only past this, where it cannot wrap. */
#define ZIP_MIN_LEN (ZIP_LOCAL_LEN + ZIP_CENTRAL_LEN + ZIP_END_LEN)

static int zip_dir(const uint8_t *z, size_t len, const char *path, ZipDir *zd, char *err, size_t errlen) {
  if (len < 4 || le(z, 4) != ZIP_LOCAL) return fail(err, errlen, "data %s: not an .npz (zip) archive", path);
  if (len < ZIP_MIN_LEN) return fail(err, errlen, "data %s: %zu bytes, too short for a zip with a member (truncated?)", path, len);
  size_t at = len - ZIP_END_LEN, stop = len - ZIP_END_LEN > ZIP_MAX_COMMENT ? len - ZIP_END_LEN - ZIP_MAX_COMMENT : 0;
  while (le(z + at, 4) != ZIP_END) {
    if (at == stop) return fail(err, errlen, "data %s: a zip with no end record (truncated?)", path);
    at--;
  }
  zd->entries = le(z + at + 10, 2), zd->offset = le(z + at + 16, 4);
  uint64_t size = le(z + at + 12, 4);
  if (zd->entries == 0xFFFF || zd->offset == 0xFFFFFFFFu || size == 0xFFFFFFFFu) {
    if (at < ZIP64_LOCATOR_LEN || le(z + at - ZIP64_LOCATOR_LEN, 4) != ZIP64_LOCATOR)
      return fail(err, errlen, "data %s: a ZIP64 archive with no ZIP64 locator", path);
    uint64_t e64 = le(z + at - ZIP64_LOCATOR_LEN + 8, 8);
    /* The ZIP64 end record lies before its locator. */
    if (at < ZIP64_LOCATOR_LEN + ZIP64_END_LEN || e64 > at - ZIP64_LOCATOR_LEN - ZIP64_END_LEN || le(z + e64, 4) != ZIP64_END)
      return fail(err, errlen, "data %s: the ZIP64 end record is not where its locator says (damaged?)", path);
    zd->entries = le(z + e64 + 32, 8), zd->offset = le(z + e64 + 48, 8);
  }
  if (zd->offset > at) return fail(err, errlen, "data %s: the zip's directory lies past its end record (truncated?)", path);
  return 0;
}

/* A central entry's sizes and local header offset, from its ZIP64 extra field where they are 0xFFFFFFFF. */
static int zip64_fields(const uint8_t *x, size_t xlen, uint64_t *usize, uint64_t *csize, uint64_t *local) {
  for (size_t k = 0; k + 4 <= xlen;) {
    size_t id = (size_t)le(x + k, 2), n = (size_t)le(x + k + 2, 2);
    if (k + 4 + n > xlen) return -1;
    if (id == ZIP64_EXTRA) {
      size_t q = k + 4;
      uint64_t *f[3] = {usize, csize, local};
      for (int i = 0; i < 3; i++) {
        if (*f[i] != 0xFFFFFFFFu) continue;
        if (q + 8 > k + 4 + n) return -1;
        *f[i] = le(x + q, 8), q += 8;
      }
      return 0;
    }
    k += 4 + n;
  }
  return *usize == 0xFFFFFFFFu || *csize == 0xFFFFFFFFu || *local == 0xFFFFFFFFu ? -1 : 0;
}

/* The data of the member whose central entry is at e. */
static int member_data(const uint8_t *z, size_t len, size_t e, const char *path, const char *name, const uint8_t **p, size_t *n, char *err,
                       size_t errlen) {
  int flags = (int)le(z + e + 8, 2), method = (int)le(z + e + 10, 2);
  uint64_t csize = le(z + e + 20, 4), usize = le(z + e + 24, 4), local = le(z + e + 42, 4);
  size_t nlen = (size_t)le(z + e + 28, 2), xlen = (size_t)le(z + e + 30, 2);
  if (zip64_fields(z + e + ZIP_CENTRAL_LEN + nlen, xlen, &usize, &csize, &local))
    return fail(err, errlen, "data %s: member %s has a damaged ZIP64 field", path, name);
  if (flags & 1) return fail(err, errlen, "data %s: member %s is encrypted", path, name);
  if (method != 0)
    return fail(err, errlen, "data %s: member %s is compressed (method %d, as np.savez_compressed writes); pipecc maps arrays in place: "
                             "write them with np.savez", path, name, method);
  if (csize != usize) return fail(err, errlen, "data %s: member %s is stored but its sizes differ (%llu, %llu)", path, name,
                                  (unsigned long long)csize, (unsigned long long)usize);
  if (local > len - ZIP_LOCAL_LEN || le(z + local, 4) != ZIP_LOCAL)
    return fail(err, errlen, "data %s: member %s's local header is past the file's end or damaged (truncated?)", path, name);
  uint64_t start = local + ZIP_LOCAL_LEN + le(z + local + 26, 2) + le(z + local + 28, 2);
  if (start > len || csize > len - start)
    return fail(err, errlen, "data %s: truncated: member %s's %llu bytes run past the file's end", path, name, (unsigned long long)csize);
  *p = z + start, *n = (size_t)csize;
  return 0;
}

/* A member's name for a message: at most 100 bytes, anything but printable ASCII as '?'. */
static size_t put_name(char *out, size_t n, const char *name, size_t len) {
  size_t k = 0;
  for (size_t i = 0; i < len && i < 100 && k + 1 < n; i++) out[k++] = name[i] >= 0x20 && name[i] <= 0x7e ? name[i] : '?';
  if (n) out[k < n ? k : n - 1] = 0;
  return k;
}

int npz_member(const uint8_t *z, size_t len, const char *path, const char *name, const uint8_t **p, size_t *n, char *err, size_t errlen) {
  ZipDir zd;
  if (zip_dir(z, len, path, &zd, err, errlen)) return -1;
  char names[512] = "";
  size_t e = (size_t)zd.offset, nl = 0;
  for (uint64_t k = 0; k < zd.entries; k++) {
    if (e > len - ZIP_CENTRAL_LEN || le(z + e, 4) != ZIP_CENTRAL)
      return fail(err, errlen, "data %s: the zip's directory is damaged at entry %llu", path, (unsigned long long)k);
    size_t flen = (size_t)le(z + e + 28, 2), xlen = (size_t)le(z + e + 30, 2), clen = (size_t)le(z + e + 32, 2);
    if (flen + xlen + clen > len - e - ZIP_CENTRAL_LEN) return fail(err, errlen, "data %s: the zip's directory runs past the file's end", path);
    const char *fname = (const char *)z + e + ZIP_CENTRAL_LEN;
    if (flen == strlen(name) && !memcmp(fname, name, flen)) return member_data(z, len, e, path, name, p, n, err, errlen);
    if (nl + 4 < sizeof names) {
      if (nl) nl += (size_t)snprintf(names + nl, sizeof names - nl, ", ");
      nl += put_name(names + nl, sizeof names - nl, fname, flen);
    }
    e += ZIP_CENTRAL_LEN + flen + xlen + clen;
  }
  fail(err, errlen, "data %s: no member %s (it holds: %s)", path, name, nl ? names : "nothing");
  return 1;
}
