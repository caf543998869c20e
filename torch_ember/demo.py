"""ember demo: a real transformers model on CPU and on ember, compared and timed.

Run with ``make demo`` or ``python -m torch_ember.demo [--quick]``.

A GPT-2 (4 layers, 256 wide, 5000-token vocabulary) is built from a config
with random weights under a fixed seed (nothing is downloaded). The demo

1. runs the same forward pass on CPU and on ember (``model.to("ember")``) and
   shows that the outputs agree: with ember's default (fast) kernels within
   float32 rounding (max abs diff), and with
   ``torch.backends.ember.cpu_parity`` bit for bit, for both attention
   implementations of transformers;
2. generates greedily on both devices and compares the token ids;
3. times forward, generate and per-token decode on CPU, on ember and on
   ember with cpu_parity (median of interleaved runs after warm-up) and
   prints the ratios to CPU;
4. reports ember's memory statistics and ``torch_ember.fallback_stats()``.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

import torch_ember

# Set before transformers is first imported (lazily, in _build_model).
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # random weights: never reach the hub
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
DEVICE = "ember"
PARITY = "ember (cpu_parity)"


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m torch_ember.demo",
        description="A transformers GPT-2 on CPU and on ember: outputs compared, latency table.",
    )
    parser.add_argument("--quick", action="store_true", help="fewer timing runs (a smoke test)")
    parser.add_argument("--runs", type=int, default=None, help="timed runs per measurement")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first")
    parser.add_argument("--seq-len", type=int, default=128, help="forward sequence length")
    parser.add_argument("--prompt-len", type=int, default=32, help="generate prompt length")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens to generate")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256, help="n_embd")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.runs is None:
        args.runs = 3 if args.quick else 15
    if args.warmup is None:
        args.warmup = 1 if args.quick else 3
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be >= 1 and --warmup >= 0")
    if args.new_tokens < 2:
        parser.error("--new-tokens must be >= 2 (per-token decode latency needs two points)")
    if args.seq_len > 1024 or args.prompt_len + args.new_tokens > 1024:
        parser.error("sequence longer than the model's 1024 positions")
    return args


# --------------------------------------------------------------------------- model


def _build_model(args: argparse.Namespace, attn: str) -> torch.nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        vocab_size=args.vocab,
        n_positions=1024,
        n_embd=args.width,
        n_layer=args.layers,
        n_head=args.heads,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        attn_implementation=attn,
    )
    torch.manual_seed(args.seed)
    return transformers.GPT2LMHeadModel(config).eval()


def _pair(args: argparse.Namespace, attn: str) -> dict[str, torch.nn.Module]:
    """The same weights on CPU and on ember."""
    cpu_model = _build_model(args, attn)
    return {"cpu": cpu_model, DEVICE: copy.deepcopy(cpu_model).to(DEVICE)}


def _sync(device: str) -> None:
    if device == DEVICE:
        torch.ember.synchronize()


# --------------------------------------------------------------------------- output table


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _section(title: str) -> None:
    print(f"\n== {title}")


# --------------------------------------------------------------------------- agreement


def _forward_logits(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, device: str):
    with torch.no_grad():
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
    return out.logits.cpu()


def _agreement(args: argparse.Namespace, ids: torch.Tensor) -> dict[str, tuple[bool, bool]]:
    """Per attention implementation: (default kernels within float32
    rounding of CPU, cpu_parity bitwise identical to CPU)."""
    _section(f"forward: logits on CPU vs ember (batch 2, seq {args.seq_len}, 2nd padded)")
    ids = torch.cat([ids, ids.roll(7, dims=1)])
    mask = torch.ones_like(ids)
    mask[1, args.seq_len * 3 // 4 :] = 0
    rows = []
    agreement: dict[str, tuple[bool, bool]] = {}
    for attn in ("eager", "sdpa"):
        models = _pair(args, attn)
        cpu = _forward_logits(models["cpu"], ids, mask, "cpu")
        # twice: the second call runs on packed weights
        ember = [_forward_logits(models[DEVICE], ids, mask, DEVICE) for _ in range(2)][-1]
        with torch.backends.ember.flags(cpu_parity=True):
            parity = _forward_logits(models[DEVICE], ids, mask, DEVICE)
        diff = (cpu - ember).abs().max().item()
        parity_diff = (cpu - parity).abs().max().item()
        close = torch.allclose(ember, cpu, rtol=1e-4, atol=1e-4)
        agreement[attn] = (close, torch.equal(cpu, parity))
        rows.append(
            [
                f"attn_implementation={attn}",
                tuple(cpu.shape),
                f"{diff:.3g}",
                agreement[attn][0],
                f"{parity_diff:.3g}",
                agreement[attn][1],
            ]
        )
    print(
        _table(
            [
                "model",
                "logits shape",
                "default: max abs diff",
                "default: within fp32 rounding",
                "cpu_parity: max abs diff",
                "cpu_parity: bitwise identical",
            ],
            rows,
        )
    )
    return agreement


def _generate(model, ids: torch.Tensor, device: str, new_tokens: int) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=torch.ones_like(ids, device=device),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,  # fixed work per call, for timing
            do_sample=False,
            pad_token_id=0,
        )
    _sync(device)
    return out


def _generation(args: argparse.Namespace, models, prompt: torch.Tensor) -> bool:
    _section(
        f"greedy generate: {args.new_tokens} new tokens after a {args.prompt_len}-token prompt"
    )
    out = {d: _generate(m, prompt, d, args.new_tokens).cpu() for d, m in models.items()}
    same = torch.equal(out["cpu"], out[DEVICE])
    for device, ids in out.items():
        print(f"{device:>6}: {ids[0, args.prompt_len :].tolist()}")
    print(f"generated ids identical: {same}")
    return same


# --------------------------------------------------------------------------- timing


def _median_ms(fns: dict[str, Callable[[], object]], runs: int, warmup: int) -> dict[str, float]:
    """Median wall time per device; devices alternate within each round to cancel drift."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples: dict[str, list[float]] = {d: [] for d in fns}
    for round_index in range(runs):
        order = list(fns) if round_index % 2 == 0 else list(reversed(fns))
        for device in order:
            start = time.perf_counter()
            fns[device]()
            samples[device].append((time.perf_counter() - start) * 1e3)
    return {d: statistics.median(s) for d, s in samples.items()}


