"""Scripted policies acting on the state observation, so they run on vector-env observation batches.

- `expert`: solves the task; `noise` adds Gaussian action noise (std in action units).
- `wrong_object`: the expert for a distractor (another target / block / zone), a failure that looks competent.
- `random`: uniform actions.
- `detour`: the expert after a detour through a random point of the workspace (drawn per episode,
  `detour_waypoint`): its frames cover the table off the expert's straight lines, in every stage the
  detour crosses (Carry: the block is picked up wherever the path meets it, and carried on).

An env may bring its own scripted policy as `env.unwrapped.expert()` (an object with `act(obs)` and
`action_size`, e.g. Meta-World's in robotics/metaworld.py); it has no distractors, so no `wrong_object`.
"""

from __future__ import annotations

import numpy as np

from vlm_rewards.robotics.config import POLICIES
from vlm_rewards.robotics.tasks import BLOCK_HALF, EE_RADIUS, WORKSPACE, CarryEnv, PushEnv, ReachEnv

GAIN = 12.0  # action per metre of position error; saturates beyond ~8 cm
DETOUR_REACHED = 0.03  # the detour ends once the effector is this close to its waypoint


def _towards(ee: np.ndarray, point: np.ndarray, gain: float = GAIN) -> np.ndarray:
    return np.clip(gain * (point - ee), -1.0, 1.0)


class ReachExpert:
    action_size = 2

    def __init__(self, num_targets: int):
        self.num_targets = self.num_objects = num_targets

    def named_object(self, obs: np.ndarray) -> int:
        return int(np.argmax(obs[4 + 2 * self.num_targets : 4 + 3 * self.num_targets]))

    def act(self, obs: np.ndarray, target: int | None = None) -> np.ndarray:
        targets = obs[4 : 4 + 2 * self.num_targets].reshape(-1, 2)
        return _towards(obs[0:2], targets[self.named_object(obs) if target is None else target])


class PushExpert:
    """Go behind the block (seen from the zone), then push through it toward the zone centre."""

    behind = EE_RADIUS + BLOCK_HALF + 0.025  # pre-push distance from the block centre
    # the effector's last aim, from the zone centre: the block comes to rest 1–1.5 cm short of the centre
    # (an aim 0.5 cm closer sometimes carries the block past it)
    push_end = EE_RADIUS + BLOCK_HALF + 0.015
    action_size = 2

    def __init__(self, num_blocks: int, num_zones: int):
        self.num_blocks, self.num_zones = num_blocks, num_zones
        self.num_objects = num_blocks

    def named_object(self, obs: np.ndarray) -> int:
        start = 4 + 2 * self.num_blocks + 2 * self.num_zones
        return int(np.argmax(obs[start : start + self.num_blocks]))

    def act(self, obs: np.ndarray, target: int | None = None) -> np.ndarray:
        ee = obs[0:2]
        blocks = obs[4 : 4 + 2 * self.num_blocks].reshape(-1, 2)
        zones_end = 4 + 2 * self.num_blocks + 2 * self.num_zones
        zones = obs[4 + 2 * self.num_blocks : zones_end].reshape(-1, 2)
        zone = zones[int(np.argmax(obs[zones_end + self.num_blocks : zones_end + self.num_blocks + self.num_zones]))]
        block = blocks[self.named_object(obs) if target is None else target]

        to_zone = zone - block
        direction = to_zone / max(np.linalg.norm(to_zone), 1e-6)
        pre_push = block - direction * self.behind
        offset = ee - block
        along = offset @ direction  # > 0: the end-effector is on the zone side of the block
        lateral = offset - along * direction
        if np.linalg.norm(ee - pre_push) > 0.02 and (along > -0.03 or np.linalg.norm(lateral) > 0.02):
            if along > -0.03 and np.linalg.norm(lateral) < 0.06:
                # in front of (or beside) the block: step sideways first so the detour does not push it
                side = (
                    lateral / max(np.linalg.norm(lateral), 1e-6)
                    if np.linalg.norm(lateral) > 1e-3
                    else (np.array([-direction[1], direction[0]]))
                )
                return _towards(ee, block + side * 0.09 - direction * 0.02)
            return _towards(ee, pre_push)
        # push the block to the zone centre; a push bias until close
        bias = 0.3 * direction if np.linalg.norm(to_zone) > 0.03 else 0.0
        return np.clip(_towards(ee, zone - direction * self.push_end, gain=8.0) + bias, -1, 1)


