"""ember tensors across processes (issue 14, item 2): mp.Queue and
DataLoader workers pass ember tensors without a copy (the segment's memory
file, torch_ember/ember/ipc.py): writes on either side are seen by the
other; the sender's block stays allocated until the receiver releases it;
memory without a memory file falls back to a copy, counted; what cannot
cross raises in the receiving process, never a hang. Each case runs in a
fresh interpreter, with timeouts that turn a hang into a failure."""

import textwrap

import pytest


def _run_script(run_python, tmp_path, source, *args, timeout=240):
    """Runs ``source`` as a script file (spawned children import its
    functions from it, which ``python -c`` code cannot offer)."""
    script = tmp_path / "case.py"
    script.write_text(source)
    return run_python(
        f"import runpy, sys; sys.argv = ['x', *{list(args)!r}]; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')",
        timeout=timeout,
    )


QUEUE = textwrap.dedent(
    """
    import sys, torch, torch.multiprocessing as mp

    def worker(q, done):
        x = torch.arange(12.0, device="ember:1").view(3, 4)
        q.put((x.t(), torch.nn.Parameter(torch.ones(2, device="ember")), x[1]))
        q.put(torch.ones(2, device="ember", requires_grad=True) * 2)  # non-leaf
        done.wait(60)  # the sender stays alive until received (as for CPU tensors)

    if __name__ == "__main__":
        ctx = mp.get_context(sys.argv[1])
        q, done = ctx.Queue(), ctx.Event()
        p = ctx.Process(target=worker, args=(q, done))
        p.start()
        t, param, row = q.get(timeout=60)
        print(t.device, t.stride(), t.sum().item(), type(param).__name__, param.requires_grad,
              row.tolist())
        try:
            q.get(timeout=60)
            print("no error")
        except Exception as error:
            print(type(error).__name__, "Cowardly" in str(error))
        done.set()
        p.join(30)
        print("exit", p.exitcode)
    """
)


@pytest.mark.requires_two_devices
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_queue_passes_ember_tensors_and_errors_reach_the_receiver(run_python, tmp_path, context):
    script = tmp_path / "queue_case.py"
    script.write_text(QUEUE)
    result = run_python(
        f"import runpy, sys; sys.argv = ['x', {context!r}]; runpy.run_path({str(script)!r}, run_name='__main__')",
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "ember:1 (1, 4) 66.0 Parameter True [4.0, 5.0, 6.0, 7.0]",
        "EmberSharingError True",
        "exit 0",
    ]


