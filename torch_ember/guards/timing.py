"""Timing of guard checks, with the measuring cost taken out.

A guard check is timed by calling ``RootGuardManager.check(f_locals)`` in a
tight loop on the frame locals of a real call. That loop pays for more than
the guards: the Python loop, the pybind11 call and the conversion of the
locals dict. :class:`GuardTimer` measures that cost once, on an *empty*
``RootGuardManager`` with the same locals, reports it as the profiler's
overhead and subtracts it from every figure.

Each figure is the minimum over several batches of the mean per-check time in
a batch (batches sized to last about a millisecond), which is stable on a
busy machine: interference only ever makes a batch slower.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any

from torch._C._dynamo.guards import RootGuardManager

from .tree import GuardNode, clone_keeping, module_sources, parents, path_to, sources_of


def time_per_call_ns(
    fn: Callable[[], Any], *, batch_s: float = 0.001, repeats: int = 5, max_n: int = 1 << 20
) -> float:
    """Minimum over ``repeats`` batches of the mean time of one ``fn()`` call, in ns."""
    n = 1
    while True:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter_ns() - t0
        if elapsed >= batch_s * 1e9 or n >= max_n:
            break
        n *= 4 if elapsed < batch_s * 1e8 else 2
    best = elapsed / n
    for _ in range(repeats - 1):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def loop_overhead_ns() -> float:
    """Cost of the timing loop itself around a call of a Python no-op."""
    return time_per_call_ns(_noop, batch_s=0.002)


def _noop() -> None:
    return None


class GuardTimer:
    """Times guard managers on one set of frame locals.

    ``overhead_us`` is the cost of checking an empty guard manager: what the
    measuring adds to a check (loop, pybind11 call, locals conversion). It is
    subtracted from every figure returned by :meth:`time_us`.
    """

    def __init__(self, f_locals: dict[str, Any], *, batch_s: float = 0.001, repeats: int = 5):
        self.f_locals = f_locals
        self.batch_s = batch_s
        self.repeats = repeats
        self.measurements = 0
        self.overhead_us = self.raw_us(RootGuardManager())

    def raw_us(self, root: Any) -> float:
        check = root.check
        f_locals = self.f_locals
        self.measurements += 1
        ns = time_per_call_ns(lambda: check(f_locals), batch_s=self.batch_s, repeats=self.repeats)
        return ns / 1000.0

    def time_us(self, root: Any) -> float:
        """Guard-evaluation time of ``root`` per check, overhead excluded."""
        return max(0.0, self.raw_us(root) - self.overhead_us)


def time_subtrees(
    root: Any,
    tree: GuardNode,
    timer: GuardTimer,
    *,
    budget: int = 48,
    min_share: float = 0.04,
) -> int:
    """Fills ``time_us`` of the most expensive subtrees of ``tree``.

    The cost of a node is the time of a pruned copy of the C++ tree that keeps
    the path from the root to the node plus the node's whole subtree, minus
    the time of the copy that keeps only the path: what checking that subtree
    adds to a call. Children are explored most expensive parent first, and
    only below nodes that cost at least ``min_share`` of the whole tree, until
    ``budget`` nodes are measured. Returns the number of nodes measured.
    """
    total = tree.time_us or 0.0
    parent_of = parents(tree)
    path_cost: dict[frozenset[str], float] = {}

    def cost_of(keep: frozenset[str]) -> float:
        if keep not in path_cost:
            path_cost[keep] = timer.time_us(clone_keeping(root, keep.__contains__))
        return path_cost[keep]

    heap: list[tuple[float, int, GuardNode]] = []
    counter = 0
    for child in tree.children:
        heapq.heappush(heap, (-total, counter, child))
        counter += 1
    measured = 0
    while heap and measured < budget:
        _, _, node = heapq.heappop(heap)
        path = path_to(tree, node, parent_of)
        above = frozenset(n.source for n in path[:-1])
        with_node = timer.time_us(clone_keeping(root, (above | sources_of(node)).__contains__))
        node.time_us = max(0.0, with_node - cost_of(above))
        measured += 1
        if node.children and node.time_us >= min_share * total:
            for child in node.children:
                heapq.heappush(heap, (-node.time_us, counter, child))
                counter += 1
    return measured


def module_guard_cost(root: Any, tree: GuardNode, timer: GuardTimer) -> tuple[float, int]:
    """(time, guard count) of the guards on nn.Modules and below them: what a
    guard filter that skips nn.Module guards would save on this entry."""
    skipped = module_sources(tree)
    if not skipped:
        return 0.0, 0
    count = sum(len(node.leaves) for node in tree.walk() if node.source in skipped)
    without = timer.time_us(clone_keeping(root, lambda source: source not in skipped))
    return max(0.0, (tree.time_us or 0.0) - without), count