def _timings(args: argparse.Namespace, models, ids: torch.Tensor, prompt: torch.Tensor):
    def forward(device):
        x = ids.to(device)

        def run():
            with torch.no_grad():
                models[device](input_ids=x, use_cache=False)
            _sync(device)

        return run

    def generate(device, tokens):
        return lambda: _generate(models[device], prompt, device, tokens)

    def parity(run):
        def wrapped():
            with torch.backends.ember.flags(cpu_parity=True):
                return run()

        return wrapped

    def systems(make):
        return {"cpu": make("cpu"), DEVICE: make(DEVICE), PARITY: parity(make(DEVICE))}

    fwd = _median_ms(systems(forward), args.runs, args.warmup)
    gen = _median_ms(systems(lambda d: generate(d, args.new_tokens)), args.runs, args.warmup)
    gen1 = _median_ms(systems(lambda d: generate(d, 1)), args.runs, args.warmup)
    decode = {d: (gen[d] - gen1[d]) / (args.new_tokens - 1) for d in gen}
    return [
        (f"forward (batch 1, seq {args.seq_len})", fwd),
        (f"generate ({args.new_tokens} tokens, greedy)", gen),
        ("decode, per token (KV cache)", decode),
    ]


# --------------------------------------------------------------------------- graphs


def _graphed_decode(args: argparse.Namespace, model, prompt: torch.Tensor) -> bool:
    """Greedy decode with a static KV cache, eager and as one graph replay per
    token (torch.ember.graph): the same tokens, the time per token of each."""
    import transformers

    steps = max(args.new_tokens, 3)
    _section(
        f"graph replay: decode with a static KV cache ({steps} tokens), "
        "one torch.ember graph replay per token"
    )
    max_len = args.prompt_len + steps + 4

    def start():
        cache = transformers.StaticCache(config=model.config, max_cache_len=max_len)
        out = model(
            input_ids=prompt.to(DEVICE),
            past_key_values=cache,
            cache_position=torch.arange(args.prompt_len, device=DEVICE),
        )
        position = torch.tensor([args.prompt_len], device=DEVICE)
        return cache, out.logits[:, -1:].argmax(-1), position

    def step(cache, token, position):  # in place: the next token, position + 1
        logits = model(input_ids=token, past_key_values=cache, cache_position=position).logits
        token.copy_(logits[:, -1].argmax(-1, keepdim=True))
        position.add_(1)

    # transformers checks the input ids for padding on the host when no
    # attention mask is given (a host read a capture refuses): no pad id here.
    pad_token_id, model.config.pad_token_id = model.config.pad_token_id, None
    try:
        eager, replayed, eager_ms, replay_ms = _decode_both(start, step, steps)
    finally:
        model.config.pad_token_id = pad_token_id
    same = replayed == eager
    print(
        _table(
            ["ember decode", "ms per token"],
            [["eager (Python loop)", f"{eager_ms:.2f}"], ["graph replay", f"{replay_ms:.2f}"]],
        )
    )
    print(f"replayed tokens identical to eager: {same}")
    return same


