"""Robotics consumers of the reward interface: MuJoCo envs, experts, reward wrappers and RL."""

import os
import sys

if __name__ == "robotics":  # the folder imported from a checkout by its old top-level name
    raise ImportError("`robotics` is installed as `vlm_rewards.robotics`: import vlm_rewards.robotics")

# MuJoCo picks its OpenGL backend when first imported, from MUJOCO_GL; unset, it is GLFW, which needs a
# display, so a headless machine (a cluster node, CI, a bare `pytest`) could not render. EGL renders
# without one; a backend the user chose is kept. A backend that does not work fails at the first render
# (`vlm_rewards.robotics.tasks.open_renderer`), naming the alternatives.
if sys.platform.startswith("linux"):
    os.environ.setdefault("MUJOCO_GL", "egl")
