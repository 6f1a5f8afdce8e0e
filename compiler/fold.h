/* fold.h - compile-time evaluators, one per op family (used through the op table). */
#ifndef PIPECC_FOLD_H
#define PIPECC_FOLD_H
#include "ir.h"
#define F(op) int fold_##op(Graph *g, Node *n);
F(Unary) F(Binary) F(Where) F(Copy) F(Cast) F(Transpose) F(Slice) F(Gather) F(Concat) F(Split)
F(Expand) F(Trilu) F(Shape) F(Size) F(Constant) F(ConstantOfShape) F(Range) F(Reduce)
#undef F
#endif
