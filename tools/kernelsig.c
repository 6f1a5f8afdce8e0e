/* kernelsig.c - build/kernelsig: compiler/kernels.def against the kernels' prototypes (make runs it
 * before it links bin/pipecc, so a mismatch fails the build).
 *
 *   kernelsig KERNELS.DEF KERNELS.H
 *
 * Reads every KERNEL(ID, "name", "letters") line of KERNELS.DEF, and KERNELS.H with the headers it
 * includes by "..." (runtime/kernels.h and its runtime/cpu/ families), comments and preprocessor lines
 * left out.  Each kernel must have a prototype there (a declaration or definition at file scope), with
 * one parameter per letter, of the letter's kind:
 *
 *   r R     a pointer to const data (float, int64_t, void, ...), not to a struct nor to uint8_t
 *   u       const uint8_t *
 *   w W a A a pointer to non-const data, not to a struct nor to uint8_t
 *   M U     uint8_t *
 *   i       an integer (int, int64_t, ...)
 *   f       float
 *   c       a pointer to a const struct (a shape), not a runtime context (RandCtx, OptCtx)
 *   s       a symbol of the runtime: an integer (an enum value such as BIN_ADD, runtime/opcodes.def),
 *           const RandCtx * (&pr_rand) or const OptCtx * (&pr_opt)
 *   L       the labels the runtime hands the loss: const int64_t *
 *
 * Each problem is one line naming the kernel, the argument and both sides,
 *   kernelsig: error: compiler/kernels.def:21: k_gemm argument 3: kernels.def has 'i' (an integer), the
 *     prototype (runtime/cpu/gemm.h:5) has 'const float *C' (a pointer to const data)
 * and the exit status is 1.  On success it prints one line and exits 0. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILES 64
#define MAX_PARAMS 64

typedef struct Src {
  char *path;
  char *text; /* comments and preprocessor lines blanked, newlines kept */
} Src;

static Src files[MAX_FILES];
static int nfiles;

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *s = malloc(cap);
  for (size_t k; s && (k = fread(s + n, 1, cap - n - 1, f)) > 0;) {
    n += k;
    if (n + 1 == cap) s = realloc(s, cap *= 2);
  }
  fclose(f);
  if (s) s[n] = 0;
  return s;
}

static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  size_t n = slash ? (size_t)(slash - path + 1) : 0;
  char *d = malloc(n + 1);
  memcpy(d, path, n);
  d[n] = 0;
  return d;
}

/* Blanks comments, string and character literals' contents, and preprocessor lines (with their
 * continuations) of s, keeping every newline, so that offsets still give line numbers.  The "..."
 * includes of the preprocessor lines are collected into incs (newline-separated). */
static void clean(char *s, char **incs) {
  size_t n = strlen(s), ilen = 0;
  *incs = calloc(1, n + 1);
  int bol = 1; /* only blanks since the line began */
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '/' && s[i + 1] == '*') {
      for (; i < n && !(s[i] == '*' && s[i + 1] == '/'); i++)
        if (s[i] != '\n') s[i] = ' ';
      if (i < n) s[i] = s[i + 1] = ' ', i++;
      continue;
    }
    if (s[i] == '/' && s[i + 1] == '/') {
      for (; i < n && s[i] != '\n'; i++) s[i] = ' ';
      bol = 1;
      continue;
    }
    if (bol && s[i] == '#') {
      const char *inc = s + i + 1;
      while (*inc == ' ' || *inc == '\t') inc++;
      if (!strncmp(inc, "include", 7)) {
        const char *q = strchr(inc, '"'), *nl = strchr(inc, '\n');
        if (q && (!nl || q < nl)) {
          const char *e = strchr(q + 1, '"');
          if (e && (!nl || e < nl)) {
            memcpy(*incs + ilen, q + 1, (size_t)(e - q - 1));
            ilen += (size_t)(e - q - 1);
            (*incs)[ilen++] = '\n';
          }
        }
      }
      for (; i < n && s[i] != '\n'; i++) {
        if (s[i] == '\\' && s[i + 1] == '\n') s[i++] = ' '; /* the newline stays */
        else s[i] = ' ';
      }
      bol = 1;
      continue;
    }
    if (s[i] == '"' || s[i] == '\'') {
      char q = s[i];
      for (i++; i < n && s[i] != q; i++) {
        if (s[i] == '\\') s[i++] = ' ';
        if (s[i] != '\n') s[i] = ' ';
      }
      bol = 0;
      continue;
    }
    if (s[i] == '\n') bol = 1;
    else if (s[i] != ' ' && s[i] != '\t') bol = 0;
  }
}

