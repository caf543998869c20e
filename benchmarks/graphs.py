"""Graph replay against eager execution (issue 12's targets), in one run.

* ``mlp-b1``: the suite's MLP (4 linears of width 256, batch 1): CPU eager,
  ember eager, and one ember graph replay per call.
* ``gpt2-decode-static``: GPT-2 small (random weights) greedy decode with a
  static KV cache (transformers' ``StaticCache``) after a 128-token prompt,
  per token: CPU eager and ember eager run the decode step as a Python loop;
  the ember graph holds one whole step (model, argmax, the token and position
  written back for the next step), so a token is one replay. The three run
  in alternating rounds of ``--tokens`` steps, each from the prompt's end.

Reports medians per call/token, ratios to CPU eager, capture time and the
memory the graph holds (ember memory allocated by capture, and the graph
pool's reserved bytes). Checks that replayed tokens equal ember eager's and
replayed MLP outputs equal eager's bit for bit.

A second table runs the same steps through ``torch.compile`` (the default
Inductor backend) with and without ``mode="reduce-overhead"``, which on ember
captures the compiled code and replays it (``torch_ember/compile/
inductor_graphs.py``); replays are checked against the compiled code's own
outputs (bitwise for the MLP, the same tokens for the decode).

    python benchmarks/graphs.py [--tokens 32] [--out docs/bench/graphs.md]

``make bench-graphs`` runs it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from suite import peak, workloads

import torch_ember  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


def _median_time(fn, number: int, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples)


def _capture(fn) -> tuple:
    """(graph, fn's result, capture seconds, ember bytes the graph holds)."""
    graph = torch.ember.EmberGraph()
    allocated = torch.ember.memory_allocated()
    start = time.perf_counter()
    with torch.ember.graph(graph):
        out = fn()
    capture_s = time.perf_counter() - start
    return graph, out, capture_s, torch.ember.memory_allocated() - allocated


def _result(times: dict, unit: str, capture: tuple, ok: bool, check: str) -> dict:
    return {
        "times": times,
        "unit": unit,
        "capture_s": capture[2],
        "held_bytes": capture[3],
        "check": check if ok else f"**not {check}**",
        "ok": ok,
    }


def _compiled_times(step, number: int, repeats: int) -> tuple[dict, bool]:
    """``step(mode)`` -> (a callable running one step, a function giving its
    last result on the host). Times the compiled step without and with
    reduce-overhead; True if the replays gave the compiled code's results."""
    import torch._dynamo
    import torch._inductor.config

    torch._dynamo.reset()
    times, results = {}, {}
    with torch._inductor.config.patch(fx_graph_cache=False):
        for name, mode in (("compiled", None), ("reduce-overhead", "reduce-overhead")):
            run, result = step(mode)
            for _ in range(3):  # compile; reduce-overhead: two warm-ups and the capture
                run()

            def timed(run=run):
                run()
                torch.ember.synchronize()

            times[name] = _median_time(timed, number, repeats)
            results[name] = result()
    torch._dynamo.reset()
    return times, torch.equal(results["compiled"], results["reduce-overhead"])


def bench_mlp(repeats: int) -> dict:
    w = workloads.mlp()
    x = w.inputs[0]
    cpu_model = w.module
    ember_model = workloads.mlp().module.to("ember")
    xe = x.to("ember")
    rows = {}
    with torch.inference_mode():
        for _ in range(3):
            ember_model(xe)  # warm-up: weights packed
        capture = _capture(lambda: ember_model(xe)[0])
        graph, static_out = capture[0], capture[1]

        def ember_eager():
            ember_model(xe)
            torch.ember.synchronize()

        def replay():
            graph.replay()
            torch.ember.synchronize()

        rows["cpu-eager"] = _median_time(lambda: cpu_model(x), 2000, repeats)
        rows["ember-eager"] = _median_time(ember_eager, 2000, repeats)
        rows["ember-graph"] = _median_time(replay, 2000, repeats)
        graph.replay()
        equal = torch.equal(static_out.cpu(), ember_model(xe)[0].cpu())

        def compiled_step(mode):
            compiled = torch.compile(ember_model, mode=mode)
            x_fixed = xe.clone()
            box = []

            def run():
                box[:] = [compiled(x_fixed)[0]]

            return run, lambda: box[0].cpu()

        compiled, compiled_ok = _compiled_times(compiled_step, 2000, repeats)
    result = _result(rows, "call", capture, equal, "replay == eager bitwise")
    result["compiled"] = compiled
    result["compiled_check"] = (
        "replay == compiled bitwise" if compiled_ok else "**replay != compiled**"
    )
    result["ok"] = result["ok"] and compiled_ok
    return result


def _gpt2(device: str, prompt_len: int, max_len: int):
    import transformers as tr

    torch.manual_seed(0)
    cfg = tr.GPT2Config()
    # Normal (not inference) tensors, as the eager suite moves its models
    # (ember packs inference tensors too).
    with torch.inference_mode(False):
        model = tr.GPT2LMHeadModel(cfg).eval().to(device)
    cache = tr.StaticCache(config=cfg, max_cache_len=max_len)
    prompt = torch.randint(
        0, cfg.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(1)
    )
    with torch.inference_mode():
        out = model(
            input_ids=prompt.to(device),
            past_key_values=cache,
            cache_position=torch.arange(prompt_len, device=device),
            use_cache=True,
        )
    token = out.logits[:, -1:].argmax(-1)
    position = torch.tensor([prompt_len], device=device)
    return model, cache, token, position


def _step(model, cache, token, position):
    """One decode step, in place: the next token into ``token``, position + 1."""
    logits = model(
        input_ids=token, past_key_values=cache, cache_position=position, use_cache=True
    ).logits[:, -1]
    token.copy_(logits.argmax(-1, keepdim=True))
    position.add_(1)


def _decode_rounds(modes: dict, tokens: int, rounds: int) -> tuple[dict, dict]:
    """``modes``: name -> (reset, step). Each round runs every mode for ``tokens``
    steps from its reset (the same position each time, so no mode decodes
    at longer contexts than another), one mode after the other; returns the
    median seconds per step of each and the tokens of its last round."""
    samples = {name: [] for name in modes}
    sequences = {}
    for _ in range(rounds):
        for name, (reset, step) in modes.items():
            reset()
            seq = []
            start = time.perf_counter()
            for _ in range(tokens):
                seq.append(step())
            if any(t.device.type == "ember" for t in seq[-1:]):
                torch.ember.synchronize()
            samples[name].append((time.perf_counter() - start) / tokens)
            sequences[name] = torch.cat([t.cpu() for t in seq], 1)
    return {name: statistics.median(v) for name, v in samples.items()}, sequences


def _decoder(device: str, prompt_len: int, max_len: int):
    """(reset, step, model, cache, token, position) of a decode from the prompt's end."""
    model, cache, token, position = _gpt2(device, prompt_len, max_len)
    first = token.clone()

    # transformers' static cache layers count the positions they have written
    # (the next write goes there, whatever cache_position says): rewound too
    counters = [
        layer.cumulative_length
        for layer in getattr(cache, "layers", ())
        if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)
    ]

    def reset():
        token.copy_(first)
        position.fill_(prompt_len)
        for written in counters:
            written.fill_(prompt_len)

    def step():
        _step(model, cache, token, position)
        return token.clone()

    for _ in range(2):  # warm-up: ember packs weights on the second call
        step()
    return reset, step, model, cache, token, position


