"""A sweep worker: runs tasks read from stdin, one JSON line each.

Events go to a private copy of the original stdout (fd 1 is pointed at
stderr, so whatever an op prints cannot corrupt the protocol):

``{"event": "ready", "cpu_parity": b}``       after loading the databases and
                                              setting the mode's switch
``{"event": "sample", "key": K, "index": i}`` before each sample (liveness,
                                              and where a crash happened)
``{"event": "result", "key": K, ...}``        the task's result

``--mode`` (``parity`` or ``default``, see :mod:`.modes`) sets the device's
``cpu_parity`` switch once, at start, and decides how values are compared.
The runner owns timeouts and crashes: a worker that dies or falls silent has
its current task recorded as ``crash`` / ``timeout`` and is replaced.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings


def _open_channel():
    channel_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(channel_fd, "w", buffering=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_ember.conformance.worker")
    parser.add_argument("--device", default="ember")
    parser.add_argument("--mode", default="parity")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--extra-ops")
    parser.add_argument("--import", dest="imports", action="append", default=[])
    args = parser.parse_args(argv)

    channel = _open_channel()

    def send(message: dict) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    warnings.simplefilter("ignore")
    import torch

    for module in args.imports:
        importlib.import_module(module)
    torch.set_num_threads(max(1, args.threads))
    device = torch.device(args.device)

    from . import cases, modes, modules
    from .tasks import Registry, Task, parse_dtype

    cpu_parity = modes.apply(device.type, args.mode)
    registry = Registry(args.extra_ops)
    send({"event": "ready", "pid": os.getpid(), "mode": args.mode, "cpu_parity": cpu_parity})

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        request = json.loads(line)
        task = Task.from_key(request["key"])
        max_samples = request.get("max_samples")

        def progress(index, sample, key=task.key):
            try:
                summary = sample.summary()[:300]
            except Exception:  # noqa: BLE001 - a summary is best effort
                summary = ""
            send({"event": "sample", "key": key, "index": index, "input": summary})

        dtype = parse_dtype(task.dtype)
        mode = args.mode
        try:
            if task.kind == "forward":
                op = registry.ops[task.name]
                result = cases.timed(
                    cases.run_forward,
                    op,
                    dtype,
                    task.variant,
                    device,
                    max_samples,
                    progress,
                    mode=mode,
                )
            elif task.kind == "backward":
                op = registry.ops[task.name]
                result = cases.timed(
                    cases.run_backward, op, dtype, device, max_samples, progress, mode=mode
                )
            else:
                info = registry.modules[task.name]
                result = cases.timed(
                    modules.run_module,
                    info,
                    dtype,
                    task.variant,
                    device,
                    max_samples,
                    progress,
                    mode=mode,
                )
        except Exception as error:  # noqa: BLE001 - reported as the task's result
            result = {
                "status": "harness_error",
                "cause": "harness error",
                "error": f"{type(error).__name__}: {error}"[:700],
            }
        send({"event": "result", "key": task.key, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
