/* data.h - libpiperun's training data: MNIST IDX, CIFAR-10 binary batches,
 * uint16 token streams (raw or llm.c's .bin), NumPy arrays (an .npz, or a
 * directory of .npy files: npy.h), and the sample order.
 *
 * Everything here is deterministic and portable: the shuffle uses splitmix64
 * (never libc rand), so every rank of a pipeline - and tests/test_data.py -
 * computes the same order from (seed, epoch).
 *
 * Files are mapped read-only where their layout allows it (MNIST, NumPy arrays,
 * tokens on a little-endian host); CIFAR-10 records interleave label and pixels, so they
 * are copied once into separate arrays. */
#ifndef PIPERUN_DATA_H
#define PIPERUN_DATA_H
#include <stddef.h>
#include <stdint.h>

enum { DATA_MNIST = 1, DATA_CIFAR10 = 2, DATA_TOKENS = 3, DATA_ARRAYS = 4 };
/* Or'ed into data_open's kind_hint: a held-out set (run.sh --val).  A directory's test files are read
 * when it has them (MNIST t10k-images-idx3-ubyte + t10k-labels-idx1-ubyte, CIFAR-10 test_batch.bin),
 * else its training files, as a real data set's directory and a held-out set of its own both work. */
enum { DATA_HELD_OUT = 16 };

struct DataPriv; /* data.c: mappings, file names, the cached permutation */

typedef struct DataSet {
  int kind;         /* DATA_* */
  int64_t n;        /* samples (images) or, for tokens, token count */
  int c, h, w;      /* image shape (MNIST 1x28x28, CIFAR 3x32x32) */
  int nclasses;     /* 10 for both image sets; labels are checked by data_check_images */
  uint8_t *images;  /* n*c*h*w bytes, sample-major, CHW within a sample */
  uint8_t *labels;  /* n bytes */
  uint16_t *tokens; /* n tokens (host order) */
  /* private */
  struct DataPriv *priv;
} DataSet;

/* Opens PATH:
 *   a directory with MNIST IDX files train-images-idx3-ubyte + train-labels-idx1-ubyte
 *     (the uncompressed names only; "train-images.idx3-ubyte" is accepted too),
 *   a directory with CIFAR-10 binary batches data_batch_1.bin .. data_batch_5.bin (any subset,
 *     read in numeric order; each record is 1 label byte + 3072 pixel bytes, CHW),
 *   or a file of uint16 tokens: llm.c's format (256 int32 little-endian header: magic 20240520,
 *     version 1, header[2] = token count, then the tokens) when it starts with that magic,
 *     else raw little-endian uint16.
 * kind_hint: 0 detects from what is there; DATA_* insists on that kind; | DATA_HELD_OUT prefers test files.
 * Returns 0, or -1 with a one-line message in err naming the file and the problem; *d is then
 * zeroed (data_close on it is harmless). */
int data_open(DataSet *d, const char *path, int kind_hint, char *err, size_t errlen);
/* data_open, and NumPy arrays (DATA_ARRAYS), read in place:
 *   an .npz (np.savez: stored members; a file that starts as a zip) holding xname.npy and yname.npy,
 *   or a directory holding xname.npy and yname.npy (x.npy alone is enough to choose this over MNIST
 *     and CIFAR-10 when no names are given).
 * xname, yname: NULL for "x" and "y".  x is (samples, ...) and y (samples,) or (samples, T); their
 * dtypes, shapes and values are checked against the model by data_check_arrays and
 * data_check_array_labels.  kind_hint never selects arrays: they are what the path holds. */
int data_open_named(DataSet *d, const char *path, int kind_hint, const char *xname, const char *yname, char *err, size_t errlen);
void data_close(DataSet *d);

/* Which mapped file holds addr (a SIGBUS's fault address: the file shrank under the
 * mapping), its size when mapped and now (-1 if it cannot be stat'ed); NULL if none. */
const char *data_mapped_file(const DataSet *d, const void *addr, long long *mapped, long long *now);

/* Before the first step: image shape c x h x w, and every label < nclasses (all scanned). */
int data_check_images(const DataSet *d, int c, int h, int w, int nclasses, char *err, size_t errlen);
/* Every token id < vocab (vocab <= 0: not checked), and at least need_tokens tokens
 * (one batch of B sequences of T needs B*T + 1). */
int data_check_tokens(const DataSet *d, int vocab, int64_t need_tokens, char *err, size_t errlen);

