"""What the generated wrapper of a compiled graph on ember calls at run time:
Inductor's C++ kernels launched on the device's stream, and views of the
graph's inputs.

The Python wrapper of a compiled graph calls ``ember_launch_cpp(device, name,
kernel, written, *args)`` for each generated C++ kernel on ember (``written``:
the positions of the pointer arguments it writes). The kernel is queued
on the device's current stream like an eager op (``torch_ember._C.
launch_cpp_kernel``: its C entry point, called on the stream's worker with the
tensors' data pointers), so the host goes on with the graph while it runs.
A stream that captures a graph records the launch, so compiled code can be
captured into an ember graph under either engine. When the kernel cannot be
launched (synchronous execution outside a capture, an argument other than an
ember tensor or an int) the wrapper waits for the stream and calls the kernel
here, as before.

``ember_input_view(input, size, stride, offset)`` stands where Inductor's
wrapper writes ``reinterpret_tensor`` for a graph input: a real view, sharing
the input's version counter (``inductor_backend.py`` says why).
"""

from __future__ import annotations

import ctypes

from torch_ember import _C

# A generated kernel (its Python binding) -> the address of its C entry point
# (0: not found). The bindings live as long as Inductor's code cache keeps
# their modules.
_entry_points: dict[object, int] = {}


def entry_point(kernel) -> int:
    """The address of the ``extern "C" kernel`` behind Inductor's Python
    binding ``kernel`` (a function of the extension module it was built in)."""
    try:
        return _entry_points[kernel]
    except KeyError:
        pass
    address = 0
    path = getattr(getattr(kernel, "__self__", None), "__file__", None)
    if path:
        try:
            address = ctypes.cast(ctypes.CDLL(path).kernel, ctypes.c_void_p).value or 0
        except (OSError, AttributeError):
            address = 0
    _entry_points[kernel] = address
    return address


def launch_cpp(device: int | None, name: str, kernel, written, *args) -> None:
    """Runs a generated C++ kernel of ``device``: queued on its current stream
    when it can be, else after that stream's work, on this thread.
    ``written``: the positions of the arguments it writes (its non-const
    pointers; None: any), reported as written as ember's ops report theirs
    (a pack of a weight the kernel updates is then dropped)."""
    if not _C.launch_cpp_kernel(device, name, entry_point(kernel), args, written):
        _C.note_kernel_writes(args, written)
        _C.wait_for_current_stream(device)
        kernel(*args)


def input_view(tensor, size, stride, offset):
    """``reinterpret_tensor``'s meaning (``offset`` counted from the tensor's
    own storage offset) as a view of ``tensor``."""
    return tensor.as_strided(size, stride, tensor.storage_offset() + offset)
