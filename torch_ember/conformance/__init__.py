"""Conformance kit: PyTorch's OpInfo and ModuleInfo databases, run on a device vs CPU.

``python -m torch_ember.conformance`` (``make conformance``) runs every
OpInfo of ``torch.testing._internal.common_methods_invocations.op_db`` for
each dtype it supports on CPU, over its sample inputs, on the device and on
CPU, and compares the results (values, dtype, shape, strides, aliasing of
in-place and ``out=`` results); then gradients (``backward``) for ops that
support autograd, and the forward/backward samples of
``common_modules.module_db`` (``modules``).

A sweep runs in one of two modes (:mod:`.modes`, ``--mode``): ``parity``,
the device's ``cpu_parity`` switch on (ember: CPU's own kernels) and values
compared bitwise; ``default``, the device's own kernels and values compared
with OpInfo's per-dtype tolerances (``assert_close`` defaults raised to the
op's declared overrides). The structure is compared exactly in both. Each
mode keeps its results in its own directory (``build/conformance/MODE``)
and every record carries its mode, so resumed sweeps never mix them;
``make conformance`` runs both and writes ``docs/conformance.md`` (parity)
and ``docs/conformance-default.md`` (default).

The sweep runs in worker subprocesses (:mod:`.runner`), so a crash or hang
is recorded as that task's result; results go to ``results.jsonl`` as they
arrive and a restarted sweep skips what is done. Every task ends with one
status: ``pass``, ``mismatch``, ``error_ember_only``, ``crash``, ``timeout``
or ``unsupported_on_cpu`` (excluded from the pass rate); ``harness_error``
marks a failure of the kit itself (a sample it could not handle). The kit only uses
``torch.device(NAME)`` (``--device NAME``), so it runs against any
PrivateUse1 backend (``--import MODULE`` loads it in every process).

Modules: :mod:`.tasks` (what to run), :mod:`.cases` (running one task in a
process), :mod:`.transform` (copying samples), :mod:`.compare` (comparing
results), :mod:`.modes` (the two sweeps: switch and tolerances),
:mod:`.runner` (the scheduler), :mod:`.report` (JSON, Markdown),
:mod:`.subset` (the fast subset run by ``make test``, in both modes).
"""

from .report import EXCLUDED, FAILING, STATUSES

__all__ = ["EXCLUDED", "FAILING", "STATUSES"]
