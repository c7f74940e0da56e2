"""Meta-World v3 tasks as envs of the robotics stack (an optional extra with its own venv: Meta-World
pins mujoco 3.3; `scripts/setup_metaworld.sh`).

Importing this module registers `metaworld/<task>` for every v3 task of the installed Meta-World
(`metaworld/reach-v3`, `metaworld/push-v3`, ... the 50 of MT50), so `env.id: metaworld/reach-v3` works
in `vlm_rewards.robotics.envs.make_env` and in the collect and rl configs. Each env:

- acts on Meta-World's 39-d goal-observable state with its 4-d action (hand delta xyz, gripper);
- draws a new object and goal layout on every reset, from `reset(seed=...)`;
- renders named cameras (`corner`, `corner2`, `corner3`, `corner4`, `topview`, `behindGripper`,
  `gripperPOV`) with shadows, reflections, skybox and multisampling off, flipped upright (Meta-World's
  cameras were set up for bottom-up frames);
- says what to do in `instruction` (a hand-written sentence per v3 task, else one made from the name);
- puts in `info` Meta-World's keys and `is_success` (its `success`), `progress` (its shaped reward / 10,
  1 on success), `dense_reward` (progress − 1), `stage` (1 on success) and `instruction`;
- brings its scripted policy (`metaworld.policies`) as the expert: `env.unwrapped.expert()`.

There is no `render_goal`: goal-image rewards need a scene rendered solved, which Meta-World cannot pose.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence

import gymnasium as gym
import metaworld
import mujoco
import numpy as np
from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE
from metaworld.policies import ENV_POLICY_MAP

from vlm_rewards.robotics.tasks import open_renderer

TASKS = tuple(metaworld.ALL_V3_ENVIRONMENTS)  # every v3 task name, "assembly-v3" ... "window-close-v3"
MAX_EPISODE_STEPS = 500  # Meta-World's own horizon (max_path_length)
MAX_REWARD = 10.0  # Meta-World's v2 shaped rewards lie in [0, 10]

INSTRUCTIONS = {
    "assembly-v3": "pick up the nut and place it onto the peg",
    "basketball-v3": "dunk the basketball into the basket",
    "bin-picking-v3": "move the puck from one bin into the other bin",
    "box-close-v3": "grasp the lid and close the box with it",
    "button-press-topdown-v3": "press the button from the top",
    "button-press-topdown-wall-v3": "reach over the wall and press the button from the top",
    "button-press-v3": "press the button",
    "button-press-wall-v3": "reach around the wall and press the button",
    "coffee-button-v3": "push the button on the coffee machine",
    "coffee-pull-v3": "pull the mug away from the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "turn the dial",
    "disassemble-v3": "pick the nut up off the peg",
    "door-close-v3": "close the door",
    "door-lock-v3": "lock the door by turning the lock",
    "door-open-v3": "open the door",
    "door-unlock-v3": "unlock the door by turning the lock",
    "hand-insert-v3": "insert the gripper into the hole",
    "drawer-close-v3": "push the drawer closed",
    "drawer-open-v3": "pull the drawer open",
    "faucet-open-v3": "turn the faucet handle to open the faucet",
    "faucet-close-v3": "turn the faucet handle to close the faucet",
    "hammer-v3": "hammer the nail into the wall",
    "handle-press-side-v3": "press the handle down from the side",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up from the side",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "pick-place-wall-v3": "pick up the puck and place it at the goal behind the wall",
    "pick-out-of-hole-v3": "pick the puck up out of the hole",
    "reach-v3": "reach the goal position",
    "push-back-v3": "pull the puck back to the goal",
    "push-v3": "push the puck to the goal",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "plate-slide-v3": "slide the plate into the cabinet",
    "plate-slide-side-v3": "slide the plate sideways into the cabinet",
    "plate-slide-back-v3": "slide the plate back out of the cabinet",
    "plate-slide-back-side-v3": "slide the plate sideways out of the cabinet",
    "peg-unplug-side-v3": "unplug the peg sideways",
    "soccer-v3": "kick the ball into the goal",
    "stick-push-v3": "grasp the stick and push the box with it",
    "stick-pull-v3": "grasp the stick and pull the box with it",
    "push-wall-v3": "push the puck around the wall to the goal",
    "reach-wall-v3": "reach over the wall to the goal position",
    "shelf-place-v3": "pick up the puck and place it on the shelf",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the table",
    "window-open-v3": "slide the window open",
    "window-close-v3": "slide the window closed",
}


def instruction_for(task: str) -> str:
    """The task's instruction; a task missing from the table gets its name in words ("pick-place-v3" ->
    "pick place")."""
    return INSTRUCTIONS.get(task) or re.sub(r"-v\d+$", "", task).replace("-", " ")


class MetaWorldExpert:
    """Meta-World's scripted policy of a task, on the 39-d observation (no distractors: no `target`)."""

    action_size = 4

    def __init__(self, task: str):
        self.policy = ENV_POLICY_MAP[task]()

    def act(self, obs: np.ndarray, target: int | None = None) -> np.ndarray:
        if target is not None:
            raise ValueError("Meta-World tasks have no distractor object to act on")
        with warnings.catch_warnings():  # the policies' gains saturate the action on purpose
            warnings.filterwarnings("ignore", message=r"Constant\(s\) may be too high")
            return np.clip(self.policy.get_action(obs), -1.0, 1.0)


