/* npy.h - NumPy's files, read in place: a .npy array's header (its dtype, order and shape, checked
 * against the bytes that follow) and an .npz archive's stored members (np.savez: a zip whose members
 * are .npy files, found through the zip's central directory, ZIP64 included).
 *
 * Nothing is copied and nothing is decoded but the header: the caller maps the file and reads the
 * elements where they lie (data.c).  Everything a file says is untrusted: every length and offset is
 * checked against the bytes there are, and what pipecc does not read is refused with a message that
 * names the file, the array and what was expected.  Never refused silently, never unpickled: an
 * object array ('|O', which np.load reads only with allow_pickle) is refused by its dtype. */
#ifndef PIPERUN_NPY_H
#define PIPERUN_NPY_H
#include <stddef.h>
#include <stdint.h>

#define NPY_MAX_RANK 8

/* The element types pipecc reads: inputs as float32, float64 or uint8 (images), token ids and
 * labels as integers. */
typedef enum { NPY_F32 = 1, NPY_F64, NPY_U8, NPY_U16, NPY_I32, NPY_I64 } NpyType;

typedef struct NpyArray {
  const uint8_t *data; /* the first element (unaligned in an .npz member: read with memcpy) */
  int type;            /* NPY_* */
  int itemsize;
  int rank;
  int64_t shape[NPY_MAX_RANK];
  int64_t count; /* elements */
  char where[4200]; /* "FILE" or "FILE: array 'x'", for messages */
} NpyArray;

/* Parses the .npy image p[0..len) (a whole file, or an .npz member) named `where`.  0, or -1 with a
 * message in err naming where and the problem: not an .npy, an unsupported or big-endian dtype, a
 * Fortran-ordered array, a header that does not parse, or fewer or more bytes than the shape takes. */
int npy_parse(const uint8_t *p, size_t len, const char *where, NpyArray *a, char *err, size_t errlen);

/* The stored member `name` of the zip image z[0..len) (the file `path`): *p, *n its bytes.  0; 1 when
 * there is no such member (err then lists the members there are); -1 with a message (not a zip, a
 * compressed or encrypted member, offsets past the file's end). */
int npz_member(const uint8_t *z, size_t len, const char *path, const char *name, const uint8_t **p, size_t *n, char *err, size_t errlen);

/* "float32", "int64", ... */
const char *npy_type_name(int type);
/* 1 for the integer types (ids and labels), 0 for the float ones.  uint8 is both: pixels or ids. */
int npy_is_integer(int type);

/* Element i of a as a double (floats) or an int64 (integers): unaligned-safe reads. */
double npy_get_f(const NpyArray *a, int64_t i);
int64_t npy_get_i(const NpyArray *a, int64_t i);

#endif
