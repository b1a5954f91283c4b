# deltacast build: one static and one shared library, the programs, the tests.
# `make` builds, `make test` runs every test, `make test SAN=1` does so under
# address and undefined-behaviour sanitizers (and the debug tier's checks,
# DCAST_DEBUG_ASSERT), `make fuzz` runs the fuzz
# targets for FUZZ_SECONDS each.  Dependencies come from `make deps`.

PREFIX   ?= /usr/local
SAN      ?= 0
CUDA     ?= 1
FUZZ_SECONDS ?= 60
PYTHON   ?= /usr/bin/python3

ifeq ($(SAN),1)
BUILD    ?= build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT      := -O1 -g -DDCAST_DEBUG=1
else
BUILD    ?= build
SANFLAGS :=
OPT      := -O2 -g
endif

PKGS     := libzmq msgpack liburing libxxhash
CC       ?= cc
# -fvisibility=hidden: libdeltacast.so exports only what the public headers
# mark DCAST_API (include/deltacast/export.h).
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -fPIC -pthread -fvisibility=hidden \
	-Iinclude -Icommon -Ischema -Ikernels -Iproducer -Iconsumer $(OPT) $(SANFLAGS)
# Deferred (=) so that pkg-config runs after `make deps` has installed things.
DEP_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
DEP_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null || echo -lzmq -lmsgpackc -luring -lxxhash)

# CUDA: compiled whenever nvcc is found, unless CUDA=0.
CUDA_HOME ?= /usr/local/cuda
NVCC := $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard $(CUDA_HOME)/bin/nvcc))
ifeq ($(CUDA),0)
NVCC :=
endif
NVCC_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_90,code=compute_90
ifneq ($(NVCC),)
CUDA_CFLAGS := -DDCAST_HAVE_CUDA=1 -I$(CUDA_HOME)/include
# CUB's host code in the kernels needs the C++ runtime at link time.
CUDA_LIBS   := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
endif

CFLAGS  := $(CFLAGS_BASE) $(CUDA_CFLAGS) $(EXTRA_CFLAGS)
# The CLI is a user of the library like any other: public headers only.
PRIVATE_INCLUDES := -Icommon -Ischema -Ikernels -Iproducer -Iconsumer
$(BUILD)/obj/cli/%.o: CFLAGS := $(filter-out $(PRIVATE_INCLUDES),$(CFLAGS))
LDLIBS   = $(DEP_LIBS) $(CUDA_LIBS) -lm -lpthread

