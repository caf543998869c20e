"""ResNet-50's convolution layers one by one: ember's route against CPU's.

The suite's ResNet-50 (``suite/workloads.py``, batch 1, 224x224) is run once
on CPU with forward hooks that record every distinct convolution (input
shape, weight shape, stride, padding). Each layer is then timed, in rounds
that alternate the systems so every figure of a row comes from the same
minutes:

* ``cpu``: PyTorch CPU eager on the NCHW input (the suite's reference);
* ``cpu-cl``: CPU eager with input and weight in channels-last;
* ``ember``: ember's default route (``async_execution=False``, so each call
  is timed whole); the route it took is read from ``verbose(1)`` output;
* ``ember-parity``: ``cpu_parity=True`` (CPU's kernel, bitwise).

    python benchmarks/conv_layers.py [--rounds 5] [--calls 20] [--out PATH] [--tiny]

``make bench-conv`` runs it. Writes a Markdown table (median ms per layer and
system, ember's GFLOP/s, ember / CPU) and prints it. Speed is judged by the
ratios of one run (the host is shared).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from suite import workloads
from suite.peak import cpu_model

import torch_ember  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("cpu", "cpu-cl", "ember", "ember-parity")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="rounds alternating the systems")
    p.add_argument("--calls", type=int, default=20, help="timed calls per system and round")
    p.add_argument("--out", type=Path, default=None, help="Markdown file to write")
    p.add_argument("--tiny", action="store_true", help="the toy ResNet (smoke test)")
    return p.parse_args(argv)


def conv_layers(tiny: bool) -> list[dict]:
    """Distinct convolutions of the suite's ResNet-50, in call order, with counts."""
    w = workloads.build("resnet50-b1", tiny=tiny)
    layers: dict[tuple, dict] = {}

    def record(module: torch.nn.Conv2d, inputs: tuple, _output: torch.Tensor) -> None:
        key = (tuple(inputs[0].shape), tuple(module.weight.shape), module.stride, module.padding)
        entry = layers.setdefault(key, {"module": module, "count": 0})
        entry["count"] += 1

    convs = [m for m in w.module.modules() if isinstance(m, torch.nn.Conv2d)]
    hooks = [m.register_forward_hook(record) for m in convs]
    with torch.inference_mode():
        w.module(*w.inputs)
    for h in hooks:
        h.remove()
    return [
        {
            "input": key[0],
            "weight": key[1],
            "stride": key[2],
            "padding": key[3],
            "count": v["count"],
            "dilation": v["module"].dilation,
            "groups": v["module"].groups,
        }
        for key, v in layers.items()
    ]


def _flops(layer: dict) -> int:
    n, _, h, w = layer["input"]
    co, ci, kh, kw = layer["weight"]
    (sh, sw), (ph, pw), (dh, dw) = layer["stride"], layer["padding"], layer["dilation"]
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return 2 * n * co * ci * kh * kw * oh * ow


def _route(call) -> str:
    """The route ember's verbose output names for one call (fd 2 captured)."""
    with tempfile.TemporaryFile(mode="w+") as log:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            with torch.backends.ember.verbose(1):
                call()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        lines = [ln for ln in log.read().splitlines() if "aten::convolution(" in ln]
    if not lines:
        return "?"
    words = lines[-1].split()
    return " ".join(words[-3:-2]) if len(words) >= 3 else "?"


def _median_ms(call, calls: int) -> float:
    times = []
    for _ in range(calls):
        begin = time.perf_counter()
        call()
        times.append(time.perf_counter() - begin)
    return statistics.median(times) * 1e3


