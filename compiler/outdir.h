/* outdir.h - writing the output directory all at once: files go to a
 * temporary sibling that replaces DIR only when everything is written, so a
 * failure never leaves a half-written plan behind. */
#ifndef PIPECC_OUTDIR_H
#define PIPECC_OUTDIR_H
#include <stddef.h>

typedef struct OutDir {
  char final[4096], tmp[4096];
} OutDir;

int outdir_begin(OutDir *d, const char *path);
int outdir_write(OutDir *d, const char *name, const char *data, size_t len);
int outdir_chmod(OutDir *d, const char *name, int mode);
int outdir_commit(OutDir *d);
void outdir_abort(OutDir *d);
#endif
