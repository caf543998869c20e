"""The guard tree of one Dynamo cache entry, as plain Python data.

Dynamo keeps the guards of a cache entry in a tree of C++ guard managers
(``torch._C._dynamo.guards.RootGuardManager`` and its children). Every node
guards one value, named by its *source* (``L['x']``, ``L['self']._modules['fc']``,
``G['torch']`` ...), holds *leaf guards* (the actual checks: ``TENSOR_MATCH``,
``ID_MATCH``, ``TYPE_MATCH``, ``DICT_VERSION``, ``LAMBDA_GUARD`` ...) and reaches
its children through *accessors* (attribute, item, frame-local lookups).

:func:`build_tree` copies that structure into :class:`GuardNode` objects that
the report can print and serialise; :func:`subtree_root` and
:func:`without_sources` build pruned copies of the C++ tree (through
``clone_manager``) so that the profiler can time any part of it on its own.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch

# Leaf guards that are shared between several managers (one object, installed on
# every tensor it relates); they are counted once.
_RELATIONAL_KINDS = {"NO_TENSOR_ALIASING", "OBJECT_ALIASING", "STORAGE_OVERLAPPING"}


@dataclasses.dataclass
class GuardNode:
    """One guard manager: the value it guards, its leaf guards, its children."""

    source: str
    manager: str
    accessor: str
    value_type: str
    is_module: bool
    leaves: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    children: list[GuardNode] = dataclasses.field(default_factory=list)
    fail_count: int = 0
    # Measured cost of checking this node and everything below it, in
    # microseconds per check (None: not measured).
    time_us: float | None = None

    def walk(self) -> Iterator[GuardNode]:
        """This node and all nodes below it, depth first."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    @property
    def guard_count(self) -> int:
        """Number of leaf guards in this subtree."""
        return sum(len(node.leaves) for node in self.walk())

    def to_dict(self, max_depth: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source,
            "manager": self.manager,
            "accessor": self.accessor,
            "type": self.value_type,
            "is_module": self.is_module,
            "guards": [{"kind": kind, "code": code} for kind, code in self.leaves],
            "guard_count": self.guard_count,
            "time_us": None if self.time_us is None else round(self.time_us, 4),
            "fail_count": self.fail_count,
        }
        if max_depth is None or max_depth > 0:
            depth = None if max_depth is None else max_depth - 1
            out["children"] = [child.to_dict(depth) for child in self.children]
        else:
            out["children_elided"] = len(self.children)
        return out


def _type_name(tp: type) -> str:
    if tp.__module__ in ("builtins", None):
        return tp.__qualname__
    return f"{tp.__module__}.{tp.__qualname__}"


def _leaf_code(guard: Any) -> str:
    parts = guard.verbose_code_parts()
    text = "; ".join(part.split("  #")[0].strip() for part in parts)
    return text if len(text) <= 240 else text[:237] + "..."


def _children(mgr: Any) -> Iterator[tuple[str, Any]]:
    """(accessor description, child manager) for every child of ``mgr``."""
    if hasattr(mgr, "get_key_value_managers"):
        for index, (key_mgr, value_mgr) in sorted(mgr.get_key_value_managers().items()):
            if key_mgr is not None:
                yield f"dict key #{index}", key_mgr
            if value_mgr is not None:
                yield f"dict value #{index}", value_mgr
    for accessor, child in zip(mgr.get_accessors(), mgr.get_child_managers()):
        yield accessor.repr(), child


def build_tree(root: Any) -> GuardNode:
    """Copies the C++ guard tree under ``root`` (a ``RootGuardManager``)."""
    seen_relational: set[Any] = set()

    def visit(mgr: Any, accessor: str) -> GuardNode:
        value_type = mgr.get_type_of_guarded_value()
        node = GuardNode(
            source=mgr.get_source(),
            manager=type(mgr).__name__,
            accessor=accessor,
            value_type=_type_name(value_type),
            is_module=isinstance(value_type, type) and issubclass(value_type, torch.nn.Module),
            fail_count=mgr.fail_count(),
        )
        for guard in mgr.get_leaf_guards():
            kind = type(guard).__name__
            if kind in _RELATIONAL_KINDS:
                if guard in seen_relational:
                    continue
                seen_relational.add(guard)
            node.leaves.append((kind, _leaf_code(guard)))
        for child_accessor, child in _children(mgr):
            node.children.append(visit(child, child_accessor))
        return node

    tree = visit(root, "")
    if hasattr(root, "get_epilogue_lambda_guards"):
        for guard in root.get_epilogue_lambda_guards():
            tree.leaves.append(("EPILOGUE_" + type(guard).__name__, _leaf_code(guard)))
    return tree


def count_by_kind(tree: GuardNode) -> dict[str, int]:
    """Leaf guards of the tree counted by kind, most frequent first."""
    counts = Counter(kind for node in tree.walk() for kind, _ in node.leaves)
    return dict(counts.most_common())


def sources_of(node: GuardNode) -> set[str]:
    return {n.source for n in node.walk()}


def parents(tree: GuardNode) -> dict[int, GuardNode]:
    """id(node) -> parent node, for every node but the root."""
    out: dict[int, GuardNode] = {}
    for node in tree.walk():
        for child in node.children:
            out[id(child)] = node
    return out


def path_to(tree: GuardNode, target: GuardNode, parent_of: dict[int, GuardNode]) -> list[GuardNode]:
    """The nodes from the root down to ``target`` (both included)."""
    path = [target]
    while path[-1] is not tree:
        path.append(parent_of[id(path[-1])])
    return list(reversed(path))


def clone_keeping(root: Any, keep: Callable[[str], bool]) -> Any:
    """A pruned copy of the C++ tree: nodes whose source fails ``keep`` are
    dropped with everything below them. The root itself is always kept (with
    its leaf guards, which are global checks such as GLOBAL_STATE)."""
    root_source = root.get_source()
    return root.clone_manager(lambda mgr: mgr.get_source() == root_source or keep(mgr.get_source()))


def module_sources(tree: GuardNode) -> set[str]:
    """Sources of every node that guards an ``nn.Module`` or lies below one.

    These are the guards that ``torch.compiler.skip_guard_on_all_nn_modules_unsafe``
    removes (approximately: that filter decides per guard from its source)."""
    out: set[str] = set()

    def visit(node: GuardNode, under_module: bool) -> None:
        inside = under_module or node.is_module
        if inside:
            out.add(node.source)
        for child in node.children:
            visit(child, inside)

    visit(tree, False)
    out.discard(tree.source)
    return out
