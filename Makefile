# pipecc - a static pipeline-parallel training compiler.
#   make deps   install the Debian packages it needs (as root, when missing)
#   make        build bin/pipecc
#   make test   the whole test suite (unit, shapes vs onnx, bad input, fuzz, ASan/UBSan)
#   make demo   plan the bundled LeNet for 4 stages and show the listing
#   make models export the large benchmark models (ResNet-18, GPT-2-small size)
#   make zoo    torchvision models and transformer LMs trained against PyTorch (docs/zoo.md)
#   make install [PREFIX=/usr/local] [DESTDIR=...]   the tools and the runtime (install.mk, docs/install.md)
#   make uninstall [PREFIX=...]                       removes exactly what install put there

CC      ?= cc
CFLAGS  ?= -O2 -g
WARN    := -Wall -Wextra -Werror
PB_DIR  := build/gen
ONNX_PROTO_DIR ?= /usr/include/onnx
CPPFLAGS := -Icompiler -I$(PB_DIR) -D_GNU_SOURCE
LDLIBS  := -lprotobuf-c -lopenblas -lm
PY      := /usr/bin/python3

DEB_PKGS := protobuf-c-compiler libprotobuf-c-dev libonnx-dev openmpi-bin libopenmpi-dev \
            libopenblas-dev libdnnl-dev liburing-dev clang libclang-rt-14-dev python3-onnx python3-torch \
            python3-torchvision python3-numpy chromium iproute2 tmux

