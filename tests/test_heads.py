import math

import pytest
import torch

from vlm_rewards.models.heads import RewardHead, bradley_terry_loss, step_correlation_loss, two_hot


def test_two_hot_expectation_recovers_the_label():
    labels = torch.tensor([0.0, 0.013, 0.5, 0.77, 1.0])
    target = two_hot(labels, num_bins=11)
    assert torch.allclose(target.sum(-1), torch.ones(5))
    assert torch.allclose(target @ torch.linspace(0, 1, 11), labels, atol=1e-6)


@pytest.mark.parametrize("kind", ["regression", "bins"])
def test_progress_heads_fit_labels(kind):
    torch.manual_seed(0)
    head = RewardHead(hidden_size=8, kind=kind, num_bins=16, mlp_size=32)
    hidden = torch.randn(4, 6, 8)
    labels = torch.rand(4, 6)
    mask = torch.ones(4, 6, dtype=torch.bool)
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(300):
        optimizer.zero_grad()
        head.progress_loss(head(hidden), labels, mask).backward()
        optimizer.step()
    predicted = head.predict(head(hidden))
    assert predicted.shape == (4, 6)
    assert (predicted - labels).abs().max() < 0.05


def test_progress_loss_ignores_masked_frames():
    head = RewardHead(hidden_size=4, kind="regression")
    hidden = torch.randn(1, 3, 4)
    mask = torch.tensor([[True, True, False]])
    base = head.progress_loss(head(hidden), torch.tensor([[0.2, 0.4, 0.0]]), mask)
    changed = head.progress_loss(head(hidden), torch.tensor([[0.2, 0.4, 1.0]]), mask)
    assert base == changed


def test_scalar_head_has_no_progress_loss():
    head = RewardHead(hidden_size=4, kind="scalar")
    with pytest.raises(ValueError, match="needs a regression or bins head"):
        head.progress_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool))


def test_bradley_terry_loss():
    equal = bradley_terry_loss(torch.zeros(3), torch.zeros(3))
    assert equal.item() == pytest.approx(math.log(2))
    assert bradley_terry_loss(torch.tensor([5.0]), torch.tensor([0.0])) < 0.01
    with_margin = bradley_terry_loss(torch.tensor([1.0]), torch.tensor([0.0]), margin=torch.tensor([1.0]))
    assert with_margin.item() == pytest.approx(math.log(2))
    # a tie is trained toward P = 1/2: its loss is smallest at equal rewards
    tie = torch.tensor([True])
    assert bradley_terry_loss(torch.zeros(1), torch.zeros(1), tie=tie) < bradley_terry_loss(
        torch.tensor([2.0]), torch.zeros(1), tie=tie
    )


def test_step_correlation_loss_asks_for_the_steps():
    labels = torch.tensor([[0.0, 0.2, 0.5, 0.9, 0.0], [0.0, 0.1, 0.1, 0.3, 0.6]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]).bool()  # the padded frame is left out
    assert step_correlation_loss(3 * labels + 1, labels, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert step_correlation_loss(-labels, labels, mask).item() == pytest.approx(2.0)
    frame_position = torch.linspace(0, 1, 5).expand(2, 5)  # steps of one size: nothing in common with the labels'
    assert step_correlation_loss(frame_position, labels, mask).item() == pytest.approx(1.0)
