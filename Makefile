# moecore build. `make` builds build/moecore; `make test` installs what is
# missing, builds and runs every test; `make run` runs the main job.
CC      ?= gcc
PKGS    := openblas yaml-0.1 json-c ompi-c
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -Wall -Wextra -Wno-unused-parameter -fopenmp -D_GNU_SOURCE -Isrc \
           $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS  := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -fopenmp -lm
TEST_LDLIBS := $(shell pkg-config --libs check 2>/dev/null)
VERSION := 0.1.0
CFLAGS  += -DMOECORE_VERSION=\"$(VERSION)\"

# The commit of this build, for run headers and benchmark records:
# build/commit.h is rewritten only when the commit changes, so that only
# version.o is rebuilt.
COMMIT := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
$(shell mkdir -p build && echo '#define MOECORE_BUILD_COMMIT "$(COMMIT)"' > build/commit.h.new && \
        (cmp -s build/commit.h.new build/commit.h || mv build/commit.h.new build/commit.h); rm -f build/commit.h.new)

LIB_SRC := $(filter-out src/main.c,$(shell find src -name '*.c' | sort))
LIB_OBJ := $(LIB_SRC:%.c=build/%.o)

# The CUDA backend is compiled wherever nvcc is found (NVCC= forces a
# CPU-only build); one binary then picks the device from the config.
NVCC ?= $(shell command -v nvcc 2>/dev/null)
ifneq ($(NVCC),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CUDA_SRC  := $(sort $(wildcard src/ops/cuda/*.cu src/dist/*.cu))
CUDA_OBJ  := $(CUDA_SRC:%.cu=build/%.o)
CFLAGS    += -DMOECORE_CUDA -I$(CUDA_HOME)/include
NVCCFLAGS ?= -O3 -lineinfo
NVCC_ARCH := -gencode=arch=compute_90a,code=sm_90a
NVCCFLAGS += -std=c++17 $(NVCC_ARCH) -Isrc -DMOECORE_CUDA \
             --expt-relaxed-constexpr -Xcompiler -Wall,-Wno-unused-function
# The Blackwell MXFP8 GEMM (fp8_sm100.cu, compile-only: never run here) is
# built for sm_100a instead where nvcc knows compute_100; elsewhere without
# its kernel (MOECORE_SM100A unset), and its function says so.
ifneq ($(shell $(NVCC) --list-gpu-arch 2>/dev/null | grep -x compute_100),)
build/src/ops/cuda/fp8_sm100.o: NVCC_ARCH := -gencode=arch=compute_100a,code=sm_100a -DMOECORE_SM100A
endif
NVCCFLAGS += -DMOECORE_CUDA_LIB_DIR='"$(CUDA_HOME)/lib64"'
LDLIBS    += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++
endif
GPU_TEST_SRC := $(sort $(wildcard tests/gpu/test_*.c))
GPU_TEST_BIN := $(GPU_TEST_SRC:tests/gpu/%.c=build/tests/gpu/%)
# GPU programs that are not tests (scripts/gpu-check.sh runs every test_*)
GPU_BENCH_BIN := build/tests/gpu/bench_kernels build/tests/gpu/bench_fp8 build/tests/gpu/bench_grouped
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=build/tests/%)
TOOL_SRC := $(sort $(wildcard tests/tool_*.c))
TOOL_BIN := $(TOOL_SRC:tests/%.c=build/tests/%)

.PHONY: all deps pydeps test test-gpu gpu-bundle gpu-pack run bench clean
all: build/moecore

deps:
	@bash scripts/install-deps.sh

# build/pyenv: tokenizers and transformers from PyPI over Debian's torch, for
# the BPE path's test (tests/test_bpe.sh skips that part when it is missing,
# e.g. offline, so a failure here does not stop `make test`).
pydeps: deps
	@bash scripts/install-py-deps.sh || echo "make: scripts/install-py-deps.sh failed; tests/test_bpe.sh will skip its transformers part"

# Header dependencies from the compilers (-MMD -MP into build/deps/TARGET.d,
# away from the test programs' names): a header change rebuilds what
# includes it. A target whose .d is missing (a build from before this rule)
# is rebuilt once; the .d is moved into place and the target touched after
# each compile, so the .d is never the newer of the two.
DEPF = $(patsubst build/%,build/deps/%,$@).d
DEP = -MMD -MP -MF $(DEPF).T
DEP_DIR = mkdir -p $(dir $@) $(dir $(DEPF))
DEP_DONE = mv -f $(DEPF).T $(DEPF) && touch $@
build/%.o: %.c build/deps/%.o.d
	@$(DEP_DIR)
	$(CC) $(CFLAGS) $(DEP) -c $< -o $@
	@$(DEP_DONE)

build/src/util/version.o: build/commit.h
build/src/util/version.o: CFLAGS += -Ibuild

build/%.o: %.cu build/deps/%.o.d
	@$(DEP_DIR)
	$(NVCC) $(NVCCFLAGS) $(DEP) -c $< -o $@
	@$(DEP_DONE)

build/libmoecore.a: $(LIB_OBJ) $(CUDA_OBJ)
	rm -f $@ && ar rcs $@ $^

build/moecore: src/main.c build/libmoecore.a build/deps/moecore.d
	@$(DEP_DIR)
	$(CC) $(CFLAGS) $(DEP) $< build/libmoecore.a $(LDLIBS) -o $@
	@$(DEP_DONE)

build/tests/%: tests/%.c build/libmoecore.a build/deps/tests/%.d
	@$(DEP_DIR)
	$(CC) $(CFLAGS) $(DEP) -Itests $< build/libmoecore.a $(TEST_LDLIBS) $(LDLIBS) -o $@
	@$(DEP_DONE)

test: deps pydeps
	@$(MAKE) --no-print-directory build/moecore $(TEST_BIN) $(TOOL_BIN)
	@bash tests/run.sh

# GPU tests (tests/gpu/): CUDA ops against the CPU backend, whole steps.
# `make gpu-bundle` builds them and copies the shared libraries they need
# into build/lib, so that build/ can be carried to a GPU machine without
# this machine's packages; there, `bash tests/gpu/run.sh` runs them.
build/tests/gpu/%: tests/gpu/%.c build/libmoecore.a build/deps/tests/gpu/%.d
	@$(DEP_DIR)
	$(CC) $(CFLAGS) $(DEP) -Itests $< build/libmoecore.a $(LDLIBS) -o $@
	@$(DEP_DONE)

# The kernel tables (`gpu-check.sh kernels`; bench_fp8): they print the commit they were built from.
build/tests/gpu/bench_%: tests/gpu/bench_%.c build/libmoecore.a build/deps/tests/gpu/bench_%.d
	@$(DEP_DIR)
	$(CC) $(CFLAGS) $(DEP) -Itests -DMOECORE_BUILD_COMMIT=\"$(COMMIT)\" $< \
		build/libmoecore.a $(LDLIBS) -o $@
	@$(DEP_DONE)

# build/lib/COMMIT names the commit the bundle was built from (a lent
# machine's copy of .git need not be current).
gpu-bundle: build/moecore $(GPU_TEST_BIN) $(GPU_BENCH_BIN)
	@for f in build/tests/gpu/test_*; do case " $(GPU_TEST_BIN) " in *" $$f "*) ;; *) rm -f "$$f" ;; esac; done
	@bash scripts/bundle-libs.sh build/lib build/moecore $(GPU_TEST_BIN) $(GPU_BENCH_BIN)
	@git describe --always --dirty > build/lib/COMMIT 2>/dev/null || echo unknown > build/lib/COMMIT

# gpu-pack: the bundle as one xz archive (stripped binaries and build/lib),
# build/gpu-pack.tar.xz, for a lent machine that takes at most 64 MiB along
# (build/ itself is over 100 MB); there: `tar xJf build/gpu-pack.tar.xz`.
# PACK= names the programs (default: moecore and the GPU tests and benches).
PACK ?= build/moecore $(GPU_TEST_BIN) $(GPU_BENCH_BIN)
gpu-pack: gpu-bundle
	@rm -rf build/pack && mkdir -p build/pack/build/tests/gpu && cp -r build/lib build/pack/build/
	@for f in $(PACK); do strip -o build/pack/$$f $$f; done
	@tar cf - -C build/pack build | xz -T2 -3 > build/gpu-pack.tar.xz && rm -rf build/pack
	@echo "gpu-pack: $$(du -h build/gpu-pack.tar.xz | cut -f1) in build/gpu-pack.tar.xz ($(words $(PACK)) programs, commit $$(cat build/lib/COMMIT))"

# Issue #6's benchmark configs on this machine's GPU: a table, and one JSON
# line per config appended to bench/results/DATE-bench.jsonl.
BENCH_CONFIGS := configs/bench/olmoe-1b-7b.yaml configs/bench/sweep-e8.yaml configs/bench/sweep-e32.yaml \
                 configs/bench/sweep-e128.yaml
bench: build/moecore
	build/moecore bench $(BENCH_CONFIGS) --record=bench/results/$$(date +%F)-bench.jsonl

test-gpu: gpu-bundle
	@bash tests/gpu/run.sh

# The main job: the byte-level corpus from Debian's own text, then
# configs/tiny.yaml (about 2 minutes on 2 cores). Run it again with
# ARGS=--resume to continue from the last checkpoint, ARGS=--overwrite to start over.
run: deps
	@$(MAKE) --no-print-directory build/moecore
	bash scripts/prepare-corpus.sh data/corpus
	./build/moecore train configs/tiny.yaml $(ARGS)

clean:
	rm -rf build

# the compilers' dependency files (above), named as targets (not left to a
# pattern: a missing intermediate would not make its target out of date)
DEPFILES := $(patsubst build/%,build/deps/%.d,$(LIB_OBJ) $(CUDA_OBJ) build/moecore $(TEST_BIN) $(TOOL_BIN) \
                                                $(GPU_TEST_BIN) $(GPU_BENCH_BIN))
$(DEPFILES):
include $(wildcard $(DEPFILES))