COMPILER_SRC := $(filter-out compiler/main.c,$(wildcard compiler/*.c compiler/ops/*.c))
COMPILER_OBJ := $(COMPILER_SRC:compiler/%.c=build/obj/%.o) build/obj/onnx.pb-c.o
ASAN_OBJ     := $(COMPILER_SRC:compiler/%.c=build/asan/%.o) build/asan/onnx.pb-c.o
SAN          := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

.PHONY: test-costprobe test-parity bench-replicas bench-auto bench-chunks docs-schedules bench-threads bench-build bench-scale all deps test demo models clean unit-tests fuzz asan probe generated bench bench-predict bench-freeze zoo test-memory test-optstate test-replicas test-pipefb test-async test-freeze test-same-bits test-chunks test-late
all: bin/pipecc bin/pipecc-probe bin/pipecc-opprobe bin/piperun-data bin/pipecc-trace

include runtime/cuda/build.mk
include install.mk

# The synthetic data generator (MNIST / CIFAR-10 / token formats).
bin/piperun-data: tools/datagen.c runtime/data.c runtime/data.h runtime/npy.c runtime/npy.h runtime/failmsg.h
	@mkdir -p $(@D)
	clang $(CFLAGS) $(WARN) -D_GNU_SOURCE tools/datagen.c runtime/data.c runtime/npy.c -o $@ -lm

# Measures the MPI link; pipecc runs it when it first probes the machine.
bin/pipecc-probe: tools/probe_mpi.c tools/probe_kernels.c
	@mkdir -p $(@D)
	mpicc $(CFLAGS) $(WARN) tools/probe_mpi.c tools/probe_kernels.c -o $@
# Times the runtime's kernels on a grid of shapes (compiler/opcost.c runs it once per machine): built as the
# stage programs are (templates/Makefile.in's flags), with the kernels they link.
OPPROBE_DNNL := $(if $(wildcard /usr/include/dnnl.h),-DPR_DNNL,)
OPPROBE_DNNL_LIB := $(if $(OPPROBE_DNNL),-ldnnl -lgomp,)
bin/pipecc-opprobe: tools/probe_ops.c runtime/kernels.h $(wildcard runtime/cpu/*.h runtime/*.def) runtime/blas_core.h runtime/conv_dnnl.c runtime/broadcast.c runtime/par.c runtime/par.h runtime/gemm.c
	@mkdir -p $(@D)
	clang -O2 -march=native -g $(WARN) -D_GNU_SOURCE -Iruntime $(OPPROBE_DNNL) $(if $(MVEC),-DPR_MVEC -fno-math-errno -fveclib=libmvec,) \
	  tools/probe_ops.c runtime/conv_dnnl.c runtime/broadcast.c runtime/par.c runtime/gemm.c -o $@ \
	  -lopenblas -lm -lpthread $(OPPROBE_DNNL_LIB) $(MVEC_LIB)
probe: bin/pipecc-probe bin/pipecc bin/pipecc-opprobe
	rm -f $${PIPECC_CACHE:-$$HOME/.cache/pipecc/machine.txt} $${PIPECC_OPS_CACHE:-$$(dirname $${PIPECC_CACHE:-$$HOME/.cache/pipecc/machine.txt})/ops.txt}
	bin/pipecc onnx_models/mlp.onnx -n 2 -o build/probe.pipe >/dev/null
	cat $${PIPECC_CACHE:-$$HOME/.cache/pipecc/machine.txt}

deps:
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "make deps: run as root (apt-get)"; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "make deps: all packages present"; fi

# protobuf-c bindings generated from Debian's onnx.proto at build time.
$(PB_DIR)/onnx.pb-c.c $(PB_DIR)/onnx.pb-c.h: $(ONNX_PROTO_DIR)/onnx.proto
	@mkdir -p $(PB_DIR)
	protoc-c --c_out=$(PB_DIR) -I$(ONNX_PROTO_DIR) $<

# The emitter templates, embedded into pipecc as C strings.
$(PB_DIR)/templates.inc: templates/Makefile.in templates/run.sh.in templates/stage_main.c.in
	@mkdir -p $(PB_DIR)
	@{ for pair in TMPL_MAKEFILE:templates/Makefile.in TMPL_RUN_SH:templates/run.sh.in TMPL_STAGE_MAIN:templates/stage_main.c.in; do \
	    echo "const char $${pair%%:*}[] ="; \
	    sed 's/\\/\\\\/g; s/"/\\"/g; s/^/    "/; s/$$/\\n"/' "$${pair#*:}"; echo "    ;"; done; } > $@

build/obj/onnx.pb-c.o: $(PB_DIR)/onnx.pb-c.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(CPPFLAGS) -c $< -o $@
build/obj/%.o: compiler/%.c compiler/*.h runtime/blas_core.h runtime/actions.h runtime/actions.def runtime/opcodes.def compiler/*.def compiler/ops/*.h $(PB_DIR)/onnx.pb-c.h $(PB_DIR)/templates.inc
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(WARN) $(CPPFLAGS) -c $< -o $@
bin/pipecc: build/kernelsig.ok build/obj/main.o $(COMPILER_OBJ)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(filter %.o,$^) -o $@ $(LDLIBS)

# compiler/kernels.def against the kernels' prototypes (tools/kernelsig.c): each kernel's argument count
# and kinds; a mismatch fails the build, naming the kernel, the argument and both sides.
build/tools/kernelsig: tools/kernelsig.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(WARN) $< -o $@
build/kernelsig.ok: build/tools/kernelsig compiler/kernels.def runtime/kernels.h $(wildcard runtime/cpu/*.h runtime/*.def)
	build/tools/kernelsig compiler/kernels.def runtime/kernels.h
	@touch $@

# The same compiler under AddressSanitizer + UBSan, for the tests.
build/asan/onnx.pb-c.o: $(PB_DIR)/onnx.pb-c.c
	@mkdir -p $(@D)
	clang -O1 -g $(SAN) $(CPPFLAGS) -c $< -o $@
build/asan/%.o: compiler/%.c compiler/*.h runtime/blas_core.h runtime/actions.h runtime/actions.def runtime/opcodes.def compiler/*.def compiler/ops/*.h $(PB_DIR)/onnx.pb-c.h $(PB_DIR)/templates.inc
	@mkdir -p $(@D)
	clang -O1 -g $(SAN) $(WARN) $(CPPFLAGS) -c $< -o $@
bin/pipecc-asan: build/kernelsig.ok build/asan/main.o $(ASAN_OBJ)
	clang $(SAN) $(filter %.o,$^) -o $@ $(LDLIBS)
asan: bin/pipecc-asan bin/pipecc-trace-asan

# Draws a run's trace (the runtime's trace-event JSON) as an SVG Gantt chart.
bin/pipecc-trace: tools/pipecc_trace.c build/obj/timeline.o build/obj/util.o
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(WARN) $(CPPFLAGS) $^ -o $@ -lm
bin/pipecc-trace-asan: tools/pipecc_trace.c build/asan/timeline.o build/asan/util.o
	@mkdir -p $(@D)
	clang -O1 -g $(SAN) $(WARN) $(CPPFLAGS) $^ -o $@ -lm
bin/test_timeline: tests/test_timeline_c.c tests/check.h build/asan/timeline.o build/asan/util.o
	@mkdir -p $(@D)
	clang -O1 -g $(SAN) $(WARN) $(CPPFLAGS) $(filter-out %.h,$^) -o $@ -lm

# Unit tests in C link the compiler's passes directly.
bin/test_partition: tests/test_partition.c tests/check.h $(ASAN_OBJ)
	clang -O1 -g $(SAN) $(WARN) $(CPPFLAGS) $(filter-out %.h,$^) -o $@ $(LDLIBS)
bin/test_dagpart: tests/test_dagpart.c tests/check.h $(ASAN_OBJ)
	clang -O1 -g $(SAN) $(WARN) $(CPPFLAGS) $(filter-out %.h,$^) -o $@ $(LDLIBS)
bin/test_schedule: tests/test_schedule.c tests/check.h $(ASAN_OBJ)
	clang -O1 -g $(SAN) $(WARN) $(CPPFLAGS) $(filter-out %.h,$^) -o $@ $(LDLIBS)
bin/test_units: tests/test_units.c tests/check.h $(ASAN_OBJ)
	clang -O1 -g $(SAN) $(WARN) $(CPPFLAGS) $(filter-out %.h,$^) -o $@ $(LDLIBS)
# The run-time kernels (runtime/kernels.h) against double references, with the vector libm the stage
# programs use where there is one (templates/Makefile.in).
MVEC     := $(if $(wildcard /usr/lib/x86_64-linux-gnu/libmvec.so),-DPR_MVEC -march=native -fno-math-errno,)
MVEC_LIB := $(if $(MVEC),-lmvec,)
bin/test_kernels: tests/test_kernels.c tests/check.h runtime/kernels.h $(wildcard runtime/cpu/*.h runtime/*.def) runtime/broadcast.c runtime/par.c runtime/par.h runtime/gemm.c
	@mkdir -p $(@D)
	clang -O1 -g $(SAN) $(WARN) -D_GNU_SOURCE -Iruntime $(MVEC) $< runtime/broadcast.c runtime/par.c runtime/gemm.c -o $@ -lopenblas -lm -lpthread $(MVEC_LIB)
# libFuzzer target for the loader and the passes after it, coverage-instrumented.
FUZZ_OBJ := $(COMPILER_SRC:compiler/%.c=build/fuzz/%.o) build/fuzz/onnx.pb-c.o
build/fuzz/onnx.pb-c.o: $(PB_DIR)/onnx.pb-c.c
	@mkdir -p $(@D)
	clang -O1 -g -fsanitize=fuzzer-no-link,address,undefined $(CPPFLAGS) -c $< -o $@
build/fuzz/%.o: compiler/%.c compiler/*.h runtime/blas_core.h runtime/actions.h runtime/actions.def runtime/opcodes.def compiler/*.def compiler/ops/*.h $(PB_DIR)/onnx.pb-c.h $(PB_DIR)/templates.inc
	@mkdir -p $(@D)
	clang -O1 -g -fsanitize=fuzzer-no-link,address,undefined $(WARN) $(CPPFLAGS) -c $< -o $@
bin/fuzz_loader: tests/fuzz_loader.c $(FUZZ_OBJ)
	clang -O1 -g -fsanitize=fuzzer,address,undefined $(WARN) $(CPPFLAGS) $^ -o $@ $(LDLIBS)
# The long run (FUZZ_SECONDS, default 1800): loading through code generation,
# then a build of what it accepted.  build/fuzz-corpus keeps what it found.
fuzz: bin/fuzz_loader bin/pipecc
	@mkdir -p build/fuzz-corpus build/fuzz-accepted
	FUZZ_KEEP_DIR=build/fuzz-accepted bin/fuzz_loader -max_total_time=$${FUZZ_SECONDS:-1800} -rss_limit_mb=4096 \
	  -artifact_prefix=build/ build/fuzz-corpus tests/fuzz_seeds
	bash tests/fuzz_build.sh build/fuzz-accepted 30

test: bin/pipecc bin/pipecc-probe bin/piperun-data bin/pipecc-asan bin/test_partition bin/test_dagpart bin/test_schedule bin/test_units \
      bin/test_kernels bin/fuzz_loader bin/pipecc-trace bin/pipecc-trace-asan bin/test_timeline
	@bash tests/run.sh

# The main job: plan LeNet over 4 stages, build the stage programs, train them
# on 4 MPI ranks on the built-in synthetic data.
DEMO := build/demo
demo: deps
	$(MAKE) all
	bin/piperun-data mnist $(DEMO)/mnist --n 12800 --seed 1 --force  # make demo again: the same data, written again
	bin/pipecc onnx_models/lenet.onnx -n 4 --batch 64 --microbatches 8 --schedule 1f1b --lr 0.1 -o $(DEMO)/lenet.pipe --listing
	$(MAKE) -s -C $(DEMO)/lenet.pipe
	$(DEMO)/lenet.pipe/run.sh --data $(DEMO)/mnist --steps 200 --shuffle --log $(DEMO)/lenet.csv --save $(DEMO)/lenet_trained.onnx

# generated/: the sample LeNet at n=4, 1F1B and async, kept reproducible (tests/test_generated.sh).
GEN_FLAGS := -n 4 --batch 64 --microbatches 8 --lr 0.1 --devices tests/devices_equal.txt
generated: bin/pipecc
	rm -rf generated/lenet.pipe generated/lenet_async.pipe
	bin/pipecc onnx_models/lenet.onnx $(GEN_FLAGS) --schedule 1f1b -o generated/lenet.pipe
	bin/pipecc onnx_models/lenet.onnx $(GEN_FLAGS) --schedule async --staleness 1 -o generated/lenet_async.pipe

# Side-by-side benchmarks against PyTorch and torch's GPipe (bench/README.md); about 8 minutes.
bench: all
	/usr/bin/python3 bench/bench.py

# The cost model against the clock (bench/predict.md): every sample model at n = 1, 2, 4 under
# every schedule, planned with a measured profile (--costs); about 10 minutes.
bench-predict: all
	/usr/bin/python3 bench/predict.py

# Section 9 of make bench alone (bench/freeze.md, bench/freeze_*.svg; not results.md): time to a held-out
# accuracy with --freeze auto, without freezing and with torch's GPipe Pipe; about 7 minutes.
# 4 ranks as stages or replicas (bench/replicas.md): LeNet and the GPT at (S, R) = (4, 1), (2, 2), (1, 4)
# beside torch DDP over gloo, and the layout --ranks 4 chose; about 5 minutes.
bench-replicas: all
	/usr/bin/python3 bench/replicabench.py

bench-freeze: all
	/usr/bin/python3 bench/freezebench.py

# --schedule auto's choice against the measured best (bench/auto.md): lenet and gpt at n = 2, m = 4 and 8,
# planned from the FLOP model and from the kernel cache; about 10 minutes.
bench-auto: all
	/usr/bin/python3 bench/autobench.py

# Virtual stages (bench/chunks.md, bench/chunks.svg): 1f1b, zb1, interleaved and zbv (--chunks 2) on lenet and gpt
# at n = 2, m = 4 and 8, in interleaved rounds, measured bubble and samples/s beside the plan; about 15-25 minutes.
bench-chunks: all
	/usr/bin/python3 bench/chunkbench.py

# docs/schedules.md's pictures and lists (docs/schedules/*.svg, *.txt, table.md): every schedule planned by pipecc
# itself on 16 equal layers at n = 4, m = 8 (--plan-only; a few seconds).
docs-schedules: bin/pipecc
	/usr/bin/python3 docs/schedules/gen.py

# --threads (bench/threads.md): one rank on 2 threads against PyTorch on 2 threads, and against one thread
# and two stages; about 8 minutes.
bench-threads: all
	/usr/bin/python3 bench/threadsbench.py

# Building what pipecc generates (bench/buildtime.md): make -j2 of each torchvision model's stages, and the
# generated directory against the ONNX file; about 5 minutes.
bench-build: all
	/usr/bin/python3 bench/buildtime.py

# The compiler at scale (bench/compilescale.md, .svg): pipecc -n 8 on GPT-2-shaped models of 3, 6, 12 blocks.
bench-scale: all
	/usr/bin/python3 bench/compilescale.py

models:
	$(PY) onnx_models/export.py --large

# Training parity's whole matrix (make test runs tests/test_parity.py --ci): every model at n = 1, 2, 4
# (the local ones at 1 and 4) under every schedule.
test-parity: bin/pipecc
	PIPECC=bin/pipecc $(PY) tests/test_parity.py

# The memory plan's whole matrix (not part of make test): every sample model
# at n = 2 and 4, 1f1b and zb1, offloaded to a peer, to a file, recomputed.
# The op probe (docs/cost.md): the synthetic-grid checks, then the real probe on a fresh cache (its time), and
# --conv auto's choice against its measurements.  About 30 s.  bench/costprobe.py measures the predictions.
test-costprobe: bin/pipecc bin/pipecc-opprobe
	$(PY) tests/test_costprobe.py

test-memory: bin/pipecc bin/piperun-data
	$(PY) tests/test_memory.py

test-optstate: bin/pipecc bin/piperun-data
	$(PY) tests/test_optstate.py

# Replicas' whole matrix (not part of make test): mlp, lenet, resnet, gpt at (S, R) = (1, 2), (2, 2), (1, 4),
# (4, 2), gpipe and 1f1b, SGD and AdamW, against PyTorch on the global batch.
test-replicas: bin/pipecc bin/piperun-data
	$(PY) tests/test_replicas.py

# PipeFB's whole matrix (not part of make test): every sample model at n = 2, 4, 6,
# an even split and the planner's, bit-identical to -n 1.
test-pipefb: bin/pipecc bin/piperun-data
	$(PY) tests/test_pipefb.py

# The async schedule's whole matrix (not part of make test): mlp, lenet, gpt at n = 2, 4, K = 1, 2, SGD and
# AdamW against a PyTorch simulation of the staleness rule.
test-async: bin/pipecc bin/piperun-data
	$(PY) tests/test_async.py

# Frozen layers' whole suite (not part of make test): LeNet, the GPT and the ResNet, --frozen and
# run.sh --freeze-at, against PyTorch with requires_grad=False.
test-freeze: bin/pipecc bin/piperun-data
	$(PY) tests/test_freeze.py

# The before/after bit test (not part of make test): BASE (default HEAD~1, any git revision) is built in a
# worktree at build/same-bits/base, and every sample model at n = 1, 2, 4 under gpipe, 1f1b and zb1 (and
# offload, recompute, --frozen, --freeze-at, async, pipefb, --val on a few) trains 3 steps on both sides to
# byte-identical saved models; stage text changes are printed.  17 to 26 minutes on 2 cores shared with
# other builds (9 CPU-minutes); SAME_BITS_FLAGS=--quick for 5 cases (about 3 minutes).
BASE ?= HEAD~1
SAME_BITS_FLAGS ?=
# Virtual stages (not part of make test, which runs tests/test_chunks.py --ci): every sample model at n = 2
# and 4 under interleaved and zbv, bit-identical to -n 1; a few minutes.
# zb1's and zbv's layouts of what W reads (--split-layout) on mlp, lenet, gpt, resnet at n = 2 and 4, bit-identical to -n 1;
# about 3 minutes.
test-late: all
	env PIPECC=bin/pipecc $(PY) tests/test_late.py

test-chunks: all
	$(PY) tests/test_chunks.py

test-same-bits: bin/pipecc bin/piperun-data
	$(PY) tests/test_same_bits.py --base $(BASE) $(SAME_BITS_FLAGS)

# The real-model suite (not part of make test): torchvision classifiers and two
# transformer LMs, n = 1 and 4, against PyTorch; writes docs/zoo.md.
zoo: bin/pipecc bin/piperun-data
	$(PY) tests/zoo/run.py --docs docs/zoo.md

clean:
	rm -rf build bin
