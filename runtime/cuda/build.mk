# runtime/cuda/build.mk - the CUDA side of the build (the Makefile includes it): the GPU kernels
# and the checks of them (tests/gpu/).  Everything here compiles and links wherever nvcc is (on PATH or
# at /usr/local/cuda); running it needs a GPU (tests/gpu/check.sh).  Without nvcc the targets say so.
NVCC      ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# Hopper (H100, H200): its own machine code, and PTX for a newer GPU's driver to compile.
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVFLAGS   := -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings -Iruntime
CUDA_SRC  := $(wildcard runtime/cuda/*.cu)
CUDA_OBJ  := $(CUDA_SRC:runtime/cuda/%.cu=build/cuda/%.o)
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
# The CPU kernels the checks compare with: no -march=native, the GPU machine's CPU may be another.
GPU_CHECK_CPU := runtime/broadcast.c runtime/par.c runtime/gemm.c

build/cuda/%.o: runtime/cuda/%.cu $(wildcard runtime/cuda/*.cuh runtime/cuda/*.h) runtime/shapes.h runtime/opcodes.def
	@test -n "$(NVCC)" || { echo "make: no nvcc on PATH or at /usr/local/cuda: the CUDA kernels need the CUDA toolkit" >&2; exit 1; }
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -c $< -o $@

# Every GPU kernel against its CPU kernel (tests/gpu/kernels.c).
bin/gpu-kernels: $(wildcard tests/gpu/*.c tests/gpu/*.h) $(CUDA_OBJ) $(GPU_CHECK_CPU) runtime/kernels.h $(wildcard runtime/cpu/*.h)
	@mkdir -p $(@D)
	clang -O2 -g $(WARN) -D_GNU_SOURCE -Iruntime -Itests/gpu -I$(CUDA_HOME)/include $(filter %.c,$^) $(CUDA_OBJ) \
	  -o $@ $(CUDA_LIBS) -l:libopenblas.a -lm -lpthread

cuda: $(CUDA_OBJ) bin/gpu-kernels

# `make` builds the CUDA kernels too where there is an nvcc (a stage build compiles its own copy).
ifneq ($(NVCC),)
all: $(CUDA_OBJ) bin/gpu-kernels
endif

# Everything tests/gpu/check.sh runs on a GPU machine, built here into .gpu/ (tests/gpu/prepare.py).
gpu-prepare: bin/pipecc bin/piperun-data bin/gpu-kernels
	$(PY) tests/gpu/prepare.py
# The GPU path's whole build matrix (make test builds every sample model at n = 2): every training
# schedule at n = 1, 2, 4 and the other precisions, compiled and linked.
test-cuda-build: bin/pipecc
	PIPECC=bin/pipecc $(PY) tests/test_cuda_build.py --all
# make install's CUDA half (make test counts it as a skip: nvcc builds the runtime in about 100 s).
test-install-cuda: bin/pipecc bin/piperun-data
	bash tests/test_install.sh --cuda
.PHONY: cuda gpu-prepare test-cuda-build test-install-cuda
