/* ops/elementwise.h - the elementwise ops' codes and their shared shape and
 * fold rules (ops/elementwise.c), which compile_time.c's arithmetic,
 * comparisons and logic use too. */
#ifndef PIPECC_OPS_ELEMENTWISE_H
#define PIPECC_OPS_ELEMENTWISE_H
#include "ir.h"

/* OpDef.code of the elementwise ops.  One shape rule and one fold rule serve
 * all of them (elementwise.c); compile_time.c's arithmetic, comparisons and
 * logic use the same rules, so each scalar function is written once. */
enum {
  EW_NONE,
  /* unary */
  EW_SQRT, EW_NEG, EW_RELU, EW_EXP, EW_LOG, EW_ABS, EW_ERF, EW_TANH, EW_SIGMOID, EW_RECIPROCAL, EW_NOT, EW_FLOOR, EW_CEIL,
  EW_CLIP, EW_HARDSIGMOID, EW_HARDSWISH, /* run time only: their parameters are not the fold rule's */
  /* binary */
  EW_ADD, EW_SUB, EW_MUL, EW_DIV, EW_POW, EW_MOD, EW_MAX, EW_MIN,
  EW_EQUAL, EW_LESS, EW_GREATER, EW_LESS_EQUAL, EW_GREATER_EQUAL, EW_AND, EW_OR,
};
/* Inputs of one element type, broadcast (Add, Max...). */
int ew_infer_binary(Graph *g, Node *n);
/* Any two inputs, broadcast, a bool result (Equal, And...). */
int ew_infer_compare(Graph *g, Node *n);
/* y = f(x) per element, f chosen by n->def->code. */
int ew_fold_unary(Graph *g, Node *n);
/* y = f(a, b) per element with broadcasting, f chosen by n->def->code. */
int ew_fold_binary(Graph *g, Node *n);
#endif
