/* outdir.c - the all-or-nothing output directory.
 *
 * Everything goes to DIR.tmp-PID, a sibling of DIR, which replaces DIR by
 * two renames only when every file is written.  DIR is replaced only when
 * pipecc wrote it (its marker file says so) and it holds nothing pipecc did
 * not write: a checkpoint folder or a trained model the user kept there
 * makes pipecc refuse, naming them, rather than delete them.  A signal
 * removes the temporary; one left by a kill -9 is removed by the next
 * compile into the same DIR. */
#include "outdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util.h"

#define MARKER ".pipecc-output"

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static void rm_tree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* ---- cleanup on a signal ----
 * The handler may only use async-signal-safe calls: it lists directories
 * with getdents64 into a stack buffer and removes with unlinkat.  The
 * temporary is at most two levels deep (weights/). */
static char g_tmp[4096];
static volatile sig_atomic_t g_armed;

struct linux_dirent64 {
  unsigned long long d_ino;
  long long d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

static void rm_tree_at(int parent, const char *name, int depth) {
  int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    char buf[4096];
    long n;
    while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0)
      for (long off = 0; off < n;) {
        struct linux_dirent64 *e = (struct linux_dirent64 *)(buf + off);
        off += e->d_reclen;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (e->d_type == DT_DIR && depth < 4) rm_tree_at(fd, e->d_name, depth + 1);
        else unlinkat(fd, e->d_name, 0);
      }
    close(fd);
  }
  unlinkat(parent, name, AT_REMOVEDIR);
}

static char g_dead[4200]; /* g_tmp renamed, so nothing more is written into it */

/* The handler may run on another thread (OpenBLAS starts some) while the
 * main thread goes on writing: first rename the temporary away, atomically,
 * so those writes fail, then remove it. */
static volatile sig_atomic_t g_signalled;

static void on_signal(int sig) {
  g_signalled = 1;
  if (g_armed && !rename(g_tmp, g_dead)) rm_tree_at(AT_FDCWD, g_dead, 0);
  signal(sig, SIG_DFL);
  raise(sig);
}

static const int k_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

/* A write failed: if because a signal handler on another thread is removing
 * the temporary, wait for it to end the process rather than report it. */
static int write_failed(const char *what, const char *path) {
  if (g_signalled)
    for (;;) pause();
  return err_set("cannot %s %s: %s", what, path, strerror(errno));
}

static void arm(const char *tmp) {
  snprintf(g_tmp, sizeof g_tmp, "%s", tmp);
  snprintf(g_dead, sizeof g_dead, "%s-removing", tmp);
  g_armed = 1;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof k_signals / sizeof *k_signals; i++) sigaction(k_signals[i], &sa, NULL);
}

static void disarm(void) {
  g_armed = 0;
  for (size_t i = 0; i < sizeof k_signals / sizeof *k_signals; i++) signal(k_signals[i], SIG_DFL);
}

static void block_signals(sigset_t *old) {
  sigset_t set;
  sigemptyset(&set);
  for (size_t i = 0; i < sizeof k_signals / sizeof *k_signals; i++) sigaddset(&set, k_signals[i]);
  sigprocmask(SIG_BLOCK, &set, old);
}

/* ---- what pipecc writes ---- */

