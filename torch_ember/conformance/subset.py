"""The fast subset: a fixed, representative slice of the sweep for ``make test``.

Every family the device must get right, at a few dtypes each and a bounded
number of samples per op-dtype-variant: ``python -m torch_ember.conformance
--subset`` runs it (about a minute on two cores).
"""

from __future__ import annotations

import torch

from .tasks import Registry, Task

# Op name -> family (the family is documentation: what the op stands for).
OPS = {
    # elementwise (unary, binary, ternary, type promotion)
    "add": "elementwise",
    "mul": "elementwise",
    "div.no_rounding_mode": "elementwise",
    "abs": "elementwise",
    "exp": "elementwise",
    "sigmoid": "elementwise",
    "clamp": "elementwise",
    "pow": "elementwise",
    "where": "elementwise",
    "eq": "elementwise",
    "lerp": "elementwise",
    "nn.functional.gelu": "elementwise",
    # reductions and scans
    "sum": "reduction",
    "mean": "reduction",
    "amax": "reduction",
    "argmax": "reduction",
    "prod": "reduction",
    "var": "reduction",
    "cumsum": "reduction",
    "logsumexp": "reduction",
    # linear algebra
    "mm": "linalg",
    "matmul": "linalg",
    "bmm": "linalg",
    "addmm": "linalg",
    "einsum": "linalg",
    "linalg.solve": "linalg",
    "linalg.cholesky": "linalg",
    # indexing
    "index_select": "indexing",
    "gather": "indexing",
    "scatter_add": "indexing",
    "index_put": "indexing",
    "masked_fill": "indexing",
    "__getitem__": "indexing",
    "nonzero": "indexing",
    "take_along_dim": "indexing",
    # views and layout
    "view": "view",
    "reshape": "view",
    "permute": "view",
    "transpose": "view",
    "expand": "view",
    "narrow": "view",
    "as_strided": "view",
    "unfold": "view",
    "diagonal": "view",
    "cat": "view",
    "contiguous": "view",
    # random
    "normal": "random",
    "bernoulli": "random",
    "randn": "random",
    "rand_like": "random",
    "multinomial": "random",
    "nn.functional.dropout": "random",
    # convolution and pooling
    "nn.functional.conv1d": "convolution",
    "nn.functional.conv2d": "convolution",
    "nn.functional.conv_transpose2d": "convolution",
    "nn.functional.max_pool2d": "convolution",
    "nn.functional.avg_pool2d": "convolution",
    # attention and normalization
    "nn.functional.scaled_dot_product_attention": "attention",
    "softmax": "attention",
    "nn.functional.layer_norm": "attention",
    "nn.functional.linear": "attention",
    "nn.functional.embedding": "attention",
    "nn.functional.cross_entropy": "attention",
    # sorting and selection
    "sort": "sorting",
    "argsort": "sorting",
    "topk": "sorting",
    "unique": "sorting",
    "kthvalue": "sorting",
    "searchsorted": "sorting",
    # complex
    "fft.fft": "complex",
    "fft.rfft": "complex",
    "view_as_real": "complex",
    "angle": "complex",
    # integer
    "bitwise_and": "integer",
    "remainder": "integer",
    "floor_divide": "integer",
    "gcd": "integer",
    # factories and conversion
    "arange": "factory",
    "full": "factory",
    "to": "factory",
}

# Forward runs at these dtypes (those the op supports on CPU); complex64 is
# what the complex family is about, int64 and bool cover integer paths.
DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64)
BACKWARD_DTYPES = (torch.float32, torch.complex64)
MODULES = (
    "nn.Linear",
    "nn.Conv2d",
    "nn.BatchNorm2d",
    "nn.LayerNorm",
    "nn.Embedding",
    "nn.LSTM",
    "nn.MultiheadAttention",
    "nn.TransformerEncoderLayer",
)
MODULE_DTYPES = (torch.float32,)
MAX_SAMPLES = 6


def tasks(registry: Registry) -> list[Task]:
    """The subset's tasks (ops missing from this PyTorch's op_db are skipped)."""
    names = [n for n in OPS if n in registry.ops]
    out = registry.tasks(("forward",), names, list(DTYPES))
    out += registry.tasks(("backward",), names, list(BACKWARD_DTYPES))
    modules = [n for n in MODULES if n in registry.modules]
    out += registry.tasks(("modules",), modules, list(MODULE_DTYPES))
    return out


def families() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, family in OPS.items():
        out.setdefault(family, []).append(name)
    return out


__all__ = ["DTYPES", "MAX_SAMPLES", "MODULES", "OPS", "families", "tasks"]
