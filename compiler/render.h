/* render.h - a renderer prints a StageSpec (spec.h) as one device's source.
 *
 * It decides nothing: every table, call list and number is in the spec.  The
 * C renderer (render_c.c) is the CPU's; a second device is a second file
 * with a row in RENDERERS (render.c), and no branch anywhere else. */
#ifndef PIPECC_RENDER_H
#define PIPECC_RENDER_H
#include "spec.h"

typedef struct Renderer {
  const char *target;     /* the device it renders for ("cpu") */
  const char *stage_file; /* a stage's file name, printf'd with the stage: "stage_%d.c" */
  void (*stage)(const StageSpec *spec, Buf *out);
} Renderer;

extern const Renderer RENDER_C;
/* The renderer for a target, or NULL. */
const Renderer *renderer_for(const char *target);
#endif