def measure(layer: dict, rounds: int, calls: int) -> dict:
    # The tensors are made outside inference mode: ember packs no inference
    # tensor (it has no version counter), so its route would be CPU's. The
    # calls run under inference mode, as the suite's do.
    torch.manual_seed(0)
    x = torch.randn(layer["input"])
    weight = torch.randn(layer["weight"])
    kw = {
        "stride": layer["stride"],
        "padding": layer["padding"],
        "dilation": layer["dilation"],
        "groups": layer["groups"],
    }
    x_cl = x.contiguous(memory_format=torch.channels_last)
    w_cl = weight.contiguous(memory_format=torch.channels_last)
    xe, we = x.to("ember"), weight.to("ember")
    runs = {
        "cpu": lambda: F.conv2d(x, weight, **kw),
        "cpu-cl": lambda: F.conv2d(x_cl, w_cl, **kw),
        "ember": lambda: F.conv2d(xe, we, **kw),
        "ember-parity": lambda: F.conv2d(xe, we, **kw),
    }
    parity = {"ember-parity": True}
    samples: dict[str, list[float]] = {s: [] for s in SYSTEMS}
    with torch.inference_mode():
        for system in SYSTEMS:  # warm-up (ember packs a weight on its second call)
            with torch.backends.ember.flags(cpu_parity=parity.get(system, False)):
                for _ in range(3):
                    runs[system]()
        for _ in range(rounds):
            for system in SYSTEMS:
                with torch.backends.ember.flags(cpu_parity=parity.get(system, False)):
                    samples[system].append(_median_ms(runs[system], calls))
        result = {s: statistics.median(v) for s, v in samples.items()}
        result["route"] = _route(runs["ember"])
        got = runs["ember"]().cpu().double()
    expected = F.conv2d(x.double(), weight.double(), **kw)
    result["rel_err"] = float((got - expected).abs().max() / expected.abs().max())
    return result


FLOPS_NOTE = (
    "ember GFLOP/s: a direct convolution's FLOPs (2 x Cout x Cin x kh x kw per output) "
    "over ember's time. The winograd route does 16 of direct convolution's 36 multiplies "
    "per 2x2 outputs, so its figure can exceed the machine's peak."
)


def render(layers: list[dict], results: list[dict], args: argparse.Namespace) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cpu_name = cpu_model()
    out = [
        "# ResNet-50's convolution layers: ember's route against CPU's",
        "",
        (
            f"Generated {now} by `python benchmarks/conv_layers.py` on {cpu_name}, "
            f"{torch.get_num_threads()} threads, torch {torch.__version__}; "
            f"{args.rounds} rounds alternating the systems, median of {args.calls} calls each."
        ),
        "",
        (
            "| input | weight | stride | pad | x | cpu ms | cpu-cl ms | ember ms | ember-parity ms "
            "| ember GFLOP/s | ember / cpu | ember route | max rel err |"
        ),
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    totals = dict.fromkeys(SYSTEMS, 0.0)
    for layer, r in zip(layers, results):
        for s in SYSTEMS:
            totals[s] += r[s] * layer["count"]
        gflops = _flops(layer) / (r["ember"] * 1e-3) / 1e9
        out.append(
            f"| {list(layer['input'])} | {list(layer['weight'])} | {layer['stride'][0]} "
            f"| {layer['padding'][0]} | {layer['count']} | {r['cpu']:.3f} | {r['cpu-cl']:.3f} "
            f"| {r['ember']:.3f} | {r['ember-parity']:.3f} | {gflops:.0f} "
            f"| {r['ember'] / r['cpu']:.2f}x | {r['route']} | {r['rel_err']:.1e} |"
        )
    out.append(
        f"| **all layers, each as often as the model calls it** | | | | | {totals['cpu']:.2f} "
        f"| {totals['cpu-cl']:.2f} | {totals['ember']:.2f} | {totals['ember-parity']:.2f} | "
        f"| {totals['ember'] / totals['cpu']:.2f}x | | |"
    )
    out.append("")
    out.append(FLOPS_NOTE)
    out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    layers = conv_layers(args.tiny)
    results = []
    # Every call timed whole: the synchronous engine.
    with torch.backends.ember.flags(async_execution=False):
        for i, layer in enumerate(layers):
            print(
                f"[conv_layers] {i + 1}/{len(layers)} {list(layer['input'])} "
                f"{list(layer['weight'])}",
                file=sys.stderr,
            )
            results.append(measure(layer, args.rounds, args.calls))
    text = render(layers, results, args)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