def _decode_both(start, step, steps: int):
    with torch.inference_mode():
        cache, token, position = start()
        step(cache, token, position)  # warm-up: weights packed on the second call
        begin = time.perf_counter()
        eager = []
        for _ in range(steps):
            step(cache, token, position)
            eager.append(token.item())
        eager_ms = (time.perf_counter() - begin) * 1e3 / steps
        cache, token, position = start()
        step(cache, token, position)
        graph = torch.ember.EmberGraph()
        with torch.ember.graph(graph):
            step(cache, token, position)  # capture runs the first step
        replayed = [token.item()]
        begin = time.perf_counter()
        for _ in range(steps - 1):
            graph.replay()
            replayed.append(token.item())
        replay_ms = (time.perf_counter() - begin) * 1e3 / (steps - 1)
    return eager, replayed, eager_ms, replay_ms


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    import transformers

    props = torch.ember.get_device_properties(0)
    print(f"ember demo: transformers GPT-2 (random weights, seed {args.seed}) on CPU and ember")
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"torch_ember {torch_ember.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"device: {props}")
    print(
        f"model: GPT2LMHeadModel n_layer={args.layers} n_embd={args.width} "
        f"n_head={args.heads} vocab={args.vocab}"
    )

    torch.ember.reset_peak_memory_stats()
    torch_ember.reset_fallback_stats()
    generator = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(1, args.vocab, (1, args.seq_len), generator=generator)
    prompt = torch.randint(1, args.vocab, (1, args.prompt_len), generator=generator)

    forward_equal = _agreement(args, ids)

    models = _pair(args, "sdpa")  # transformers' default attention
    n_params = sum(p.numel() for p in models["cpu"].parameters())
    generate_equal = _generation(args, models, prompt)

    _section(
        f"latency: median of {args.runs} interleaved runs after {args.warmup} warm-up "
        "(default sdpa attention)"
    )
    rows = []
    for label, ms in _timings(args, models, ids, prompt):
        cpu, ember, parity = ms["cpu"], ms[DEVICE], ms[PARITY]

        def ratio(value, cpu=cpu):
            return f"{value / cpu:.2f}x" if cpu > 0 else "n/a"

        rows.append(
            [label, f"{cpu:.2f}", f"{ember:.2f}", ratio(ember), f"{parity:.2f}", ratio(parity)]
        )
    print(
        _table(["measurement", "CPU ms", "ember ms", "ember/CPU", "parity ms", "parity/CPU"], rows)
    )

    graph_equal = _graphed_decode(args, models[DEVICE], prompt)

    _section("ember memory and fallbacks")
    print(f"parameters: {n_params / 1e6:.2f} M ({_mib(n_params * 4)} float32)")
    print(f"torch.ember.memory_allocated():     {_mib(torch.ember.memory_allocated())}")
    print(f"torch.ember.max_memory_allocated(): {_mib(torch.ember.max_memory_allocated())}")
    print(f"torch.ember.memory_reserved():      {_mib(torch.ember.memory_reserved())}")
    stats = torch_ember.fallback_stats()
    if stats:
        print("torch_ember.fallback_stats(): ops whose results had to be copied")
        print(
            _table(
                ["op", "copies", "bytes"],
                [[op, s["copies"], s["bytes"]] for op, s in sorted(stats.items())],
            )
        )
    else:
        print("torch_ember.fallback_stats(): {} (every op ran zero-copy)")

    _section("summary")
    for attn, (close, bitwise) in forward_equal.items():
        print(f"forward logits within fp32 rounding, default kernels ({attn} attention): {close}")
        print(f"forward logits bitwise identical, cpu_parity ({attn} attention): {bitwise}")
    print(f"generated token ids identical: {generate_equal}")
    print(f"graph replay tokens identical to eager: {graph_equal}")
    print(f"total time: {time.perf_counter() - started:.1f} s")
    ok = all(close for close, _ in forward_equal.values()) and forward_equal["eager"][1]
    return 0 if generate_equal and graph_equal and ok else 1


if __name__ == "__main__":
    sys.exit(main())
