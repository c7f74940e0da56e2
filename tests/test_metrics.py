import numpy as np
import pytest

from vlm_rewards.evaluation.metrics import (
    mean_voc,
    pairwise_accuracy,
    progress_mae,
    step_correlation,
    success_auc,
    voc,
)
from vlm_rewards.evaluation.plots import plot_progress_curves, plot_training_curves

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_voc_known_values():
    rising = np.array([0.0, 0.1, 0.5, 0.6, 0.9])
    assert voc(rising) == pytest.approx(1.0)
    assert voc(rising[::-1]) == pytest.approx(-1.0)
    assert voc(np.full(5, 0.3)) == 0.0
    assert voc(np.array([0.1, np.nan, 0.5])) == 0.0
    assert voc(np.array([0.7])) == 0.0
    assert voc(np.array([0.0, 0.2, 0.1, 0.3])) == pytest.approx(0.8)  # one swapped pair


def test_voc_of_random_values_is_near_zero_on_average():
    rng = np.random.default_rng(0)
    assert abs(mean_voc([rng.random(16) for _ in range(400)])) < 0.05


def test_mean_voc():
    assert mean_voc([np.arange(4.0), np.arange(4.0)[::-1], np.zeros(4)]) == pytest.approx(0.0)
    with pytest.raises(ValueError):
        mean_voc([])


def test_pairwise_accuracy_counts_predicted_ties_as_half():
    p_first_better = np.array([0.9, 0.2, 0.5, 0.7])
    first_is_better = np.array([True, False, True, False])
    assert pairwise_accuracy(p_first_better, first_is_better) == pytest.approx((1 + 1 + 0.5 + 0) / 4)
    assert pairwise_accuracy(np.full(4, 0.5), first_is_better) == 0.5


def test_pairwise_accuracy_leaves_out_labelled_ties():
    tie = np.array([False, False, True, True])
    accuracy = pairwise_accuracy(np.array([0.9, 0.8, 0.1, 0.1]), np.array([True, True, False, True]), tie)
    assert accuracy == 1.0
    with pytest.warns(UserWarning, match="no untied pairs"):
        assert np.isnan(pairwise_accuracy(np.array([0.9]), np.array([True]), np.array([True])))
    with pytest.raises(ValueError, match="shapes"):
        pairwise_accuracy(np.array([0.9, 0.1]), np.array([True]))


def test_success_auc_known_values():
    success = np.array([False, False, True, True])
    assert success_auc(np.array([0.1, 0.2, 0.8, 0.9]), success) == 1.0
    assert success_auc(np.array([0.9, 0.8, 0.2, 0.1]), success) == 0.0
    assert success_auc(np.array([0.1, 0.4, 0.35, 0.8]), success) == 0.75
    with pytest.warns(UserWarning, match="all 3 episodes are failures"):
        assert np.isnan(success_auc(np.array([0.1, 0.2, 0.3]), np.zeros(3, bool)))


def test_progress_mae():
    assert progress_mae(np.array([0.0, 0.5, 1.0]), np.array([0.0, 0.25, 0.5])) == pytest.approx(0.25)
    assert progress_mae(np.array([np.nan, 0.5]), np.array([0.0, 0.25])) == pytest.approx(0.25)
    assert np.isnan(progress_mae(np.array([np.nan]), np.array([0.0])))
    with pytest.raises(ValueError, match="shape"):
        progress_mae(np.zeros(3), np.zeros(4))


def test_plots_write_png_files_atomically(tmp_path):
    rng = np.random.default_rng(0)
    curves = [
        {
            "title": f"episode {i}",
            "predicted": rng.random(8),
            "label": np.linspace(0, 1, 8) if i % 2 else None,
        }
        for i in range(15)
    ]
    plot_progress_curves(tmp_path / "progress.png", curves, max_panels=6)
    plot_training_curves(tmp_path / "training.png", {"loss": [(0, 1.0), (10, 0.5)], "voc": [(10, 0.3)]})
    for name in ["progress.png", "training.png"]:
        assert (tmp_path / name).read_bytes()[:8] == PNG_SIGNATURE
    assert sorted(path.name for path in tmp_path.iterdir()) == ["progress.png", "training.png"]


def test_step_correlation_follows_step_changes_not_frame_position():
    rng = np.random.default_rng(0)
    labels = [np.clip(np.cumsum(rng.uniform(-0.1, 0.3, 12)), 0, 1) for _ in range(20)]
    assert step_correlation([2 * label + 1 for label in labels], labels) == pytest.approx(1.0)
    by_position = [1 - np.exp(-np.arange(12) / 4) for _ in labels]  # rises early, as most labels do
    assert step_correlation(by_position, labels) == 0.0
    noisy = [label + rng.normal(0, 0.05, 12) for label in labels]
    assert 0.2 < step_correlation(noisy, labels) < 0.9
    with_nan = [label.copy() for label in labels]
    with_nan[0][3] = np.nan  # the two steps next to it are left out
    assert step_correlation(with_nan, labels) == pytest.approx(1.0)
    assert np.isnan(step_correlation(by_position, by_position))  # labels that all change alike: nothing to follow
