"""ember tensors across processes (issue 14, item 2): mp.Queue and
DataLoader workers pass ember tensors by value (torch_ember/ember/ipc.py);
what cannot cross raises in the receiving process, never a hang. Each case
runs in a fresh interpreter, with timeouts that turn a hang into a failure."""

import textwrap

import pytest

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

    loader = DataLoader(Items(), batch_size=4, num_workers=2, timeout=120)
    print([(b.device.type, b[:, 0].tolist()) for b in loader])
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
        "EmberSharingError",
    ]
