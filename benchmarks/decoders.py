"""Greedy decode across transformers' decoder architectures: ember against CPU.

The suite times GPT-2 and Llama; users bring other decoders, whose
attention, masks and position code take other ops. Each architecture here
is built from a small config with random weights (4 layers, width 768, 12
query heads; grouped-query where the architecture has it), fed an 8-token
prompt, and then decoded token by token with its KV cache on CPU eager and
on ember eager, in rounds that alternate the two, so both figures of a row
come from the same minutes. Beside the times, the queue waits ember's
engine counted per decode step (`torch_ember.launch_stats()`: synchronous
ops that found launched work queued and drained it), by op: the places
where an architecture still stops the host from running ahead.

    python benchmarks/decoders.py [--rounds 5] [--tokens 32] [--models a,b]
        [--out PATH] [--tiny]

``make bench-decoders`` runs it and writes docs/bench/decoders.md. Speed is
judged by the ratios of one run (the host is shared).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers as tr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite.peak import cpu_model

import torch_ember

HEADER = "# Decoder architectures: ember eager against CPU eager, ms per token"


def configs(tiny: bool) -> dict[str, object]:
    """Small configs of each decoder family (random weights, no downloads)."""
    width, layers, heads, kv_heads = (64, 2, 4, 2) if tiny else (768, 4, 12, 4)
    ffn, vocab = 4 * width, 1000 if tiny else 32000
    common = {"hidden_size": width, "num_hidden_layers": layers, "vocab_size": vocab}
    gqa = {**common, "num_attention_heads": heads, "num_key_value_heads": kv_heads}
    return {
        "llama": tr.LlamaConfig(intermediate_size=ffn, **gqa),
        "mistral": tr.MistralConfig(intermediate_size=ffn, **gqa),
        "qwen2": tr.Qwen2Config(intermediate_size=ffn, **gqa),
        "gemma": tr.GemmaConfig(intermediate_size=ffn, head_dim=width // heads, **gqa),
        "phi3": tr.Phi3Config(intermediate_size=ffn, pad_token_id=0, **gqa),
        "gpt_neox": tr.GPTNeoXConfig(intermediate_size=ffn, num_attention_heads=heads, **common),
        "opt": tr.OPTConfig(
            ffn_dim=ffn, num_attention_heads=heads, word_embed_proj_dim=width, **common
        ),
        # multi-query: one key/value head broadcast against the query heads
        "falcon": tr.FalconConfig(num_attention_heads=heads, **common),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="rounds alternating CPU and ember")
    p.add_argument("--tokens", type=int, default=32, help="decode steps per round")
    p.add_argument("--models", default=None, help="comma list (default: every architecture)")
    p.add_argument("--out", type=Path, default=None, help="Markdown file to write")
    p.add_argument("--tiny", action="store_true", help="toy sizes (smoke test)")
    return p.parse_args(argv)


def decode(model: torch.nn.Module, device: str, tokens: int) -> list[float]:
    """Seconds per decode step after an 8-token prompt (greedy, KV cache)."""
    ids = torch.randint(0, 1000, (1, 8), generator=torch.Generator().manual_seed(0))
    steps = []
    with torch.inference_mode():
        out = model(ids.to(device), use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(tokens):
            begin = time.perf_counter()
            out = model(token, past_key_values=past, use_cache=True)
            past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            steps.append(time.perf_counter() - begin)
        if device == "ember":
            torch.ember.synchronize()
    return steps


def measure(name: str, config, rounds: int, tokens: int) -> dict:
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    cpu_model = tr.AutoModelForCausalLM.from_config(config).eval()
    ember_model = copy.deepcopy(cpu_model).to("ember")
    warm = max(1, tokens // 6)  # the first steps warm caches and packs weights
    times: dict[str, list[float]] = {"cpu": [], "ember": []}
    waits: dict[str, int] = {}
    for _ in range(rounds):
        times["cpu"].append(statistics.median(decode(cpu_model, "cpu", tokens)[warm:]))
        torch_ember.reset_launch_stats()
        times["ember"].append(statistics.median(decode(ember_model, "ember", tokens)[warm:]))
        for op, counts in torch_ember.launch_stats().items():
            waits[op] = waits.get(op, 0) + counts["waited"]
    cpu, ember = statistics.median(times["cpu"]), statistics.median(times["ember"])
    per_step = {op: n / (rounds * (tokens + 1)) for op, n in waits.items() if n}
    return {"name": name, "cpu_ms": cpu * 1e3, "ember_ms": ember * 1e3, "waits": per_step}


def render(results: list[dict], args: argparse.Namespace) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cpu_name = cpu_model()
    lines = [
        HEADER,
        "",
        (
            f"Generated {now} by `python benchmarks/decoders.py` on {cpu_name}, "
            f"{torch.get_num_threads()} threads, torch {torch.__version__}; {args.rounds} rounds "
            f"alternating the systems, median step of {args.tokens} decode steps each (the first "
            "sixth left out). Weights random, 8-token prompt, greedy, KV cache, sdpa attention."
        ),
        "",
        (
            "| architecture | CPU eager ms/token | ember eager ms/token | ember / CPU | "
            "queue waits per step (op: count) |"
        ),
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        waits = ", ".join(f"`{op}` {n:.2f}" for op, n in sorted(r["waits"].items())) or "none"
        lines.append(
            f"| {r['name']} | {r['cpu_ms']:.2f} | {r['ember_ms']:.2f} | "
            f"{r['ember_ms'] / r['cpu_ms']:.2f}x | {waits} |"
        )
    lines += [
        "",
        (
            "Queue waits count the prompt's call too (one per round), hence the fractions; "
            "a wait per step is a place where the host stops to let the worker drain its queue."
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    all_configs = configs(args.tiny)
    names = args.models.split(",") if args.models else list(all_configs)
    unknown = [n for n in names if n not in all_configs]
    if unknown:
        raise SystemExit(f"unknown architectures: {unknown}; known: {list(all_configs)}")
    results = []
    for name in names:
        results.append(measure(name, all_configs[name], args.rounds, args.tokens))
        r = results[-1]
        print(f"{name}: CPU {r['cpu_ms']:.2f} ms/token, ember {r['ember_ms']:.2f}", flush=True)
    md = render(results, args)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
