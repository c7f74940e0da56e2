import numpy as np
import pytest

from vlm_rewards.data.synthetic import ShapesWorld
from vlm_rewards.interface import RewardRequest


@pytest.fixture
def world() -> ShapesWorld:
    return ShapesWorld(size=56)


@pytest.fixture
def expert_requests(world) -> list[RewardRequest]:
    rng = np.random.default_rng(0)
    episodes = [world.rollout(rng, 8, "expert") for _ in range(4)]
    return [RewardRequest(e.frames, e.instruction, reference=e.goal_frame) for e in episodes]
