"""torch.distributed on ember: the "ember" c10d backend (gloo's transport on
zero-copy CPU aliases of ember tensors, torch_ember/distributed). Every case
spawns real processes in a fresh interpreter, bounded by a timeout."""

import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_ember  # noqa: F401

TESTS = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 300

COLLECTIVES = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp

    def run(rank, world, port, backend):
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world)
        E = "ember"
        t = torch.full((4,), float(rank + 1), device=E)
        dist.all_reduce(t)
        assert t.device.type == E and t.tolist() == [3.0] * 4, t
        t = torch.full((2,), float(rank + 1), device=E)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        assert t.tolist() == [2.0, 2.0]
        b = torch.arange(4.0, device=E) if rank == 0 else torch.zeros(4, device=E)
        dist.broadcast(b, 0)
        assert b.tolist() == [0, 1, 2, 3]
        r = torch.full((2,), float(rank + 1), device=E)
        dist.reduce(r, dst=1)
        if rank == 1:
            assert r.tolist() == [3.0, 3.0]
        out = [torch.zeros(2, device=E) for _ in range(world)]
        dist.all_gather(out, torch.full((2,), float(rank), device=E))
        assert [o.tolist() for o in out] == [[0, 0], [1, 1]]
        flat = torch.zeros(4, device=E)
        dist.all_gather_into_tensor(flat, torch.full((2,), float(rank), device=E))
        assert flat.tolist() == [0, 0, 1, 1]
        shard = torch.zeros(2, device=E)
        dist.reduce_scatter_tensor(shard, torch.arange(4.0, device=E))
        assert shard.tolist() == ([0, 2] if rank == 0 else [4, 6]), shard
        parts = torch.empty(2, device=E)
        dist.all_to_all_single(parts, torch.tensor([rank * 10.0, rank * 10.0 + 1], device=E))
        assert parts.tolist() == [rank, 10 + rank], parts
        outs = [torch.empty(1, device=E) for _ in range(world)]
        dist.all_to_all(outs, [torch.tensor([rank * 10.0 + i], device=E) for i in range(world)])
        assert [o.item() for o in outs] == [rank, 10 + rank]
        g = [torch.zeros(1, device=E) for _ in range(world)] if rank == 0 else None
        dist.gather(torch.tensor([rank + 5.0], device=E), g, dst=0)
        if rank == 0:
            assert [x.item() for x in g] == [5.0, 6.0]
        s = torch.zeros(1, device=E)
        dist.scatter(s, [torch.tensor([7.0], device=E), torch.tensor([8.0], device=E)]
                     if rank == 0 else None, src=0)
        assert s.item() == 7.0 + rank
        if rank == 0:
            dist.send(torch.tensor([7.0, 8.0], device=E), 1)
        else:
            got = torch.zeros(2, device=E)
            dist.recv(got, 0)
            assert got.tolist() == [7.0, 8.0]
        # A view of a larger ember tensor: gloo writes through to its bytes.
        base = torch.zeros(3, 4, device=E)
        row = base[1]
        row.fill_(rank + 1.0)
        dist.all_reduce(row)
        assert base[1].tolist() == [3.0] * 4 and base[0].sum().item() == 0
        work = dist.all_reduce(torch.ones(2, device=E), async_op=True)
        work.wait()
        assert work.get_future().value()[0].device.type == E
        cpu = torch.ones(3)
        dist.all_reduce(cpu)
        assert cpu.tolist() == [2.0] * 3
        dist.barrier()
        print(f"rank {rank} ok")
        dist.destroy_process_group()

    if __name__ == "__main__":
        port, backend = int(sys.argv[1]), sys.argv[2]
        mp.spawn(run, args=(2, port, backend), nprocs=2)
    """
)

DDP = textwrap.dedent(
    """
    import os, sys, torch, transformers
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    sys.path.insert(0, sys.argv[3])
    from tiny_models import bert_config

    def make():
        torch.manual_seed(0)
        config = bert_config(transformers, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0, num_labels=3)
        return transformers.BertForSequenceClassification(config).to("ember")

    def batches():
        g = torch.Generator().manual_seed(1)
        return [(torch.randint(0, 1000, (8, 16), generator=g),
                 torch.randint(0, 3, (8,), generator=g)) for _ in range(3)]

    def train(model, rank=0, world=1):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        per = 8 // world
        for ids, labels in batches():
            ids, labels = ids[rank * per:(rank + 1) * per], labels[rank * per:(rank + 1) * per]
            loss = model(input_ids=ids.to("ember"), labels=labels.to("ember")).loss
            opt.zero_grad()
            loss.backward()
            opt.step()

    mode, out = sys.argv[1], sys.argv[2]
    if mode == "single":
        model = make()
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, "initial.pt")
        train(model)
    else:
        dist.init_process_group("cpu:gloo,ember:ember")  # torchrun's env:// rendezvous
        rank, world = dist.get_rank(), dist.get_world_size()
        model = DDP(make())
        assert dist.get_backend() == "cpu:gloo,ember:ember"
        train(model, rank, world)
        model = model.module
        dist.destroy_process_group()
        if rank != 0:
            sys.exit(0)
    assert all(p.device.type == "ember" for p in model.parameters())
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, out)
    print("saved", mode)
    """
)

FSDP = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def run(rank, world, port):
        dist.init_process_group("cpu:gloo,ember:ember", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world)
        torch.backends.ember.cpu_parity = True  # compared with CPU below
        mesh = init_device_mesh("ember", (world,))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 4)).to("ember")
        reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                        torch.nn.Linear(16, 4))
        reference.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        assert all(p.to_local().device.type == "ember" for p in model.parameters())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(3)
        for _ in range(3):
            x = torch.randn(4, 8, generator=g)
            loss = model(x[rank * 2:rank * 2 + 2].to("ember")).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            ref_loss = reference(x).pow(2).mean()
            ref_opt.zero_grad()
            ref_loss.backward()
            ref_opt.step()
        full = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
        for k, v in reference.state_dict().items():
            torch.testing.assert_close(full[k], v, rtol=1e-5, atol=1e-6)
        print(f"rank {rank} fsdp ok")
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(run, args=(2, int(sys.argv[1])), nprocs=2)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(args, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_backend_is_registered_for_ember_devices():
    import torch.distributed as dist

    assert "ember" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map.get("ember") == "ember"


@pytest.mark.parametrize("backend", ["ember", "cpu:gloo,ember:ember"])
def test_collectives_on_ember_tensors(tmp_path, backend):
    script = tmp_path / "collectives.py"
    script.write_text(COLLECTIVES)
    result = _run([str(script), str(_free_port()), backend], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "rank 0 ok" in result.stdout and "rank 1 ok" in result.stdout


def test_fsdp2_fully_shard_matches_cpu_on_the_whole_batch(tmp_path):
    script = tmp_path / "fsdp.py"
    script.write_text(FSDP)
    result = _run([str(script), str(_free_port())], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "rank 0 fsdp ok" in result.stdout and "rank 1 fsdp ok" in result.stdout


def _single_run(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    single = _run([str(script), "single", "single.pt", TESTS], tmp_path)
    assert single.returncode == 0, single.stderr[-4000:]
    return script


def _assert_same_training(tmp_path, ddp_file):
    initial = torch.load(tmp_path / "initial.pt")
    one = torch.load(tmp_path / "single.pt")
    two = torch.load(tmp_path / ddp_file)
    assert one.keys() == two.keys()
    moved = [name for name in one if not torch.equal(one[name], initial[name])]
    assert len(moved) > len(one) // 2  # training changed the weights
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5, msg=name)


def test_ddp_two_processes_match_one_process_on_the_whole_batch(tmp_path):
    pytest.importorskip("transformers")
    script = _single_run(tmp_path)
    ddp = _run(
        [
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
            str(script),
            "ddp",
            "ddp.pt",
            TESTS,
        ],
        tmp_path,
    )
    assert ddp.returncode == 0, ddp.stderr[-4000:]
    _assert_same_training(tmp_path, "ddp.pt")


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair: ("ns", "address", "ifname")
    for each host. Removed afterwards. Skips where namespaces cannot be made."""
    tag = f"{os.getpid() % 100000}"
    hosts = [
        (f"ember-a{tag}", "10.231.7.1", f"ea{tag}"),
        (f"ember-b{tag}", "10.231.7.2", f"eb{tag}"),
    ]
    if shutil.which("ip") is None:
        pytest.skip("cannot create network namespaces here: no `ip` command (iproute2)")
    made = _ip("netns", "add", hosts[0][0])
    if made.returncode != 0:
        pytest.skip(f"cannot create network namespaces here: {made.stderr.strip()}")
    try:
        steps = [
            ("netns", "add", hosts[1][0]),
            ("link", "add", hosts[0][2], "type", "veth", "peer", "name", hosts[1][2]),
        ]
        for ns, address, ifname in hosts:
            steps += [
                ("link", "set", ifname, "netns", ns),
                ("-n", ns, "addr", "add", f"{address}/24", "dev", ifname),
                ("-n", ns, "link", "set", ifname, "up"),
                ("-n", ns, "link", "set", "lo", "up"),
            ]
        for step in steps:
            result = _ip(*step)
            if result.returncode != 0:
                pytest.skip(f"cannot set up the veth pair: ip {' '.join(step)}: {result.stderr}")
        yield hosts
    finally:
        for ns, _, _ in hosts:
            _ip("netns", "del", ns)


