# The two commands that matter: `make demo` and `make test`. Both set up
# everything they need (see scripts/setup.sh).
PY := .venv/bin/python
# pytest runs in this many processes (pytest-xdist), a test file per process
# at a time (module fixtures run once): on 2 cores the suite takes ~0.6x the
# time of one process, most of it spent in subprocesses and Python, not
# kernels. PYTEST_WORKERS=0 runs it in this process (pdb, -x).
PYTEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

.PHONY: setup build demo test test-cpp test-py test-async test-sync bench-overhead lint format clean

setup build:
	@scripts/setup.sh

demo: setup
	$(PY) -m torch_ember.demo

test: setup
	cd build && ctest --output-on-failure
	EMBER_DEVICES=2 $(PYTEST) tests

test-cpp: setup
	cd build && ctest --output-on-failure

test-py: setup
	EMBER_DEVICES=2 $(PYTEST) tests

# The whole pytest suite with asynchronous execution forced on (the default
# from 2 cores, so CI runs it that way; this also covers 1-core machines) or
# forced off (the synchronous engine, every op at its call). Not in CI (time).
test-async: setup
	EMBER_ASYNC=1 EMBER_DEVICES=2 $(PYTEST) tests

test-sync: setup
	EMBER_ASYNC=0 EMBER_DEVICES=2 $(PYTEST) tests

bench-overhead: setup
	$(PY) benchmarks/op_overhead.py

lint:
	$(PY) -m ruff check torch_ember tests benchmarks
	@command -v clang-format >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-format >/dev/null
	clang-format --dry-run --Werror $$(git ls-files '*.cpp' '*.h')

format:
	@command -v clang-format >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-format >/dev/null
	clang-format -i $$(git ls-files '*.cpp' '*.h')
	$(PY) -m ruff format torch_ember tests benchmarks