def bench_decode(tokens: int, prompt_len: int, rounds: int) -> dict:
    max_len = prompt_len + tokens + 8
    with torch.inference_mode():
        cpu_reset, cpu_step, *_ = _decoder("cpu", prompt_len, max_len)
        reset, step, model, cache, token, position = _decoder("ember", prompt_len, max_len)
        reset()
        capture = _capture(lambda: _step(model, cache, token, position))  # one step
        graph = capture[0]

        def replay():
            graph.replay()
            return token.clone()

        rows, sequences = _decode_rounds(
            {
                "cpu-eager": (cpu_reset, cpu_step),
                "ember-eager": (reset, step),
                "ember-graph": (reset, replay),
            },
            tokens,
            rounds,
        )
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

        def compiled_step(mode):
            model, cache, token, position = _gpt2("ember", prompt_len, max_len)
            compiled = torch.compile(_step, mode=mode)
            seq = []

            def run():
                compiled(model, cache, token, position)
                seq.append(token.clone())

            return run, lambda: torch.cat([t.cpu() for t in seq], 1)

        compiled, compiled_ok = _compiled_times(compiled_step, tokens // 4, 3)
    same = torch.equal(sequences["ember-graph"], sequences["ember-eager"])
    result = _result(rows, "token", capture, same, "replayed tokens == ember eager's")
    result["compiled"] = compiled
    result["compiled_check"] = (
        "same tokens as compiled" if compiled_ok else "**tokens differ from compiled**"
    )
    result["ok"] = result["ok"] and compiled_ok
    # Every step reads every weight once: weights / read bandwidth (measured
    # now, in this run) is the fastest a step can be, replayed or not.
    lib = peak._compile(False)
    threads = torch.get_num_threads()
    bw = peak.measure_read_bandwidth(lib, threads, peak.mem_buffer_bytes(), 5) if lib else None
    result["streaming"] = {"weight_bytes": weight_bytes, "read_bw": bw, "threads": threads}
    return result


def streaming_lines(r: dict) -> list[str]:
    """Decode: each mode's weights streamed per second against the read
    bandwidth measured in the same run, and the floor that sets."""
    st = r.get("streaming")
    if not st or not st["read_bw"]:
        return []
    t, bw, wb = r["times"], st["read_bw"], st["weight_bytes"]
    floor = wb / bw
    lines = [
        "",
        (
            f"gpt2-decode-static reads {wb / 2**20:.0f} MiB of weights per token; the memory "
            f"read bandwidth measured in this run ({st['threads']} threads, STREAM-style read "
            f"of {peak.mem_buffer_bytes() / 2**30:.0f} GiB) is {bw / 1e9:.1f} GB/s, so no "
            f"step can take less than {floor * 1e3:.2f} ms:"
        ),
        "",
        "| mode | per token | weights streamed | of read bandwidth | floor / this mode |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for mode in ("cpu-eager", "ember-eager", "ember-graph"):
        lines.append(
            f"| {mode} | {t[mode] * 1e3:.3f} ms | {wb / t[mode] / 1e9:.1f} GB/s | "
            f"{wb / t[mode] / bw:.0%} | {floor / t[mode]:.2f}x |"
        )
    return lines


def markdown(meta: dict, results: dict[str, dict]) -> str:
    lines = [
        (
            "<!-- GENERATED FILE: written by benchmarks/graphs.py (`make bench-graphs`). "
            "Do not edit by hand; rerun the command below to regenerate. -->"
        ),
        "",
        "# Graph replay against eager execution",
        "",
        (
            f"Generated {meta['date']} by `{meta['command']}`, {meta['threads']} threads, "
            f"on {meta['cpu_model']} ({meta['cores']} cores); asynchronous execution "
            f"{'on' if meta['async'] else 'off'} (replays run "
            f"{'as one queued unit, or at the call on an idle stream whose worker sleeps' if meta['async'] else 'on the calling thread'})."
        ),
        "",
        (
            "| workload | CPU eager | ember eager | ember graph replay | replay / CPU eager | "
            "replay / ember eager | capture | memory held by the graph | check |"
        ),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, r in results.items():
        t = r["times"]
        lines.append(
            f"| {name} (per {r['unit']}) | {t['cpu-eager'] * 1e3:.3f} ms | "
            f"{t['ember-eager'] * 1e3:.3f} ms | {t['ember-graph'] * 1e3:.3f} ms | "
            f"{t['ember-graph'] / t['cpu-eager']:.2f}x | "
            f"{t['ember-graph'] / t['ember-eager']:.2f}x | {r['capture_s'] * 1e3:.0f} ms | "
            f"{r['held_bytes'] / 2**20:.1f} MiB | {r['check']} |"
        )
    lines += [
        "",
        (
            "- memory held by the graph: ember memory allocated during capture and still "
            "allocated after it (the graph's outputs and the intermediates its recorded "
            "kernels write, kept for every replay)."
        ),
        (
            "- gpt2-decode-static: one replay is one whole decode step (model, argmax, next "
            "token and position written in place); eager runs the same step from Python. "
            "Targets (issue 12): mlp-b1 replay <= 0.5x CPU eager; decode replay <= 0.5x CPU "
            "eager per token, and below ember eager by the same margin (the floor below "
            "bounds how far below ember eager any replay can go)."
        ),
    ]
    lines += [
        "",
        '## torch.compile(mode="reduce-overhead") on ember',
        "",
        (
            "The same steps compiled by the default Inductor backend, without and with "
            '`mode="reduce-overhead"` (the compiled code captured on its third call and '
            "replayed after it; docs/compile.md)."
        ),
        "",
        (
            "| workload | ember eager | compiled | compiled, reduce-overhead | "
            "reduce-overhead / compiled | reduce-overhead / CPU eager | check |"
        ),
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, r in results.items():
        t, c = r["times"], r["compiled"]
        lines.append(
            f"| {name} (per {r['unit']}) | {t['ember-eager'] * 1e3:.3f} ms | "
            f"{c['compiled'] * 1e3:.3f} ms | {c['reduce-overhead'] * 1e3:.3f} ms | "
            f"{c['reduce-overhead'] / c['compiled']:.2f}x | "
            f"{c['reduce-overhead'] / t['cpu-eager']:.2f}x | {r['compiled_check']} |"
        )
    lines += streaming_lines(results.get("gpt2-decode-static", {}))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "graphs.md")
    args = p.parse_args(argv)
    threads = peak.physical_cores()
    torch.set_num_threads(threads)
    results = {
        "mlp-b1": bench_mlp(args.repeats),
        "gpt2-decode-static": bench_decode(args.tokens, args.prompt, args.repeats),
    }
    meta = {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "command": os.environ.get("BENCH_COMMAND") or shlex.join(["python", *sys.argv]),
        "threads": threads,
        "cpu_model": peak.cpu_model(),
        "cores": peak.physical_cores(),
        "async": torch.backends.ember.async_execution,
    }
    text = markdown(meta, results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
