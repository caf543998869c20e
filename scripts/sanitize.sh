#!/usr/bin/env bash
# make sanitize: ASan + UBSan build in build/sanitize/, then the runtime's
#   GoogleTests and the Python test suite against it.
# make tsan: ThreadSanitizer build of the runtime in build/tsan/, then its
#   GoogleTests (the concurrency tests: allocator and stream pool from many
#   threads, fork while other threads allocate).
# make tsan-stress: ThreadSanitizer build of torch_ember._C in
#   build/tsan-python/, then the engine's Python stress tests against it.
# Usage: scripts/sanitize.sh address|thread|thread-python [pytest arguments]
# SANITIZE_JOBS sets the build's parallelism (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=$ROOT/.venv/bin/python
JOBS=${SANITIZE_JOBS:-$(nproc)}
kind=${1:?usage: scripts/sanitize.sh address|thread|thread-python [pytest args]}
shift

configure() {  # build dir, flags, source dir
  local build=$1 flags=$2 source=$3
  if [ ! -f "$build/build.ninja" ]; then
    echo "[sanitize] configuring $build ($flags)"
    env TORCH_DEVICE_BACKEND_AUTOLOAD=0 cmake -S "$source" -B "$build" -G Ninja \
      -DEMBER_ROOT="$ROOT" -DPython3_EXECUTABLE="$PY" \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer" \
      -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" \
      -DCMAKE_MODULE_LINKER_FLAGS="$flags" \
      -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
  fi
  echo "[sanitize] building $build"
  env TORCH_DEVICE_BACKEND_AUTOLOAD=0 cmake --build "$build" -j"$JOBS"
}

# The package tree of a sanitized build: its _C plus links to every other
# file of torch_ember/.
package_tree() {
  local pkg=$1/python/torch_ember entry
  for entry in torch_ember/*; do
    case $entry in *.so) continue ;; esac
    ln -sfn "$ROOT/$entry" "$pkg/$(basename "$entry")"
  done
}

case $kind in
  address)
    BUILD=build/sanitize
    configure "$BUILD" "-fsanitize=address,undefined -fno-sanitize-recover=undefined" scripts/sanitize
    echo "[sanitize] runtime GoogleTests under ASan + UBSan"
    (cd "$BUILD" && ctest --output-on-failure)
    package_tree "$BUILD"
    echo "[sanitize] Python tests under ASan + UBSan (ember's code instrumented; torch is not)"
    # Python and torch are not instrumented: the runtime is preloaded, leaks
    # (Python's, at exit) are not reported.
    export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:halt_on_error=1:verify_asan_link_order=0}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    export PYTHONPATH="$ROOT/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
    # Never the source tree's (unsanitized) package through the current
    # directory, which `python -m` and `python -c` put first on sys.path.
    export PYTHONSAFEPATH=1
    # Tests of third-party runtimes (the benchmark's exporter systems) skip:
    # OpenVINO exits under the preloaded ASan runtime, and none runs ember code.
    export EMBER_SANITIZER=address
    EMBER_DEVICES=2 "$PY" -m pytest -q -p no:cacheprovider "${@:-tests}"
    ;;
  thread)
    BUILD=build/tsan
    # The runtime alone: Python and torch are not instrumented, and TSan
    # reports every access it cannot see as a race.
    configure "$BUILD" "-fsanitize=thread" runtime
    echo "[sanitize] runtime GoogleTests under TSan"
    (cd "$BUILD" && TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1} \
      EMBER_DEVICES=4 ./ember_runtime_tests)
    ;;
  thread-python)
    # The engine's Python stress tests (threads x devices x streams with
    # cross-stream events, launched ops, pinned uploads) against a
    # ThreadSanitizer build of torch_ember._C. Python and torch are not
    # instrumented: TSan checks the accesses ember's code makes and the
    # synchronisation it can see (pthread mutexes and condition variables,
    # atomics in ember's code). OpenMP is not instrumented either, so its
    # barriers would look like no synchronisation at all: kernels run on one
    # thread (OMP_NUM_THREADS=1); the engine's own threads (stream workers,
    # Python threads) are what this checks.
    BUILD=build/tsan-python
    configure "$BUILD" "-fsanitize=thread" scripts/sanitize
    package_tree "$BUILD"
    export LD_PRELOAD="$(gcc -print-file-name=libtsan.so)"
    # Data races are what this looks for. Mutex misuse reports are off: a
    # mutex that libtorch locks (uninstrumented) and inline code compiled
    # into ember unlocks (the dispatcher's registration handles, the
    # autograd engine's queues) looks like an unlock of an unlocked mutex.
    # Reports go to files as well (pytest hides a passing test's stderr);
    # the first one ends the run (exit status 66).
    REPORTS=$ROOT/$BUILD/reports
    rm -rf "$REPORTS" && mkdir -p "$REPORTS"
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:report_mutex_bugs=0:report_signal_unsafe=0:log_path=$REPORTS/tsan:suppressions=$ROOT/scripts/tsan-python.supp}
    export OMP_NUM_THREADS=1
    export PYTHONPATH="$ROOT/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONSAFEPATH=1
    export EMBER_SANITIZER=thread
    # TSan's shadow memory needs the classic address-space layout.
    # The fork tests are left out: TSan refuses to start threads in a child
    # forked from a multi-threaded process (it exits the child).
    if [ $# -eq 0 ]; then
      set -- tests/test_engine.py tests/test_streams.py tests/test_async_execution.py \
        tests/test_graphs.py tests/test_pinned.py -k "not fork"
    fi
    status=0
    EMBER_DEVICES=2 EMBER_ASYNC=1 setarch "$(uname -m)" -R "$PY" -m pytest -q -p no:cacheprovider "$@" ||
      status=$?
    if compgen -G "$REPORTS/tsan*" >/dev/null; then
      cat "$REPORTS"/tsan*
      echo "[sanitize] ThreadSanitizer reports above (also in $REPORTS)" >&2
      exit 1
    fi
    exit $status
    ;;
  *)
    echo "unknown sanitizer '$kind' (address, thread or thread-python)" >&2
    exit 2
    ;;
esac
