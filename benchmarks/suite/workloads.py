"""The workloads: models built in-process from transformers configs, an MLP, GEMMs.

Every workload is one ``torch.nn.Module`` (eval mode, on CPU) that takes
positional tensors and returns a tuple of tensors, plus the inputs of one run
and a *driver*: ``driver(call, inputs)`` runs the workload once with ``call``
standing for the module as a system prepared it. For most workloads the driver
is ``call(*inputs)``; GPT-2 decode is a loop of greedy steps.

Weights are random (``torch.manual_seed``) and inputs come from seeded
generators, so every build is identical and nothing is downloaded. ``tiny=True``
builds the same workload at a toy size (for tests).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

Call = Callable[..., Sequence[torch.Tensor]]
Driver = Callable[[Call, tuple], tuple]


def _direct(call: Call, inputs: tuple) -> tuple:
    return tuple(call(*inputs))


@dataclass
class Workload:
    name: str
    title: str  # what it is, for the report
    module: torch.nn.Module  # CPU, eval; module(*inputs) -> tuple of tensors
    inputs: tuple  # one run's inputs (CPU tensors)
    driver: Driver = _direct
    dtype: torch.dtype = torch.float32
    rtol: float = 1e-3  # allowed max|out - ref| / max|ref|
    per_run: int = 1  # latency is reported per this many units ...
    unit: str = "run"  # ... of this name ("token" for decode)
    dynamic_shapes: Any = None  # torch.export spec for ``module``'s inputs, if any
    compare: Callable | None = None  # compare(ref, out, rtol) -> (max_abs, rel, note)
    notes: list[str] = field(default_factory=list)

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    @property
    def streamed_bytes(self) -> int:
        """Bytes of the parameters a run reads whole: each parameter once (tied
        ones once), except tables only an ``nn.Embedding`` uses (a lookup reads
        a row per token: Llama's untied token table, GPT-2's positions)."""
        lookups = {id(m.weight) for m in self.module.modules() if isinstance(m, torch.nn.Embedding)}
        for m in self.module.modules():
            if not isinstance(m, torch.nn.Embedding):
                lookups -= {id(p) for p in m.parameters(recurse=False)}
        return sum(
            p.numel() * p.element_size() for p in self.module.parameters() if id(p) not in lookups
        )


# --------------------------------------------------------------------------- helpers


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


class _Field(torch.nn.Module):
    """Calls a transformers model with one keyword input; returns one output field."""

    def __init__(self, model: torch.nn.Module, arg: str, field_name: str):
        super().__init__()
        self.model, self.arg, self.field_name = model, arg, field_name

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (getattr(self.model(**{self.arg: x}), self.field_name),)


# --------------------------------------------------------------------------- encoders, vision


def bert(batch: int, tiny: bool = False) -> Workload:
    tr = _quiet_transformers()
    if tiny:
        cfg = tr.BertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
        seq = 8
    else:
        cfg, seq = tr.BertConfig(), 128  # bert-base-uncased shape
    torch.manual_seed(0)
    model = tr.BertModel(cfg, add_pooling_layer=False).eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=_gen(1))
    return Workload(
        name=f"bert-b{batch}",
        title=f"BERT-base encoder, seq {seq}, batch {batch}",
        module=_Field(model, "input_ids", "last_hidden_state").eval(),
        inputs=(ids,),
    )


def vit(tiny: bool = False) -> Workload:
    tr = _quiet_transformers()
    if tiny:
        cfg = tr.ViTConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            image_size=32,
            patch_size=8,
        )
    else:
        cfg = tr.ViTConfig()  # vit-base-patch16-224
    torch.manual_seed(0)
    model = tr.ViTModel(cfg, add_pooling_layer=False).eval()
    size = cfg.image_size
    pixels = torch.randn(1, 3, size, size, generator=_gen(1))
    return Workload(
        name="vit-b1",
        title=f"ViT-base {size}x{size}, batch 1",
        module=_Field(model, "pixel_values", "last_hidden_state").eval(),
        inputs=(pixels,),
    )


def resnet(tiny: bool = False) -> Workload:
    tr = _quiet_transformers()
    if tiny:
        cfg, size = tr.ResNetConfig(embedding_size=8, hidden_sizes=[16, 32], depths=[1, 1]), 32
    else:
        cfg, size = tr.ResNetConfig(), 224  # the defaults are resnet-50
    cfg.num_labels = 1000
    torch.manual_seed(0)
    model = tr.ResNetForImageClassification(cfg).eval()
    pixels = torch.randn(1, 3, size, size, generator=_gen(1))
    return Workload(
        name="resnet50-b1",
        title=f"ResNet-50 {size}x{size}, batch 1 (1000 classes)",
        module=_Field(model, "pixel_values", "logits").eval(),
        inputs=(pixels,),
    )


# --------------------------------------------------------------------------- GPT-2


def _cat_layer_class():
    from transformers.cache_utils import DynamicLayer

    class CatLayer(DynamicLayer):
        """A DynamicLayer that starts from the first states instead of an empty tensor.

        transformers' own layer concatenates onto ``torch.tensor([])``, a 1-d
        empty tensor that the OpenVINO converter cannot concatenate along
        dim -2. The values are the same.
        """

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.dtype, self.device = key_states.dtype, key_states.device
                self.keys, self.values = key_states, value_states
                self.is_initialized = True
            else:
                self.keys = torch.cat([self.keys, key_states], dim=-2)
                self.values = torch.cat([self.values, value_states], dim=-2)
            return self.keys, self.values

    return CatLayer


# Made once, when a GPT-2 workload is built: a class made per call would fail
# torch.compile's guards on every call.
_CAT_LAYER: type | None = None


def _cache(config, flat: Sequence[torch.Tensor] = ()):
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    cache.layers = [_CAT_LAYER() for _ in range(config.num_hidden_layers)]
    for i in range(len(flat) // 2):
        cache.layers[i].update(flat[2 * i], flat[2 * i + 1])
    return cache


def _flat(cache) -> tuple[torch.Tensor, ...]:
    return tuple(t for layer in cache.layers for t in (layer.keys, layer.values))


class GPT2Prefill(torch.nn.Module):
    """input_ids -> (logits of the last position, k0, v0, k1, v1, ...), as generate() does."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cache = _cache(self.model.config)
        out = self.model(input_ids=input_ids, past_key_values=cache, logits_to_keep=1)
        return (out.logits[:, -1],) + _flat(out.past_key_values)


