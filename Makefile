# The two commands that matter: `make demo` and `make test`. Both set up
# everything they need (see scripts/setup.sh).
PY := .venv/bin/python

.PHONY: setup build demo test test-cpp test-py bench-overhead lint format clean

setup build:
	@scripts/setup.sh

demo: setup
	$(PY) -m torch_ember.demo

test: setup
	cd build && ctest --output-on-failure
	EMBER_DEVICES=2 $(PY) -m pytest -q tests

test-cpp: setup
	cd build && ctest --output-on-failure

test-py: setup
	EMBER_DEVICES=2 $(PY) -m pytest -q tests

bench-overhead: setup
	$(PY) benchmarks/op_overhead.py

lint:
	$(PY) -m ruff check torch_ember tests benchmarks
	clang-format --dry-run --Werror $$(git ls-files '*.cpp' '*.h')

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')
	$(PY) -m ruff format torch_ember tests benchmarks

clean:
	rm -rf build torch_ember/*.so
