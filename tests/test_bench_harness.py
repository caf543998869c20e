"""The benchmark suite's harness (benchmarks/suite): every workload at a toy size.

Runs each workload once on the systems that are cheap to prepare (CPU eager,
ember eager) plus a deliberately wrong system, checks the result structure,
the report (Markdown, JSON, plots) and that the correctness check flags the
wrong system and leaves it unranked. ember-parity (cpu_parity mode) must match
CPU bitwise where the build has the switch. The third-party peers (ONNX
Runtime, OpenVINO, zentorch) are tests/test_bench_peers.py; the shared
helpers are tests/bench_helpers.py. No timing assertions.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math

import pytest
import torch
from bench_helpers import WRONG, check_structure, run, settings
from suite import harness, report, report_plots, workloads
from suite.systems import SYSTEMS, Prepared, System, cpu_eager

FIXTURE_SYSTEMS = ["ember-eager", "ember-parity", WRONG.name]


def _has_cpu_parity() -> bool:
    return hasattr(torch, "ember") and hasattr(torch.backends.ember, "cpu_parity")


# the process's setting (EMBER_CPU_PARITY may set it): systems must leave it as it was
PARITY_AT_START = torch.backends.ember.cpu_parity if _has_cpu_parity() else None


@pytest.fixture(scope="module")
def results():
    return run(list(workloads.WORKLOADS), FIXTURE_SYSTEMS)


def test_every_workload_runs_on_cpu_and_ember(results):
    assert [r.name for r in results] == list(workloads.WORKLOADS)
    for r in results:
        check_structure(r, FIXTURE_SYSTEMS)
        ember = r.get("ember-eager")
        assert ember.status == "ok", (r.name, ember.reason)
        assert ember.rel_err <= r.rtol
        assert ember.ember_max_allocated is not None and ember.ember_max_allocated > 0


def test_ember_parity_matches_cpu_bitwise(results):
    for r in results:
        parity = r.get("ember-parity")
        if not _has_cpu_parity():
            assert parity.status == "skip" and "cpu_parity" in parity.reason
            continue
        assert parity.status == "ok", (r.name, parity.reason)
        assert parity.max_abs_diff == 0.0, (r.name, parity.max_abs_diff)
    if _has_cpu_parity():  # set only around its own runs
        assert torch.backends.ember.cpu_parity == PARITY_AT_START


def test_ember_async_runs_every_workload_correctly_and_restores_the_switch():
    """The asynchronous engine end to end: every (tiny) workload with its
    GEMMs, convolutions, norms and attention launched matches CPU; the
    report sets it against ember-sync."""
    before = torch.backends.ember.async_execution
    results = run(list(workloads.WORKLOADS), ["ember-sync", "ember-async"])
    for r in results:
        launched = r.get("ember-async")
        assert launched.status == "ok", (r.name, launched.reason)
        assert launched.rel_err <= r.rtol, r.name
    assert torch.backends.ember.async_execution == before
    engine = report.engine_section(results)
    for r in results:
        ratio = r.get("ember-async").median_s / r.get("ember-sync").median_s
        assert f"| {r.name} |" in engine and report.fmt_ratio(ratio) in engine
    assert report.engine_section([]) == ""


def test_wrong_system_is_flagged_and_not_ranked(results):
    for r in results:
        wrong = r.get(WRONG.name)
        assert wrong.status == "WRONG", (r.name, wrong.rel_err)
        assert wrong.rank is None
        assert "tolerance" in wrong.reason
        assert wrong.max_abs_diff > 0
        assert r.best_baseline() is not None
        assert r.best_baseline().system != WRONG.name
    md = report.summary_table(results)
    assert WRONG.name not in md  # never the best baseline


def test_decode_reports_per_token(results):
    decode = next(r for r in results if r.name == "gpt2-decode")
    assert decode.unit == "token" and decode.per_run > 1
    ref = decode.get(harness.REFERENCE)
    assert ref.median_s == pytest.approx(ref.samples_s[0] / decode.per_run)


def _wrong_after_first(w, threads: int) -> Prepared:
    """CPU eager whose first run is right and every later run off by 1: only
    checking a timed run catches it."""
    inner = cpu_eager(w, threads)
    calls = [0]

    def run():
        calls[0] += 1
        out = inner.run()
        if calls[0] == 1:
            return out
        return tuple(t + 1 for t in out)

    return Prepared(run=run)


def test_a_system_wrong_only_in_timed_runs_is_flagged():
    late = System("wrong-when-timed", _wrong_after_first, lambda: "test", "right once")
    (r,) = harness.run_suite(["mlp-b1"], [late.name], settings(), extra_systems={late.name: late})
    wrong = r.get(late.name)
    assert wrong.status == "WRONG" and wrong.rank is None
    assert wrong.reason.startswith("timed run: ") and "tolerance" in wrong.reason
    assert wrong.rel_err == 0.0  # its first output was right


def test_max_alloc_counts_only_the_systems_own_memory():
    """A second ember system prepared while the first one's model is alive
    reports its own peak, not both (bert-b1 read 423 -> 1943 MiB across the
    four ember rows before)."""
    again = System("ember-eager-again", SYSTEMS["ember-eager"].fn, lambda: "test", "twice")
    extra = {again.name: again}
    # Synchronous: queued results alive at once vary with the engine's timing
    # (a few blocks of this tiny model's 7-10 KiB peak).
    with torch.backends.ember.flags(async_execution=False):
        (r,) = harness.run_suite(["mlp-b1"], ["ember-eager", again.name], settings(), extra)
    first, second = r.get("ember-eager"), r.get(again.name)
    assert first.status == second.status == "ok"
    assert first.ember_max_allocated > 0
    # Same model, same runs: the same peak (within allocator rounding).
    assert (
        abs(second.ember_max_allocated - first.ember_max_allocated)
        <= 0.1 * first.ember_max_allocated
    )


def test_compiled_system_carries_no_ember_memory_into_the_next_workload():
    """Inductor keeps each compiled graph imported, and with freezing its
    module holds the frozen weights: closing the system must let them go
    (bert-b1's ember-compiled weights stayed allocated through every later
    workload before: 832 -> 4224 MiB)."""
    import gc

    from suite.systems import reset_compiler

    import torch_ember.compile  # noqa: F401  (the ember backend's passes)

    # graphs compiled by earlier tests in this process hold their frozen weights
    reset_compiler()
    gc.collect()
    torch.ember.empty_cache()
    rs = harness.run_suite(["mlp-b1", "mlp-b1"], ["ember-compiled"], settings())
    assert all(r.get("ember-compiled").status == "ok" for r in rs)
    assert not any("still allocated" in n for r in rs for n in r.notes), rs[1].notes
    assert torch.ember.memory_allocated() == 0


def test_all_cores_warms_up_and_starts_threads_together():
    import threading
    import time

    from suite import peak

    calls: list[tuple[str, int, float]] = []
    lock = threading.Lock()

    def fake(n: int) -> float:
        with lock:
            calls.append((threading.current_thread().name, n, time.perf_counter()))
        time.sleep(0.002)
        return 0.01  # seconds "taken": rate n * work / 0.01

    rate = peak._all_cores(fake, 1000, 2.0, cores=3, repeats=4)
    assert rate == pytest.approx(3 * 1000 * 2.0 / 0.01)
    by_thread: dict[str, list[int]] = {}
    for name, n, _ in calls:
        by_thread.setdefault(name, []).append(n)
    assert len(by_thread) == 3
    for ns in by_thread.values():
        assert ns == [250, 1000, 1000, 1000, 1000]  # a warm-up call first


def test_settling_waits_for_a_busy_thread_of_the_process_to_stop():
    """Between samples the harness waits while another thread of the process
    still runs (a runtime's spinning worker), and not once all are idle."""
    import threading

    done = threading.Event()

    def busy():  # matrix products run outside the GIL: the thread stays runnable
        a = torch.randn(768, 768)
        while not done.is_set():
            a @ a

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        # The thread keeps running: settling gives up after its limit.
        assert harness.settle_threads(0.3) >= 0.3
    finally:
        done.set()
        worker.join()
    assert harness.settle_threads(5.0) < 1.0  # nothing runs: returns at once


def test_compare():
    a = (torch.ones(3), torch.arange(3))
    assert harness.compare(a, a, 1e-3)[:2] == (0.0, 0.0)
    diff, rel, _ = harness.compare(a, (torch.ones(3) * 1.01, torch.arange(3)), 1e-3)
    assert diff == pytest.approx(0.01, rel=1e-4) and rel == pytest.approx(0.01, rel=1e-4)
    assert math.isinf(harness.compare(a, (torch.ones(3), torch.arange(3) + 1), 1e-3)[1])
    assert math.isinf(harness.compare(a, (torch.ones(4), torch.arange(3)), 1e-3)[1])
    nan = harness.compare(a, (torch.full((3,), math.nan), torch.arange(3)), 1e-3)[1]
    assert not nan <= 1e-3  # NaN output is never within tolerance


def test_greedy_compare_near_tie_is_not_wrong():
    logits = [torch.tensor([[1.0, 0.5]]), torch.tensor([[0.2, 0.2000001]])]
    ref = (torch.tensor([[0, 1]]), *logits)
    out = (torch.tensor([[0, 0]]), logits[0], logits[1] + torch.tensor([[1e-7, 0.0]]))
    _, rel, note = workloads._compare_greedy(ref, out, 1e-3)
    assert rel <= 1e-3 and "step 1" in note


def test_report_markdown_json_and_plots(results, tmp_path):
    meta = {
        "date": "today",
        "command": "make bench",
        "argv": "python benchmarks/run_suite.py",
        "elapsed_s": 1.0,
        "cpu_model": "cpu",
        "cores": 2,
        "logical": 2,
        "mem_gib": 1.0,
        "flags": {"avx2": True, "amx_bf16": False},
        "os": "Linux",
        "settings": vars(settings()),
        "systems": {n: {"version": "1", "config": "c"} for n in ("cpu-eager", "ember-eager")},
        "packages": {"transformers": "x"},
    }
    plots = []
    if importlib.util.find_spec("matplotlib") is not None:
        plots = report_plots.plots(results, tmp_path / "plots", tmp_path)
        assert all((tmp_path / p).stat().st_size > 0 for p in plots)
        assert "plots/ratio.png" in plots
    md = report.markdown(meta, None, results, plots)
    assert md.startswith(report.HEADER) and "Do not edit by hand" in md
    assert "| workload | CPU eager (median) | ember eager / CPU eager |" in md
    for r in results:
        assert f"### {r.name}:" in md
    assert "**WRONG**" in md
    report.write_json(tmp_path / "r.json", meta, None, results)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [w["name"] for w in doc["workloads"]] == list(workloads.WORKLOADS)
    first = doc["workloads"][0]["systems"][0]
    for key in ("system", "status", "median_s", "p10_s", "p90_s", "ratio", "max_abs_diff"):
        assert key in first


def _fake_peak():
    from suite import peak

    return peak.Peak(
        cpu_model="cpu",
        cores=2,
        flags={"avx2": True},
        clock_ghz=3.0,
        clock_method="test",
        fp32_lanes=16,
        fp32_flops_per_cycle=64.0,
        fp32_measured_flops_per_cycle=None,
        bf16_flops_per_cycle=128.0,
        bf16_measured_flops_per_cycle=None,
        bf16_method="test",
        mem_read_bw={1: 30e9, 2: 40e9},
        mem_buffer_bytes=128 * 2**20,
        mem_method="sum of a 128 MiB buffer",
    )


def test_each_workload_records_a_one_core_fma_probe_before_and_after_timing(results):
    """The harness times a one-core FMA loop around each workload's timing
    (where a C compiler builds the loop) and the report gives it as a share
    of the peak's per-core rate."""
    from suite import peak

    if peak.fma_probe() is None:
        pytest.skip("no C compiler for the FMA loop")
    for r in results:
        assert len(r.fma_probe_flops) == 2 and all(f > 1e8 for f in r.fma_probe_flops)
    fake = _fake_peak()  # 3 GHz x 64 FLOPs a cycle: 192 GFLOP/s a core
    r = results[0]
    probes, load = r.fma_probe_flops, r.other_load
    r.fma_probe_flops, r.other_load = [96e9, 48e9], 0.0  # other processes' load apart
    try:
        assert report._core_share(r, fake) == [0.5, 0.25]
        assert "| 50% / 25% |" in report.summary_table([r], fake)
        assert "FMA loop ran at 50% and 25% of the peak's per-core rate" in (
            report.workload_section(r, fake, 2)
        )
        warning = "\n".join(report._noise_warning([r], 2, fake))
        assert "**Shared cores:**" in warning and "25%-50%" in warning
        r.fma_probe_flops = [190e9, 185e9]
        assert report._noise_warning([r], 2, fake) == []
        assert report.summary_table([r]).count("| - |") >= 1  # no peak: no share
    finally:
        r.fma_probe_flops, r.other_load = probes, load


def test_streamed_bytes_leave_out_tables_only_looked_up():
    """A decode step reads one row of an embedding table but every byte of a
    weight a linear uses: Llama's untied token table is left out, GPT-2's
    token table (tied to its output layer) counted once, its position table
    left out."""

    def nbytes(t):
        return t.numel() * t.element_size()

    llama = workloads.llama_decode(tiny=True)
    model = llama.module.model
    every = sum(nbytes(p) for p in model.parameters())
    assert llama.streamed_bytes == every - nbytes(model.model.embed_tokens.weight)
    gpt2 = workloads.gpt2_decode(tiny=True)
    model = gpt2.module.model
    assert model.lm_head.weight is model.transformer.wte.weight
    every = sum(nbytes(p) for p in model.parameters())  # the tied table once
    assert gpt2.streamed_bytes == every - nbytes(model.transformer.wpe.weight)


def test_report_memory_bandwidth_and_decode_streaming(results):
    p = _fake_peak()
    assert p.read_bandwidth(2) == (2, 40e9) and p.read_bandwidth(1) == (1, 30e9)
    assert p.read_bandwidth(8) == (2, 40e9)  # capped at the cores
    decode = next(r for r in results if r.name == "gpt2-decode")
    assert harness.streams_weights(decode) and decode.streamed_bytes > 0
    assert not harness.streams_weights(next(r for r in results if r.name == "mlp-b1"))
    for r in results:
        harness.apply_bandwidth(r, p.read_bandwidth(2)[1])
    ref = decode.get(harness.REFERENCE)
    assert ref.weights_bytes_per_s == pytest.approx(decode.streamed_bytes / ref.median_s)
    assert ref.frac_mem_bw == pytest.approx(ref.weights_bytes_per_s / 40e9)
    streaming = [r.name for r in results if harness.streams_weights(r)]
    assert streaming == ["gpt2-decode", "gpt2-decode-bf16", "llama-decode"]
    bf16 = next(r for r in results if r.name == "gpt2-decode-bf16")
    assert bf16.streamed_bytes * 2 == decode.streamed_bytes  # the same model in bf16
    assert all(
        s.weights_bytes_per_s is None
        for r in results
        if not harness.streams_weights(r)
        for s in r.systems
    )
    section = report.peak_section(p, 2, results)
    assert "memory read bandwidth, 2 thread(s)" in section and "40.0 GB/s" in section
    assert "ridge point" in section
    assert "### decode: weights streamed per second" in section
    assert "| gpt2-decode | cpu-eager |" in section
    assert "weights streamed (of mem read BW)" in report.workload_section(decode, p, 2)
    assert "weights streamed" not in report.workload_section(results[0], p, 2)


def test_best_fp32_gemm_is_never_a_reduced_precision_system():
    """ember-medium's fp32 GEMM has bf16 products: reported against the fp32
    peak it read 163% once; the fp32 row names the best fp32 system."""

    def system(name, gflops):
        return harness.SystemResult(system=name, status="ok", gflops=gflops)

    gemm = harness.WorkloadResult(
        name="gemm-fp32", title="GEMM", dtype="float32", unit="run", per_run=1,
        params=0, flops=1e9, rtol=1e-4, notes=[],
        systems=[system("cpu-eager", 200.0), system("ember-eager", 300.0),
                 system("ember-medium", 800.0)],
    )  # fmt: skip
    section = report.peak_section(_fake_peak(), 2, [gemm])
    row = next(line for line in section.splitlines() if "best system on the GEMM" in line)
    assert "(ember-eager)" in row and "ember-medium" not in row
    harness.apply_peak(gemm, 400e9, 800e9)
    assert [s.frac_peak for s in gemm.systems] == pytest.approx([0.5, 0.75, 1.0])


def test_results_json_reads_back_and_renders_the_same_report(results, tmp_path):
    p = _fake_peak()
    meta = {"settings": {"threads": 2}, "date": "d", "command": "c"}
    report.write_json(tmp_path / "r.json", meta, p, results)
    meta2, p2, results2 = report.read_json(tmp_path / "r.json")
    assert (meta2, p2) == (meta, p)
    assert results2 == results
    assert report.peak_section(p2, 2, results2) == report.peak_section(p, 2, results)


def test_cli_writes_report(tmp_path):
    import run_suite

    out = tmp_path / "B.md"
    rc = run_suite.main(
        [
            "--tiny",
            "--workloads",
            "mlp-b1",
            "--systems",
            "ember-eager",
            "--no-peak",
            "--no-progress",
            "--threads",
            str(torch.get_num_threads()),
            "--out",
            str(out),
            "--plots",
            str(tmp_path / "plots"),
        ]
    )
    assert rc == 0
    assert out.read_text().startswith(report.HEADER)
    assert json.loads((tmp_path / "plots" / "results.json").read_text())["workloads"]


def test_peak_fields():
    from suite import peak

    p = peak.measure(quick=True, gemm_sizes=[64])
    assert p.cores >= 1 and p.clock_ghz > 0 and p.fp32_flops_per_cycle >= 8
    assert p.bf16_flops_per_cycle >= p.fp32_flops_per_cycle
    assert p.theoretical(torch.bfloat16) >= p.theoretical(torch.float32) > 0
    assert set(p.gemm_best) == ({"fp32", "bf16"} if peak.native_bf16() else {"fp32"})
    if p.mem_read_bw:  # measured where a C compiler is present
        assert set(p.mem_read_bw) >= {1, p.cores}
        assert all(v > 1e8 for v in p.mem_read_bw.values())  # > 0.1 GB/s
        assert p.mem_buffer_bytes >= 128 * 2**20 and "buffer" in p.mem_method


def test_fma_pipes_are_the_fewest_that_explain_the_better_loop():
    from suite import peak

    # The all-core loop's 285.8 GFLOP/s on 2 cores at 2.59 GHz is 55.2 a core: 2 pipes.
    assert peak.fma_pipes(20.0, 285.8e9, 2, 2.59, 16) == 2
    # A slow all-core loop does not pull a good one-core figure down.
    assert peak.fma_pipes(60.0, 100e9, 2, 2.59, 16) == 2
    assert peak.fma_pipes(30.4, 172.4e9, 2, 2.80, 8) == 2  # AVX2 Zen 3, 2026-12-02
    # Loops slowed by a core's other tenants: any rate clearly above one
    # pipe's proves a second (44.5 of AVX-512's 32, Intel 2026-12-06; 19.6
    # of AVX2's 16 with the all-core loop as slow, Zen 3 2026-12-07).
    assert peak.fma_pipes(44.5, None, 2, 2.59, 16) == 2
    assert peak.fma_pipes(19.6, 2 * 18.0 * 2.97e9, 2, 2.97, 8) == 2
    # One pipe's rate, give or take the clock's error, is one pipe (a
    # half-width AVX-512 core: 32 FLOPs/cycle of 512-bit FMAs).
    assert peak.fma_pipes(32.0, None, 2, 3.7, 16) == 1
    assert peak.fma_pipes(35.0, None, 2, 3.7, 16) == 1
    assert peak.fma_pipes(0.5, None, 1, 3.0, 8) == 1  # never below one pipe


def test_default_workloads_leave_bf16_out_on_cpus_without_bf16(monkeypatch, tmp_path):
    assert workloads.default_names(bf16=True) == list(workloads.WORKLOADS)
    no_bf16 = workloads.default_names(bf16=False)
    assert no_bf16 and all("bf16" not in n for n in no_bf16)
    assert "gemm-fp32" in no_bf16 and "gemm-bf16" not in no_bf16
    assert workloads.default_names(quick=True, bf16=False) == [
        n for n in workloads.QUICK if "bf16" not in n
    ]
    # op_breakdown (make bench-breakdown) takes the same default set
    import op_breakdown
    from suite import peak

    if not hasattr(torch, "ember"):
        pytest.skip("torch_ember is not loaded")
    monkeypatch.setattr(peak, "native_bf16", lambda: False)
    monkeypatch.setattr(op_breakdown, "breakdown", lambda name, *a: {"name": name})
    monkeypatch.setattr(
        op_breakdown, "markdown", lambda meta, results, top: ",".join(r["name"] for r in results)
    )
    out = tmp_path / "names.md"
    assert op_breakdown.main(["--out", str(out)]) == 0
    assert out.read_text().split(",") == no_bf16


_MODE_LOG: dict[str, int] = {}


def _counting_mode(w, threads: int) -> Prepared:
    """CPU eager in a mode that records (in _MODE_LOG) each entry and the runs
    made inside and outside it."""
    inner = cpu_eager(w, threads)
    log = _MODE_LOG
    log.update(entries=0, inside=0, outside=0)
    depth = [0]

    @contextlib.contextmanager
    def mode():
        log["entries"] += 1
        depth[0] += 1
        try:
            yield
        finally:
            depth[0] -= 1

    def run_in_mode():
        log["inside" if depth[0] else "outside"] += 1
        return inner.run()

    def run():
        with mode():
            return run_in_mode()

    return Prepared(run=run, mode=mode, run_in_mode=run_in_mode)


def test_a_timed_sample_enters_the_systems_mode_once():
    """ember-sync, -parity, -medium and -tuned switch flags around their runs:
    the harness enters such a mode once per timed sample (the switch cost
    mlp-b1 ~12 us of ~90 a run when entered per run), and every run, timed or
    not, happens inside it."""
    moded = System("counting-mode", _counting_mode, lambda: "test", "counts entries")
    timed = settings()
    timed.rounds = timed.min_rounds = 3
    timed.sample_s = 0.001  # several runs a sample
    (r,) = harness.run_suite(["mlp-b1"], [moded.name], timed, extra_systems={moded.name: moded})
    res = r.get(moded.name)
    log = _MODE_LOG
    assert res.status == "ok" and res.number > 1 and len(res.samples_s) == 3
    assert log["outside"] == 0
    timed_runs = 3 * res.number
    # the untimed runs (first run, warm-up, calibration) enter it one by one
    untimed = log["inside"] - timed_runs
    assert untimed >= 1 and log["entries"] == untimed + 3
