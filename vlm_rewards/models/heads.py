"""Reward heads and their losses: what transformers does not ship for Qwen-VL.

A head maps backbone hidden states (read at each frame's position) to a value:
- `regression`: one logit per frame, progress = sigmoid(logit), trained with BCE (or MSE).
- `bins`: K logits per frame over bin centres 0, 1/(K−1), …, 1, trained with cross-entropy against a
  two-hot target (the label split between its two nearest centres), progress = the expectation.
- `scalar`: one unbounded value, the preference reward, trained Bradley–Terry.
A progress head may also carry a success head (one logit per frame, P(the task is done) = sigmoid,
trained with BCE), a stage head (S logits per frame, softmax over the task's stages, trained with
cross-entropy) and a goal-offset head (a linear map to where the named goal is from the effector, trained
with squared error on simulation state), read from the same hidden states: one backbone forward gives every
output.
Losses run in fp32 whatever the backbone's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vlm_rewards.models.config import HeadKind


@dataclass
class FrameLogits:
    """Every head's logits at each frame: progress (B, T[, K]); success (B, T), stage (B, T, S) and goal
    offset (B, T, 2) when the model has those heads, else None."""

    progress: torch.Tensor
    success: torch.Tensor | None = None
    stage: torch.Tensor | None = None
    goal_offset: torch.Tensor | None = None


class RewardHead(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        kind: HeadKind = "regression",
        num_bins: int = 32,
        mlp_size: int = 256,
        success: bool = False,
        num_stages: int | None = None,
        goal_offset: bool = False,
    ):
        super().__init__()
        self.kind = kind
        self.num_bins = num_bins
        self.mlp = _mlp(hidden_size, mlp_size, num_bins if kind == "bins" else 1)
        self.success = _mlp(hidden_size, mlp_size, 1) if success else None
        self.stage = _mlp(hidden_size, mlp_size, num_stages) if num_stages else None
        # linear on purpose: the hidden state itself must hold the offset, where the progress MLP can read it
        self.goal_offset = nn.Linear(hidden_size, 2) if goal_offset else None
        self.register_buffer("bin_centers", torch.linspace(0, 1, num_bins), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., hidden) -> progress (or scalar) logits (..., K) for bins, else (...)."""
        logits = self.mlp(hidden.float())
        return logits if self.kind == "bins" else logits.squeeze(-1)

    def frame_logits(self, hidden: torch.Tensor) -> FrameLogits:
        """(..., hidden) -> the logits of every head this model has."""
        hidden = hidden.float()
        return FrameLogits(
            progress=self(hidden),
            success=self.success(hidden).squeeze(-1) if self.success is not None else None,
            stage=self.stage(hidden) if self.stage is not None else None,
            goal_offset=self.goal_offset(hidden) if self.goal_offset is not None else None,
        )

    def predict(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits -> progress in [0, 1] (regression, bins) or the raw reward (scalar)."""
        if self.kind == "bins":
            return logits.softmax(-1) @ self.bin_centers
        if self.kind == "regression":
            return logits.sigmoid()
        return logits

    def progress_loss(self, logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, mse: bool = False):
        """Mean per-frame loss over frames where `mask` is true; labels in [0, 1]."""
        labels = labels.float().clamp(0, 1)
        if self.kind == "bins":
            per_frame = -(two_hot(labels, self.num_bins) * logits.log_softmax(-1)).sum(-1)
        elif self.kind == "regression":
            per_frame = (
                F.mse_loss(logits.sigmoid(), labels, reduction="none")
                if mse
                else F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
            )
        else:
            raise ValueError(f"progress_loss needs a regression or bins head, this head is {self.kind!r}")
        return _masked_mean(per_frame, mask)


def success_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean BCE over frames where `mask` is true and the success label is known (labels 1, 0; −1 unknown)."""
    known = mask & (labels >= 0)
    per_frame = F.binary_cross_entropy_with_logits(logits, labels.float().clamp(min=0), reduction="none")
    return _masked_mean(per_frame, known)


def stage_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over frames where `mask` is true and the stage is known (labels 0..S−1; −1 unknown)."""
    known = mask & (labels >= 0)
    per_frame = F.cross_entropy(logits.transpose(1, -1), labels.long().clamp(min=0), reduction="none")
    return _masked_mean(per_frame, known)


def goal_offset_loss(predicted: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error (summed over the two axes) over frames where `mask` is true and the offset is known
    (labels (B, T, 2), NaN unknown)."""
    known = mask & torch.isfinite(labels).all(-1)
    per_frame = (predicted - labels.nan_to_num()).square().sum(-1)
    return _masked_mean(per_frame, known)


def _masked_mean(per_frame: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean over true entries of `mask`; 0 (with gradients, so every head joins each backward) when none."""
    mask = mask.float()
    return (per_frame * mask).sum() / mask.sum().clamp(min=1)


def _mlp(hidden_size: int, mlp_size: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(hidden_size, mlp_size), nn.GELU(), nn.Linear(mlp_size, outputs))


def step_correlation_loss(progress: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 − the Pearson correlation of predicted and labelled progress changes between frames next to each
    other in the clip, over all of the batch's frame pairs. Per-frame losses fit progress levels, and a
    curve that only rises with the frame's place in the clip already fits many of them; this term asks
    for the steps, whatever their scale."""
    pairs = mask[:, 1:] & mask[:, :-1]
    predicted = (progress[:, 1:] - progress[:, :-1])[pairs].float()
    target = (labels[:, 1:] - labels[:, :-1])[pairs].float()
    predicted, target = predicted - predicted.mean(), target - target.mean()
    return 1 - (predicted * target).sum() / (predicted.norm() * target.norm()).clamp(min=1e-8)


def two_hot(labels: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Split each label between the two nearest of `num_bins` centres so that the expectation is exact."""
    position = labels * (num_bins - 1)
    lower = position.floor().long()
    upper = (lower + 1).clamp(max=num_bins - 1)
    upper_weight = position - lower.float()
    target = torch.zeros(*labels.shape, num_bins, device=labels.device)
    target.scatter_add_(-1, lower.unsqueeze(-1), (1 - upper_weight).unsqueeze(-1))
    target.scatter_add_(-1, upper.unsqueeze(-1), upper_weight.unsqueeze(-1))
    return target


def bradley_terry_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    tie: torch.Tensor | None = None,
) -> torch.Tensor:
    """−log σ(r_chosen − r_rejected − margin); a tie is trained toward P = ½ (BCE with target ½)."""
    difference = chosen.float() - rejected.float()
    if margin is not None:
        difference = difference - margin.float()
    loss = -F.logsigmoid(difference)
    if tie is not None:
        tie_loss = F.binary_cross_entropy_with_logits(
            chosen.float() - rejected.float(), torch.full_like(difference, 0.5), reduction="none"
        )
        loss = torch.where(tie.bool(), tie_loss, loss)
    return loss.mean()
