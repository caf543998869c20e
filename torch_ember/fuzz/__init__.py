"""Random-program fuzzer: seeded op sequences on ember and on CPU.

``python -m torch_ember.fuzz --programs 10000`` (``make fuzz``) generates
programs (views, in-place ops, ``out=``, broadcasting, dtype promotion,
non-contiguous and zero-size tensors, special values, autograd), runs each
on both devices and compares: bitwise with ``cpu_parity`` on (``--mode
parity``), within OpInfo's default tolerances otherwise (``--mode
default``). A difference is shrunk to the fewest lines that still show it
and printed as a standalone reproducer script.

* :mod:`.program` -- the generator and the ``make`` tensor helper
* :mod:`.runner`  -- running, comparing, shrinking, the reproducer
"""

from torch_ember.fuzz.program import Program, generate, make
from torch_ember.fuzz.runner import Failure, reproducer, run, shrink

__all__ = ["Failure", "Program", "generate", "make", "reproducer", "run", "shrink"]