clean:
	rm -rf build torch_ember/*.so

# --------------------------------------------------------------------------
# Benchmark suite (issue 3): ember against PyTorch eager, Inductor, ONNX
# Runtime and OpenVINO, in one run. Writes BENCHMARKS.md and docs/bench/.
#   make bench            full suite (~30-40 min on 2 cores)
#   make bench QUICK=1    reduced set (< 10 min)
#   make bench-deps       installs requirements-bench.txt (exact pins) into .venv
# BENCH_ARGS passes extra options, e.g. BENCH_ARGS="--threads 1 --workloads mlp-b1".
.PHONY: bench bench-deps

BENCH_FLAGS := $(if $(filter 1 yes true,$(QUICK)),--quick,) $(BENCH_ARGS)

bench-deps: setup
	@req_hash=$$(sha256sum requirements-bench.txt | cut -c1-16); \
	if [ ! -f .venv/.bench-$$req_hash ]; then \
	  echo "[bench-deps] installing requirements-bench.txt"; \
	  $(PY) -m pip install -q -r requirements-bench.txt && \
	  rm -f .venv/.bench-* && touch .venv/.bench-$$req_hash; \
	fi
	@$(PY) -c "import torch, sys; v = torch.__version__; \
	  sys.exit(0 if v == '2.13.0+cpu' else 'torch changed to ' + v + ': reinstall requirements-dev.txt')"

bench: bench-deps
	BENCH_COMMAND="make bench$(if $(filter 1 yes true,$(QUICK)), QUICK=1,)$(if $(BENCH_ARGS), BENCH_ARGS=\"$(BENCH_ARGS)\",)" \
	  $(PY) benchmarks/run_suite.py $(BENCH_FLAGS)

# --------------------------------------------------------------------------
# Conformance kit (issue 4): PyTorch's OpInfo and ModuleInfo databases run on
# ember and on CPU. Two sweeps, one after the other:
#   parity   ember with torch.backends.ember.cpu_parity on (EMBER_CPU_PARITY=1),
#            compared bitwise; results in build/conformance/parity/, report in
#            docs/conformance.md
#   default  ember's own kernels, values compared with OpInfo's per-dtype
#            tolerances (structure exactly); results in build/conformance/default/,
#            report in docs/conformance-default.md (also: which tasks pass only
#            with tolerance, and where the two sweeps disagree)
# Not part of CI: `make test` runs only the fast subset (tests/test_conformance.py).
#   make conformance        both full sweeps: forward, backward, modules (~14k tasks
#                           each, ~4-9 min each on 2 cores); resumable (results of
#                           another build, kit version or mode run again)
#   make conformance CONFORMANCE_MODES=default               one sweep only
#   make conformance CONFORMANCE_ARGS="--fresh"              start over
#   make conformance CONFORMANCE_ARGS="--rerun failed"       rerun the failures
#   make conformance CONFORMANCE_ARGS="--kind forward --ops 'linalg.*'"
# A filtered run writes a report of what it selected. Options:
# `python -m torch_ember.conformance --help` (--mode picks the sweep there).
.PHONY: conformance

CONFORMANCE_ARGS ?=
CONFORMANCE_MODES ?= parity default

conformance: setup
	@set -e; for mode in $(CONFORMANCE_MODES); do \
	  case $$mode in parity) doc=docs/conformance.md;; *) doc=docs/conformance-$$mode.md;; esac; \
	  echo "[conformance] $$mode sweep -> $$doc"; \
	  $(PY) -m torch_ember.conformance --mode $$mode --doc $$doc $(CONFORMANCE_ARGS); \
	done

# torch.backends.ember switches: what each mode costs and buys (benchmarks/flags.py).
.PHONY: bench-flags
bench-flags: setup
	$(PY) benchmarks/flags.py

# --------------------------------------------------------------------------
# Guard profiler (issues 6, 15): guard time per call (per token for decode)
# before and after torch_ember.guards.optimize on a module-heavy model, BERT,
# ViT and GPT-2 decode (target: >= 50% less, identical outputs/tokens); whole
# call compared interleaved. Writes docs/bench/guards.md.
#   make bench-guards
# Options: `python benchmarks/guards.py --help` (e.g. --device ember, --models bert).
.PHONY: bench-guards

bench-guards: setup
	$(PY) benchmarks/guards.py --markdown docs/bench/guards.md

# --------------------------------------------------------------------------
# Per-op time breakdown: every suite workload on ember under torch.profiler,
# default mode and cpu_parity mode side by side (benchmarks/op_breakdown.py).
#   make bench-breakdown
#   make bench-breakdown BREAKDOWN_ARGS="--workloads gpt2-decode --runs 10"
# Writes docs/bench/op_breakdown.md and docs/bench/op_breakdown.json.
.PHONY: bench-breakdown

BREAKDOWN_ARGS ?=

bench-breakdown: setup
	BENCH_COMMAND="make bench-breakdown$(if $(BREAKDOWN_ARGS), BREAKDOWN_ARGS=\"$(BREAKDOWN_ARGS)\",)" \
	  $(PY) benchmarks/op_breakdown.py $(BREAKDOWN_ARGS)

# Graph replay against eager (issue 12): mlp-b1 and GPT-2 small decode with a
# static KV cache, one replay per call/token, against CPU and ember eager (~2 min).
# Writes docs/bench/graphs.md.
# ResNet-50's convolution layers one by one: ember's route (and its time)
# against CPU eager NCHW, CPU channels-last and cpu_parity, rounds alternating
# the systems (~1 min). Writes docs/bench/conv_layers.md.
.PHONY: bench-conv

bench-conv: setup
	$(PY) benchmarks/conv_layers.py --out docs/bench/conv_layers.md

# Greedy decode across transformers' decoder architectures (Llama, Mistral,
# Qwen2, Gemma, Phi-3, GPT-NeoX, OPT, Falcon; small configs, random weights):
# ember eager against CPU eager in alternating rounds, and the queue waits per
# step by op (~3 min). Writes docs/bench/decoders.md.
.PHONY: bench-decoders

bench-decoders: setup
	$(PY) benchmarks/decoders.py --out docs/bench/decoders.md

# Serving throughput (issue 11): N BERT replicas on N devices that own their
# cores vs one device owning them all, one 1-core device and CPU; every
# configuration 3 times in rotating order, medians (~10 min on 2 cores).
.PHONY: bench-serving

bench-serving: bench-deps
	BENCH_COMMAND="make bench-serving" $(PY) benchmarks/serving.py --out docs/bench/serving.md --plot docs/bench/serving.png
	BENCH_COMMAND="make bench-serving" $(PY) benchmarks/serving.py --graphs --out docs/bench/serving_graphs.md --plot docs/bench/serving_graphs.png

.PHONY: bench-graphs

bench-graphs: bench-deps
	BENCH_COMMAND="make bench-graphs" $(PY) benchmarks/graphs.py

# Transformer-shaped fp32 GEMMs (issue 10: M=128..1024, K,N=768..3072),
# ember against ONNX Runtime, OpenVINO and zentorch in one run (~5 min).
#   make bench-gemm-shapes
#   make bench-gemm-shapes GEMM_SHAPES_ARGS="--shapes linear-128x768x2304"
# Writes docs/bench/gemm_shapes.md and docs/bench/gemm_shapes.json.
.PHONY: bench-gemm-shapes

GEMM_SHAPES_ARGS ?=

bench-gemm-shapes: bench-deps
	BENCH_COMMAND="make bench-gemm-shapes$(if $(GEMM_SHAPES_ARGS), GEMM_SHAPES_ARGS=\"$(GEMM_SHAPES_ARGS)\",)" \
	  $(PY) benchmarks/gemm_shapes.py $(GEMM_SHAPES_ARGS)

# --------------------------------------------------------------------------
# Random-program fuzzer (issue 14): seeded op sequences (views, in-place,
# out=, broadcasting, promotion, non-contiguous and zero-size tensors,
# autograd) on ember and on CPU; bitwise with cpu_parity (parity mode),
# OpInfo tolerances otherwise (default mode). A difference is shrunk and
# written as a standalone reproducer to build/fuzz/. CI runs a fixed-seed
# slice (tests/test_fuzz.py).
#   make fuzz                                  10,000 programs per mode
#   make fuzz FUZZ_ARGS="--programs 500 --seed 7 --mode default"
.PHONY: fuzz

FUZZ_ARGS ?=

fuzz: setup
	EMBER_DEVICES=2 $(PY) -m torch_ember.fuzz --programs 10000 $(FUZZ_ARGS)

# --------------------------------------------------------------------------
# Sanitizers (issue 14). Each builds in its own directory; neither runs in CI
# (time). The allocator poisons free blocks and the slack behind every
# allocation for ASan, so overruns inside ember memory are reported.
#   make sanitize     ASan + UBSan (build/sanitize/): runtime GoogleTests, then
#                     the Python tests against the sanitized torch_ember._C
#   make sanitize SANITIZE_TESTS="tests/test_memory.py -x"
#   make tsan         ThreadSanitizer (build/tsan/): the runtime's GoogleTests
#                     (its concurrency and fork tests)
#   make tsan-stress  ThreadSanitizer build of torch_ember._C
#                     (build/tsan-python/): the engine's Python stress tests
#                     (8 threads x 2 devices x 2 streams, launched ops,
#                     events) with asynchronous execution on
#   make tsan-stress TSAN_TESTS="tests/test_engine.py -k stress"
.PHONY: sanitize tsan tsan-stress

SANITIZE_TESTS ?=

sanitize: setup
	scripts/sanitize.sh address $(SANITIZE_TESTS)

tsan: setup
	scripts/sanitize.sh thread

TSAN_TESTS ?=

tsan-stress: setup
	scripts/sanitize.sh thread-python $(TSAN_TESTS)
