/* render.c - the renderers, one row per device target (render.h). */
#include <string.h>

#include "render.h"

static const Renderer *const RENDERERS[] = {&RENDER_C, &RENDER_CUDA};

const Renderer *renderer_for(const char *target) {
  for (size_t i = 0; i < sizeof RENDERERS / sizeof RENDERERS[0]; i++)
    if (!strcmp(RENDERERS[i]->target, target)) return RENDERERS[i];
  return NULL;
}
