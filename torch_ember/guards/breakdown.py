"""Guard time of one cache entry broken down by guard kind and by source.

Dynamo's guard tree cannot be timed leaf guard by leaf guard (pybind11 gives
no way to drop one leaf guard), only node by node through pruned copies
(``clone_manager``). So the entry's time is *peeled*: nodes are removed from
the tree in steps, deepest first (a node only after everything below it), and
each step's cost is the time of the tree before the step minus the time
after it. The steps form a chain from the full tree down to an empty root
manager, so their costs add up to the entry's guard time exactly (the
telescoping sum of the chain). Each single step is a difference of two
noisy measurements; since removing guards never makes a check slower, the
chain is replaced by its closest non-increasing fit (ends held fixed) before
the differences are taken, so no step comes out negative.

A step removes the nodes of one height that share a *source group* and a
*signature* (their set of leaf-guard kinds); its cost is:

* by kind: counted under the node's principal leaf-guard kind
  (:data:`KIND_PRIORITY`: a tensor node's TENSOR_MATCH, not the
  NO_TENSOR_ALIASING and DIMENSION_DYNAMIC_MARKING_GUARD riding on it), or
  ``ACCESSOR`` for nodes without leaf guards (only the lookup of a value);
  the root's own guards (GLOBAL_STATE, ...) are the last step, and whatever
  the pruned copies lose against the original tree (e.g. the epilogue
  guards) the first;
* by source group: :data:`SOURCE_GROUPS`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .timing import GuardTimer
from .tree import GuardNode, clone_keeping

# Order in which a node's leaf-guard kinds name the node: the check that does
# the work first, the cheap companions last.
KIND_PRIORITY = (
    "TENSOR_MATCH",
    "LAMBDA_GUARD",
    "SYMBOLIC_SHAPE_GUARD",
    "DICT_VERSION",
    "MAPPING_KEYS_MATCH",
    "DICT_CONTAINS",
    "EQUALS_MATCH",
    "ID_MATCH",
    "TYPE_MATCH",
    "LENGTH_CHECK",
    "DICT_LENGTH",
    "NO_HASATTR",
    "NONE_MATCH",
    "NOT_NONE",
    "TRUE_MATCH",
    "FALSE_MATCH",
)

INPUTS = "inputs"  # frame locals that are not modules: L['x'], L['kwargs'][...]
MODULE_TREE = "module tree"  # nn.Modules and everything below them
GLOBALS = "globals"  # G[...] and below
GLOBAL_STATE = "global state"  # the root's own guards: grad mode, autocast, ...
NOT_CLONED = "not in pruned copies"  # epilogue guards the clones do not keep
SOURCE_GROUPS = (INPUTS, MODULE_TREE, GLOBALS, GLOBAL_STATE, NOT_CLONED)
ACCESSOR = "ACCESSOR"


@dataclasses.dataclass
class Breakdown:
    """Per-kind and per-source guard time of one entry (us per check)."""

    by_kind: dict[str, float]
    by_source: dict[str, float]
    guards_by_source: dict[str, int]
    steps: int  # measurements in the chain (each a difference of two)

    @property
    def total_us(self) -> float:
        return sum(self.by_kind.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "by_kind_us": {k: round(v, 4) for k, v in _sorted(self.by_kind).items()},
            "by_source_us": {k: round(v, 4) for k, v in _sorted(self.by_source).items()},
            "guards_by_source": self.guards_by_source,
            "steps": self.steps,
        }


def _sorted(values: dict[str, float]) -> dict[str, float]:
    return dict(sorted(values.items(), key=lambda kv: -kv[1]))


def principal_kind(node: GuardNode) -> str:
    kinds = {kind for kind, _ in node.leaves}
    for kind in KIND_PRIORITY:
        if kind in kinds:
            return kind
    return min(kinds) if kinds else ACCESSOR


def _groups(tree: GuardNode) -> dict[int, str]:
    """id(node) -> source group, for every node below the root."""
    out: dict[int, str] = {}

    def visit(node: GuardNode, group: str) -> None:
        if group == INPUTS and node.is_module:
            group = MODULE_TREE
        out[id(node)] = group
        for child in node.children:
            visit(child, group)

    for child in tree.children:
        top = GLOBALS if child.source.startswith("G") else INPUTS
        visit(child, top)
    return out


def _heights(tree: GuardNode) -> dict[int, int]:
    out: dict[int, int] = {}

    def visit(node: GuardNode) -> int:
        height = 1 + max((visit(c) for c in node.children), default=-1)
        out[id(node)] = height
        return height

    visit(tree)
    return out


def peel(
    root: Any, tree: GuardNode, timer: GuardTimer, raw_us: float, *, passes: int = 2
) -> Breakdown:
    """Peels ``tree`` (the copy of ``root``) as described in the module doc.

    ``raw_us``: the already measured time of checking ``root`` (overhead
    included), the top of the chain; its bottom is ``timer.overhead_us``."""
    groups = _groups(tree)
    heights = _heights(tree)
    # A source can name several nodes (dict key and value managers): it goes
    # with the step of its highest node, whose removal drops the others.
    step_of_source: dict[str, tuple[int, str, str]] = {}
    kind_of_step: dict[tuple[int, str, str], str] = {}
    guards_by_source: dict[str, int] = {}
    for node in tree.walk():
        if node is tree:
            continue
        group = groups[id(node)]
        guards_by_source[group] = guards_by_source.get(group, 0) + len(node.leaves)
        signature = "+".join(sorted({kind for kind, _ in node.leaves})) or ACCESSOR
        step = (heights[id(node)], group, signature)
        previous = step_of_source.get(node.source)
        if previous is None or step[0] > previous[0]:
            step_of_source[node.source] = step
        kind_of_step.setdefault(step, principal_kind(node))
    root_kinds = [kind for kind, _ in tree.leaves if not kind.startswith("EPILOGUE_")]
    epilogue = [kind for kind, _ in tree.leaves if kind.startswith("EPILOGUE_")]
    if root_kinds:
        guards_by_source[GLOBAL_STATE] = len(root_kinds)
    if epilogue:
        guards_by_source[NOT_CLONED] = len(epilogue)

    by_kind: dict[str, float] = {}
    by_source: dict[str, float] = {}

    def add(kind: str, group: str, cost: float) -> None:
        by_kind[kind] = by_kind.get(kind, 0.0) + cost
        by_source[group] = by_source.get(group, 0.0) + cost

    # The chain of measurements, top (the whole tree) to bottom (the empty
    # root); each step's cost is the drop from one link to the next.
    copies: list[Any] = []
    labels: list[tuple[str, str]] = []
    if epilogue:
        # Pruned copies lose the epilogue guards: the first step is the copy.
        copies.append(clone_keeping(root, lambda source: True))
        labels.append((epilogue[0][len("EPILOGUE_") :], NOT_CLONED))
    removed: set[str] = set()
    for step in sorted(set(step_of_source.values())):
        removed.update(s for s, st in step_of_source.items() if st == step)
        gone = frozenset(removed)
        copies.append(clone_keeping(root, lambda source, gone=gone: source not in gone))
        labels.append((kind_of_step[step], step[1]))
    # Each link is the minimum over ``passes`` sweeps down the chain (spread
    # in time, so one burst of load does not hit a link twice):
    # interference only ever makes a measurement slower.
    links = [float("inf")] * len(copies)
    for _ in range(max(1, passes)):
        for index, copy in enumerate(copies):
            links[index] = min(links[index], timer.raw_us(copy))
    chain = [raw_us, *links]
    chain.append(timer.overhead_us)
    root_kind = principal_kind(GuardNode("", "", "", "", False, [(k, "") for k in root_kinds]))
    labels.append((root_kind if root_kinds else ACCESSOR, GLOBAL_STATE))
    # Removing guards never makes a check slower: noise that does is taken
    # out by the closest non-increasing fit, with both ends held fixed.
    fitted = non_increasing_fit(chain, pinned_ends=True)
    for (kind, group), upper, lower in zip(labels, fitted, fitted[1:]):
        add(kind, group, upper - lower)
    return Breakdown(by_kind, by_source, guards_by_source, len(labels))


def non_increasing_fit(values: list[float], *, pinned_ends: bool = False) -> list[float]:
    """Least-squares non-increasing sequence closest to ``values`` (pool
    adjacent violators). ``pinned_ends``: the first and last value stay as
    they are (they carry an overwhelming weight)."""
    heavy = 1e12
    blocks: list[list[float]] = []  # [mean, weight, length]
    for index, value in enumerate(values):
        end = index in (0, len(values) - 1)
        blocks.append([value, heavy if pinned_ends and end else 1.0, 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            mean_b, weight_b, len_b = blocks.pop()
            mean_a, weight_a, len_a = blocks.pop()
            weight = weight_a + weight_b
            blocks.append([(mean_a * weight_a + mean_b * weight_b) / weight, weight, len_a + len_b])
    out: list[float] = []
    for mean, _, length in blocks:
        out.extend([mean] * length)
    return out