class MetaWorldEnv(gym.Env):
    """One Meta-World v3 task (`task`, e.g. "reach-v3") with the robotics stack's render and info API.

    num_distractors: accepted for the stack's env factory; Meta-World scenes are fixed, it is unused.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}  # 0.0125 s per step
    stage_budgets = (1.0,)  # one stage: stage-based labels equal time-based ones

    def __init__(
        self,
        task: str,
        render_mode: str | None = None,
        width: int = 64,
        height: int = 64,
        camera: str = "corner",
        reward_type: str = "sparse",
        terminate_on_success: bool = True,
        num_distractors: int | None = None,
    ):
        if task not in TASKS:
            raise ValueError(f"Meta-World task {task!r}; v3 tasks: {', '.join(TASKS)}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode {render_mode!r}; expected None or 'rgb_array'")
        if reward_type not in ("sparse", "dense"):
            raise ValueError(f"reward_type {reward_type!r}; expected 'sparse' or 'dense'")
        self.task, self.render_mode, self.width, self.height = task, render_mode, width, height
        self.reward_type, self.terminate_on_success = reward_type, terminate_on_success
        self.sim = ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE[f"{task}-goal-observable"](seed=0)
        self.sim._freeze_rand_vec = False  # a new layout on every reset (the constructor froze the first one)
        self.sim.seeded_rand_vec = True  # ... drawn from the sim's own seeded generator
        model = self.sim.model
        self.cameras = tuple(model.camera(i).name for i in range(model.ncam))
        if camera not in self.cameras:
            raise ValueError(f"camera {camera!r}; Meta-World has cameras {self.cameras}")
        self.camera = camera
        self.observation_space, self.action_space = self.sim.sawyer_observation_space, self.sim.action_space
        self._renderer: mujoco.Renderer | None = None

    @property
    def instruction(self) -> str:
        return instruction_for(self.task)

    def expert(self) -> MetaWorldExpert:
        return MetaWorldExpert(self.task)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.sim.seed(int(self.np_random.integers(2**31 - 1)))
        obs, _ = self.sim.reset()
        reward, info = self.sim.evaluate_state(obs, np.zeros(4, np.float32))
        return obs, self._info(reward, info)

    def step(self, action):
        obs, reward, _, truncated, info = self.sim.step(np.clip(np.asarray(action, np.float32), -1.0, 1.0))
        info = self._info(reward, info)
        reward = info["dense_reward"] if self.reward_type == "dense" else float(info["is_success"])
        terminated = info["is_success"] and self.terminate_on_success
        return obs, reward, terminated, truncated, info

    def _info(self, reward: float, info: dict) -> dict:
        success = bool(info["success"])
        progress = 1.0 if success else float(np.clip(reward / MAX_REWARD, 0.0, 1.0))
        return dict(
            info,
            is_success=success,
            progress=progress,
            dense_reward=progress - 1.0,
            stage=int(success),
            instruction=self.instruction,
        )

    def render(self, camera: str | None = None) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        return self._render_camera(camera or self.camera)

    def render_cameras(self, cameras: Sequence[str]) -> dict[str, np.ndarray]:
        """Frames of several cameras of the current state: name -> (H, W, 3) uint8."""
        return {name: self._render_camera(name) for name in cameras}

    def _render_camera(self, camera: str) -> np.ndarray:
        if camera not in self.cameras:
            raise ValueError(f"camera {camera!r}; Meta-World has cameras {self.cameras}")
        if self._renderer is None:
            self._renderer = self._open_renderer()
        self._renderer.update_scene(self.sim.data, camera=camera)
        return np.ascontiguousarray(self._renderer.render()[::-1])

    def _open_renderer(self) -> mujoco.Renderer:
        """Without multisampling, into an offscreen buffer of the frame's size (Meta-World's is 640x480 with 4x
        MSAA): on a CPU renderer (llvmpipe) a 64 px frame of the ~67k-triangle arm costs about half the time."""
        visual = self.sim.model.vis
        visual.quality.offsamples = 0
        visual.global_.offwidth, visual.global_.offheight = self.width, self.height
        return open_renderer(self.sim.model, self.height, self.width)

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self.sim.close()


def register_tasks() -> None:
    """Register `metaworld/<task>` for every v3 task (idempotent); importing this module does it."""
    for task in TASKS:
        env_id = f"metaworld/{task}"
        if env_id not in gym.registry:
            entry_point = f"{MetaWorldEnv.__module__}:{MetaWorldEnv.__name__}"
            gym.register(env_id, entry_point=entry_point, max_episode_steps=MAX_EPISODE_STEPS, kwargs={"task": task})


register_tasks()