DATALOADER = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Items(Dataset):
        def __init__(self, bad=False):
            self.bad = bad
        def __len__(self):
            return 8
        def __getitem__(self, i):
            x = torch.full((3,), float(i), device="ember")
            return x.requires_grad_() * 2 if self.bad else x

    from torch_ember.ember import ipc

    loader = DataLoader(Items(), batch_size=4, num_workers=2, timeout=120)
    print([(b.device.type, b[:, 0].tolist()) for b in loader])
    print("batches mapped without a copy:", ipc.sharing_stats()["mappings_opened"])
    # A batch that cannot cross: the error in the main process, first batch.
    bad = DataLoader(Items(bad=True), batch_size=None, num_workers=1, timeout=120)
    try:
        next(iter(bad))
        print("no error")
    except Exception as error:
        print(type(error).__name__)
    """
)


def test_dataloader_workers_return_ember_tensors(run_python):
    result = run_python(DATALOADER, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "[('ember', [0.0, 1.0, 2.0, 3.0]), ('ember', [4.0, 5.0, 6.0, 7.0])]",
        "batches mapped without a copy: 2",
        "EmberSharingError",
    ]


ZERO_COPY = textwrap.dedent(
    """
    import sys, torch, torch.multiprocessing as mp
    from torch_ember.ember import ipc

    def worker(q, back, done):
        x, tail = q.get(timeout=60)
        print("child sees", x[:2].tolist(), flush=True)
        tail.fill_(5.0)                  # a view sent alongside: same bytes
        x[0] = 1.0                       # seen by the parent
        before = torch.ember.memory_allocated()
        back.put(torch.full((4,), 7.0, device="ember"))
        back.put(before)
        done.wait(60)

    if __name__ == "__main__":
        ctx = mp.get_context(sys.argv[1])
        mp.set_sharing_strategy(sys.argv[2])  # ember passes fds either way
        q, back, done = ctx.Queue(), ctx.Queue(), ctx.Event()
        p = ctx.Process(target=worker, args=(q, back, done))
        p.start()
        x = torch.zeros(1 << 16, device="ember")
        x[1] = 3.0
        q.put((x, x[100:200]))
        allocated = torch.ember.memory_allocated()
        y = back.get(timeout=60)
        back.get(timeout=60)
        print("parent sees", x[0].item(), x[100:200].unique().tolist(), y.tolist(), y.device)
        # A received storage is the mapping's, not the allocator's.
        print("receiver memory_allocated unchanged:", torch.ember.memory_allocated() == allocated)
        y.add_(1)  # writes into the child's block
        stats = ipc.sharing_stats()
        print("stats", stats["zero_copy"], stats["by_copy"], stats["mappings_open"])
        done.set()
        p.join(30)
        print("exit", p.exitcode)
    """
)


@pytest.mark.parametrize(
    ("context", "strategy"),
    [("fork", "file_descriptor"), ("spawn", "file_descriptor"), ("spawn", "file_system")],
)
def test_zero_copy_writes_are_seen_on_both_sides(run_python, tmp_path, context, strategy):
    result = _run_script(run_python, tmp_path, ZERO_COPY, context, strategy)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "child sees [0.0, 3.0]",
        "parent sees 1.0 [5.0] [7.0, 7.0, 7.0, 7.0] ember:0",
        "receiver memory_allocated unchanged: True",
        "stats 2 0 1",
        "exit 0",
    ]


LIFETIME = textwrap.dedent(
    """
    import torch, torch.multiprocessing as mp
    from torch_ember.ember import ipc

    def worker(q, got, release, released):
        x = q.get(timeout=60)
        got.set()
        release.wait(60)
        del x                      # releases the share
        released.set()

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        got, release, released = ctx.Event(), ctx.Event(), ctx.Event()
        p = ctx.Process(target=worker, args=(q, got, release, released))
        p.start()
        base = torch.ember.memory_allocated()
        x = torch.ones(1 << 18, device="ember")
        address = x.data_ptr()
        q.put(x)
        del x
        got.wait(60)
        # Held for the receiver: the block stays allocated, not reused.
        y = torch.empty(1 << 18, device="ember")
        print("held", torch.ember.memory_allocated() - base == 2 * (1 << 20),
              y.data_ptr() != address, ipc.sharing_stats()["held"])
        del y
        release.set()
        released.wait(60)
        print("after release", torch.ember.ipc_collect(),
              torch.ember.memory_allocated() == base)
        p.join(30)
        print("exit", p.exitcode)
    """
)


def test_sender_block_is_held_until_the_receiver_releases_it(run_python, tmp_path):
    result = _run_script(run_python, tmp_path, LIFETIME)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["held True True 1", "after release 0 True", "exit 0"]


FALLBACK = textwrap.dedent(
    """
    import torch, torch.multiprocessing as mp
    import torch_ember
    from torch_ember.ember import ipc

    def worker(q, back):
        x = q.get(timeout=60)
        x.fill_(9.0)
        back.put(x.sum().item())

    if __name__ == "__main__":
        torch_ember._C._set_shared_segments(0, False)  # as if memfd_create failed
        torch.ember.empty_cache()
        x = torch.zeros(16, device="ember")
        print("unshareable segments", torch_ember._C._unshareable_segments(0) > 0)
        ctx = mp.get_context("spawn")
        q, back = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=worker, args=(q, back))
        p.start()
        q.put(x)
        print("child", back.get(timeout=60), "parent", x.sum().item())
        p.join(30)
        stats = ipc.sharing_stats()
        print("by copy", stats["by_copy"], "zero copy", stats["zero_copy"], "exit", p.exitcode)
    """
)


def test_memory_without_a_memory_file_crosses_by_copy_and_is_counted(run_python, tmp_path):
    result = _run_script(run_python, tmp_path, FALLBACK)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "unshareable segments True",
        "child 144.0 parent 0.0",
        "by copy 1 zero copy 0 exit 0",
    ]


FEWER_DEVICES = textwrap.dedent(
    """
    import os, torch, torch.multiprocessing as mp

    def worker(q, back):
        try:
            q.get(timeout=60)
            back.put("no error")
        except Exception as error:
            back.put(type(error).__name__ + ": " + str(error))

    if __name__ == "__main__":
        x = torch.ones(4, device="ember:1")
        os.environ["EMBER_DEVICES"] = "1"   # the child has one device only
        ctx = mp.get_context("spawn")
        q, back = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=worker, args=(q, back))
        p.start()
        q.put(x)
        print(back.get(timeout=60))
        p.join(30)
        print("exit", p.exitcode)
    """
)


@pytest.mark.requires_two_devices
def test_a_share_that_cannot_be_mapped_raises_in_the_receiver(run_python, tmp_path):
    result = _run_script(run_python, tmp_path, FEWER_DEVICES)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("EmberSharingError: "), lines
    assert "the tensor was on ember:1 but this process has 1 ember device(s)" in lines[0], lines
    assert lines[1] == "exit 0"


STORAGE = textwrap.dedent(
    """
    import torch, torch.multiprocessing as mp

    def worker(q, back):
        s = q.get(timeout=60)
        back.put((type(s).__name__, s.device.type, s.nbytes()))
        torch.empty(0, dtype=torch.uint8, device=s.device).set_(s).fill_(3)
        back.put("written")

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        q, back = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=worker, args=(q, back))
        p.start()
        x = torch.zeros(8, dtype=torch.uint8, device="ember")
        q.put(x.untyped_storage())
        print(back.get(timeout=60), back.get(timeout=60), x.tolist())
        p.join(30)
        print("exit", p.exitcode)
    """
)


def test_an_untyped_storage_crosses_as_a_shared_storage(run_python, tmp_path):
    result = _run_script(run_python, tmp_path, STORAGE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "('UntypedStorage', 'ember', 8) written [3, 3, 3, 3, 3, 3, 3, 3]",
        "exit 0",
    ]
