"""The sweep scheduler: worker subprocesses, timeouts, crashes, resuming.

Tasks are handed out one at a time to ``jobs`` worker processes
(:mod:`.worker`). Each result is appended to ``results.jsonl`` as soon as it
arrives, so an interrupted sweep resumes where it stopped (keys already in
the file are skipped; results of another build, kit version or mode run
again: each record carries its ``build`` and ``mode``). A worker that dies has its current task recorded as
``crash`` (with the signal, the sample being run and the tail of its stderr);
one that reports nothing for ``timeout`` seconds is killed and its task
recorded as ``timeout``. Either way a fresh worker takes over.
"""

from __future__ import annotations

import hashlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from . import modes
from .tasks import Task

STARTUP_TIMEOUT = 300.0
# The kit's modules whose code decides a task's result (part of the fingerprint).
RESULT_SOURCES = (
    "_db.py",
    "cases.py",
    "compare.py",
    "modes.py",
    "modules.py",
    "tasks.py",
    "transform.py",
    "worker.py",
)
# `import torch` first, so that another PrivateUse1 backend loaded by torch's
# backend autoload is in place before the kit's own modules import.
WORKER_BOOTSTRAP = (
    "import sys, torch; from torch_ember.conformance.worker import main; sys.exit(main())"
)
MAX_STARTUP_FAILURES = 3
STDERR_TAIL = 1500


def read_records(path: Path) -> list[dict]:
    """Every record of a results.jsonl file, in order (a torn last line is ignored)."""
    records: list[dict] = []
    if not path.exists():
        return records
    with path.open() as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "key" in record:
                records.append(record)
    return records


def load_results(path: Path, mode: str | None = None) -> dict[str, dict]:
    """key -> last record in a results.jsonl file; with ``mode``, the last
    record of that mode (records of the other mode, e.g. of an earlier sweep
    into the same directory, are not results of this one)."""
    return {r["key"]: r for r in read_records(path) if mode is None or r.get("mode") == mode}


def build_fingerprint(device: str) -> str:
    """Identifies torch, the backend's compiled code (its .so files) and this kit's code.

    Results recorded under another fingerprint are stale: a resumed sweep runs
    those tasks again.
    """
    import torch

    parts = [torch.__version__]
    for name in RESULT_SOURCES:
        parts.append(hashlib.sha1((Path(__file__).parent / name).read_bytes()).hexdigest())
    module = getattr(torch, device, None)
    top = getattr(module, "__name__", "").split(".")[0]
    package = sys.modules.get(top)
    if package is not None and getattr(package, "__file__", None):
        root = Path(package.__file__).parent
        for so in sorted(root.rglob("*.so")):
            stat = so.stat()
            parts.append(f"{so.name}:{stat.st_size}:{int(stat.st_mtime)}")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


