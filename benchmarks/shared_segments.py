"""ember memory as memory files (zero-copy IPC) against anonymous private
memory, measured in one run, on the same build.

ember's allocator segments are memfd-backed (MAP_SHARED) so tensors cross
processes without a copy; torch_ember._C._set_shared_segments(device, False)
maps new segments as anonymous private memory instead (the fallback). Each
case runs under both settings, alternating sample by sample, and reports
medians and the ratio shared / private:

* ``matmul 4096``: ``a @ b`` of two 4096x4096 fp32 tensors, the result
  block reused from the cache (steady state);
* ``add 64 MiB``: ``x + y`` on 16M floats (steady state, memory bound);
* ``cold 64 MiB``: ``torch.empty(64 MiB).fill_(1)`` after ``empty_cache()``,
  so every call maps a fresh segment, faults its pages in and unmaps it:
  the cost the cache normally hides.

    python benchmarks/shared_segments.py [--samples N]
"""

import argparse
import statistics
import time

import torch

import torch_ember

MiB = 1 << 20


def _set_shared(shared: bool) -> None:
    torch.ember.empty_cache()  # cached segments of the other setting go
    torch_ember._C._set_shared_segments(0, shared)


def _time(fn, arg, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn(arg)
    return (time.perf_counter() - start) / number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=7)
    args = parser.parse_args()

    # Inputs of each setting live in that setting's segments.
    inputs = {}
    for shared in (True, False):
        _set_shared(shared)
        inputs[shared] = {
            "a": torch.randn(4096, 4096, device="ember"),
            "b": torch.randn(4096, 4096, device="ember"),
            "x": torch.randn(16 * MiB, device="ember"),
            "y": torch.randn(16 * MiB, device="ember"),
        }

    def cold():
        torch.empty(64 * MiB, dtype=torch.uint8, device="ember").fill_(1)
        torch.ember.empty_cache()

    cases = {
        "matmul 4096": (lambda t: t["a"] @ t["b"], 3),
        "add 64 MiB": (lambda t: t["x"] + t["y"], 10),
        "cold 64 MiB": (lambda t: cold(), 10),
    }
    print(f"{'case':<14} {'shared ms':>10} {'private ms':>11} {'shared/private':>15}")
    for name, (fn, number) in cases.items():
        samples = {True: [], False: []}
        for round_ in range(args.samples):
            for shared in (True, False) if round_ % 2 == 0 else (False, True):
                _set_shared(shared)
                tensors = inputs[shared]
                fn(tensors)  # warm: segments mapped (steady cases)
                samples[shared].append(_time(fn, tensors, number))
        shared_ms = statistics.median(samples[True]) * 1e3
        private_ms = statistics.median(samples[False]) * 1e3
        print(f"{name:<14} {shared_ms:>10.2f} {private_ms:>11.2f} {shared_ms / private_ms:>14.2f}x")
    _set_shared(True)


if __name__ == "__main__":
    main()
