/* outdir.c - the all-or-nothing output directory. */
#define _XOPEN_SOURCE 700
#include "outdir.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static void rm_tree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

int outdir_begin(OutDir *d, const char *path) {
  if (strlen(path) > 4000) return err_set("-o %s: path too long", path);
  struct stat st;
  if (!stat(path, &st) && !S_ISDIR(st.st_mode)) return err_set("-o %s: exists and is not a directory", path);
  if (!stat(path, &st)) {
    /* Replacing a directory is only safe when it is one of ours. */
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/plan.json", path);
    if (access(probe, F_OK))
      return err_set("-o %s: the directory exists and is not a pipecc output (no plan.json); remove it or choose another", path);
  }
  snprintf(d->final, sizeof d->final, "%s", path);
  snprintf(d->tmp, sizeof d->tmp, "%s.tmp-%ld", path, (long)getpid());
  rm_tree(d->tmp);
  if (mkdir(d->tmp, 0755)) return err_set("-o %s: cannot create %s: %s", path, d->tmp, strerror(errno));
  return 0;
}

int outdir_write(OutDir *d, const char *name, const char *data, size_t len) {
  char path[8192];
  snprintf(path, sizeof path, "%s/%s", d->tmp, name);
  char *slash = strrchr(path, '/');
  /* Create sub-directories (weights/) on the way. */
  for (char *p = path + strlen(d->tmp) + 1; p <= slash; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(path, 0755);
      *p = '/';
    }
  FILE *f = fopen(path, "wb");
  if (!f) return err_set("cannot write %s: %s", path, strerror(errno));
  int ok = fwrite(data, 1, len, f) == len;
  ok &= fclose(f) == 0;
  if (!ok) return err_set("cannot write %s: %s", path, strerror(errno));
  return 0;
}

int outdir_copy(OutDir *d, const char *name, const char *src) {
  FILE *f = fopen(src, "rb");
  if (!f) return err_set("cannot read %s: %s", src, strerror(errno));
  char path[8192];
  snprintf(path, sizeof path, "%s/%s", d->tmp, name);
  FILE *o = fopen(path, "wb");
  if (!o) {
    fclose(f);
    return err_set("cannot write %s: %s", path, strerror(errno));
  }
  char buf[1 << 16];
  size_t n;
  int ok = 1;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) ok &= fwrite(buf, 1, n, o) == n;
  ok &= !ferror(f);
  fclose(f);
  ok &= fclose(o) == 0;
  return ok ? 0 : err_set("cannot copy %s to %s", src, path);
}

int outdir_chmod(OutDir *d, const char *name, int mode) {
  char path[8192];
  snprintf(path, sizeof path, "%s/%s", d->tmp, name);
  if (chmod(path, (mode_t)mode)) return err_set("cannot chmod %s: %s", path, strerror(errno));
  return 0;
}

int outdir_commit(OutDir *d) {
  char old[8200];
  snprintf(old, sizeof old, "%s.old-%ld", d->final, (long)getpid());
  struct stat st;
  int had = !stat(d->final, &st);
  if (had && rename(d->final, old)) return err_set("-o %s: cannot replace it: %s", d->final, strerror(errno));
  if (rename(d->tmp, d->final)) {
    int e = errno;
    if (had) rename(old, d->final);
    return err_set("-o %s: cannot create it: %s", d->final, strerror(e));
  }
  if (had) rm_tree(old);
  return 0;
}

void outdir_abort(OutDir *d) {
  if (d->tmp[0]) rm_tree(d->tmp);
}