/* "stage_<digits><suffix>" exactly. */
static int is_stage_name(const char *s, const char *suffix) {
  if (strncmp(s, "stage_", 6)) return 0;
  s += 6;
  if (*s < '0' || *s > '9') return 0;
  while (*s >= '0' && *s <= '9') s++;
  return !strcmp(s, suffix);
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* An entry of DIR (sub = "" at the top, "weights" or "build" below) that
 * pipecc or the Makefile it wrote creates. */
static int is_ours(const char *sub, const char *name, int is_dir) {
  if (!*sub) {
    static const char *files[] = {MARKER, "plan.json", "schedule.txt", "timeline.svg", "Makefile", "run.sh", "model.onnx"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++)
      if (!strcmp(name, files[i])) return !is_dir;
    if (!strcmp(name, "weights") || !strcmp(name, "build")) return is_dir;
    return !is_dir && (is_stage_name(name, ".c") || is_stage_name(name, ""));
  }
  if (!strcmp(sub, "weights")) return !is_dir && (!strcmp(name, "manifest.txt") || is_stage_name(name, ".bin"));
  /* build/: the Makefile's objects, the GPU's runtime library, and what a make killed mid-rule leaves
   * (each is written as NAME.PID.tmp, then renamed): a re-plan killed during make goes again (run.sh). */
  return !is_dir && (ends_with(name, ".o") || ends_with(name, ".d") || ends_with(name, ".so") || ends_with(name, ".tmp"));
}

/* Appends to *list the entries of path/sub pipecc did not write; returns
 * their count, or -1 when path cannot be listed. */
static int foreign_entries(const char *path, const char *sub, Buf *list) {
  char dir[8192];
  snprintf(dir, sizeof dir, "%s%s%s", path, *sub ? "/" : "", sub);
  DIR *dp = opendir(dir);
  if (!dp) return -1;
  int count = 0;
  struct dirent *e;
  while ((e = readdir(dp))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char full[8192 + 256];
    snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
    struct stat st;
    int is_dir = !lstat(full, &st) && S_ISDIR(st.st_mode);
    if (is_ours(sub, e->d_name, is_dir)) {
      if (is_dir) {
        int k = foreign_entries(path, e->d_name, list);
        count += k < 0 ? 0 : k;
      }
      continue;
    }
    if (count++ < 6) buf_printf(list, "%s%s%s%s%s", list->len ? ", " : "", sub, *sub ? "/" : "", e->d_name, is_dir ? "/" : "");
  }
  closedir(dp);
  return count;
}

static int dir_is_empty(const char *path) {
  DIR *dp = opendir(path);
  if (!dp) return 0;
  struct dirent *e;
  int empty = 1;
  while (empty && (e = readdir(dp))) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
  closedir(dp);
  return empty;
}

static int has_marker(const char *path) {
  char m[8300];
  snprintf(m, sizeof m, "%s/" MARKER, path);
  struct stat st;
  return !lstat(m, &st) && S_ISREG(st.st_mode);
}

/* Written by pipecc before the marker (0.3.0 and older): plan.json and
 * schedule.txt, and nothing pipecc does not write. */
static int is_legacy(const char *path) {
  char m[8300];
  struct stat st;
  snprintf(m, sizeof m, "%s/plan.json", path);
  if (lstat(m, &st) || !S_ISREG(st.st_mode)) return 0;
  snprintf(m, sizeof m, "%s/schedule.txt", path);
  if (lstat(m, &st) || !S_ISREG(st.st_mode)) return 0;
  Buf list = {0};
  int k = foreign_entries(path, "", &list);
  buf_free(&list);
  return k == 0;
}

/* DIR may be replaced: it is new, empty, or pipecc's and holds only what
 * pipecc writes. */
static int check_replaceable(const char *path) {
  struct stat st;
  if (lstat(path, &st)) return errno == ENOENT ? 0 : err_set("-o %s: %s", path, strerror(errno));
  if (S_ISLNK(st.st_mode)) return err_set("-o %s: is a symbolic link; name the directory itself", path);
  if (!S_ISDIR(st.st_mode)) return err_set("-o %s: exists and is not a directory", path);
  if (dir_is_empty(path)) return 0;
  if (!has_marker(path) && !is_legacy(path))
    return err_set("-o %s: the directory exists and pipecc did not write it (no %s file); nothing was changed: remove "
                   "it or choose another", path, MARKER);
  Buf list = {0};
  int k = foreign_entries(path, "", &list);
  int rc = 0;
  if (k < 0) rc = err_set("-o %s: cannot list it: %s", path, strerror(errno));
  else if (k > 0)
    rc = err_set("-o %s: holds %d file%s pipecc did not write (%s%s); recompiling would replace the directory, so "
                 "nothing was changed: move %s out or choose another -o", path, k, k == 1 ? "" : "s", list.s,
                 k > 6 ? ", ..." : "", k == 1 ? "it" : "them");
  buf_free(&list);
  return rc;
}

/* The last compile into DIR was killed (kill -9, a power cut): its
 * temporaries DIR.tmp-PID and DIR.old-PID are left, for a process that no
 * longer runs.  Remove what is pipecc's; if it died between its two renames
 * (DIR gone, DIR.old-PID left), DIR.old-PID is the previous output and is
 * put back. */
static void clean_stale(const char *path) {
  char parent[4096];
  snprintf(parent, sizeof parent, "%s", path);
  char *slash = strrchr(parent, '/');
  const char *base = slash ? slash + 1 : path;
  if (slash) *slash = 0;
  DIR *dp = opendir(slash ? (parent[0] ? parent : "/") : ".");
  if (!dp) return;
  size_t bl = strlen(base);
  struct dirent *e;
  while ((e = readdir(dp))) {
    const char *s = e->d_name;
    if (strncmp(s, base, bl) || (strncmp(s + bl, ".tmp-", 5) && strncmp(s + bl, ".old-", 5))) continue;
    char *end;
    long pid = strtol(s + bl + 5, &end, 10);
    int removing = !strcmp(end, "-removing"); /* a signal handler's, interrupted */
    if ((*end && !removing) || pid <= 0 || pid == (long)getpid() || !(kill((pid_t)pid, 0) && errno == ESRCH)) continue;
    char full[8192];
    snprintf(full, sizeof full, "%s%s%s", slash ? (parent[0] ? parent : "") : "", slash ? "/" : "", s);
    if (!removing && !has_marker(full)) continue; /* not ours: leave it */
    struct stat st;
    if (s[bl + 1] == 'o' && lstat(path, &st) && errno == ENOENT) {
      if (!rename(full, path)) fprintf(stderr, "pipecc: note: put back %s, left by a compile that was killed\n", path);
      continue;
    }
    Buf list = {0};
    int k = foreign_entries(full, "", &list);
    buf_free(&list);
    if (k == 0) rm_tree(full);
  }
  closedir(dp);
}

int outdir_begin(OutDir *d, const char *path) {
  char clean[4096];
  size_t n = strlen(path);
  if (n > 4000) return err_set("-o %s: path too long", path);
  memcpy(clean, path, n + 1);
  while (n > 1 && clean[n - 1] == '/') clean[--n] = 0; /* -o DIR/ names DIR */
  const char *base = strrchr(clean, '/');
  base = base ? base + 1 : clean;
  if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
    return err_set("-o %s: name the output directory itself (pipecc replaces it as a whole), not '%s'", path,
                   *base ? base : "/");
  clean_stale(clean);
  if (check_replaceable(clean)) return -1;
  snprintf(d->final, sizeof d->final, "%s", clean);
  snprintf(d->tmp, sizeof d->tmp, "%s.tmp-%ld", clean, (long)getpid());
  rm_tree(d->tmp);
  arm(d->tmp);
  if (mkdir(d->tmp, 0755)) {
    int e = errno;
    disarm();
    d->tmp[0] = 0;
    if (e == ENOENT) {
      char parent[4096];
      snprintf(parent, sizeof parent, "%.*s", (int)(base - clean - 1), clean);
      return err_set("-o %s: its parent directory %s does not exist", path, parent);
    }
    return err_set("-o %s: cannot create %s.tmp-%ld: %s", path, clean, (long)getpid(), strerror(e));
  }
  /* The note names no path: the directory may be moved or copied, and the
   * sample in generated/ must compare equal to a fresh compile elsewhere. */
  static const char note[] =
      "Written by pipecc " PIPECC_VERSION ". A new compile into this directory replaces it as a whole;\n"
      "pipecc refuses instead if it holds files it did not write (a checkpoint, a trained model).\n";
  return outdir_write(d, MARKER, note, sizeof note - 1);
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
  if (!f) return write_failed("write", path);
  int ok = fwrite(data, 1, len, f) == len;
  ok &= fclose(f) == 0;
  if (!ok) return write_failed("write", path);
  /* Test hook (tests/test_cli.sh): stop here, after writing this file, so a
   * test can signal or kill the compile while the temporary exists. */
  const char *stop = getenv("PIPECC_STOP_AFTER_WRITING");
  if (stop && !strcmp(stop, name)) raise(SIGSTOP);
  return 0;
}

int outdir_chmod(OutDir *d, const char *name, int mode) {
  char path[8192];
  snprintf(path, sizeof path, "%s/%s", d->tmp, name);
  if (chmod(path, (mode_t)mode)) return write_failed("chmod", path);
  return 0;
}

int outdir_commit(OutDir *d) {
  /* Check again: the user may have put something into DIR while pipecc ran. */
  if (check_replaceable(d->final)) return -1;
  char old[8200];
  snprintf(old, sizeof old, "%s.old-%ld", d->final, (long)getpid());
  struct stat st;
  int had = !lstat(d->final, &st);
  /* No signal between the two renames: DIR is always either the old or the new output. */
  sigset_t mask;
  block_signals(&mask);
  g_armed = 0; /* a signal on another thread now leaves both for the next compile's clean_stale */
  int rc = 0;
  if (had && rename(d->final, old)) {
    rc = err_set("-o %s: cannot replace it: %s", d->final, strerror(errno));
  } else if (rename(d->tmp, d->final)) {
    int e = errno;
    if (had) rename(old, d->final);
    rc = err_set("-o %s: cannot create it: %s", d->final, strerror(e));
  } else {
    d->tmp[0] = 0;
  }
  sigprocmask(SIG_SETMASK, &mask, NULL);
  if (!rc && had) rm_tree(old);
  if (!rc) disarm();
  return rc;
}

void outdir_abort(OutDir *d) {
  if (d->tmp[0]) rm_tree(d->tmp);
  d->tmp[0] = 0;
  disarm();
}
