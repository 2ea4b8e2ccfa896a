"""Learning-rate schedules: sequences computed by hand from Burn's definitions, bad configs,
and records that resume the same sequence."""
import math

import pytest

from engine.optim import (
    ConstantLr,
    CosineAnnealingLrSchedulerConfig,
    ExponentialLrSchedulerConfig,
    LinearLrSchedulerConfig,
    LrSchedulerError,
    NoamLrSchedulerConfig,
    SequentialLrSchedulerConfig,
    StepLrSchedulerConfig,
    as_scheduler,
    linear_warmup,
)


def seq(s, n):
    return [s.step() for _ in range(n)]


def test_constant():
    assert seq(ConstantLr(0.3), 3) == [0.3, 0.3, 0.3]
    assert seq(as_scheduler(0.01), 2) == [0.01, 0.01]


def test_linear_decreasing_increasing_and_flat():
    assert seq(LinearLrSchedulerConfig(0.9, 0.5, 4).init(), 6) == pytest.approx([0.9, 0.8, 0.7, 0.6, 0.5, 0.5])
    assert seq(LinearLrSchedulerConfig(0.01, 0.04, 3).init(), 5) == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.04])
    assert seq(LinearLrSchedulerConfig(0.3, 0.3, 2).init(), 4) == pytest.approx([0.3] * 4)


def test_cosine_with_restart():
    # initial 0.5, min 0.1, 2 iterations: cos(0), cos(pi/2), cos(pi), restart
    assert seq(CosineAnnealingLrSchedulerConfig(0.5, 2, min_lr=0.1).init(), 4) == pytest.approx([0.5, 0.3, 0.1, 0.5])
    s = CosineAnnealingLrSchedulerConfig(1.0, 4).init()
    assert seq(s, 3) == pytest.approx([1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5])


def test_step():
    assert seq(StepLrSchedulerConfig(0.5, 3, gamma=0.1).init(), 9) == pytest.approx(
        [0.5, 0.5, 0.5, 0.05, 0.05, 0.05, 0.005, 0.005, 0.005])
    assert seq(StepLrSchedulerConfig(0.1, 2, gamma=2.0).init(), 6) == pytest.approx([0.1, 0.1, 0.2, 0.2, 0.4, 0.4])
    assert StepLrSchedulerConfig(0.4, 2).gamma == 0.1  # Burn's default


def test_exponential():
    assert seq(ExponentialLrSchedulerConfig(0.8, 0.1).init(), 5) == pytest.approx([0.8, 0.08, 0.008, 0.0008, 0.00008])


def test_noam_values_and_shape():
    s = NoamLrSchedulerConfig(2.0, warmup_steps=4, model_size=16).init()
    lrs = seq(s, 8)
    # factor * d^-0.5 * min(t^-0.5, t * w^-1.5); w^-1.5 = 1/8
    expected = [2.0 * 0.25 * min(t ** -0.5, t / 8.0) for t in range(1, 9)]
    assert lrs == pytest.approx(expected)
    assert lrs[:4] == sorted(lrs[:4]) and lrs[3:] == sorted(lrs[3:], reverse=True)
    assert NoamLrSchedulerConfig(1.0).warmup_steps == 4000 and NoamLrSchedulerConfig(1.0).model_size == 512


def test_sequential_switches_at_milestones():
    cfg = SequentialLrSchedulerConfig(
        [LinearLrSchedulerConfig(0.1, 0.3, 2), ExponentialLrSchedulerConfig(0.5, 0.5), CosineAnnealingLrSchedulerConfig(0.8, 2)],
        [2, 5],
    )
    assert seq(cfg.init(), 8) == pytest.approx([0.1, 0.2, 0.5, 0.25, 0.125, 0.8, 0.4, 0.0])


def test_linear_warmup_then_cosine():
    s = linear_warmup(CosineAnnealingLrSchedulerConfig(0.4, 2), 4).init()
    assert seq(s, 7) == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.2, 0.0])


@pytest.mark.parametrize("cfg, words", [
    (lambda: LinearLrSchedulerConfig(0.0, 0.5, 10), "initial_lr"),
    (lambda: LinearLrSchedulerConfig(1.5, 0.5, 10), "initial_lr"),
    (lambda: LinearLrSchedulerConfig(0.5, -0.1, 10), "final_lr"),
    (lambda: LinearLrSchedulerConfig(0.5, 0.1, 0), "num_iters"),
    (lambda: CosineAnnealingLrSchedulerConfig(0.5, 10, min_lr=0.6), "min_lr"),
    (lambda: CosineAnnealingLrSchedulerConfig(0.5, 0), "num_iters"),
    (lambda: StepLrSchedulerConfig(0.5, 0), "step_size"),
    (lambda: ExponentialLrSchedulerConfig(0.5, 1.5), "gamma"),
    (lambda: NoamLrSchedulerConfig(1.0, warmup_steps=0), "warmup_steps"),
    (lambda: NoamLrSchedulerConfig(1.0, model_size=0), "model_size"),
    (lambda: SequentialLrSchedulerConfig([0.1, 0.2], [2, 3]), "milestones"),
    (lambda: SequentialLrSchedulerConfig([0.1, 0.2, 0.3], [3, 2]), "strictly increasing"),
])
def test_bad_configs_say_which_field(cfg, words):
    with pytest.raises(LrSchedulerError, match=words):
        cfg().init()


@pytest.mark.parametrize("make", [
    lambda: LinearLrSchedulerConfig(1.0, 0.01, 6),
    lambda: CosineAnnealingLrSchedulerConfig(1.0, 9),
    lambda: StepLrSchedulerConfig(0.007, 10, 0.03),
    lambda: ExponentialLrSchedulerConfig(0.083, 0.3),
    lambda: NoamLrSchedulerConfig(1.0, 5, 8),
    lambda: linear_warmup(CosineAnnealingLrSchedulerConfig(0.5, 5), 3),
])
def test_record_resumes_the_same_sequence(make):
    truth = make().init()
    first = make().init()
    seq(truth, 5)
    seq(first, 5)
    resumed = make().init().load_record(dict(first.to_record()))
    assert seq(resumed, 12) == pytest.approx(seq(truth, 12), abs=1e-12)
