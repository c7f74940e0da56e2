"""An exponential moving average of the trained (LoRA) parameters, used for evaluation when enabled."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

# where accelerate's `save_state` puts the first (in `vlmr grpo`, the only) object registered for checkpointing
EMA_STATE = "custom_checkpoint_0.pkl"


class ParameterEMA:
    """shadow ← decay·shadow + (1 − decay)·param after each optimizer step; `applied()` evaluates with it.

    `state_dict` / `load_state_dict` let accelerate checkpoint it (`register_for_checkpointing`).
    """

    def __init__(self, parameters: list[torch.nn.Parameter], decay: float = 0.95):
        self.parameters = parameters
        self.decay = decay
        self.shadow = [p.detach().clone() for p in parameters]

    @torch.no_grad()
    def update(self) -> None:
        for shadow, parameter in zip(self.shadow, self.parameters):
            shadow.lerp_(parameter.detach(), 1 - self.decay)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Swap the averaged values in for the duration of the block."""
        current = [p.detach().clone() for p in self.parameters]
        self.apply()
        try:
            yield
        finally:
            self._copy_into(current)

    def apply(self) -> None:
        """Overwrite the parameters with the averaged values, for good."""
        self._copy_into(self.shadow)

    @torch.no_grad()
    def _copy_into(self, values: list[torch.Tensor]) -> None:
        for parameter, value in zip(self.parameters, values):
            parameter.copy_(value)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "shadow": [s.clone() for s in self.shadow]}

    def load_state_dict(self, state: dict) -> None:
        if len(state["shadow"]) != len(self.shadow):
            raise ValueError(f"EMA state has {len(state['shadow'])} tensors, the model {len(self.shadow)}")
        self.decay = state["decay"]
        for shadow, saved in zip(self.shadow, state["shadow"]):
            shadow.copy_(saved)
