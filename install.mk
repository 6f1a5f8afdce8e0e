# install.mk - make install and make uninstall (the Makefile includes it; docs/install.md):
#   make install [PREFIX=/usr/local] [DESTDIR=STAGING] [NVCC=]
#   make uninstall [PREFIX=/usr/local] [DESTDIR=STAGING]
# install puts bin/{pipecc,pipecc-probe,pipecc-opprobe,pipecc-trace,piperun-data} under PREFIX, and the runtime under
# PREFIX/lib/pipecc/runtime: its headers and a library built here for this machine (CPU, and CUDA where
# nvcc is; NVCC= leaves the CUDA one out).  tools/install.sh copies the files and keeps the manifest
# uninstall removes them by.
PREFIX  ?= /usr/local
DESTDIR ?=
IB      := build/install
INSTALL_DEVICES := cpu $(if $(NVCC),cuda)

# The runtime is built by the Makefile pipecc generates (templates/Makefile.in, its stages left empty):
# the compilers, flags and feature detection of a stage build, so the installed library is the one a
# generated directory compiles on this machine.  It is asked every time: it knows which sources changed.
# Its objects stay in its own build/ (not in a PIPERUN_OBJ_CACHE of the environment: the test suite's is
# temporary), so that the next install rebuilds only what changed.
IB_MAKE = $(MAKE) -s --no-print-directory -C $(IB)/$* DEVICE=$* PIPERUN=$(CURDIR)/runtime PIPECC_GEN=$(CURDIR)/$(PB_DIR) \
          PIPERUN_OBJ_CACHE=
# $(call IB_ASK,EXPR): EXPR as that Makefile sees it (the queries below, written with $$ so they reach it whole).
IB_ASK  = $(IB_MAKE) --eval 'pr-ask: ; @echo $(1)' pr-ask
IB_OBJS := $$(RT_OBJ)
IB_DEFS := $$(strip $$(filter -DPR_%,$$(CFLAGS)))
IB_ARCH := $$(strip $$(filter -march=%,$$(CFLAGS)) $$(if $$(filter cuda,$$(DEVICE)),$$(CUDA_ARCH)))
IB_LIB_cpu    := libpiperun.a
IB_LIB_cuda   := libpiperun-cuda.so
IB_RTOBJ_cpu  := $$(PIPERUN)/libpiperun.a
IB_RTOBJ_cuda :=

# A new template may compile with other flags, which make does not track: its runtime is built afresh.
$(IB)/%/Makefile: templates/Makefile.in
	@mkdir -p $(@D)
	rm -rf $(@D)/build
	sed 's/{{[A-Z_]*}}//g' $< > $@

# The library, then prebuilt-DEVICE.mk beside it (the flags it was built with, for the stage builds).
# On the CPU the objects become one archive; on the GPU the stage Makefile links its own shared library.
$(IB)/%/prebuilt.mk: $(IB)/%/Makefile templates/prebuilt.mk.in $(PB_DIR)/onnx.pb-c.c $(PB_DIR)/onnx.pb-c.h FORCE
	+$(IB_MAKE) runtime
	+@if [ $* = cpu ]; then \
	  objs=$$($(call IB_ASK,$(IB_OBJS))) && cd $(IB)/$* && rm -f $(IB_LIB_cpu).tmp && \
	  ar rcs $(IB_LIB_cpu).tmp $$objs && mv -f $(IB_LIB_cpu).tmp $(IB_LIB_cpu); \
	else cp -f $(IB)/$*/build/$(IB_LIB_$*) $(IB)/$*/$(IB_LIB_$*); fi
	+@defs=$$($(call IB_ASK,$(IB_DEFS))) && arch=$$($(call IB_ASK,$(IB_ARCH))) && \
	sed -e 's|{{DEVICE}}|$*|g' -e 's|{{LIB}}|$(IB_LIB_$*)|' -e "s|{{ARCH}}|$$arch|" -e "s|{{DEFINES}}|$$defs|" \
	    -e 's|{{RT_OBJ}}|$(IB_RTOBJ_$*)|' templates/prebuilt.mk.in > $@.tmp && mv -f $@.tmp $@

install-runtime: $(foreach d,$(INSTALL_DEVICES),$(IB)/$(d)/prebuilt.mk)

install: bin/pipecc bin/pipecc-probe bin/pipecc-opprobe bin/pipecc-trace bin/piperun-data install-runtime
	bash tools/install.sh install "$(DESTDIR)" "$(PREFIX)" $(INSTALL_DEVICES)

uninstall:
	bash tools/install.sh uninstall "$(DESTDIR)" "$(PREFIX)"

# The filled template stays: the next install asks the same Makefile.
.PRECIOUS: $(IB)/%/Makefile
FORCE:
.PHONY: install install-runtime uninstall FORCE
