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

extern const Renderer RENDER_C, RENDER_CUDA;

/* What the C renderer (render_c.c) prints differently for a device whose calls are made from C: the
 * CPU's, and the GPU's (render_cuda.c), whose stage program is host C launching the GPU's kernels. */
typedef struct CDialect {
  const char *kernel_prefix; /* a call's name: kernels.def's with its "k_" replaced by this ("k_", "kc_") */
  const char *includes;      /* printed after #include "piperun.h" */
  const char *arena;         /* the arena's declaration(s) */
  const char *arena_fields;  /* the descriptor's arena fields; %s: the precision's PR_PREC_ name */
} CDialect;
void render_c_stage(const StageSpec *spec, Buf *out, const CDialect *d);
/* The renderer for a target, or NULL. */
const Renderer *renderer_for(const char *target);
#endif