class CarryExpert:
    """Go to the block (it is picked up on contact), then carry it to the zone centre.
    The objects a `wrong_object` expert may go for are the zones."""

    action_size = 2

    def __init__(self, num_zones: int):
        self.num_zones = self.num_objects = num_zones

    def named_object(self, obs: np.ndarray) -> int:
        return int(np.argmax(obs[6 + 2 * self.num_zones : 6 + 3 * self.num_zones]))

    def act(self, obs: np.ndarray, target: int | None = None) -> np.ndarray:
        ee, block, held = obs[0:2], obs[4:6], obs[6 + 3 * self.num_zones] > 0.5
        if not held:
            return _towards(ee, block)
        zones = obs[6 : 6 + 2 * self.num_zones].reshape(-1, 2)
        return _towards(ee, zones[self.named_object(obs) if target is None else target])


Expert = ReachExpert | PushExpert | CarryExpert


def make_expert(env) -> Expert:
    """The expert of an env (any wrapper around a `vlmr/*` env, or an env with an `expert()` method)."""
    task = env.unwrapped
    if hasattr(task, "expert"):
        return task.expert()
    if isinstance(task, ReachEnv):
        return ReachExpert(task.num_targets)
    if isinstance(task, PushEnv):
        return PushExpert(task.num_blocks, task.num_zones)
    if isinstance(task, CarryEnv):
        return CarryExpert(task.num_zones)
    raise ValueError(f"no scripted expert for {type(task).__name__}; experts exist for ReachEnv, PushEnv, CarryEnv")


def scripted_action(
    expert: Expert,
    policy: str,
    obs: np.ndarray,
    rng: np.random.Generator,
    noise: float = 0.0,
    wrong_target: int | None = None,
    waypoint: np.ndarray | None = None,
) -> np.ndarray:
    """One action of `policy` for one observation. `wrong_target`: the distractor `wrong_object` goes for;
    `waypoint`: where `detour` still goes before acting as the expert (None once reached)."""
    if policy == "random":
        return rng.uniform(-1.0, 1.0, size=expert.action_size).astype(np.float32)
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}; expected one of {POLICIES}")
    if policy == "wrong_object" and wrong_target is None:
        raise ValueError(f"wrong_object: the task of {type(expert).__name__} has no distractor to go for")
    if policy == "detour" and waypoint is not None:
        return _towards(obs[0:2], waypoint).astype(np.float32)
    action = expert.act(obs, target=wrong_target if policy == "wrong_object" else None)
    if noise > 0:
        action = action + rng.normal(0.0, noise, size=expert.action_size)
    return np.clip(action, -1.0, 1.0).astype(np.float32)


def detour_waypoint(expert: Expert, rng: np.random.Generator) -> np.ndarray:
    """A `detour` episode's waypoint: uniform over the workspace."""
    if not isinstance(expert, Expert):
        raise ValueError(f"detour: needs a vlmr task's expert (the effector at obs[0:2]), got {type(expert).__name__}")
    return rng.uniform(-WORKSPACE, WORKSPACE, size=2)


def detour_reached(obs: np.ndarray, waypoint: np.ndarray | None) -> np.ndarray | None:
    """The waypoint still to visit after this observation: None once the effector is there."""
    return None if waypoint is None or np.linalg.norm(obs[0:2] - waypoint) < DETOUR_REACHED else waypoint


def pick_wrong_target(expert: Expert, obs: np.ndarray, rng: np.random.Generator) -> int | None:
    """A distractor for `wrong_object`; None for an expert of a task without distractors."""
    if not isinstance(expert, Expert):
        return None
    named = expert.named_object(obs)
    return int(rng.choice([i for i in range(expert.num_objects) if i != named]))
