/* timeline.h - pipeline schedules drawn as SVG Gantt charts: one row per
 * rank, one box per action.  The compiler draws its planned schedule with it,
 * bin/pipecc-trace a measured one from the runtime's trace (docs/timeline.md). */
#ifndef PIPECC_TIMELINE_H
#define PIPECC_TIMELINE_H
#include "util.h"

/* One action on one rank; start and end in seconds (any origin: the chart
 * starts at the earliest start).  mb < 0: no micro-batch (nothing written).
 * pipecc --chunks: chunk is which of its rank's chunks the action runs (-1:
 * the whole rank's, as UPDATE; 0 without chunks) and stage that chunk's
 * stage of the model (-1: unknown).  A chart is chunked when a span has
 * chunk > 0. */
typedef struct TlSpan {
  int rank;
  int kind;
  int mb;
  int step;
  double start, end;
  int chunk, stage;
} TlSpan;

#define TL_MAX_RANKS 65536
#define TL_MAX_CHUNKS 64

/* A span's kind: an action's (runtime/actions.def, numbered as the runtime's trace writes them), or a wait. */
enum {
#define ACTION(name, legend, meaning) TL_##name,
#include "../runtime/actions.def"
#undef ACTION
  TL_WAIT,
  TL_NKINDS
};

/* "F","B","I","W","SEND","RECV","SEND_GRAD","RECV_GRAD","UPDATE","wait";
 * "?" for a kind out of range. */
const char *tl_kind_name(int kind);
/* The inverse (exact, case-sensitive); -1 if unknown or NULL. */
int tl_kind_from_name(const char *s);

/* Appends a standalone SVG document: a title line, one row per rank
 * ("rank k"), a time axis with ticks and units, one colour per action kind
 * with a legend of the kinds present, the micro-batch number in each box
 * wide enough to hold it, and a tooltip (<title>) on every action.  A
 * chunked chart draws a later chunk's boxes in a lighter shade of their
 * kind's colour, writes "3@1" (micro-batch 3 of chunk 1) in them, and says
 * under the legend which stages each rank runs.
 * Zero-width actions (SEND/RECV posts) are drawn as thin ticks so every action
 * is visible.  Spans with a rank outside [0, nranks), a kind out of range or a
 * non-finite time are skipped; end < start is drawn as zero width.  The same
 * input gives the same bytes.  title may be NULL; it is XML-escaped, control
 * characters and invalid UTF-8 become '?'.  At most TL_MAX_RANKS rows are drawn;
 * a span with chunk >= TL_MAX_CHUNKS is skipped. */
void timeline_svg(Buf *o, const TlSpan *spans, int n, int nranks, const char *title);

/* A chunked chart's stages: appends "rank 0 runs stages 0 and 3; rank 1 runs
 * stages 1 and 2" (a stage no span names is "?") and returns the chunks a
 * rank runs (its highest chunk + 1); appends nothing and returns 0 when no
 * span has chunk > 0.  Spans are taken as timeline_svg takes them. */
int timeline_chunks_text(Buf *o, const TlSpan *spans, int n, int nranks);
/* "3", "0 and 3", "0, 4 and 8": a list of n stages as the listing and the
 * charts write it (a negative one is "?"). */
void timeline_stage_list(Buf *o, const int *stages, int n);
#endif
