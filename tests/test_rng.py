"""Random numbers on ember: per-device default generators, torch.Generator
objects, independence from the CPU generator, state save/restore."""

import warnings

import pytest
import torch
import torch.nn.functional as F

NUM_DEVICES = torch.ember.device_count()


def _draw(n: int = 64, device: str = "ember") -> torch.Tensor:
    return torch.randn(n, device=device).cpu()


def test_manual_seed_makes_draws_reproducible():
    torch.ember.manual_seed(1234)
    first = _draw()
    torch.ember.manual_seed(1234)
    second = _draw()
    assert torch.equal(first, second)
    # Consecutive draws differ.
    assert not torch.equal(second, _draw())


def test_different_seeds_differ():
    torch.ember.manual_seed(1)
    first = _draw()
    torch.ember.manual_seed(2)
    second = _draw()
    assert not torch.equal(first, second)


def test_cpu_seeding_and_draws_do_not_affect_ember():
    torch.ember.manual_seed(99)
    expected = _draw()
    torch.ember.manual_seed(99)
    torch.default_generator.manual_seed(123)
    for _ in range(20):
        torch.rand(100)
    assert torch.equal(_draw(), expected)


def test_ember_draws_do_not_advance_cpu_generator():
    torch.default_generator.manual_seed(5)
    expected = torch.rand(32)
    torch.default_generator.manual_seed(5)
    torch.ember.manual_seed(0)
    for _ in range(5):
        torch.randn(100, device="ember")
        torch.rand(10, device="ember")
    assert torch.equal(torch.rand(32), expected)


def test_rng_state_roundtrip():
    torch.ember.manual_seed(7)
    _draw()
    state = torch.ember.get_rng_state()
    assert state.dtype == torch.uint8
    assert state.device == torch.device("cpu")
    expected = _draw()
    _draw()
    torch.ember.set_rng_state(state)
    assert torch.equal(_draw(), expected)
    # The state is a copy: drawing does not change it.
    torch.ember.set_rng_state(state)
    assert torch.equal(_draw(), expected)


def test_rng_state_all_roundtrip():
    torch.ember.manual_seed_all(11)
    states = torch.ember.get_rng_state_all()
    assert len(states) == NUM_DEVICES
    expected = [_draw(device=f"ember:{i}") for i in range(NUM_DEVICES)]
    torch.ember.set_rng_state_all(states)
    assert all(torch.equal(_draw(device=f"ember:{i}"), expected[i]) for i in range(NUM_DEVICES))


def test_initial_seed():
    torch.ember.manual_seed(424242)
    assert torch.ember.initial_seed() == 424242
    assert torch.ember.default_generators[0].initial_seed() == 424242


def test_seed_picks_a_new_seed():
    torch.ember.manual_seed(3)
    torch.ember.seed()
    first = torch.ember.initial_seed()
    torch.ember.seed()
    assert torch.ember.initial_seed() != first  # 64-bit random seeds


def _generator_draws(generator: torch.Generator) -> list[torch.Tensor]:
    dev = "ember"
    return [
        torch.randn(8, device=dev, generator=generator),
        torch.rand(8, device=dev, generator=generator),
        torch.randint(0, 1000, (8,), device=dev, generator=generator),
        torch.randperm(20, device=dev, generator=generator),
        torch.empty(8, device=dev).normal_(generator=generator),
        torch.empty(8, device=dev).uniform_(generator=generator),
        torch.bernoulli(torch.full((16,), 0.5, device=dev), generator=generator),
        torch.multinomial(torch.ones(20, device=dev), 8, generator=generator),
    ]


def test_ember_generator_objects():
    generator = torch.Generator(device="ember")
    assert generator.device == torch.device("ember", 0)
    generator.manual_seed(2024)
    first = _generator_draws(generator)
    for result in first:
        assert result.device == torch.device("ember", 0)
    generator.manual_seed(2024)
    second = _generator_draws(generator)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a.cpu(), b.cpu())
    generator.manual_seed(2025)
    third = _generator_draws(generator)
    assert not torch.equal(first[0].cpu(), third[0].cpu())
    assert sorted(first[3].cpu().tolist()) == list(range(20))  # a permutation


