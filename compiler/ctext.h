/* ctext.h - text from the model made safe inside generated C: comments,
 * string literals, and floats as literals that read back exactly. */
#ifndef PIPECC_CTEXT_H
#define PIPECC_CTEXT_H
#include "util.h"

/* s inside a C comment: a name holding the end of a comment or a newline
 * would otherwise put its own code into the program.  Unprintable bytes
 * become \xNN. */
void put_comment(Buf *o, const char *s);
/* s as the body of a C string literal: quotes, backslashes and '?'
 * (trigraphs) escaped, other unprintable bytes as 3-digit octal. */
void put_cstring(Buf *o, const char *s);
/* A float as a C literal that reads back as the same float: 1.0f, 0.05f, 1e-05f, INFINITY. */
void put_float(Buf *o, float v);
#endif