# Library sources: every .c in these folders (broker/ and cli/ are programs).
LIB_DIRS := common schema kernels producer consumer consumer/store
LIB_SRCS := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)
CU_SRCS  := $(if $(NVCC),$(wildcard kernels/*.cu))
CU_OBJS  := $(CU_SRCS:%.cu=$(BUILD)/obj/%.cu.o)

BROKER_SRCS := $(wildcard broker/*.c)
CLI_SRCS    := $(wildcard cli/*.c)
PROGS := $(if $(BROKER_SRCS),$(BUILD)/deltacast-broker) $(if $(CLI_SRCS),$(BUILD)/deltacast)

TEST_SRCS := $(wildcard tests/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
TOOL_SRCS := $(wildcard tests/tools/*.c)
TOOL_BINS := $(TOOL_SRCS:tests/tools/%.c=$(BUILD)/tools/%)
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
# Test support (tests/support/*.c), compiled once and linked by every test and tool.
SUPPORT_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/support/*.c))

LIBA  := $(BUILD)/libdeltacast.a
LIBSO := $(BUILD)/libdeltacast.so
# One version for the library, deltacast.pc and the Python package.
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' python/deltacast/_version.py)
SOMAJOR := $(firstword $(subst ., ,$(VERSION)))
SONAME  := libdeltacast.so.$(SOMAJOR)

.PRECIOUS: $(BUILD)/obj/%.o $(BUILD)/obj/tests/%.o $(BUILD)/obj/tests/tools/%.o $(BUILD)/obj/tests/support/%.o
.PHONY: all deps test test-gpu fuzz install uninstall clean vectors
all: $(LIBA) $(LIBSO) $(PROGS)

deps:
	@scripts/deps.sh

# Objects depend on a stamp of the flags, so switching CUDA=0/1 rebuilds them.
FLAGS_STAMP := $(BUILD)/.flags-$(shell echo '$(CC) $(CFLAGS) $(NVCC)' | md5sum | cut -c1-12)
$(FLAGS_STAMP):
	@mkdir -p $(@D) && rm -f $(BUILD)/.flags-* && touch $@

$(BUILD)/obj/%.o: %.c $(FLAGS_STAMP) | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(DEP_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu $(FLAGS_STAMP) | deps
	@mkdir -p $(@D)
	$(NVCC) -O3 -std=c++17 $(NVCC_ARCH) -Iinclude -Ikernels -Icommon -Xcompiler -fPIC,-fvisibility=hidden \
		-DDCAST_HAVE_CUDA=1 -MMD -MP -c $< -o $@

$(LIBA): $(LIB_OBJS) $(CU_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(LIBSO): $(LIB_OBJS) $(CU_OBJS) Makefile scripts/libdeltacast.map
	$(CC) -shared $(SANFLAGS) -Wl,-soname,$(SONAME) -Wl,--version-script=scripts/libdeltacast.map \
		-o $@ $(filter %.o,$^) $(LDLIBS)

# `--version` of both programs prints VERSION (rebuilt when it changes).
VERSION_MAINS := $(BUILD)/obj/cli/main.o $(BUILD)/obj/broker/main.o
$(VERSION_MAINS): CFLAGS += -DDCAST_PACKAGE_VERSION='"$(VERSION)"'
$(VERSION_MAINS): python/deltacast/_version.py

$(BUILD)/deltacast-broker: $(BROKER_SRCS:%.c=$(BUILD)/obj/%.o) $(LIBA)
	$(CC) $(SANFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/deltacast: $(CLI_SRCS:%.c=$(BUILD)/obj/%.o) $(LIBA)
	$(CC) $(SANFLAGS) -o $@ $^ $(LDLIBS)

# The broker embedded in a test (everything but main.o): two brokers in one process.
BROKER_EMBED_OBJS := $(filter-out $(BUILD)/obj/broker/main.o,$(BROKER_SRCS:%.c=$(BUILD)/obj/%.o))
$(BUILD)/tests/test_broker_inproc: $(BUILD)/obj/tests/test_broker_inproc.o $(BROKER_EMBED_OBJS) $(SUPPORT_OBJS) $(LIBA)
	@mkdir -p $(@D)
	$(CC) $(SANFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(SUPPORT_OBJS) $(LIBA)
	@mkdir -p $(@D)
	$(CC) $(SANFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tools/%: $(BUILD)/obj/tests/tools/%.o $(SUPPORT_OBJS) $(LIBA)
	@mkdir -p $(@D)
	$(CC) $(SANFLAGS) -o $@ $^ $(LDLIBS)

# `make test` runs every tests/test_* (C executables, .sh and .py scripts).
test: all $(TEST_BINS) $(TOOL_BINS)
	@BUILD=$(BUILD) PYTHON=$(PYTHON) tests/run.sh $(T)

# `make test-valgrind [T=NAME]`: the C tests under valgrind's memcheck (not
# in `make test`: 20-50x slower); an invalid access or a definite leak fails
# the test (tests/valgrind.supp: libzmq's own, as LSan's suppression in
# tests/support/proc.c).  Not with SAN=1: ASan and valgrind exclude each other.
VALGRIND_FLAGS = -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
	--suppressions=tests/valgrind.supp
.PHONY: test-valgrind
test-valgrind: all $(TEST_BINS) $(TOOL_BINS)
	@[ "$(SAN)" != 1 ] || { echo "test-valgrind: not with SAN=1 (ASan and valgrind exclude each other)"; exit 2; }
	@scripts/deps.sh valgrind
	@BUILD=$(BUILD) PYTHON=$(PYTHON) TEST_TIMEOUT=$${TEST_TIMEOUT:-1800} \
		TEST_WRAP="valgrind $(VALGRIND_FLAGS)" tests/run.sh $(T)

test-gpu: all $(TEST_BINS)
	@BUILD=$(BUILD) PYTHON=$(PYTHON) tests/run.sh gpu

# Regenerate schema/vectors from the C encoder (the committed files are the contract).
vectors: $(BUILD)/tools/gen_vectors
	$(BUILD)/tools/gen_vectors schema/vectors

# libFuzzer targets, built with clang from the library's C sources.
FUZZ_CC ?= clang
FUZZ_FLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Icommon -Ischema -Ikernels \
	-Iproducer -Iconsumer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
$(BUILD)/fuzz/%: tests/fuzz/%.c $(LIB_SRCS) | deps
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< $(LIB_SRCS) $(DEP_LIBS) -lm -lpthread

fuzz: $(FUZZ_SRCS:tests/fuzz/%.c=$(BUILD)/fuzz/%)
	@for f in $^; do n=$$(basename $$f); mkdir -p $(BUILD)/fuzz/corpus-$$n; \
	  echo "fuzz: $$n for $(FUZZ_SECONDS)s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -print_final_stats=1 \
	    $(BUILD)/fuzz/corpus-$$n tests/fuzz/seeds/$$n 2>&1 | tail -n 12 || exit 1; done

# `make install [PREFIX=/usr/local] [DESTDIR=...]`: headers, libdeltacast.a,
# libdeltacast.so.VERSION with its SONAME link .so.MAJOR and the .so link,
# the programs, deltacast.pc, and the Python package into the interpreter's
# directory for PREFIX (scripts/pysite.py; PYSITE=DIR overrides), which
# records LIBDIR so that `import deltacast` needs no environment.  Under a
# prefix the loader does not search, deltacast.pc adds an rpath.
LIBDIR ?= $(PREFIX)/lib
PYSITE ?= $(shell $(PYTHON) scripts/pysite.py $(PREFIX))
SYSTEM_LIBDIRS := /usr/lib /usr/local/lib
PC_RPATH = $(if $(filter $(SYSTEM_LIBDIRS),$(LIBDIR)),,-Wl,-rpath,$${libdir})
install: all
	install -d $(DESTDIR)$(PREFIX)/include/deltacast $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/deltacast/*.h $(DESTDIR)$(PREFIX)/include/deltacast/
	install -m 644 $(LIBA) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(LIBSO) $(DESTDIR)$(LIBDIR)/libdeltacast.so.$(VERSION)
	ln -sf libdeltacast.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libdeltacast.so
	$(if $(PROGS),install -m 755 $(PROGS) $(DESTDIR)$(PREFIX)/bin/)
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@VERSION@|$(VERSION)|' \
		-e 's|@RPATH@|$(PC_RPATH)|' \
		-e 's|@LIBS@|$(DEP_LIBS) $(CUDA_LIBS) -lm -lpthread|' \
		scripts/deltacast.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/deltacast.pc
	install -d $(DESTDIR)$(PYSITE)/deltacast
	install -m 644 python/deltacast/*.py python/deltacast/py.typed $(DESTDIR)$(PYSITE)/deltacast/
	printf '"""Written by make install."""\nLIBDIR = "%s"\n' '$(LIBDIR)' \
		> $(DESTDIR)$(PYSITE)/deltacast/_install.py
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then \
		ldconfig; fi

# Removes what `make install` put under the same PREFIX / DESTDIR / PYSITE.
uninstall:
	rm -rf $(DESTDIR)$(PREFIX)/include/deltacast $(DESTDIR)$(PYSITE)/deltacast
	rm -f $(DESTDIR)$(LIBDIR)/libdeltacast.a $(DESTDIR)$(LIBDIR)/libdeltacast.so \
		$(DESTDIR)$(LIBDIR)/$(SONAME) $(DESTDIR)$(LIBDIR)/libdeltacast.so.$(VERSION) \
		$(DESTDIR)$(LIBDIR)/pkgconfig/deltacast.pc \
		$(DESTDIR)$(PREFIX)/bin/deltacast $(DESTDIR)$(PREFIX)/bin/deltacast-broker

clean:
	rm -rf build build-san

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# --- codec benchmarks ---
.PHONY: bench-codec bench-gpu
# Sizes and CPU speed of the codec on RL-like bf16 updates; rewrites the
# bench-codec section of docs/benchmarks.md.  BENCH_CODEC_QUICK=1: 8M
# elements (8 chunks), best of 3.
BENCH_CODEC_QUICK ?= 0
BENCH_CODEC_ARGS ?= $(if $(filter 1,$(BENCH_CODEC_QUICK)),--elems 8388608 --reps 3,)
bench-codec: $(BUILD)/tools/bench_codec
	$(BUILD)/tools/bench_codec $(BENCH_CODEC_ARGS) --write docs/benchmarks.md

# GPU encode/apply/digest throughput against a device-to-device copy, then
# the producer's device encode range by range against all ranges in one
# call (bench_gpu_ranges), then the device path on a 7B-shaped model
# (bench_gpu_model: encode, decode-ahead, the pause; its last line
# `gpu_pause_gbps P decode_ahead_gbps D encode_gbps E copy_gbps C`); says
# "skip: no CUDA device" (exit 77 from the
# tools) where there is none.
bench-gpu: $(BUILD)/tools/bench_gpu_codec $(BUILD)/tools/bench_gpu_ranges $(BUILD)/tools/bench_gpu_model
	@$(BUILD)/tools/bench_gpu_codec; rc=$$?; [ $$rc = 77 ] || exit $$rc
	@$(BUILD)/tools/bench_gpu_ranges; rc=$$?; [ $$rc = 77 ] || exit $$rc
	@$(BUILD)/tools/bench_gpu_model; rc=$$?; [ $$rc = 77 ] || exit $$rc

# --- producer ---
# `make bench-slices`: a consumer's apply of a 1% delta with tensor-parallel
# slices bound (views) against an untiled tensor bound whole, into
# docs/benchmarks.md (BENCH_SLICES_QUICK=1: small, print only).
.PHONY: bench-slices
bench-slices: all
	DELTACAST_BUILD=$(BUILD) $(PYTHON) scripts/bench_slices.py

# `make bench-producer`: publish time of a 1%-density gen-trace version vs one
# memcpy of the model, and wire bytes vs model bytes, into docs/benchmarks.md.
BENCH_PRODUCER_PARAMS ?= 100M
.PHONY: bench-producer
bench-producer: all $(BUILD)/tools/bench_producer
	@[ -f $(BUILD)/bench-producer-$(BENCH_PRODUCER_PARAMS)/v0001.safetensors ] || \
	  $(BUILD)/deltacast gen-trace --params $(BENCH_PRODUCER_PARAMS) --steps 1 --density 0.01 \
	    -o $(BUILD)/bench-producer-$(BENCH_PRODUCER_PARAMS)
	DELTACAST_BUILD=$(BUILD) $(BUILD)/tools/bench_producer \
	  --trace $(BUILD)/bench-producer-$(BENCH_PRODUCER_PARAMS) --rounds 21 --doc docs/benchmarks.md \
	  --cmd "make bench-producer BENCH_PRODUCER_PARAMS=$(BENCH_PRODUCER_PARAMS)"

# `make bench-publish`: how long publish() of a host anchor (BENCH_PUBLISH_MB
# MiB) keeps the trainer, against one memcpy of the same bytes; prints
# publish_over_memcpy (the table is in docs/benchmarks.md, "Producer").
BENCH_PUBLISH_MB ?= 256
.PHONY: bench-publish
bench-publish: all $(BUILD)/tools/bench_publish
	DELTACAST_BUILD=$(BUILD) $(BUILD)/tools/bench_publish --mb $(BENCH_PUBLISH_MB)

# --- consumer ---
# `make bench-consumer`: staging throughput vs memcpy into the pinned pool,
# apply time of a 1%-density version vs its end-to-end receive time, and
# record-log writes vs dd, against the real broker and producer; the table
# goes into docs/benchmarks.md between the bench-consumer markers.
BENCH_CONSUMER_MB ?= 128
.PHONY: bench-consumer
bench-consumer: all $(BUILD)/tools/bench_consumer
	DELTACAST_BUILD=$(abspath $(BUILD)) $(BUILD)/tools/bench_consumer $(BENCH_CONSUMER_MB) > $(BUILD)/bench-consumer.md
	@cat $(BUILD)/bench-consumer.md
	@$(PYTHON) -c 'import sys; d, t = sys.argv[1], open(sys.argv[2]).read(); \
	  b, e = "<!-- bench-consumer:begin -->", "<!-- bench-consumer:end -->"; s = open(d).read(); \
	  import os, subprocess, time; rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(); \
	  host = "%d CPUs, load average %s" % (os.cpu_count(), open("/proc/loadavg").read().split()[0]); \
	  body = b + "\n`make bench-consumer BENCH_CONSUMER_MB=$(BENCH_CONSUMER_MB)` (%s; tree at %s, %s):\n\n" % (host, rev, time.strftime("%Y-%m-%d", time.gmtime())) + t + e; \
	  s = s[:s.index(b)] + body + s[s.index(e) + len(e):] if b in s else s + "\n## Consumer\n\n" + body + "\n"; \
	  open(d, "w").write(s)' docs/benchmarks.md $(BUILD)/bench-consumer.md

# --- e2e ---
# `make demo`: the whole system on loopback (scripts/demo.sh): broker, a
# gen-trace model (DEMO_PARAMS, default 300M), a producer, 4 consumers (one
# late, one killed and restarted), live progress, summary, equality check.
# `make test-faults`: the fault-injection suite (scripts/faults.sh): SEEDS
# trials (default 5), or SEED=N for exactly one.
E2E_TOOLS = $(BUILD)/tools/fault_digest $(BUILD)/tools/fault_consumer \
	$(BUILD)/tools/fault_publish $(BUILD)/tools/faultproxy
SEEDS ?= 5
.PHONY: demo test-faults
demo: all $(E2E_TOOLS)
	@DELTACAST_BUILD=$(abspath $(BUILD)) PYTHON=$(PYTHON) scripts/demo.sh
test-faults: all $(E2E_TOOLS)
	@DELTACAST_BUILD=$(abspath $(BUILD)) PYTHON=$(PYTHON) SEEDS=$(SEEDS) scripts/faults.sh
# `make bench`: deltacast deltas vs full anchors vs HTTP (nginx), Redis
# pub/sub, a shared-filesystem reload and raw TCP loopback, time to every
# consumer (scripts/bench_e2e.sh; BENCH_PARAMS, BENCH_CONSUMERS, BENCH_ROWS,
# BENCH_REPEATS);
# installs nginx/redis/matplotlib if missing; rewrites the bench-e2e section
# of docs/benchmarks.md and docs/plots/bench_e2e_*.png.
.PHONY: bench
bench: all $(BUILD)/tools/bench_tcp $(BUILD)/tools/bench_redis $(BUILD)/tools/bench_fs \
	$(BUILD)/tools/fault_publish
	@scripts/deps.sh bench
	@DELTACAST_BUILD=$(abspath $(BUILD)) PYTHON=$(PYTHON) scripts/bench_e2e.sh

# --- cluster ---
# `make bench-cluster`: deltacast deltas (star and a relay tree), full
# anchors and whole-model HTTP (nginx + curl) to N = 8 16 32 64 workers, each
# in its own network namespace behind tbf-shaped links (root only;
# scripts/bench_cluster.sh), and an equal-rate 3-level tree of 64 workers,
# store and forward against --cut-through (BENCH_CLUSTER_ROWS=tree3 alone;
# BENCH_CLUSTER_QUICK=1: a small run, print only); rewrites the
# bench-cluster sections of docs/benchmarks.md and docs/plots/bench_cluster_*.png.
.PHONY: bench-cluster
# The peer row's tool (XOR + zstd per tensor), built only here: libzstd is a
# bench dependency (scripts/deps.sh bench), not a build one.
$(BUILD)/peers/xor_zstd: tests/peers/xor_zstd.c $(LIBA)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $^ -lzstd $(LDLIBS)
bench-cluster: all $(BUILD)/tools/fault_publish $(BUILD)/tools/fault_digest
	@scripts/deps.sh bench
	@$(MAKE) --no-print-directory $(BUILD)/peers/xor_zstd
	@DELTACAST_BUILD=$(abspath $(BUILD)) PYTHON=$(PYTHON) nice -n 10 scripts/bench_cluster.sh

# --- live broker fuzzing ---
# `make fuzz-broker`: tests/tools/fuzz_broker drives a real broker with
# mutated producer and consumer conversations for FUZZ_BROKER_SECONDS
# (default 600), niced, seed FUZZ_BROKER_SEED (default: the clock); it
# prints inputs tried, crashes and max VmRSS, and on a failure the seed and
# batch that replay it.  FUZZ_BROKER_BULK=1: the broker with --bulk, and
# hostile connections to its bulk port and unix socket too;
# FUZZ_BROKER_METRICS=1: with --metrics, and hostile clients of that port;
# FUZZ_BROKER_CURVE=1 (not with FUZZ_BROKER_BULK=1): with CURVE and key
# lists, each fuzzed connection drawing a key, listed or not, and hostile
# ZMTP greetings and CURVE handshakes on both ZeroMQ ports.
# docs/reliability.md has the figures of past runs.
FUZZ_BROKER_SECONDS ?= 600
FUZZ_BROKER_SEED ?= $(shell date +%s)
FUZZ_BROKER_BULK ?= 0
FUZZ_BROKER_METRICS ?= 0
FUZZ_BROKER_CURVE ?= 0
.PHONY: fuzz-broker
fuzz-broker: all $(BUILD)/tools/fuzz_broker $(BUILD)/tools/wire_client
	DELTACAST_BUILD=$(abspath $(BUILD)) nice -n 10 $(BUILD)/tools/fuzz_broker \
	  --seed $(FUZZ_BROKER_SEED) --seconds $(FUZZ_BROKER_SECONDS) --bulk $(FUZZ_BROKER_BULK) \
	  --metrics $(FUZZ_BROKER_METRICS) --curve $(FUZZ_BROKER_CURVE)

# `make fuzz-consumer`: tests/tools/fuzz_consumer serves a real consumer
# from a broker that lies (damaged, dropped, repeated and reordered
# messages, forged fields) for FUZZ_CONSUMER_SECONDS (default 600), seed
# FUZZ_CONSUMER_SEED (default: the clock); every applied version is checked
# bit for bit, and after each round the consumer, opened again and served
# cleanly, must reach the newest version.
# FUZZ_CONSUMER_BULK=1: anchors over a bulk connection too, damaged as well.
# FUZZ_CONSUMER_RELAY=N (1-4): the lying broker is the upstream of a chain
# of N real relays, and the consumer joins the last (each relay must stay
# up and exit 0); FUZZ_CONSUMER_CURVE=1 (with it): the first relay a CURVE
# client of the lying broker, now and then with a wrong server key.
FUZZ_CONSUMER_SECONDS ?= 600
FUZZ_CONSUMER_SEED ?= $(shell date +%s)
FUZZ_CONSUMER_BULK ?= 0
FUZZ_CONSUMER_RELAY ?= 0
FUZZ_CONSUMER_CURVE ?= 0
.PHONY: fuzz-consumer
fuzz-consumer: all $(BUILD)/tools/fuzz_consumer
	DELTACAST_BUILD=$(abspath $(BUILD)) nice -n 10 $(BUILD)/tools/fuzz_consumer --seed $(FUZZ_CONSUMER_SEED) \
	  --seconds $(FUZZ_CONSUMER_SECONDS) --bulk $(FUZZ_CONSUMER_BULK) --relay $(FUZZ_CONSUMER_RELAY) \
	  --curve $(FUZZ_CONSUMER_CURVE)

# `make fuzz-producer`: tests/tools/fuzz_producer publishes from a real
# producer through a proxy that lies to it about what a real broker says
# (ACKs, CREDIT, WELCOMEs, ERRORs, HEARTBEATs dropped, repeated, changed or
# made up) for FUZZ_PRODUCER_SECONDS (default 600), seed FUZZ_PRODUCER_SEED
# (default: the clock); each round the producer, once the proxy is honest,
# must have a version taken, and a fresh consumer must reach it bit-exact.
# FUZZ_PRODUCER_PARTS=P (1-4): the model published by P parts at once.
FUZZ_PRODUCER_SECONDS ?= 600
FUZZ_PRODUCER_SEED ?= $(shell date +%s)
FUZZ_PRODUCER_PARTS ?= 1
.PHONY: fuzz-producer
fuzz-producer: all $(BUILD)/tools/fuzz_producer
	DELTACAST_BUILD=$(abspath $(BUILD)) nice -n 10 $(BUILD)/tools/fuzz_producer \
	  --seed $(FUZZ_PRODUCER_SEED) --seconds $(FUZZ_PRODUCER_SECONDS) --parts $(FUZZ_PRODUCER_PARTS)

# --- bench-sync ---
# `make bench-sync`: a 1% delta of a BENCH_SYNC_PARAMS bf16 model to N = 1, 4,
# 8 consumers (the library in C and Python, `deltacast subscribe`, and on a
# host with a CUDA device the device form: the producer's and consumers'
# tensors in CUDA memory), against
# raw TCP of the delta's bytes and of the whole model, and the codec's
# compute floor; bytes hashed and written per version; the sync targets
# (scripts/bench_sync.sh).  Rewrites the bench-sync section of
# docs/benchmarks.md.  BENCH_SYNC_QUICK=1: a 10M model, N = 1, 4, print only.
# More knobs in the script's header (BENCH_SYNC_SUBSCRIBE_ARGS, ...).
BENCH_SYNC_QUICK ?= 0
BENCH_SYNC_PARAMS ?= $(if $(filter 1,$(BENCH_SYNC_QUICK)),10M,100M)
.PHONY: bench-sync
bench-sync: all $(BUILD)/tools/bench_tcp $(BUILD)/tools/bench_sync_floor \
	$(BUILD)/tools/fault_publish $(BUILD)/tools/bench_sync_consumer
	@DELTACAST_BUILD=$(abspath $(BUILD)) PYTHON=$(PYTHON) BENCH_SYNC_QUICK=$(BENCH_SYNC_QUICK) \
	  BENCH_SYNC_PARAMS=$(BENCH_SYNC_PARAMS) scripts/bench_sync.sh

# --- bench-scale ---
# `make bench-scale`: a BENCH_SCALE_PARAMS (default 1B) bf16 model through a
# broker with --data-dir to 2 workers; a restarted producer's version;
# each version's time to both workers, each process's peak RSS and each
# worker directory's peak on disk over the model (scripts/bench_scale.sh).
# Rewrites the bench-scale section of docs/benchmarks.md (BENCH_SCALE_DOC=0:
# print only).
BENCH_SCALE_PARAMS ?= 1B
.PHONY: bench-scale
bench-scale: all $(BUILD)/tools/fault_publish
	@DELTACAST_BUILD=$(abspath $(BUILD)) PYTHON=$(PYTHON) BENCH_SCALE_PARAMS=$(BENCH_SCALE_PARAMS) \
	  scripts/bench_scale.sh

# --- bench-fanout ---
# `make bench-fanout`: an anchor (the whole BENCH_FANOUT_PARAMS bf16 model) to
# N = 1, 4, 16 receivers over loopback, side by side in one run: raw TCP,
# nginx + curl, the broker to consumers that only receive, the broker to
# library consumers until READY, and the broker's VmRSS, and each cell's
# receivers' and sender's CPU per GB; medians of 3, the targets, a last line
# `intake_cpu_over_tcp R broker_cpu_over_nginx S fanout_over_raw_tcp_n1 T`
# (scripts/bench_fanout.sh; installs nginx if missing).  Rewrites the
# bench-fanout section of docs/benchmarks.md.  BENCH_FANOUT_QUICK=1: a 10M
# model, N = 1, 4, print only.  More knobs in the script's header.
BENCH_FANOUT_QUICK ?= 0
BENCH_FANOUT_PARAMS ?= $(if $(filter 1,$(BENCH_FANOUT_QUICK)),10M,100M)
.PHONY: bench-fanout
bench-fanout: all $(BUILD)/tools/bench_tcp $(BUILD)/tools/fault_publish \
	$(BUILD)/tools/bench_sync_consumer $(BUILD)/tools/wire_client
	@scripts/deps.sh bench
	@DELTACAST_BUILD=$(abspath $(BUILD)) PYTHON=$(PYTHON) BENCH_FANOUT_QUICK=$(BENCH_FANOUT_QUICK) \
	  BENCH_FANOUT_PARAMS=$(BENCH_FANOUT_PARAMS) nice -n 10 scripts/bench_fanout.sh
