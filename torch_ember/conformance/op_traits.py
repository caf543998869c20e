"""What the conformance kit knows about an op before running it: which ops
give random or uninitialized values (compared for structure only) and which
CPU results are not reproducible on CPU itself."""

from __future__ import annotations

import fnmatch

# Ops whose values are random: compared for type, device, dtype, shape and
# strides only. (With equal seeds ember's generators reproduce CPU's streams,
# so a values difference is still counted, as ``random_value_diffs``.)
RANDOM_OPS = (
    "bernoulli",
    "cauchy",
    "exponential",
    "geometric",
    "log_normal",
    "multinomial",
    "normal",
    "normal.*",
    "uniform",
    "rand*",
    "nn.functional.*dropout*",
    "nn.functional.rrelu",
    "nn.functional.fractional_max_pool*",
    "svd_lowrank",
    "pca_lowrank",
)
# Ops random only for samples with dropout: name -> predicate on the sample.
SOMETIMES_RANDOM_OPS = {
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
    "nn.functional.multi_head_attention_forward": lambda s: bool(s.kwargs.get("training")),
}
# Samples whose CPU result is not reproducible on CPU itself: compared with
# assert_close's default tolerances. linalg.lstsq's gelsy driver (CPU's
# default) gives results that depend on the prior contents of recycled memory
# (two results for the same input on CPU after different allocations).
IRREPRODUCIBLE_ON_CPU = {
    name: lambda s: s.kwargs.get("driver") in (None, "gelsy")
    for name in ("linalg.lstsq", "linalg.lstsq.grad_oriented")
}
# Ops that return uninitialized memory: structure only.
UNINITIALIZED_OPS = ("empty*", "new_empty*", "resize_", "resize_as_")
RANDOM_MODULES = ("nn.*Dropout*", "nn.RReLU", "nn.FractionalMaxPool*")


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def is_random_op(op) -> bool:
    return _matches(op.full_name, RANDOM_OPS) or _matches(op.name, RANDOM_OPS)


def _uninitialized(op) -> bool:
    return getattr(op, "has_nondeterministic_output", False) or _matches(
        op.full_name, UNINITIALIZED_OPS
    )


def values_compared(op) -> bool:
    """False for ops whose values are random or uninitialized."""
    if getattr(op, "has_nondeterministic_output", False):
        return False
    return not (is_random_op(op) or _matches(op.full_name, UNINITIALIZED_OPS))
