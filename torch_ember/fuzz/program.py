"""Seeded random programs: op sequences run on ember and on CPU.

A program is Python source: lines that create tensors with :func:`make`
(seeded data, any dtype, zero-size dims, transposed or strided layouts,
signed zeros / infinities / NaNs) and then apply ops to them -- views,
in-place ops (also through views), ``out=``, broadcasting, dtype promotion,
reductions, indexing and, in autograd programs, a backward pass at the end.
Every line names its device ``D``, so the same text runs on both devices and
prints as a standalone reproducer.

Generation runs each candidate line on CPU and keeps only lines CPU accepts:
a program is always valid on CPU; what ember does with it is the test.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, field

import torch

FLOAT_DTYPES = ("torch.float32", "torch.float64", "torch.bfloat16")
INT_DTYPES = ("torch.int64", "torch.int32", "torch.uint8")
DTYPES = FLOAT_DTYPES * 3 + INT_DTYPES + ("torch.bool",)
LAYOUTS = ("contiguous", "contiguous", "transposed", "strided")
SPECIALS = (0.0, -0.0, float("inf"), float("-inf"), float("nan"))


def make(shape, dtype, seed, layout, special, device, requires_grad=False):
    """Seeded tensor data on ``device``: ``layout`` "transposed" (last two
    dims swapped in memory) or "strided" (every other element of the last
    dim); ``special`` writes 0.0, -0.0, +-inf and NaN into a few elements."""
    g = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    stored = shape
    if layout == "transposed" and len(shape) >= 2:
        stored = shape[:-2] + (shape[-1], shape[-2])
    elif layout == "strided" and len(shape) >= 1:
        stored = shape[:-1] + (shape[-1] * 2,)
    if dtype.is_floating_point:
        data = (torch.randn(stored, generator=g, dtype=torch.float64) * 3).to(dtype)
        if special and data.numel():
            flat = data.view(-1)
            where = torch.randint(0, flat.numel(), (min(5, flat.numel()),), generator=g)
            for index, value in zip(
                where.tolist(), (0.0, -0.0, float("inf"), float("-inf"), float("nan"))
            ):
                flat[index] = value
    elif dtype == torch.bool:
        data = torch.randint(0, 2, stored, generator=g).bool()
    else:
        low = 0 if dtype == torch.uint8 else -9
        data = torch.randint(low, 10, stored, generator=g).to(dtype)
    data = data.to(device)
    if layout == "transposed" and len(shape) >= 2:
        data = data.transpose(-1, -2)
    elif layout == "strided" and len(shape) >= 1:
        data = data[..., ::2]
    if requires_grad:
        data.requires_grad_(True)
    return data


@dataclass
class Program:
    seed: int
    autograd: bool
    lines: list[str] = field(default_factory=list)

    def source(self) -> str:
        return "\n".join(self.lines)


def _shape(rng: random.Random) -> tuple[int, ...]:
    rank = rng.choice((0, 1, 1, 2, 2, 2, 3, 3, 4))
    sizes = (0, 1, 1, 2, 3, 3, 4, 5, 7, 8, 16)
    return tuple(
        rng.choice(sizes) if rng.random() < 0.9 else rng.choice((1, 2)) for _ in range(rank)
    )


def _broadcastable(rng: random.Random, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with ``shape``: trailing dims kept or set to 1."""
    keep = rng.randint(0, len(shape))
    tail = shape[len(shape) - keep :]
    out = tuple(1 if rng.random() < 0.3 else s for s in tail)
    if rng.random() < 0.15:
        out = (1,) + out  # one more leading dim
    return out


def _dim(rng, t) -> int:
    return rng.randrange(-t.dim(), t.dim()) if t.dim() else 0


def _vars(env, predicate=lambda t: True):
    return [n for n, v in env.items() if isinstance(v, torch.Tensor) and predicate(v)]


def _float(t):
    return t.is_floating_point()


