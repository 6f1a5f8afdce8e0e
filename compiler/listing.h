/* listing.h - the human listing (schedule.txt) and machine plan (plan.json). */
#ifndef PIPECC_LISTING_H
#define PIPECC_LISTING_H
#include "plan.h"

void listing_text(const Plan *p, Buf *b);
void listing_json(const Plan *p, Buf *b);
/* The planned step as an SVG Gantt chart (timeline.svg): one row per rank, every action. */
void listing_timeline(const Plan *p, Buf *b);
#endif
