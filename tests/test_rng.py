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


# ---------------------------------------------------------------------------
# Distributions: ember's draws against CPU's draws of the same generator
# (independent seeds, so agreement is statistical, not a copy). Two-sample
# Kolmogorov-Smirnov for continuous draws, chi-square on counts for discrete
# ones, plus moments; every threshold is a false-alarm rate of about 1e-6,
# so a wrong distribution fails and a right one practically never does.

N = 200_000
KS_C = 2.8  # sqrt(-ln(1e-6 / 2) / 2): two-sample KS critical value factor


def _ks_statistic(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample KS statistic: the largest gap between the empirical CDFs."""
    a, b = a.double().flatten().sort().values, b.double().flatten().sort().values
    points = torch.cat([a, b])
    cdf_a = torch.searchsorted(a, points, right=True).double() / a.numel()
    cdf_b = torch.searchsorted(b, points, right=True).double() / b.numel()
    return (cdf_a - cdf_b).abs().max().item()


def _assert_same_continuous(ember: torch.Tensor, cpu: torch.Tensor) -> None:
    n, m = ember.numel(), cpu.numel()
    bound = KS_C * ((n + m) / (n * m)) ** 0.5
    stat = _ks_statistic(ember.cpu(), cpu)
    assert stat < bound, f"KS statistic {stat:.4f} >= {bound:.4f}"


def _chi_square(counts: torch.Tensor, expected: torch.Tensor) -> float:
    return (((counts.double() - expected) ** 2) / expected).sum().item()


def _chi_square_bound(categories: int) -> float:
    # Upper 1e-6 quantile of chi-square(k - 1), Wilson-Hilferty approximation.
    k = categories - 1
    z = 4.75
    return k * (1 - 2 / (9 * k) + z * (2 / (9 * k)) ** 0.5) ** 3


def _draw_both(fn, seed: int):
    torch.ember.manual_seed(seed)
    torch.manual_seed(seed + 1)
    return fn("ember"), fn("cpu")


def test_ks_check_rejects_a_wrong_distribution():
    """The check itself can fail: a slightly shifted normal is caught."""
    torch.manual_seed(0)
    with pytest.raises(AssertionError, match="KS statistic"):
        _assert_same_continuous(torch.randn(N) + 0.05, torch.randn(N))


@pytest.mark.parametrize(
    ("name", "fn", "mean", "var"),
    [
        ("randn", lambda d: torch.randn(N, device=d), 0.0, 1.0),
        ("rand", lambda d: torch.rand(N, device=d), 0.5, 1 / 12),
        ("normal_", lambda d: torch.empty(N, device=d).normal_(3.0, 2.0), 3.0, 4.0),
        ("uniform_", lambda d: torch.empty(N, device=d).uniform_(-2.0, 6.0), 2.0, 64 / 12),
        ("randn_f64", lambda d: torch.randn(N, device=d, dtype=torch.float64), 0.0, 1.0),
        ("randn_strided", lambda d: torch.randn(N, 2, device=d).t()[0], 0.0, 1.0),
    ],
)
def test_continuous_draws_follow_their_distribution(name, fn, mean, var):
    ember, cpu = _draw_both(fn, 11)
    assert ember.device.type == "ember"
    _assert_same_continuous(ember, cpu)
    sample = ember.cpu().double()
    sd = var**0.5
    assert abs(sample.mean().item() - mean) < 5 * sd / N**0.5
    # Variance of a sample variance ~ 2 var^2 / N (normal), looser for uniform.
    assert abs(sample.var().item() - var) < 5 * var * (2 / N) ** 0.5


def test_randint_is_uniform_over_its_range():
    ember, cpu = _draw_both(lambda d: torch.randint(3, 13, (N,), device=d), 12)
    assert ember.min().item() == 3 and ember.max().item() == 12
    counts = torch.bincount(ember.cpu() - 3, minlength=10)
    assert _chi_square(counts, torch.full((10,), N / 10)) < _chi_square_bound(10)
    # Same distribution as CPU's draw: chi-square of the 2 x 10 table.
    cpu_counts = torch.bincount(cpu - 3, minlength=10)
    pooled = (counts + cpu_counts).double() / 2
    stat = _chi_square(counts, pooled) + _chi_square(cpu_counts, pooled)
    assert stat < _chi_square_bound(10)


@pytest.mark.parametrize("p", [0.03, 0.3, 0.9])
def test_bernoulli_frequency_matches_p(p):
    probs = torch.full((N,), p)
    ember, cpu = _draw_both(lambda d: torch.bernoulli(probs.to(d)), 13)
    for sample in (ember.cpu(), cpu):
        assert set(sample.unique().tolist()) <= {0.0, 1.0}
        assert abs(sample.mean().item() - p) < 5 * (p * (1 - p) / N) ** 0.5
    # A different p per element: each element follows its own p.
    ramp = torch.linspace(0, 1, N)
    torch.ember.manual_seed(14)
    drawn = torch.bernoulli(ramp.to("ember")).cpu()
    for lo in (0.0, 0.5):
        part = (ramp >= lo) & (ramp < lo + 0.5)
        expected = ramp[part].mean().item()
        assert abs(drawn[part].mean().item() - expected) < 5 * (0.25 / part.sum().item()) ** 0.5


def test_multinomial_counts_follow_the_probabilities():
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
    ember, cpu = _draw_both(lambda d: torch.multinomial(probs.to(d), N, replacement=True), 15)
    counts = torch.bincount(ember.cpu(), minlength=6)
    assert counts[5].item() == 0  # probability 0 is never drawn
    expected = probs[:5] * N
    assert _chi_square(counts[:5], expected) < _chi_square_bound(5)
    cpu_counts = torch.bincount(cpu, minlength=6)
    assert _chi_square(cpu_counts[:5], expected) < _chi_square_bound(5)


def test_multinomial_without_replacement_draws_distinct_indices_by_weight():
    weights = torch.tensor([8.0, 4.0, 2.0, 1.0, 1.0])
    torch.ember.manual_seed(16)
    rows = torch.multinomial(weights.to("ember").expand(20_000, 5), 2).cpu()
    assert (rows[:, 0] != rows[:, 1]).all()
    first = torch.bincount(rows[:, 0], minlength=5)
    expected = weights / weights.sum() * rows.shape[0]
    assert _chi_square(first, expected) < _chi_square_bound(5)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_drops_p_and_scales_the_rest(p):
    x = torch.rand(N) + 0.5
    torch.ember.manual_seed(17)
    out = F.dropout(x.to("ember"), p=p, training=True).cpu()
    kept = out != 0
    assert abs(1 - kept.double().mean().item() - p) < 5 * (p * (1 - p) / N) ** 0.5
    torch.testing.assert_close(out[kept], x[kept] / (1 - p))
    # Which elements drop is independent of their position: both halves
    # drop about p.
    for half in (kept[: N // 2], kept[N // 2 :]):
        assert abs(1 - half.double().mean().item() - p) < 5 * (p * (1 - p) / (N / 2)) ** 0.5
