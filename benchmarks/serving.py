"""Serving throughput: N model replicas served from N threads, on N ember
devices that own disjoint cores, against one device owning them all, and
against CPU eager with the same threads. Ratios are measured in one run.

    python benchmarks/serving.py                      # BERT-tiny and BERT-base
    python benchmarks/serving.py --models bert-tiny --requests 200 --plot out.png
    python benchmarks/serving.py --graphs             # each request one graph replay

Each configuration runs in a fresh interpreter (EMBER_DEVICES is read once
per process): ``replicas`` threads, each with its own copy of the model (the
same seeded weights) on its own device (ember, N devices: each thread bound
to its device's cores with ``torch.ember.use_device_cores``) or all on one
device owning every core (ember, 1 device) or on CPU, each thread answering
``requests`` batch-1 requests after a warm-up. Throughput = all requests /
wall time. Outputs of every configuration are checked against CPU's.

The configurations run ``--rounds`` times (3 by default), in an order that
rotates each round, so that a slow spell of a shared host falls on every
configuration alike: the table gives each configuration's median, and each
ratio as the median of its per-round ratios with their range (one round of
each configuration made the same 2-device/1-device ratio 1.06x in one run
and 1.56x in the next on one host).

With ``--graphs`` each ember replica is captured once (``torch.ember.graph``,
on its own stream) and a request is one ``replay()``: the serving threads
then share the GIL for one call per request instead of one per op, which is
what bounds small models served from threads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

from tqdm import tqdm

MODELS = {
    # google/bert_uncased_L-2_H-128_A-2's shape ("BERT-tiny"), seq 128.
    "bert-tiny": {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 512,
    },
    # bert-base-uncased's shape, seq 128.
    "bert-base": {},
}

WORKER = textwrap.dedent(
    """
    import json, os, sys, threading, time
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch, transformers
    import torch_ember  # noqa: F401  (explicit: torch 2.11 builds load no backend entry point)
    transformers.logging.set_verbosity_error()
    spec = json.loads(sys.argv[1])
    torch.manual_seed(0)
    cfg = transformers.BertConfig(**spec["config"])
    base = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = base(input_ids=ids).last_hidden_state
    replicas = spec["replicas"]
    if spec["system"] == "cpu":
        devices = ["cpu"] * replicas
    elif spec["devices"] == 1:
        devices = ["ember:0"] * replicas
    else:
        devices = [f"ember:{i}" for i in range(replicas)]
    models = []
    for d in devices:
        m = transformers.BertModel(cfg, add_pooling_layer=False).eval()
        m.load_state_dict(base.state_dict())
        models.append((m.to(d), ids.to(d)))
    # --graphs: each ember replica captured once (after its warm-up, here on
    # the main thread) and replayed per request on its own stream: a request
    # is one replay call, so the serving threads hold the GIL for one call,
    # not for every op of the model.
    graphs = []
    if spec["graphs"] and spec["system"] == "ember":
        for d, (model, x) in zip(devices, models):
            index = torch.device(d).index
            with torch.no_grad(), torch.ember.device(index):
                for _ in range(spec["warmup"]):
                    model(input_ids=x)
                stream, g = torch.ember.Stream(index), torch.ember.EmberGraph()
                with torch.ember.graph(g, stream=stream):
                    static_out = model(input_ids=x).last_hidden_state
            graphs.append((g, stream, static_out))
    barrier = threading.Barrier(replicas + 1)
    errors = []

    def serve(i):
        model, x = models[i]
        try:
            if spec["system"] == "ember" and (spec["devices"] > 1 or spec["cores"]):
                # One serving thread per device, on that device's cores.
                torch.ember.use_device_cores(i)
            if graphs:  # warmed up at capture; a request is one replay
                g, stream, static_out = graphs[i]
                context, warmup = torch.ember.stream(stream), 0

                def request():
                    g.replay()
                    return static_out
            else:
                context, warmup = torch.no_grad(), spec["warmup"]

                def request():
                    return model(input_ids=x).last_hidden_state

            with context:
                for _ in range(warmup):
                    request()
                if not torch.allclose(request().cpu(), reference, atol=1e-3, rtol=1e-3):
                    errors.append(f"replica {i} on {devices[i]} differs from CPU")
                barrier.wait()
                for _ in range(spec["requests"]):
                    request()
                if devices[i] != "cpu":
                    torch.ember.synchronize(torch.device(devices[i]).index)
        except Exception as e:  # reported by the parent; never a hang
            errors.append(f"replica {i} on {devices[i]}: {e!r}")
            barrier.abort()

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(replicas)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    begin = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - begin
    cores = [torch.ember.get_device_properties(i).core_ids for i in range(torch.ember.device_count())]
    print(json.dumps({"throughput": replicas * spec["requests"] / wall, "errors": errors, "cores": cores}))
    """
)


def run_config(
    model: str,
    system: str,
    devices: int,
    replicas: int,
    requests: int,
    warmup: int,
    cores: str | None = None,
    graphs: bool = False,
) -> dict:
    """``cores``: EMBER_DEVICE_CORES for the run (default: the process's cores
    split evenly between the devices)."""
    spec = {
        "config": MODELS[model],
        "system": system,
        "devices": devices,
        "replicas": replicas,
        "requests": requests,
        "warmup": warmup,
        "cores": cores,
        "graphs": graphs,
    }
    env = {**os.environ, "EMBER_DEVICES": str(devices)}
    env.pop("EMBER_DEVICE_CORES", None)
    if cores is not None:
        env["EMBER_DEVICE_CORES"] = cores
    result = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{model} {system} x{devices}: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--replicas", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--requests", type=int, default=None, help="per replica (default: by model)"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs of every configuration (rotating order)"
    )
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="ember replicas replay a captured graph per request (torch.ember.graph)",
    )
    parser.add_argument("--plot", default=None, help="PNG: throughput by configuration")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--out", default=None, help="markdown report (make bench-serving)")
    args = parser.parse_args()

    n = args.replicas
    first_core = str(min(os.sched_getaffinity(0)))
    # (label, system, devices, replicas, EMBER_DEVICE_CORES)
    configs = [
        ("cpu eager", "cpu", 1, n, None),
        ("ember, 1 device", "ember", 1, n, None),
        ("ember, one 1-core device, 1 replica", "ember", 1, 1, first_core),
        (f"ember, {n} devices", "ember", n, n, None),
    ]
    samples: dict[str, dict[str, list[float]]] = {}
    jobs = [(m, c) for m in args.models for c in configs]
    order = [
        jobs[(r + i) % len(jobs)] for r in range(max(1, args.rounds)) for i in range(len(jobs))
    ]
    for model, (label, system, devices, replicas, cores) in tqdm(
        order, desc="serving", unit="config"
    ):
        requests = args.requests or (200 if model == "bert-tiny" else 20)
        out = run_config(
            model, system, devices, replicas, requests, args.warmup, cores, args.graphs
        )
        if out["errors"]:
            raise SystemExit(f"{model} {label}: {out['errors']}")
        samples.setdefault(model, {}).setdefault(label, []).append(out["throughput"])
    results = {
        model: {label: statistics.median(v) for label, v in row.items()}
        for model, row in samples.items()
    }
    lines = serving_table(samples, [c[0] for c in configs], n)
    print("\n" + "\n".join(lines))
    if args.out:
        write_markdown(args.out, lines, n, args.graphs)

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"replicas": n, "results": results, "samples": samples}, f, indent=2)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
        for ax, (model, row) in zip(axes[0], results.items(), strict=True):
            ax.bar(list(row), list(row.values()), color=["#888", "#e8743b", "#f0b27a", "#c0392b"])
            ax.set_title(f"{model}: {n} replicas, {n} threads")
            ax.set_ylabel("requests / s")
            ax.tick_params(axis="x", labelrotation=15)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"\nplot: {args.plot}")


def ratio_cell(numerator: list[float], denominator: list[float]) -> str:
    """The median of per-round ratios, with their range when there are
    several rounds."""
    ratios = sorted(a / b for a, b in zip(numerator, denominator, strict=True))
    cell = f"{statistics.median(ratios):.2f}x"
    if len(ratios) > 1:
        cell += f" ({ratios[0]:.2f}-{ratios[-1]:.2f})"
    return cell


def serving_table(
    samples: dict[str, dict[str, list[float]]], labels: list[str], n: int
) -> list[str]:
    """The markdown table: per model each configuration's median throughput
    over the rounds, then the ratios of the N-device configuration (labels
    in order: cpu, one device, one 1-core device, N devices)."""
    rounds = min(len(v) for row in samples.values() for v in row.values())
    lines = [
        (
            f"{n} replicas from {n} threads (the 1-core column: 1 replica, 1 thread), batch 1, "
            f"seq 128 (requests/s, median of {rounds} round(s); ratios: median of the "
            "per-round ratios (range); all in this run)"
        ),
        "",
        "| model | "
        + " | ".join(labels)
        + f" | {n} dev / 1 dev | {n} dev / one 1-core dev | {n} dev / cpu |",
        "|" + "---|" * (len(labels) + 4),
    ]
    for model, row in samples.items():
        cpu, one, one_core, many = (row[label] for label in labels)
        cells = " | ".join(f"{statistics.median(row[label]):.1f}" for label in labels)
        lines.append(
            f"| {model} | {cells} | {ratio_cell(many, one)} | {ratio_cell(many, one_core)} | "
            f"{ratio_cell(many, cpu)} |"
        )
    return lines


def write_markdown(path: str, table: list[str], n: int, graphs: bool) -> None:
    import datetime

    from suite.peak import cpu_model

    command = os.environ.get("BENCH_COMMAND") or " ".join(["python", *sys.argv])
    cpu = cpu_model()
    text = [
        (
            "<!-- GENERATED FILE: written by benchmarks/serving.py (`make bench-serving`). "
            "Do not edit by hand; rerun the command below to regenerate. -->"
        ),
        "",
        "# Serving throughput: devices that own their cores"
        + (", requests replayed as graphs" if graphs else ""),
        "",
        (
            f"Generated {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} by `{command}` "
            f"on {cpu} ({len(os.sched_getaffinity(0))} CPUs)."
        ),
        "",
        *(
            [
                (
                    "Graphs: every ember replica is captured once after its warm-up "
                    "(`torch.ember.graph`, its own stream) and each request is one "
                    "`replay()`; CPU eager runs the model op by op as always."
                ),
                "",
            ]
            if graphs
            else []
        ),
        *table,
        "",
        (
            f"Targets (issue 11): {n} devices x 1 core >= 1.8x one 1-core device, and >= 1.3x one "
            f"{n}-core device running the same requests. Each configuration runs in a fresh "
            "interpreter; outputs are checked against CPU's."
        ),
    ]
    with open(path, "w") as f:
        f.write("\n".join(text) + "\n")


if __name__ == "__main__":
    main()