UNARY = (
    "torch.neg({a})",
    "torch.abs({a})",
    "torch.exp({a})",
    "torch.log({a})",
    "torch.sin({a})",
    "torch.tanh({a})",
    "torch.sigmoid({a})",
    "torch.relu({a})",
    "torch.sqrt({a})",
    "torch.floor({a})",
    "torch.sign({a})",
    "torch.clamp({a}, min=-0.5, max=0.5)",
    "torch.nn.functional.gelu({a})",
    "torch.nn.functional.silu({a})",
    "torch.reciprocal({a})",
    "torch.square({a})",
    "torch.isnan({a})",
    "torch.nan_to_num({a})",
    "{a}.to(torch.float32)",
    "{a}.to(torch.int64)",
    "{a}.to(torch.bool)",
    "{a}.to(torch.float64)",
    "{a}.clone()",
    "{a}.contiguous()",
)
DIM_OPS = (
    "torch.softmax({a}, {d})",
    "torch.log_softmax({a}, {d})",
    "torch.cumsum({a}, {d})",
    "torch.sum({a}, {d})",
    "torch.sum({a}, {d}, keepdim=True)",
    "torch.mean({a}, {d})",
    "torch.amax({a}, {d})",
    "torch.argmax({a}, {d})",
    "torch.var({a}, {d})",
    "torch.sort({a}, {d}, stable=True)[0]",
    "torch.sort({a}, {d}, stable=True)[1]",
    "torch.flip({a}, ({d},))",
    "torch.roll({a}, 1, {d})",
    "torch.prod({a}, {d})",
    "torch.linalg.vector_norm({a}, dim={d})",
    "torch.logsumexp({a}, {d})",
    "torch.any({a}, {d})",
    "torch.cummax({a}, {d})[0]",
)
FULL_REDUCTIONS = ("{a}.sum()", "{a}.mean()", "{a}.amax()", "{a}.norm()", "{a}.all()", "{a}.std()")
BINARY = (
    "torch.add({a}, {b})",
    "torch.add({a}, {b}, alpha=2)",
    "torch.sub({a}, {b})",
    "torch.mul({a}, {b})",
    "torch.div({a}, {b})",
    "torch.maximum({a}, {b})",
    "torch.minimum({a}, {b})",
    "torch.pow({a}, {b})",
    "torch.atan2({a}, {b})",
    "torch.eq({a}, {b})",
    "torch.lt({a}, {b})",
    "torch.remainder({a}, {b})",
    "torch.bitwise_and({a}, {b})",
    "torch.where({a} > 0, {a}, {b})",
    "{a} * 0.5 + {b}",
    "torch.floor_divide({a}, {b})",
    "torch.hypot({a}, {b})",
    "torch.copysign({a}, {b})",
)
VIEWS = (
    "{a}.t()",
    "{a}.transpose(0, -1)",
    "{a}.reshape(-1)",
    "{a}.view(-1)",
    "{a}.unsqueeze({d})",
    "{a}.squeeze()",
    "{a}.narrow({d}, 0, 1)",
    "{a}[..., ::2]",
    "{a}.select({d}, 0)",
    "{a}.diagonal()",
    "{a}.permute(*reversed(range({a}.dim())))",
    "{a}.flatten()",
    "{a}.expand(2, *{a}.shape)",
    "{a}.movedim(0, -1)",
    "{a}.unflatten(-1, (1, -1))",
    "{a}.real",
    "{a}[1:]",
)
INPLACE = (
    "{a}.add_({b})",
    "{a}.mul_({b})",
    "{a}.clamp_(-1, 1)",
    "{a}.zero_()",
    "{a}.fill_(-0.0)",
    "{a}.copy_({b})",
    "{a}.masked_fill_({a} > 0, 7)",
    "{a}.relu_()",
    "{a}.neg_()",
    "{a}.div_({b})",
    "{a}.sub_({b}, alpha=3)",
    "{a}.abs_()",
    "{a}.sqrt_()",
    "{a}.exp_()",
)
OUT = (
    "torch.add({a}, {b}, out=torch.empty(0, dtype=torch.result_type({a}, {b}), device=D))",
    "torch.mul({a}, {b}, out=torch.empty(0, dtype=torch.result_type({a}, {b}), device=D))",
    "torch.neg({a}, out=torch.empty_like({a}))",
    "torch.sum({a}, {d}, out=torch.empty(0, dtype={a}.dtype, device=D))",
    "torch.cat([{a}, {a}], {d}, out=torch.empty(0, dtype={a}.dtype, device=D))",
    "torch.exp({a}, out=torch.empty(3, dtype={a}.dtype, device=D))",
)
OTHER = (
    "torch.cat([{a}, {b}], {d})",
    "torch.stack([{a}, {a}.clone()], {d})",
    "torch.matmul({a}, {a}.transpose(-1, -2))",
    "{a} @ {a}.t()",
    "torch.index_select({a}, {d}, torch.tensor([0, 0, 1], device=D) % max({a}.shape[{d}], 1))",
    "torch.masked_select({a}, {a} > 0)",
    "torch.nonzero({a})",
    "torch.where({a} > 0)[0]",
    "torch.gather({a}, {d}, torch.zeros_like({a}, dtype=torch.int64))",
    "torch.tril({a})",
    "torch.outer({a}.flatten()[:4], {a}.flatten()[:3])",
    "torch.einsum('...i,...i->...', {a}, {a})",
    "torch.topk({a}, 1, {d})[0]",
    "torch.unique({a}, sorted=True)",
    "torch.bincount({a}.flatten().to(torch.int64).abs() % 64)",
    "torch.nn.functional.layer_norm({a}, {a}.shape[-1:])",
    "torch.addcmul({a}, {a}, {a}, value=0.5)",
)
# Reductions inside a product are kept to OpInfo's sample sizes, for which
# its tolerances hold: a 768-term fp32 dot product rounds differently in
# oneDNN and MKL by more than float32's default rtol (not a kernel bug).
GEMMS = ("matmul", "@", "einsum", "addcmul")
MAX_INNER = 32
KINDS = (
    (UNARY, 4),
    (DIM_OPS, 4),
    (FULL_REDUCTIONS, 1),
    (BINARY, 5),
    (VIEWS, 4),
    (INPLACE, 3),
    (OUT, 2),
    (OTHER, 3),
)


