/* ctext.c - text from the model made safe inside generated C (ctext.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ctext.h"

void put_comment(Buf *o, const char *s) {
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '*' && c[1] == '/') buf_printf(o, "*\\/"), c++;
    else if (*c == '/' && c[1] == '*') buf_printf(o, "/\\*"), c++;
    else if (*c < 0x20 || *c >= 0x7f || *c == '\\') buf_printf(o, "\\x%02x", *c);
    else buf_printf(o, "%c", *c);
  }
}

void put_cstring(Buf *o, const char *s) {
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\' || *c == '?') buf_printf(o, "\\%c", *c);
    else if (*c < 0x20 || *c >= 0x7f) buf_printf(o, "\\%03o", *c);
    else buf_printf(o, "%c", *c);
  }
}

void put_float(Buf *o, float v) {
  char num[64];
  if (isinf(v) || isnan(v)) { /* printf's "inf" is no C literal; math.h's macros are (Clip's open bounds) */
    buf_printf(o, "%s", isnan(v) ? "NAN" : v > 0 ? "INFINITY" : "-INFINITY");
    return;
  }
  snprintf(num, sizeof num, "%.9g", v);
  buf_printf(o, "%s%sf", num, strpbrk(num, ".eEni") ? "" : ".0");
}