class GPT2Step(torch.nn.Module):
    """One decode step: (token [b,1], k0, v0, ...) -> (logits [b,vocab], k0', v0', ...)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, token: torch.Tensor, *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cache = _cache(self.model.config, flat)
        out = self.model(input_ids=token, past_key_values=cache)
        return (out.logits[:, -1],) + _flat(out.past_key_values)


def _gpt2(tiny: bool, dtype: torch.dtype = torch.float32):
    global _CAT_LAYER
    tr = _quiet_transformers()
    if _CAT_LAYER is None:
        _CAT_LAYER = _cat_layer_class()
    if tiny:
        cfg = tr.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
        prompt, steps = 8, 4
    else:
        cfg, prompt, steps = tr.GPT2Config(), 128, 32  # gpt2 (small, 124M)
    torch.manual_seed(0)
    model = tr.GPT2LMHeadModel(cfg).eval().to(dtype)
    ids = torch.randint(0, cfg.vocab_size, (1, prompt), generator=_gen(1))
    return model, ids, steps


def gpt2_prefill(tiny: bool = False) -> Workload:
    model, ids, _ = _gpt2(tiny)
    return Workload(
        name="gpt2-prefill",
        title=f"GPT-2 small prefill, {ids.shape[1]} tokens (KV cache out, last logits)",
        module=GPT2Prefill(model).eval(),
        inputs=(ids,),
    )


def _greedy(steps: int) -> Driver:
    def drive(call: Call, inputs: tuple) -> tuple:
        token, kv = inputs[0], tuple(inputs[1:])
        tokens, logits = [], []
        for _ in range(steps):
            out = call(token, *kv)
            kv = tuple(out[1:])
            logits.append(out[0])
            token = out[0].argmax(-1, keepdim=True)
            tokens.append(token)
        return (torch.cat(tokens, dim=1), *logits)

    return drive


def _compare_greedy(ref: tuple, out: tuple, rtol: float) -> tuple[float, float, str]:
    """Tokens must agree; where they first differ, that step's logits decide.

    The logits of step k are computed from identical inputs up to the first
    token that differs, so steps 0..k are comparable; a token that differs
    while its logits agree within tolerance is a near-tie, not an error.
    """
    ref_tok, out_tok = ref[0].cpu().reshape(-1), out[0].cpu().reshape(-1)
    differ = (ref_tok != out_tok).nonzero()
    last = int(differ[0]) if len(differ) else len(ref_tok) - 1
    scale = max(float(t.abs().max()) for t in ref[1 : last + 2]) or 1.0
    diff = max(
        float((o.cpu().float() - r.float()).abs().max())
        for r, o in zip(ref[1 : last + 2], out[1 : last + 2])
    )
    rel = diff / scale
    note = ""
    if len(differ):  # a near-tie only where that step's logits agree within tolerance
        note = f"tokens diverge at step {last}" + (" (near-tie)" if rel <= rtol else "")
    return diff, rel, note


def _decode(name: str, title: str, model, ids, steps: int, max_positions: int, **kw) -> Workload:
    """Greedy decode from the KV cache of a prefill of ``ids``: ``steps`` tokens a run."""
    with torch.inference_mode():
        first = GPT2Prefill(model)(ids)
    token = first[0].argmax(-1, keepdim=True)
    kv = tuple(t.clone() for t in first[1:])
    past = torch.export.Dim("past", min=1, max=max_positions - 1)
    return Workload(
        name=name,
        title=f"{title}, {steps} steps after a {ids.shape[1]}-token prefill",
        module=GPT2Step(model).eval(),
        inputs=(token, *kv),
        driver=_greedy(steps),
        per_run=steps,
        unit="token",
        dynamic_shapes=(None, tuple({2: past} for _ in kv)),
        compare=_compare_greedy,
        notes=["KV cache grows by concatenation (transformers' DynamicCache semantics)"],
        **kw,
    )


def gpt2_decode(tiny: bool = False, dtype: torch.dtype = torch.float32) -> Workload:
    model, ids, steps = _gpt2(tiny, dtype)
    bf16 = dtype == torch.bfloat16
    return _decode(
        "gpt2-decode-bf16" if bf16 else "gpt2-decode",
        f"GPT-2 small greedy decode{', bf16 weights' if bf16 else ''}",
        model,
        ids,
        steps,
        model.config.n_positions,
        dtype=dtype,
        rtol=2e-2 if bf16 else 1e-3,
    )


def _llama(tiny: bool):
    global _CAT_LAYER
    tr = _quiet_transformers()
    if _CAT_LAYER is None:
        _CAT_LAYER = _cat_layer_class()
    common = {"rope_theta": 10000.0, "tie_word_embeddings": False}
    if tiny:
        cfg = tr.LlamaConfig(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **common,
        )  # fmt: skip
        prompt, steps = 8, 4
    else:
        # The Llama architecture (grouped-query attention, RMSNorm, rotary
        # embeddings, SwiGLU) at GPT-2 small's size: 12 layers of width 768,
        # 4 key/value heads for 12 query heads, a 32000-token vocabulary.
        cfg = tr.LlamaConfig(
            vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
            num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=1024, **common,
        )  # fmt: skip
        prompt, steps = 128, 32
    torch.manual_seed(0)
    model = tr.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, prompt), generator=_gen(1))
    return model, ids, steps


def llama_decode(tiny: bool = False) -> Workload:
    model, ids, steps = _llama(tiny)
    return _decode(
        "llama-decode",
        "Llama-architecture greedy decode (GQA, RMSNorm, rotary, SwiGLU)",
        model,
        ids,
        steps,
        model.config.max_position_embeddings,
        rtol=1e-3,
    )


# --------------------------------------------------------------------------- MLP, GEMM


def mlp(tiny: bool = False) -> Workload:
    width = 16 if tiny else 256
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for i in range(4):
        layers.append(torch.nn.Linear(width, width))
        if i < 3:
            layers.append(torch.nn.ReLU())
    seq = torch.nn.Sequential(*layers).eval()

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = seq

        def forward(self, x):
            return (self.net(x),)

    return Workload(
        name="mlp-b1",
        title=f"MLP, 4 linear layers of width {width} (ReLU), batch 1",
        module=MLP().eval(),
        inputs=(torch.randn(1, width, generator=_gen(1)),),
    )


class MatMul(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor]:
        return (a @ b,)


def gemm(dtype: torch.dtype, tiny: bool = False) -> Workload:
    n = 64 if tiny else 2048
    short = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    a = torch.randn(n, n, generator=_gen(1)).to(dtype)
    b = torch.randn(n, n, generator=_gen(2)).to(dtype)
    return Workload(
        name=f"gemm-{short}",
        title=f"GEMM {n}x{n} @ {n}x{n}, {short}",
        module=MatMul().eval(),
        inputs=(a, b),
        dtype=dtype,
        rtol=2e-2 if dtype == torch.bfloat16 else 1e-4,
    )


class _Linear(torch.nn.Module):
    def __init__(self, k: int, n: int):
        super().__init__()
        self.linear = torch.nn.Linear(k, n)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.linear(x),)


def linear_shape(m: int, k: int, n: int) -> Workload:
    """One transformer-shaped Linear (bias), x [m, k] -> [m, n], fp32."""
    torch.manual_seed(0)
    return Workload(
        name=f"linear-{m}x{k}x{n}",
        title=f"Linear {k} -> {n} (bias) on {m} rows, fp32",
        module=_Linear(k, n).eval(),
        inputs=(torch.randn(m, k, generator=_gen(1)),),
        rtol=1e-4,
    )


# Issue 10's transformer GEMM shapes (M rows; K, N in 768..3072): BERT/GPT-2
# base's four linears (qkv 768->2304, out 768->768, up 768->3072, down 3072->768).
LINEAR_SHAPES: dict[str, tuple[int, int, int]] = {
    f"linear-{m}x{k}x{n}": (m, k, n)
    for m in (128, 512, 1024)
    for k, n in ((768, 768), (768, 2304), (768, 3072), (3072, 768))
}


# --------------------------------------------------------------------------- registry

WORKLOADS: dict[str, Callable[[bool], Workload]] = {
    "mlp-b1": mlp,
    "gemm-fp32": lambda tiny=False: gemm(torch.float32, tiny),
    "gemm-bf16": lambda tiny=False: gemm(torch.bfloat16, tiny),
    "bert-b1": lambda tiny=False: bert(1, tiny),
    "bert-b8": lambda tiny=False: bert(8, tiny),
    "gpt2-prefill": gpt2_prefill,
    "gpt2-decode": gpt2_decode,
    "gpt2-decode-bf16": lambda tiny=False: gpt2_decode(tiny, torch.bfloat16),
    "llama-decode": llama_decode,
    "vit-b1": vit,
    "resnet50-b1": resnet,
}

# ``--quick``: the latency-bound case, both GEMMs, one encoder, one LLM phase each.
QUICK = ["mlp-b1", "gemm-fp32", "gemm-bf16", "bert-b1", "gpt2-prefill", "gpt2-decode"]


def default_names(quick: bool = False, bf16: bool = True) -> list[str]:
    """The workloads a run takes when none are named. ``bf16=False`` (a CPU
    without bf16 instructions, ``peak.native_bf16()``) leaves the bf16 ones
    out: every system's bf16 GEMMs run scalar code there, hours for no insight."""
    return [n for n in (QUICK if quick else WORKLOADS) if bf16 or "bf16" not in n]


def build(name: str, tiny: bool = False) -> Workload:
    if name in LINEAR_SHAPES:
        m, k, n = LINEAR_SHAPES[name]
        return linear_shape(8, 16, 24) if tiny else linear_shape(m, k, n)
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return WORKLOADS[name](tiny)