static int load(const char *path) {
  for (int k = 0; k < nfiles; k++)
    if (!strcmp(files[k].path, path)) return 0;
  if (nfiles == MAX_FILES) {
    fprintf(stderr, "kernelsig: error: more than %d headers under %s\n", MAX_FILES, files[0].path);
    return -1;
  }
  char *text = slurp(path);
  if (!text) {
    fprintf(stderr, "kernelsig: error: cannot read %s\n", path);
    return -1;
  }
  Src *f = &files[nfiles++];
  f->path = strdup(path);
  f->text = text;
  char *incs;
  clean(text, &incs);
  char *dir = dir_of(path);
  for (char *p = incs, *nl; (nl = strchr(p, '\n')); p = nl + 1) {
    *nl = 0;
    char *sub = malloc(strlen(dir) + strlen(p) + 1);
    sprintf(sub, "%s%s", dir, p);
    /* Only the runtime's own headers: an include that is not there is a system one's business. */
    FILE *probe = fopen(sub, "rb");
    if (probe) {
      fclose(probe);
      if (load(sub)) return -1;
    }
    free(sub);
  }
  free(dir);
  free(incs);
  return 0;
}

static int line_at(const char *text, const char *p) {
  int line = 1;
  for (const char *q = text; q < p; q++) line += *q == '\n';
  return line;
}

static int is_id(int c) { return isalnum(c) || c == '_'; }

/* The prototype of `name`: a file-scope `... name (` whose token before the name is a type's (an
 * identifier or '*'), in any of the files.  Returns the '(' and sets *file. */
static const char *find_proto(const char *name, int *file) {
  size_t len = strlen(name);
  for (int k = 0; k < nfiles; k++) {
    const char *t = files[k].text;
    int brace = 0, paren = 0;
    for (const char *p = t; *p; p++) {
      if (*p == '{') brace++;
      else if (*p == '}') brace--;
      else if (*p == '(') paren++;
      else if (*p == ')') paren--;
      else if (brace == 0 && paren == 0 && !strncmp(p, name, len) && !is_id(p[len]) && (p == t || !is_id(p[-1]))) {
        const char *q = p + len;
        while (isspace((unsigned char)*q)) q++;
        if (*q != '(') continue;
        const char *b = p - 1;
        while (b >= t && isspace((unsigned char)*b)) b--;
        if (b < t || !(is_id(*b) || *b == '*')) continue;
        *file = k;
        return q;
      }
    }
  }
  return NULL;
}

typedef struct Param {
  char text[256]; /* as written, blanks squeezed */
  int line;
} Param;

/* The parameters between the '(' at open and its ')'. */
static int split_params(const char *text, const char *open, Param *ps) {
  int n = 0, depth = 0;
  const char *start = open + 1;
  for (const char *p = open + 1; *p; p++) {
    if (*p == '(' || *p == '[') depth++;
    else if ((*p == ')' || *p == ']') && depth > 0) depth--;
    else if ((*p == ',' || *p == ')') && depth == 0) {
      if (n == MAX_PARAMS) return -1;
      Param *q = &ps[n];
      size_t k = 0;
      int blank = 0;
      const char *s = start;
      while (s < p && isspace((unsigned char)*s)) s++;
      q->line = line_at(text, s);
      for (; s < p && k + 2 < sizeof q->text; s++) {
        if (isspace((unsigned char)*s)) blank = 1;
        else {
          if (blank && k) q->text[k++] = ' ';
          blank = 0;
          q->text[k++] = *s;
        }
      }
      q->text[k] = 0;
      if (k || *p == ',' || n) n++; /* f(void) and f() have none */
      if (*p == ')') break;
      start = p + 1;
    }
  }
  if (n == 1 && !strcmp(ps[0].text, "void")) n = 0;
  return n;
}

/* What a parameter is: a kind and, for a pointer, what it points to. */
enum { P_INT, P_FLOAT, P_PTR, P_CONST_PTR, P_OTHER };
typedef struct Kind {
  int kind;
  char base[64]; /* the type named, qualifiers left out */
  int is_struct; /* base is not one of C's or stdint.h's scalar types */
} Kind;

static const char *const SCALARS[] = {"void", "char", "short", "int", "long", "unsigned", "signed", "float", "double",
                                      "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t",
                                      "uint64_t", "size_t", "ptrdiff_t", "_Bool", "bool"};