class _Worker:
    def __init__(self, index: int, command: list[str], log_dir: Path, env: dict):
        self.index = index
        self.log_path = log_dir / f"worker-{index}.log"
        self.log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
        )
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.buffer = b""
        self.ready = False
        self.started = time.monotonic()
        self.last_activity = self.started
        self.task: Task | None = None
        self.sample: int | None = None
        self.sample_input = ""
        self.log_offset = 0
        self.tasks_done = 0

    def assign(self, task: Task, max_samples: int | None) -> None:
        self.task = task
        self.sample = None
        self.sample_input = ""
        self.last_activity = time.monotonic()
        self.log.flush()
        self.log_offset = self.log_path.stat().st_size
        request = {"key": task.key, "max_samples": max_samples}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()

    def read_events(self) -> tuple[list[dict], bool]:
        """Complete events available now, and whether the pipe reached EOF."""
        eof = False
        while True:
            try:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                eof = True
                break
            self.buffer += chunk
        events = []
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            if line.strip():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        if events:
            self.last_activity = time.monotonic()
        return events, eof

    def stderr_tail(self) -> str:
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(self.log_offset)
                data = handle.read()
        except OSError:
            return ""
        text = data.decode(errors="replace").strip()
        return text[-STDERR_TAIL:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.close()

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.log.close()


class Runner:
    def __init__(
        self,
        tasks: list[Task],
        out_dir: Path,
        device: str = "ember",
        jobs: int = 2,
        threads: int = 1,
        timeout: float = 60.0,
        max_samples: int | None = None,
        extra_ops: str | None = None,
        imports: list[str] | None = None,
        recycle: int = 400,
        log=print,
        mode: str = modes.DEFAULT_MODE,
    ):
        self.tasks = tasks
        self.mode = modes.check(mode)
        self.out_dir = out_dir
        self.results_path = out_dir / "results.jsonl"
        self.device = device
        self.jobs = max(1, jobs)
        self.threads = threads
        self.timeout = timeout
        self.max_samples = max_samples
        self.recycle = recycle
        self.log = log
        self.command = [
            sys.executable,
            "-c",
            WORKER_BOOTSTRAP,
            "--device",
            device,
            "--threads",
            str(threads),
            "--mode",
            self.mode,
        ]
        if extra_ops:
            self.command += ["--extra-ops", str(extra_ops)]
        for module in imports or []:
            self.command += ["--import", module]
        self.env = dict(os.environ)
        # Each worker gets its share of the cores; keep OpenMP from spinning up more.
        self.env.setdefault("OMP_NUM_THREADS", str(threads))
        # The mode's switch from process start (workers also set the flag).
        self.env.update(modes.worker_env(self.mode))
        self.startup_failures = 0

    def run(self) -> dict[str, dict]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "logs").mkdir(exist_ok=True)
        for old_log in (self.out_dir / "logs").glob("worker-*.log"):
            old_log.unlink()
        self.build = build_fingerprint(self.device)
        done = load_results(self.results_path, self.mode)
        wanted = {t.key for t in self.tasks}
        stale = [k for k, r in done.items() if k in wanted and r.get("build") != self.build]
        for key in stale:
            del done[key]
        if stale:
            self.log(f"[conformance] {len(stale)} results are from another build: running again")
        pending = deque(t for t in self.tasks if t.key not in done)
        total, skipped = len(self.tasks), len(self.tasks) - len(pending)
        if skipped:
            self.log(f"[conformance] resuming: {skipped} of {total} tasks already have results")
        self.log(
            f"[conformance] {len(pending)} tasks on {self.jobs} worker(s), device {self.device}, "
            f"mode {self.mode} ({modes.COMPARISON[self.mode]})"
        )
        if not pending:
            return done
        self.finished = 0
        self.to_run = len(pending)
        self.start_time = time.monotonic()
        self.last_report = self.start_time
        self.counts: dict[str, int] = {}
        with self.results_path.open("a") as results_file:
            self.results_file = results_file
            self._loop(pending, done)
        return done

    def _spawn(self, index: int) -> _Worker:
        return _Worker(index, self.command, self.out_dir / "logs", self.env)

    def _record(self, worker: _Worker, result: dict, done: dict) -> None:
        task = worker.task
        record = {**task.to_dict(), **result, "build": self.build, "mode": self.mode}
        done[task.key] = record
        self.results_file.write(json.dumps(record) + "\n")
        self.results_file.flush()
        worker.task = None
        worker.tasks_done += 1
        self.finished += 1
        status = record["status"]
        self.counts[status] = self.counts.get(status, 0) + 1
        if status not in ("pass", "unsupported_on_cpu"):
            error = str(record.get("error", "")).splitlines()
            self.log(f"  {status:<18} {task.key}  {error[0][:110] if error else ''}")
        now = time.monotonic()
        if now - self.last_report > 30 or self.finished == self.to_run:
            self.last_report = now
            elapsed = now - self.start_time
            rate = self.finished / elapsed if elapsed else 0.0
            eta = (self.to_run - self.finished) / rate if rate else 0.0
            counts = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
            self.log(
                f"[conformance] {self.finished}/{self.to_run} in {elapsed:.0f}s "
                f"(eta {eta:.0f}s) {counts}"
            )

    def _loop(self, pending: deque, done: dict) -> None:
        selector = selectors.DefaultSelector()
        workers: list[_Worker | None] = [None] * min(self.jobs, len(pending))

        def start(slot: int) -> None:
            worker = self._spawn(slot)
            workers[slot] = worker
            selector.register(worker.proc.stdout, selectors.EVENT_READ, worker)

        def retire(worker: _Worker, kill: bool) -> None:
            selector.unregister(worker.proc.stdout)
            if kill:
                worker.kill()
            else:
                worker.proc.wait()
                worker.close()
            workers[worker.index] = None

        for slot in range(len(workers)):
            start(slot)
        try:
            while pending or any(w is not None and w.task is not None for w in workers):
                for slot, worker in enumerate(workers):
                    if worker is None and pending:
                        start(slot)
                        continue
                    if worker is not None and worker.ready and worker.task is None:
                        if pending:
                            worker.assign(pending.popleft(), self.max_samples)
                        else:
                            worker.proc.stdin.close()
                            retire(worker, kill=True)
                for key, _ in selector.select(timeout=0.5):
                    worker = key.data
                    events, eof = worker.read_events()
                    for event in events:
                        self._handle(worker, event, done)
                    if eof:
                        self._died(worker, done, pending)
                        retire(worker, kill=False)
                        continue
                    if worker.task is None and worker.tasks_done >= self.recycle and pending:
                        retire(worker, kill=True)
                now = time.monotonic()
                for worker in list(workers):
                    if worker is None:
                        continue
                    if worker.task is not None and now - worker.last_activity > self.timeout:
                        self._timed_out(worker, done)
                        retire(worker, kill=True)
                    elif not worker.ready and now - worker.started > STARTUP_TIMEOUT:
                        self._startup_failed(worker, "did not start in time")
                        retire(worker, kill=True)
        finally:
            for worker in workers:
                if worker is not None:
                    retire(worker, kill=True)
            selector.close()

    def _handle(self, worker: _Worker, event: dict, done: dict) -> None:
        kind = event.get("event")
        if kind == "ready":
            worker.ready = True
            self.startup_failures = 0
        elif kind == "sample":
            worker.sample = event.get("index")
            worker.sample_input = event.get("input", "")
        elif kind == "result" and worker.task is not None and event.get("key") == worker.task.key:
            result = {k: v for k, v in event.items() if k not in ("event", "key")}
            self._record(worker, result, done)

    def _died(self, worker: _Worker, done: dict, pending: deque) -> None:
        returncode = worker.proc.wait()
        if not worker.ready:
            self._startup_failed(worker, f"exited during startup ({_signal_name(returncode)})")
            return
        if worker.task is None:
            return
        where = "" if worker.sample is None else f" during sample {worker.sample}"
        result = {
            "status": "crash",
            "cause": f"process killed by {_signal_name(returncode)}",
            "error": f"worker died ({_signal_name(returncode)}){where}",
            "sample": worker.sample,
            "input": worker.sample_input,
            "stderr": worker.stderr_tail(),
        }
        self._record(worker, result, done)

    def _timed_out(self, worker: _Worker, done: dict) -> None:
        where = "" if worker.sample is None else f" in sample {worker.sample}"
        result = {
            "status": "timeout",
            "cause": f"no progress for {self.timeout:g} s",
            "error": f"no progress for {self.timeout:g} s{where}",
            "sample": worker.sample,
            "input": worker.sample_input,
            "stderr": worker.stderr_tail(),
        }
        self._record(worker, result, done)

    def _startup_failed(self, worker: _Worker, why: str) -> None:
        self.startup_failures += 1
        tail = worker.stderr_tail() if worker.log_offset else _read_tail(worker.log_path)
        self.log(f"[conformance] worker {why}:\n{tail}")
        if self.startup_failures >= MAX_STARTUP_FAILURES:
            raise RuntimeError(f"conformance workers fail to start ({why}); see {worker.log_path}")


def _read_tail(path: Path) -> str:
    try:
        return path.read_bytes().decode(errors="replace")[-STDERR_TAIL:]
    except OSError:
        return ""