def test_ddp_across_two_hosts_in_network_namespaces(tmp_path, two_hosts):
    pytest.importorskip("transformers")
    script = _single_run(tmp_path)
    master = two_hosts[0][1]
    port = "29631"
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    procs = []
    for rank, (ns, _, ifname) in enumerate(two_hosts):
        command = [
            "ip", "netns", "exec", ns, "env", f"GLOO_SOCKET_IFNAME={ifname}",
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1",
            "--master-addr", master, "--master-port", port,
            str(script), "ddp", f"hosts{rank}.pt", TESTS,
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                command,
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=TIMEOUT))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-4000:]
    _assert_same_training(tmp_path, "hosts0.pt")


RELEASE = textwrap.dedent(
    """
    import time, torch, torch.distributed as dist
    import torch_ember.distributed as ed

    dist.init_process_group("ember", init_method="tcp://127.0.0.1:" + __import__("sys").argv[1],
                            rank=0, world_size=1)
    t = torch.ones(8, device="ember")
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert ed._held_by_gloo() == 1  # the Work keeps its alias
    start = time.monotonic()
    ed._wait_for_gloo_release(timeout_s=0.3)
    assert time.monotonic() - start >= 0.3  # bounded: a held Work is waited for, not forever
    del work
    ed._wait_for_gloo_release(timeout_s=5.0)
    assert ed._held_by_gloo() == 0  # released: no gloo worker can drop it at exit
    dist.destroy_process_group()
    print("release ok")
    """
)


def test_gloo_lets_go_of_ember_aliases_before_exit(tmp_path):
    """A gloo worker that drops a finished collective's tensors after the
    interpreter began finalising aborts the process; ember's backend tracks
    the aliases it hands gloo, and shutdown and exit wait (boundedly) until
    gloo has let go of them."""
    script = tmp_path / "release.py"
    script.write_text(RELEASE)
    result = _run([str(script), str(_free_port())], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "release ok" in result.stdout
