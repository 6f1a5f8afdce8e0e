/* templates.c - filling the emitter templates. */
#include "templates.h"

#include <stdlib.h>
#include <string.h>

#include "templates.inc"

void tmpl_fill(Buf *b, const char *tmpl, const char *const *keys, const char *const *vals, int n) {
  for (const char *s = tmpl; *s;) {
    const char *open = strstr(s, "{{");
    if (!open) {
      buf_printf(b, "%s", s);
      return;
    }
    buf_printf(b, "%.*s", (int)(open - s), s);
    const char *close = strstr(open, "}}");
    if (!close) abort();
    const char *val = NULL;
    for (int i = 0; i < n && !val; i++)
      if (strlen(keys[i]) == (size_t)(close - open - 2) && !strncmp(open + 2, keys[i], (size_t)(close - open - 2))) val = vals[i];
    if (!val) {
      fprintf(stderr, "pipecc: internal error: template key %.*s has no value\n", (int)(close - open - 2), open + 2);
      abort();
    }
    buf_printf(b, "%s", val);
    s = close + 2;
    /* A key alone on its line whose value is empty leaves no empty line behind: optional blocks
     * (the Makefile's PREBUILT) cost nothing where they do not apply. */
    if (!*val && (open == tmpl || open[-1] == '\n') && *s == '\n') s++;
  }
}
