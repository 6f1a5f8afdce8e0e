/* render_cuda.c - the GPU's renderer (pipecc --target cuda).
 *
 * A CUDA stage program is the C renderer's program with three things changed: its calls are the
 * GPU's kernels (runtime/cuda/kernels.h: kc_<name> for each k_<name>, the same arguments, every
 * buffer in device memory), its arena is a pointer the runtime aims at one device allocation of
 * ARENA_BYTES (the same offsets, so the listing's memory is the GPU memory the program takes), and
 * the static array the CPU computes in becomes the arena's host image, through which the runtime loads
 * weights, stages messages and writes checkpoints.  The host code only launches: every kernel runs
 * on the stage's stream in the order the spec lists it, and the runtime's events order the messages
 * after them (runtime/cuda/device.cu). */
#include "render.h"

static const CDialect C_CUDA = {
    .kernel_prefix = "kc_",
    .includes = "#include \"cuda/kernels.h\"\n",
    .arena = "/* The arena is on the GPU: the runtime points `arena` at one device allocation of ARENA_BYTES before the\n"
             " * first call (every buffer above is an offset into it).  arena_host is its host image: weights are loaded\n"
             " * into it, messages staged through it, checkpoints read from it; nothing is computed there. */\n"
             "static unsigned char arena_host[ARENA_BYTES] __attribute__((aligned(64)));\n"
             "static unsigned char *arena;\n",
    .arena_fields = ".arena = arena_host, .dev_arena = &arena, .precision = %s",
};

static void render_stage(const StageSpec *s, Buf *o) { render_c_stage(s, o, &C_CUDA); }

const Renderer RENDER_CUDA = {.target = "cuda", .stage_file = "stage_%d.c", .stage = render_stage};