/* Sample order for images.  bpe = n / B batches per epoch (the last partial batch is dropped);
 * step s is batch k = s % bpe of epoch e = s / bpe and uses samples perm_e[k*B .. (k+1)*B).
 * Without shuffle perm_e is the identity.  With shuffle perm_e is a Fisher-Yates shuffle of
 * 0..n-1 (all n samples, so the dropped ones change per epoch):
 *     x = data_mix64(seed ^ data_mix64((uint64_t)e + 0x9E3779B97F4A7C15))   (splitmix64 state)
 *     p = identity; for i = n-1 down to 1: j = data_splitmix64(&x) % (i+1); swap p[i], p[j]
 * where data_splitmix64 is the reference splitmix64 (x += 0x9E3779B97F4A7C15; return mix(x))
 * and data_mix64 its finaliser (the modulo's bias is below n / 2^64).  The last epoch's
 * permutation is cached behind d->priv, so a step costs O(B) except the first of an epoch,
 * which costs O(n); not thread-safe for one DataSet.  If n < B (bpe 0, an error callers check
 * first) the indices wrap modulo n. */
void data_batch_indices(const DataSet *d, int64_t step, int B, uint64_t seed, int shuffle, int64_t *idx);
/* Images as float32 NCHW scaled to [0,1] (pixel / 255.0f), labels as int64; either may be NULL.
 * Returns 0, or -1 with a message in err when a label is at or past the classes data_check_images
 * passed: the file changed under its mapping during the run (rewritten in place), and the label would
 * index past the loss's logits. */
int data_images(const DataSet *d, const int64_t *idx, int count, float *x, int64_t *labels, char *err, size_t errlen);

/* Tokens, like llm.c's loader: a batch of B sequences of length T starting at token pos reads
 * tokens [pos, pos + B*T + 1); x = the first B*T, y = the same shifted by one.  The next batch
 * starts B*T later, and when fewer than B*T + 1 tokens remain it wraps to 0.  Exactly:
 *     nb = (n - 1) / (B*T)          batches before the wrap (the usable span is nb*B*T tokens)
 *     start(s) = (s % nb) * B*T
 *     sequence r of step s: x[t] = tokens[start(s) + r*T + t], y[t] = tokens[start(s) + r*T + t + 1]
 * data_tokens fills nseq sequences starting at sequence first_seq of step s's batch
 * (x and y hold nseq*T entries each; either may be NULL), so micro-batches take sub-ranges.
 * If n < B*T + 1 (nb 0, which data_check_tokens rejects) positions wrap modulo n - 1.
 * Returns 0, or -1 with a message in err when a token id is at or past the smallest vocabulary
 * data_check_tokens passed: the file changed under its mapping during the run (rewritten in place),
 * and the id would index past the embedding or the logits. */
int64_t data_tokens_start(const DataSet *d, int64_t step, int B, int T);
int data_tokens(const DataSet *d, int64_t step, int B, int T, int first_seq, int nseq, int64_t *x, int64_t *y, char *err, size_t errlen);

/* NumPy arrays, before the first step: x's dtype and sample shape against the model's input of rank
 * `rank` and dims (dims[0], the batch, is not compared); ids: the input takes token ids (an integer x,
 * every id from 0 to below vocab when vocab > 0), else float32 values (float32, float64, or uint8
 * scaled by 1/255 as the image formats are). */
int data_check_arrays(const DataSet *d, int ids, int rank, const int64_t *dims, int64_t vocab, char *err, size_t errlen);
/* y: per_sample labels a sample ((samples,) or (samples, 1) for 1; (samples, per_sample) else), each a
 * class from 0 to below nclasses. */
int data_check_array_labels(const DataSet *d, int64_t per_sample, int nclasses, char *err, size_t errlen);
/* Samples idx[0..count) of NumPy arrays: x into xf (float32 values) or xi (int64 ids), y into y (the
 * per_sample labels data_check_array_labels passed, int64); any may be NULL.  The sample order is
 * data_batch_indices', for token models too (--shuffle shuffles their sequences).  -1 with a message
 * when an id or label is past what the checks passed (the file was rewritten in place). */
int data_rows(const DataSet *d, const int64_t *idx, int count, float *xf, int64_t *xi, int64_t *y, char *err, size_t errlen);

/* The PRNG, exported for the data generator and tests. */
uint64_t data_mix64(uint64_t z);
uint64_t data_splitmix64(uint64_t *state);

#endif