def _pick_template(rng: random.Random) -> tuple[str, tuple]:
    population = [kind for kind, weight in KINDS for _ in range(weight)]
    kind = rng.choice(population)
    return rng.choice(kind), kind


def _execute(lines: list[str], device: str) -> dict:
    env: dict = {"torch": torch, "make": make, "D": device}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for line in lines:
            exec(line, env)  # noqa: S102 - the program is ours, generated just above
    return env


def generate(seed: int, max_lines: int = 14) -> Program:
    """The program of ``seed``: a few tensors, then up to ``max_lines`` ops
    that CPU accepts."""
    rng = random.Random(seed)
    program = Program(seed=seed, autograd=rng.random() < 0.25)
    for index in range(rng.randint(1, 3)):
        dtype = "torch.float32" if program.autograd else rng.choice(DTYPES)
        grad = program.autograd and rng.random() < 0.8
        special = not program.autograd and rng.random() < 0.3
        program.lines.append(
            f"v{index} = make({_shape(rng)}, {dtype}, {rng.randrange(10**6)}, "
            f"{rng.choice(LAYOUTS)!r}, {special}, D{', requires_grad=True' if grad else ''})"
        )
    env = _execute(program.lines, "cpu")
    count = len(program.lines)
    attempts = 0
    while len(program.lines) < count + max_lines and attempts < 4 * max_lines:
        attempts += 1
        template, kind = _pick_template(rng)
        names = _vars(env)
        a = rng.choice(names)
        others = [n for n in names if n != a] or [a]
        b = rng.choice(others)
        t = env[a]
        if kind is BINARY and rng.random() < 0.4:
            # A fresh broadcastable operand, often of another dtype (promotion).
            name = f"v{count}"
            dtype = rng.choice(DTYPES) if rng.random() < 0.5 else str(t.dtype)
            creation = (
                f"{name} = make({_broadcastable(rng, tuple(t.shape))}, {dtype}, "
                f"{rng.randrange(10**6)}, {rng.choice(LAYOUTS)!r}, False, D)"
            )
            if _try(program, env, creation):
                count += 1
                b = name
        if any(g in template for g in GEMMS) and t.dim() and t.shape[-1] > MAX_INNER:
            continue
        expr = template.format(a=a, b=b, d=_dim(rng, t))
        if kind is INPLACE:
            line = expr
        else:
            line = f"v{count} = {expr}"
        if _try(program, env, line) and kind is not INPLACE:
            count += 1
    if program.autograd:
        for line in _backward_lines(env):
            if not _try(program, env, line):
                break
    return program


# Larger results are refused: programs stay small (and a fuzz run's memory
# bounded; a data-dependent size such as bincount's could ask for gigabytes).
MAX_NUMEL = 1 << 16


def _too_big(env: dict) -> bool:
    return any(v.numel() > MAX_NUMEL for v in env.values() if isinstance(v, torch.Tensor))


def _try(program: Program, env: dict, line: str) -> bool:
    """Runs ``line`` on the CPU environment; keeps it if CPU accepts it (and
    its result stays small)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            exec(line, env)  # noqa: S102
            if _too_big(env):
                raise MemoryError(f"a result above {MAX_NUMEL} elements")
        except Exception:  # noqa: BLE001 - CPU refused: not a valid program line
            # A refused in-place op may have written part of its output: start over.
            env.clear()
            env.update(_execute(program.lines, "cpu"))
            return False
    program.lines.append(line)
    return True


def _backward_lines(env: dict) -> list[str]:
    leaves = [n for n in _vars(env, lambda t: t.requires_grad and t.is_leaf)]
    outputs = [n for n in _vars(env, lambda t: t.requires_grad and _float(t))]
    if not leaves or not outputs:
        return []
    loss = " + ".join(f"{n}.float().sum()" for n in outputs)
    return [
        f"loss = {loss}",
        f"grads = torch.autograd.grad(loss, [{', '.join(leaves)}], allow_unused=True)",
    ]
