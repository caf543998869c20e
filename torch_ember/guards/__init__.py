"""Guard profiler for ``torch.compile`` (any device: CPU, ember, ...).

Every call of a compiled function first runs Dynamo's guards, the checks that
decide whether a cached graph may run. This package shows what they cost,
which ones fail and why, and drops the ones a frozen inference model does not
need::

    import torch_ember.guards as guards

    report = guards.profile(compiled_model, x)      # one compiled callable
    print(report)                                   # text; .to_json(), .to_html()

    fast = guards.optimize(model.eval(), (x,))      # frozen inference model
    print(fast.guard_report)                        # guard time before/after

    model.forward = torch.compile(model.forward)    # decoding with generate()
    print(guards.profile_generate(model, ids, max_new_tokens=32))   # per token

From the shell: ``python -m torch_ember.guards report SCRIPT [args]``.
See docs/guards.md.
"""

from .advice import Advice
from .breakdown import Breakdown
from .compare import CallComparison, compare_calls
from .decode import GenerateOptimizeResult, optimize_generate, profile_generate
from .optimize import OptimizeResult, optimize
from .profiler import CodeProfile, EntryProfile, GuardProfile, Profiler, collect, profile
from .recorder import FrameHook, RecompileEvent, RecompileLog
from .tree import GuardNode, build_tree, count_by_kind

__all__ = [
    "Advice",
    "Breakdown",
    "CallComparison",
    "CodeProfile",
    "EntryProfile",
    "FrameHook",
    "GenerateOptimizeResult",
    "GuardNode",
    "GuardProfile",
    "OptimizeResult",
    "Profiler",
    "RecompileEvent",
    "RecompileLog",
    "build_tree",
    "collect",
    "compare_calls",
    "count_by_kind",
    "optimize",
    "optimize_generate",
    "profile",
    "profile_generate",
]
