import os

import numpy as np
import pytest
import torch

from vlm_rewards.data.synthetic import ShapesWorld
from vlm_rewards.interface import RewardRequest

if "PYTEST_XDIST_WORKER" in os.environ:
    # one torch thread per xdist worker: oversubscribed OpenMP threads spin and slow everything down
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run far faster on one thread than on oversubscribed OpenMP threads (outside xdist too)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def world() -> ShapesWorld:
    return ShapesWorld(size=56)


@pytest.fixture
def expert_requests(world) -> list[RewardRequest]:
    rng = np.random.default_rng(0)
    episodes = [world.rollout(rng, 8, "expert") for _ in range(4)]
    return [RewardRequest(e.frames, e.instruction, reference=e.goal_frame) for e in episodes]
