"""vlm-rewards: VLM progress and preference reward models behind one reward interface."""

from vlm_rewards.interface import (
    BaseReward,
    RewardModel,
    RewardRequest,
    RewardResult,
    RewardSession,
    RewardSpec,
    SampleKey,
)
from vlm_rewards.registry import build_reward, register

__all__ = [
    "BaseReward",
    "RewardModel",
    "RewardRequest",
    "RewardResult",
    "RewardSession",
    "RewardSpec",
    "SampleKey",
    "build_reward",
    "register",
]
