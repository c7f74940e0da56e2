import numpy as np
import pytest

from vlm_rewards.normalization import RunningMeanStd


def test_a_first_batch_of_equal_values_keeps_the_prior_variance():
    """Without the prior the variance is 0 and -0.8063 is divided by sqrt(1e-8): -8,063."""
    stats = RunningMeanStd()
    stats.update(np.full(4, -0.8063))
    assert stats.count == 5 and stats.var > 0.2
    first = stats.normalize(np.full(4, -0.8063), center=False)
    assert np.all(np.abs(first) < 2)


def test_the_prior_fades_as_values_arrive():
    values = np.random.default_rng(0).normal(0.5, 0.2, size=10_000)
    stats = RunningMeanStd()
    stats.update(values)
    assert stats.mean == pytest.approx(values.mean(), rel=1e-3)
    assert stats.var == pytest.approx(values.var(), rel=0.01)


def test_prior_count_must_be_positive():
    with pytest.raises(ValueError, match="prior_count 0; expected > 0"):
        RunningMeanStd(prior_count=0)
