/* compile_time.c - shape arithmetic and masks: ops pipecc evaluates while
 * compiling (constant folding) and never runs in a stage program.  An export's
 * x.size() views, arange positions and causal masks end up here. */
#include "ops/rule.h"

#define CT(name, infer, fold) {name, "compile_time", infer, fold, 0, STASH_NONE, NULL, 0, NULL, NULL, NULL}
const OpDef OPS_COMPILE_TIME[] = {
    CT("Constant", infer_Constant, fold_Constant),
    CT("ConstantOfShape", infer_ConstantOfShape, fold_ConstantOfShape),
    CT("Shape", infer_Shape, fold_Shape),
    CT("Size", infer_Size, fold_Size),
    CT("Range", infer_Range, fold_Range),
    CT("Equal", infer_Compare, fold_Binary),
    CT("Less", infer_Compare, fold_Binary),
    CT("Greater", infer_Compare, fold_Binary),
    CT("LessOrEqual", infer_Compare, fold_Binary),
    CT("GreaterOrEqual", infer_Compare, fold_Binary),
    CT("And", infer_Compare, fold_Binary),
    CT("Or", infer_Compare, fold_Binary),
    CT("Not", infer_Unary, fold_Unary),
    CT("Trilu", infer_Unary, fold_Trilu),
    CT("Neg", infer_Unary, fold_Unary),
    CT("Exp", infer_Unary, fold_Unary),
    CT("Log", infer_Unary, fold_Unary),
    CT("Abs", infer_Unary, fold_Unary),
    CT("Reciprocal", infer_Unary, fold_Unary),
    CT("Floor", infer_Unary, fold_Unary),
    CT("Ceil", infer_Unary, fold_Unary),
    CT("Max", infer_Binary, fold_Binary),
    CT("Min", infer_Binary, fold_Binary),
    CT("Mod", infer_Binary, fold_Binary),
    {0},
};