static const char *const INTS[] = {"char", "short", "int", "long", "unsigned", "signed", "int8_t", "int16_t", "int32_t",
                                   "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "size_t", "ptrdiff_t"};

static int in_list(const char *w, const char *const *list, size_t n) {
  for (size_t k = 0; k < n; k++)
    if (!strcmp(w, list[k])) return 1;
  return 0;
}

static Kind classify(const char *param) {
  Kind k = {P_OTHER, "", 0};
  char words[16][64];
  int nw = 0, stars = 0, const_before_star = 0, arrays = strchr(param, '[') != NULL;
  for (const char *p = param; *p;) {
    if (is_id(*p)) {
      int len = 0;
      while (is_id(p[len])) len++;
      if (nw < 16 && len < 64) {
        memcpy(words[nw], p, (size_t)len);
        words[nw++][len] = 0;
        if (!strcmp(words[nw - 1], "const") && stars == 0) const_before_star = 1;
      }
      p += len;
    } else {
      if (*p == '*') stars++;
      p++;
    }
  }
  /* The type's words: all but qualifiers, `struct`, `enum` and the parameter's name (the last word,
   * when a type word comes before it). */
  char type[16][64];
  int nt = 0;
  for (int w = 0; w < nw; w++) {
    if (!strcmp(words[w], "const") || !strcmp(words[w], "volatile") || !strcmp(words[w], "restrict") ||
        !strcmp(words[w], "struct") || !strcmp(words[w], "enum"))
      continue;
    strcpy(type[nt++], words[w]);
  }
  if (nt >= 2) nt--; /* the name */
  if (nt == 0) return k;
  strcpy(k.base, type[nt - 1]);
  int scalar = 1, integer = 1;
  for (int w = 0; w < nt; w++) {
    scalar &= in_list(type[w], SCALARS, sizeof SCALARS / sizeof *SCALARS);
    integer &= in_list(type[w], INTS, sizeof INTS / sizeof *INTS);
  }
  k.is_struct = !scalar;
  if (stars + arrays == 1) k.kind = const_before_star ? P_CONST_PTR : P_PTR;
  else if (stars + arrays == 0 && integer) k.kind = P_INT;
  else if (stars + arrays == 0 && nt == 1 && !strcmp(type[0], "float")) k.kind = P_FLOAT;
  return k;
}

static const char *kind_words(const Kind *k) {
  switch (k->kind) {
  case P_INT: return "an integer";
  case P_FLOAT: return "a float";
  case P_CONST_PTR:
    if (!strcmp(k->base, "uint8_t")) return "const uint8_t *";
    if (k->is_struct && (!strcmp(k->base, "RandCtx") || !strcmp(k->base, "OptCtx"))) return !strcmp(k->base, "RandCtx") ? "const RandCtx *" : "const OptCtx *";
    if (!strcmp(k->base, "int64_t")) return "const int64_t *";
    if (!strcmp(k->base, "char")) return "const char *";
    return k->is_struct ? "a pointer to a const struct"
                        : "a pointer to const data";
  case P_PTR:
    if (!strcmp(k->base, "uint8_t")) return "uint8_t *";
    return k->is_struct ? "a pointer to a non-const struct" : "a pointer to non-const data";
  default: return "none of the kinds kernels.def has";
  }
}

static const char *letter_words(char c) {
  switch (c) {
  case 'r': return "a buffer read: a pointer to const data, not uint8_t";
  case 'R': return "a buffer read, or NULL: a pointer to const data, not uint8_t";
  case 'u': return "a mask read: const uint8_t *";
  case 'w': return "a buffer written: a pointer to non-const data, not uint8_t";
  case 'W': return "a buffer written, or NULL: a pointer to non-const data, not uint8_t";
  case 'a': return "a buffer added into: a pointer to non-const data, not uint8_t";
  case 'A': return "a buffer added into, or NULL: a pointer to non-const data, not uint8_t";
  case 'M': return "a mask written, or NULL: uint8_t *";
  case 'U': return "a bool result written: uint8_t *";
  case 'i': return "an integer";
  case 'f': return "a float";
  case 'c': return "a shape constant: a pointer to a const struct";
  case 's': return "a runtime symbol: an integer (enum value), const RandCtx * or const OptCtx *";
  case 'L': return "the loss's labels: const int64_t *";
  case 'n': return "the node's name: const char *";
  default: return NULL;
  }
}

static int matches(char c, const Kind *k) {
  int u8 = !strcmp(k->base, "uint8_t");
  switch (c) {
  case 'r': case 'R': return k->kind == P_CONST_PTR && !k->is_struct && !u8;
  case 'u': return k->kind == P_CONST_PTR && u8;
  case 'w': case 'W': case 'a': case 'A': return k->kind == P_PTR && !k->is_struct && !u8;
  case 'M': case 'U': return k->kind == P_PTR && u8;
  case 'i': return k->kind == P_INT;
  case 'f': return k->kind == P_FLOAT;
  case 'c': return k->kind == P_CONST_PTR && k->is_struct && strcmp(k->base, "RandCtx") && strcmp(k->base, "OptCtx");
  case 's': return k->kind == P_INT || (k->kind == P_CONST_PTR && (!strcmp(k->base, "RandCtx") || !strcmp(k->base, "OptCtx")));
  case 'L': return k->kind == P_CONST_PTR && !k->is_struct && !strcmp(k->base, "int64_t");
  case 'n': return k->kind == P_CONST_PTR && !k->is_struct && !strcmp(k->base, "char");
  default: return 0;
  }
}

/* A "..." field of a KERNEL line, from p; returns after its closing quote, or NULL. */
static const char *quoted(const char *p, char *out, size_t cap) {
  p = strchr(p, '"');
  if (!p) return NULL;
  const char *e = strchr(p + 1, '"');
  if (!e || (size_t)(e - p - 1) >= cap) return NULL;
  memcpy(out, p + 1, (size_t)(e - p - 1));
  out[e - p - 1] = 0;
  return e + 1;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: kernelsig KERNELS.DEF KERNELS.H\n");
    return 2;
  }
  const char *def = argv[1];
  char *dtext = slurp(def);
  if (!dtext) {
    fprintf(stderr, "kernelsig: error: cannot read %s\n", def);
    return 2;
  }
  if (load(argv[2])) return 2;
  int errors = 0, kernels = 0, lineno = 0;
  for (char *line = dtext, *nl; line && *line; line = nl ? nl + 1 : NULL) {
    nl = strchr(line, '\n');
    if (nl) *nl = 0;
    lineno++;
    const char *p = line;
    while (isspace((unsigned char)*p)) p++;
    if (strncmp(p, "KERNEL(", 7)) continue;
    char name[128], letters[MAX_PARAMS + 1];
    const char *q = quoted(p, name, sizeof name);
    if (!q || !quoted(q, letters, sizeof letters)) {
      fprintf(stderr, "kernelsig: error: %s:%d: a KERNEL line without its name and letters\n", def, lineno);
      errors++;
      continue;
    }
    kernels++;
    for (const char *l = letters; *l; l++)
      if (!letter_words(*l)) {
        fprintf(stderr, "kernelsig: error: %s:%d: %s argument %d: unknown letter '%c'\n", def, lineno, name,
                (int)(l - letters) + 1, *l);
        errors++;
      }
    int fi;
    const char *open = find_proto(name, &fi);
    if (!open) {
      fprintf(stderr, "kernelsig: error: %s:%d: %s: no prototype in %s or the headers it includes\n", def, lineno, name,
              argv[2]);
      errors++;
      continue;
    }
    Param ps[MAX_PARAMS];
    int np = split_params(files[fi].text, open, ps), nl_ = (int)strlen(letters);
    int at = line_at(files[fi].text, open);
    if (np < 0) {
      fprintf(stderr, "kernelsig: error: %s: more than %d parameters (%s:%d)\n", name, MAX_PARAMS, files[fi].path, at);
      errors++;
      continue;
    }
    if (np != nl_) {
      fprintf(stderr,
              "kernelsig: error: %s:%d: %s: kernels.def has %d arguments (\"%s\"), the prototype (%s:%d) has %d\n",
              def, lineno, name, nl_, letters, files[fi].path, at, np);
      errors++;
    }
    for (int k = 0; k < np && k < nl_; k++) {
      Kind kd = classify(ps[k].text);
      if (!letter_words(letters[k]) || matches(letters[k], &kd)) continue;
      fprintf(stderr,
              "kernelsig: error: %s:%d: %s argument %d: kernels.def has '%c' (%s), the prototype (%s:%d) has '%s' (%s)\n",
              def, lineno, name, k + 1, letters[k], letter_words(letters[k]), files[fi].path, ps[k].line, ps[k].text,
              kind_words(&kd));
      errors++;
    }
  }
  if (errors) {
    fprintf(stderr, "kernelsig: %d problem%s: %s does not match the kernels' prototypes\n", errors, errors == 1 ? "" : "s", def);
    return 1;
  }
  if (!kernels) {
    fprintf(stderr, "kernelsig: error: %s has no KERNEL lines\n", def);
    return 1;
  }
  printf("kernelsig: the %d kernels of %s match their prototypes in %s and %d headers it includes\n", kernels, def,
         argv[2], nfiles - 1);
  return 0;
}
