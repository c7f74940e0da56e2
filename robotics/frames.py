"""Per-env wrapper that puts what a reward needs into `info`: camera frames, instruction, goal image.

Rendering inside each env (not in the vector wrapper) means an `AsyncVectorEnv` / `SubprocVecEnv`
renders in its worker processes, in parallel, and the frames of a terminal state survive the
autoreset that follows it (they travel in that step's info).

Works with any gymnasium env with `render_mode="rgb_array"`: an env with `render_cameras(names)`
(the `vlmr/*` tasks) offers named cameras, any other env the single camera `"default"` (`render()`).
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np

DEFAULT_CAMERA = "default"


class CameraFrames(gym.Wrapper):
    """Adds `info["frames"]` (camera -> (H, W, 3) uint8) on reset and step, and on reset
    `info["instruction"]` and, with `goal_image=True`, `info["reference"]` ((1, H, W, 3) goal frame).

    instruction: a fixed instruction for envs that have none (`env.unwrapped.instruction`).
    """

    def __init__(
        self,
        env: gym.Env,
        cameras: Sequence[str] = ("top",),
        goal_image: bool = False,
        instruction: str | None = None,
    ):
        super().__init__(env)
        if env.render_mode != "rgb_array":
            raise ValueError(
                f"CameraFrames: the env renders with render_mode={env.render_mode!r}; make it with "
                "render_mode='rgb_array' so the reward can see it"
            )
        if not cameras:
            raise ValueError("CameraFrames: no cameras; name at least one")
        self.cameras = tuple(cameras)
        self.task = env.unwrapped
        known = self.known_cameras()
        missing = [name for name in self.cameras if name not in known]
        if missing:
            raise ValueError(f"CameraFrames: camera(s) {missing} do not exist; this env has {list(known)}")
        if goal_image and not hasattr(self.task, "render_goal"):
            raise ValueError(f"CameraFrames: goal_image=True, but {type(self.task).__name__} has no render_goal()")
        if instruction is None and not hasattr(type(self.task), "instruction"):
            raise ValueError(
                f"CameraFrames: {type(self.task).__name__} has no `instruction`; pass a fixed instruction text"
            )
        self.goal_image, self.fixed_instruction = goal_image, instruction

    def known_cameras(self) -> tuple[str, ...]:
        if hasattr(self.task, "render_cameras"):
            from vlm_rewards.robotics.tasks import CAMERAS

            return tuple(getattr(self.task, "cameras", CAMERAS))
        return (DEFAULT_CAMERA,)

    def frames(self) -> dict[str, np.ndarray]:
        if hasattr(self.task, "render_cameras"):
            frames = self.task.render_cameras(self.cameras)
        else:
            frames = {DEFAULT_CAMERA: self.env.render()}
        for name, frame in frames.items():
            if not (
                isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[-1] == 3
            ):
                got = getattr(frame, "shape", type(frame).__name__)
                raise ValueError(f"CameraFrames: camera {name!r} rendered {got}; expected an (H, W, 3) uint8 frame")
        return frames

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        info = dict(info, frames=self.frames(), instruction=self.fixed_instruction or self.task.instruction)
        if self.goal_image:
            info["reference"] = self.task.render_goal(self.cameras[0])[None]
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, dict(info, frames=self.frames())
