/* untie.h - --untie (untie.c). */
#ifndef PIPECC_UNTIE_H
#define PIPECC_UNTIE_H
#include "ir.h"

/* A weight read by nodes of one kind gets a copy per reader after the first. */
int untie_merged(Graph *g);
#endif