def test_generator_objects_do_not_touch_default_generator():
    torch.ember.manual_seed(17)
    expected = _draw()
    torch.ember.manual_seed(17)
    generator = torch.Generator(device="ember").manual_seed(0)
    _generator_draws(generator)
    assert torch.equal(_draw(), expected)


def test_generator_state_roundtrip():
    generator = torch.Generator(device="ember").manual_seed(8)
    state = generator.get_state()
    expected = torch.rand(16, device="ember", generator=generator).cpu()
    generator.set_state(state)
    assert torch.equal(torch.rand(16, device="ember", generator=generator).cpu(), expected)


def test_cpu_generator_passed_to_ember_op_raises():
    cpu_generator = torch.Generator().manual_seed(0)
    with pytest.raises(RuntimeError):
        torch.randn(3, device="ember", generator=cpu_generator)
    target = torch.zeros(3, device="ember")
    with pytest.raises(RuntimeError):
        target.normal_(generator=cpu_generator)
    assert torch.equal(target.cpu(), torch.zeros(3))
    with pytest.raises(RuntimeError, match="Expected a 'ember' device type for generator"):
        torch.randperm(5, device="ember", generator=cpu_generator)


def test_ember_generator_passed_to_cpu_op_raises():
    generator = torch.Generator(device="ember").manual_seed(0)
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator"):
        torch.randn(3, generator=generator)


def test_dropout_is_reproducible_and_drops_about_p():
    x = torch.ones(20000, device="ember")
    torch.ember.manual_seed(0)
    first = F.dropout(x, p=0.3, training=True)
    torch.ember.manual_seed(0)
    second = F.dropout(x, p=0.3, training=True)
    assert first.device == torch.device("ember", 0)
    assert torch.equal(first.cpu(), second.cpu())
    zeros = (first == 0).float().mean().item()
    assert 0.27 < zeros < 0.33
    kept = first[first != 0].cpu()
    assert torch.allclose(kept, torch.full_like(kept, 1 / 0.7))
    assert torch.equal(F.dropout(x, p=0.3, training=False).cpu(), x.cpu())


def test_global_manual_seed_seeds_ember():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the 'does not take effect' warning fails too
        torch.manual_seed(31337)
        first = _draw()
        torch.manual_seed(31337)
        second = _draw()
    assert torch.equal(first, second)
    assert torch.ember.initial_seed() == 31337


@pytest.mark.requires_two_devices
def test_per_device_generators_are_independent():
    generator0, generator1 = torch.ember.default_generators
    assert generator0.device == torch.device("ember", 0)
    assert generator1.device == torch.device("ember", 1)
    torch.ember.manual_seed_all(0)
    expected = _draw(device="ember:0")
    torch.ember.manual_seed_all(0)
    for _ in range(3):
        _draw(device="ember:1")
    assert torch.equal(_draw(device="ember:0"), expected)
    # manual_seed seeds only the current device.
    with torch.ember.device(1):
        torch.ember.manual_seed(99)
    assert generator1.initial_seed() == 99
    assert generator0.initial_seed() == 0


@pytest.mark.requires_two_devices
def test_generator_on_second_device():
    generator = torch.Generator(device="ember:1").manual_seed(5)
    first = torch.randn(8, device="ember:1", generator=generator)
    assert first.device == torch.device("ember", 1)
    generator.manual_seed(5)
    assert torch.equal(torch.randn(8, device="ember:1", generator=generator).cpu(), first.cpu())


def test_fork_rng_restores_ember_state():
    torch.ember.manual_seed(0)
    expected = _draw()
    torch.ember.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the "initialises every device" note
        with torch.random.fork_rng(device_type="ember"):
            torch.ember.manual_seed(1)
            inside = _draw()
    assert not torch.equal(inside, expected)
    assert torch.equal(_draw(), expected)


@pytest.mark.requires_two_devices
def test_fork_rng_restores_every_device():
    torch.ember.manual_seed_all(0)
    expected = [_draw(device=f"ember:{i}") for i in range(2)]
    torch.ember.manual_seed_all(0)
    with torch.random.fork_rng(devices=[0, 1], device_type="ember"):
        _draw(device="ember:0")
        _draw(device="ember:1")
    assert torch.equal(_draw(device="ember:0"), expected[0])
    assert torch.equal(_draw(device="ember:1"), expected[1])
