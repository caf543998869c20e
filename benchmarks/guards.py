"""Guard cost per call before and after ``torch_ember.guards.optimize``, on a
synthetic module-heavy model and on transformers models.

Models (``--models``, default all):

* ``synthetic``: the worst case for guards, deep nesting of small modules
  (residual blocks of Linear + LayerNorm + GELU, each wrapped in modules with
  a float attribute, nested ``--depth`` levels, ``--blocks`` of them), tiny
  tensors so that guards are a visible share of a call;
* ``bert``: ``BertModel`` (2 layers, hidden 64), called with keyword
  arguments through transformers' ``**kwargs`` wrapper, batch 1, 32 tokens;
* ``vit``: ``ViTModel`` (2 layers, hidden 64, 32x32 image, patch 8);
* ``gpt2-decode``: ``GPT2LMHeadModel`` (2 layers, hidden 64) in greedy
  ``generate()`` with a KV cache, its forward compiled: per new token.

All transformers models are built from configs with random weights (no
download). Rows: "guards" is the guard count of the entry that serves the
call (the decode step for generate); "guard us" the isolated guard check of
that call (``RootGuardManager.check`` on the frame locals of a real call,
timed at the call, profiler overhead subtracted; for decode: all guards of
one ``generate()`` per new token); "share" guard time / whole call (per
token); "whole call" the median per call (per token) before -> after,
measured interleaved over ``--rounds`` rounds with the interquartile range,
and the verdict of :func:`torch_ember.guards.compare_calls` ("no measurable
change" when the 95% interval of the paired difference covers zero);
"identical": outputs (tokens) bitwise equal to plain ``torch.compile``.
Every figure is measured in this run.

Target (``--check``): guard time per call cut by >= 50% on every model, with
identical outputs.

    python benchmarks/guards.py [--models synthetic,bert,vit,gpt2-decode]
        [--device cpu|ember] [--backend B] [--rounds 15] [--threads 1]
        [--json PATH] [--markdown PATH] [--check]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import sys
import time
from typing import Any

import torch

import torch_ember  # noqa: F401  (registers the ember device)
from torch_ember import guards

TARGET_CUT = 0.5
MODELS = ("synthetic", "bert", "vit", "gpt2-decode")


class Scaled(torch.nn.Module):
    """A module around a module, with a float attribute (guarded as a constant)."""

    def __init__(self, inner: torch.nn.Module, scale: float):
        super().__init__()
        self.inner = inner
        self.scale = scale

    def forward(self, x):
        return x + self.inner(x) * self.scale


class Leaf(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(d, d), torch.nn.LayerNorm(d), torch.nn.GELU()
        )

    def forward(self, x):
        return self.body(x)


def nest(d: int, depth: int) -> torch.nn.Module:
    """``depth`` levels of Scaled around a Leaf, each level also adding a Leaf."""
    if depth == 0:
        return Leaf(d)
    return torch.nn.Sequential(Scaled(nest(d, depth - 1), 0.5), Scaled(Leaf(d), 0.25))


class ModuleHeavy(torch.nn.Module):
    def __init__(self, d: int = 16, blocks: int = 6, depth: int = 4):
        super().__init__()
        self.blocks = torch.nn.ModuleList(nest(d, depth) for _ in range(blocks))
        self.head = torch.nn.Linear(d, d)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@dataclasses.dataclass
class Row:
    model: str
    description: str
    unit: str  # "call" or "token"
    guards_before: int
    guards_after: int
    guard_us_before: float
    guard_us_after: float
    whole: guards.CallComparison
    identical: bool
    compile_s: float

    @property
    def cut(self) -> float:
        return 1.0 - self.guard_us_after / self.guard_us_before if self.guard_us_before else 0.0

    @property
    def share_before(self) -> float:
        return self.guard_us_before / self.whole.before_median_us

    @property
    def share_after(self) -> float:
        return self.guard_us_after / self.whole.after_median_us

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["whole"] = self.whole.to_dict()
        out.update(cut=self.cut, share_before=self.share_before, share_after=self.share_after)
        return out


def _serving_entry(profile: guards.GuardProfile) -> guards.EntryProfile:
    return max(profile.hit_entries, key=lambda e: e.calls)


def _one_call_row(name: str, description: str, model, args, kwargs, opts) -> Row:
    t0 = time.perf_counter()
    with torch.no_grad():
        fast = guards.optimize(
            model, args, example_kwargs=kwargs, backend=opts.backend, rounds=opts.rounds,
            profiler=guards.Profiler(budget=0, rounds=0, breakdown=False),
        )  # fmt: skip
    result = fast.guard_report
    assert result.whole_call is not None
    return Row(
        model=name,
        description=description,
        unit="call",
        guards_before=_serving_entry(result.before).guard_count,
        guards_after=_serving_entry(result.after).guard_count,
        guard_us_before=result.guard_us_before,
        guard_us_after=result.guard_us_after,
        whole=result.whole_call,
        identical=result.outputs_equal,
        compile_s=time.perf_counter() - t0,
    )


def synthetic_row(opts) -> Row:
    model = ModuleHeavy(opts.dim, opts.blocks, opts.depth).to(opts.device).eval()
    x = torch.randn(opts.batch, opts.dim, device=opts.device)
    modules = sum(1 for _ in model.modules())
    description = (
        f"{modules} modules ({opts.blocks} blocks, nesting depth {opts.depth}),"
        f" input {tuple(x.shape)}"
    )
    return _one_call_row("synthetic", description, model, (x,), {}, opts)


def bert_row(opts) -> Row:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
    )
    model = BertModel(config).to(opts.device).eval()
    ids = torch.randint(0, config.vocab_size, (1, 32), device=opts.device)
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    description = "BertModel, 2 layers, hidden 64; called as model(input_ids=, attention_mask=)"
    return _one_call_row("bert", description + ", 1x32 tokens", model, (), kwargs, opts)


def vit_row(opts) -> Row:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        image_size=32, patch_size=8,
    )  # fmt: skip
    model = ViTModel(config).to(opts.device).eval()
    pixels = torch.randn(1, 3, 32, 32, device=opts.device)
    description = "ViTModel, 2 layers, hidden 64, 32x32 image, patch 8; model(pixel_values=)"
    return _one_call_row("vit", description, model, (), {"pixel_values": pixels}, opts)


def gpt2_decode_row(opts) -> Row:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_embd=64, n_layer=2, n_head=2, vocab_size=1000, n_positions=256,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config).to(opts.device).eval()
    prompt = torch.randint(1, config.vocab_size, (1, 8), device=opts.device)
    t0 = time.perf_counter()
    result = guards.optimize_generate(
        model, prompt, max_new_tokens=opts.new_tokens, backend=opts.backend,
        rounds=opts.rounds, pad_token_id=0,
        profiler=guards.Profiler(budget=0, rounds=0, breakdown=False),
    )  # fmt: skip
    return Row(
        model="gpt2-decode",
        description=(
            f"GPT2LMHeadModel, 2 layers, hidden 64; greedy generate(), prompt 8,"
            f" {opts.new_tokens} new tokens, KV cache; forward compiled"
        ),
        unit="token",
        guards_before=_serving_entry(result.before).guard_count,
        guards_after=_serving_entry(result.after).guard_count,
        guard_us_before=result.guard_us_per_token_before,
        guard_us_after=result.guard_us_per_token_after,
        whole=result.per_token,
        identical=result.tokens_equal and result.tokens_equal_eager,
        compile_s=time.perf_counter() - t0,
    )


BUILDERS = {
    "synthetic": synthetic_row,
    "bert": bert_row,
    "vit": vit_row,
    "gpt2-decode": gpt2_decode_row,
}


def _table(rows: list[Row]) -> list[str]:
    lines = [
        (
            "| model | per | guards | guard us | share | whole call, median (IQR) | verdict |"
            " identical |"
        ),
        "| --- | --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for row in rows:
        w = row.whole
        b_iqr, a_iqr = w.to_dict()["before_iqr_us"], w.to_dict()["after_iqr_us"]
        lines.append(
            f"| {row.model} | {row.unit} | {row.guards_before} -> {row.guards_after}"
            f" | {row.guard_us_before:.2f} -> {row.guard_us_after:.2f} (-{100 * row.cut:.0f}%)"
            f" | {100 * row.share_before:.1f}% -> {100 * row.share_after:.1f}%"
            f" | {w.before_median_us:.0f} ({b_iqr[0]:.0f}..{b_iqr[1]:.0f}) ->"
            f" {w.after_median_us:.0f} ({a_iqr[0]:.0f}..{a_iqr[1]:.0f}) us"
            f" | {w.verdict()} | {'yes' if row.identical else 'NO'} |"
        )
    return lines


def _markdown(rows: list[Row], opts, header: str) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        (
            "<!-- GENERATED FILE: written by benchmarks/guards.py (`make bench-guards`)."
            " Do not edit by hand; rerun the command below to regenerate. -->"
        ),
        "",
        "# Guard cost before and after `torch_ember.guards.optimize`",
        "",
        (
            f"Generated {now} by `make bench-guards` (runs `python benchmarks/guards.py"
            f" --markdown docs/bench/guards.md`). **Do not edit by hand**: rerun the command."
        ),
        "",
        f"- {header}",
        (
            f"- whole call: {opts.rounds} interleaved rounds (ABBA) of about 20 ms per side"
            " (decode: 50 ms of generate() calls); median, interquartile range, and the verdict"
            " on the paired differences (95% distribution-free interval for their median)"
        ),
        (
            "- before = plain `torch.compile`; after = nn.Module guards skipped"
            " (`skip_guard_on_all_nn_modules_unsafe`), free tensors installed except for the"
            " eager/aot_eager backends; method and columns: docs/guards.md"
        ),
        "",
        *_table(rows),
        "",
        (
            "The whole call can drop by more than the isolated guard time: inside a real"
            " call the guards run with cold CPU caches (the profiler's `guard_in_call_us`"
            " cross-check, call time minus call time with guard evaluation skipped, is"
            " larger than the isolated figure), and with Inductor the installed free"
            " tensors also remove the per-call parameter look-ups."
        ),
        "",
    ]
    for row in rows:
        out.append(f"- **{row.model}**: {row.description}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"among {MODELS}")
    parser.add_argument("--device", default="cpu", help="cpu or ember")
    parser.add_argument(
        "--backend",
        default=None,
        help="torch.compile backend (default: inductor on cpu, eager elsewhere; guards are"
        " the same for every backend)",
    )
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=16, help="gpt2-decode tokens")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved whole-call rounds")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (tiny ops)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--markdown", metavar="PATH", help="write the report as Markdown")
    parser.add_argument("--check", action="store_true", help="exit 1 if the target is missed")
    opts = parser.parse_args(argv)
    if opts.backend is None:
        opts.backend = "inductor" if opts.device == "cpu" else "eager"
    names = [n.strip() for n in opts.models.split(",") if n.strip()]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose among {MODELS}")

    torch.set_num_threads(opts.threads)
    header = (
        f"device {opts.device}, backend {opts.backend!r}, {opts.threads} thread(s),"
        f" torch {torch.__version__}, python {platform.python_version()},"
        f" {platform.processor() or platform.machine()}"
    )
    print(header)
    rows = []
    for name in names:
        torch.manual_seed(0)
        torch._dynamo.reset()
        row = BUILDERS[name](opts)
        rows.append(row)
        print(
            f"{name}: guards {row.guards_before} -> {row.guards_after}, guard us/{row.unit}"
            f" {row.guard_us_before:.2f} -> {row.guard_us_after:.2f} (-{100 * row.cut:.1f}%),"
            f" whole {row.unit}: {row.whole.summary()}; identical: {row.identical}"
            f" ({row.compile_s:.0f} s)",
            flush=True,
        )
    print()
    print("\n".join(_table(rows)))
    ok = all(row.identical and row.cut >= TARGET_CUT for row in rows)
    print(f"\ntarget (guard time cut >= {100 * TARGET_CUT:.0f}%, identical outputs): {ok}")
    if opts.json:
        payload = {"header": header, "rounds": opts.rounds, "target_met": ok}
        payload["rows"] = [row.to_dict() for row in rows]
        with open(opts.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1)
    if opts.markdown:
        with open(opts.markdown, "w", encoding="utf-8") as f:
            f.write(_markdown(rows, opts, header))
    if opts.check and not ok:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
