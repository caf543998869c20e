"""ember's benchmark suite: workloads x systems, measured in one run.

* ``workloads``: what is run (transformers models built from configs with random
  weights, an MLP, GEMMs), each as one module plus a driver;
* ``systems``: who runs it (PyTorch eager, Inductor, zentorch, ONNX Runtime, OpenVINO,
  ember), a registry where a system is one function;
* ``harness``: preparation, correctness check against CPU eager, interleaved
  timing, memory;
* ``peak``: the machine's physical limit (clock, FMA width, best GEMM, memory read
  bandwidth);
* ``report``: BENCHMARKS.md, JSON and plots.

``benchmarks/run_suite.py`` is the command line.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # random weights: never reach the hub
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
