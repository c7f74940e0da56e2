"""Language-conditioned MuJoCo tabletop tasks with a 2-D point end-effector.

The end-effector and the blocks move on slide joints in the table plane (no gravity, no rotation),
which keeps physics and rendering fast on CPU. Colours are drawn per episode, so the policy (state
observation with a one-hot of the named object) and the reward (pixels + instruction) both need the
instruction to know which object counts.

- `vlmr/Reach-v0`: "reach the red target" among distractor targets.
- `vlmr/Push-v0`: "push the red block to the green zone" among a distractor block and zone.
- `vlmr/Carry-v0`: "carry the block to the red zone" among distractor zones; the effector picks the
  block up when it touches it (a magnet), so the task is a pick-and-place in two stages.

Every env: `render_mode="rgb_array"`, cameras `top` and `front` (`render(camera)`, `render_cameras()`),
`render_goal(camera)` (the scene with the task solved, for goal-image rewards), `instruction`,
and in `info`: `is_success` (sparse), `progress` (task-geometric progress in [0, 1]), `dense_reward`
(progress − 1, the ground-truth dense reward: ≤ 0, so finishing early never loses return), `stage`
(subtasks done: Push has approach, then push; Carry has pick, then carry) and `instruction`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gymnasium as gym
import mujoco
import numpy as np

COLOURS = {
    "red": (0.9, 0.1, 0.1),
    "green": (0.1, 0.75, 0.1),
    "blue": (0.15, 0.3, 0.95),
    "yellow": (0.95, 0.85, 0.1),
    "purple": (0.6, 0.2, 0.8),
    "orange": (1.0, 0.5, 0.0),
    "cyan": (0.1, 0.85, 0.85),
}
CAMERAS = ("top", "front")
WORKSPACE = 0.3  # objects are placed in [-WORKSPACE, WORKSPACE]^2
EE_RADIUS = 0.025
BLOCK_HALF = 0.03
MAX_SPEED = 0.6  # m/s of the end-effector at |action| = 1
MARKER_RADIUS = 0.05  # drawn size of targets and of the end-effector's footprint: ~7 px at 64 px, big enough to see

_SCENE = """
<mujoco model="vlmr_tabletop">
  <option timestep="0.01" gravity="0 0 0"/>
  <visual><quality shadowsize="0"/><global offwidth="256" offheight="256"/></visual>
  {table_asset}
  <worldbody>
    <light pos="0 0 2" dir="0 0 -1" castshadow="false" diffuse="0.8 0.8 0.8"/>
    <camera name="top" pos="0 0 1.05" xyaxes="1 0 0 0 1 0" fovy="45"/>
    <camera name="front" pos="0 -0.85 0.75" xyaxes="1 0 0 0 0.66 0.75" fovy="45"/>
    <geom name="table" type="plane" size="0.45 0.45 0.01" {table_look} contype="0" conaffinity="0"/>
    {walls}
    {markers}
    <body name="ee" pos="0 0 {ee_z}">
      <joint name="ee_x" type="slide" axis="1 0 0" range="-0.38 0.38" damping="1"/>
      <joint name="ee_y" type="slide" axis="0 1 0" range="-0.38 0.38" damping="1"/>
      <geom name="ee" type="sphere" size="{ee_radius}" mass="0.2" rgba="0.08 0.08 0.08 1" contype="1" conaffinity="1"/>
      <geom name="ee_marker" type="cylinder" size="{marker_radius} 0.001" pos="0 0 -{ee_z}" mass="0"
            rgba="0.08 0.08 0.08 1" contype="0" conaffinity="0"/>
    </body>
    {blocks}
  </worldbody>
  <actuator>
    <velocity name="vx" joint="ee_x" kv="20" ctrlrange="-{speed} {speed}"/>
    <velocity name="vy" joint="ee_y" kv="20" ctrlrange="-{speed} {speed}"/>
  </actuator>
</mujoco>
"""


def _walls() -> str:
    sides = [("0.42 0 0.03", "0.02 0.44 0.03"), ("-0.42 0 0.03", "0.02 0.44 0.03"),
             ("0 0.42 0.03", "0.44 0.02 0.03"), ("0 -0.42 0.03", "0.44 0.02 0.03")]  # fmt: skip
    return "\n".join(
        f'<geom type="box" pos="{pos}" size="{size}" rgba="0.35 0.3 0.25 1" contype="1" conaffinity="1"/>'
        for pos, size in sides
    )


def _marker(name: str, shape: str, radius: float = MARKER_RADIUS) -> str:
    """A flat, non-colliding coloured marker (a reach target disc, a goal zone square or Carry's block)."""
    size = {"disc": f"{radius} 0.002", "square": "0.06 0.06 0.002", "block": "0.04 0.04 0.001"}[shape]
    geom_type = "cylinder" if shape == "disc" else "box"
    return (
        f'<body name="{name}" mocap="true" pos="0 0 0.002">'
        f'<geom name="{name}" type="{geom_type}" size="{size}" contype="0" conaffinity="0"/></body>'
    )


def _block(name: str) -> str:
    return (
        f'<body name="{name}" pos="0 0 {BLOCK_HALF}">'
        f'<joint name="{name}_x" type="slide" axis="1 0 0" damping="4"/>'
        f'<joint name="{name}_y" type="slide" axis="0 1 0" damping="4"/>'
        f'<geom name="{name}" type="box" size="{BLOCK_HALF} {BLOCK_HALF} {BLOCK_HALF}" mass="0.1" '
        f'contype="1" conaffinity="1" friction="0.5 0.005 0.0001"/></body>'
    )


TABLES = ("plain", "gradient")
TABLE_TEXTURE = 64  # texels per side of the `gradient` table


def _gradient_table() -> np.ndarray:
    """(H, W, 3) uint8 table texture whose shade tells where on the table a patch is: lighter toward +x,
    warmer toward +y, darker toward −y (low saturation, so no colour word fits it). A vision tower with
    only relative positions (rotary) can then read a patch's absolute place from its content."""
    v, u = np.meshgrid(np.linspace(0, 1, TABLE_TEXTURE), np.linspace(0, 1, TABLE_TEXTURE), indexing="ij")
    light = 0.36 + 0.34 * u
    tint = 0.08 * (2 * v - 1)
    rgb = np.stack([light + tint, 0.95 * light, 0.9 * light - tint], axis=-1)
    return (np.clip(rgb, 0, 1) * 255).round().astype(np.uint8)


def build_model(
    markers: list[tuple[str, str]], blocks: list[str], table: str = "plain", marker_radius: float = MARKER_RADIUS
) -> mujoco.MjModel:
    if table not in TABLES:
        raise ValueError(f"table {table!r}; expected one of {TABLES}")
    gradient = table == "gradient"
    asset = (
        f'<asset><texture name="table" type="2d" builtin="flat" rgb1="1 1 1" width="{TABLE_TEXTURE}" '
        f'height="{TABLE_TEXTURE}"/><material name="table" texture="table"/></asset>'
    )
    xml = _SCENE.format(
        table_asset=asset if gradient else "",
        table_look='material="table"' if gradient else 'rgba="0.55 0.5 0.45 1"',
        walls=_walls(),
        markers="\n".join(_marker(name, shape, marker_radius) for name, shape in markers),
        blocks="\n".join(_block(name) for name in blocks),
        ee_z=EE_RADIUS,
        ee_radius=EE_RADIUS,
        marker_radius=marker_radius,
        speed=MAX_SPEED,
    )
    model = mujoco.MjModel.from_xml_string(xml)
    if gradient:  # texture data is set before any renderer uploads it
        texture = model.texture("table").id
        start = model.tex_adr[texture]
        model.tex_data[start : start + TABLE_TEXTURE**2 * 3] = _gradient_table()[::-1].ravel()
    return model


def open_renderer(model: mujoco.MjModel, height: int, width: int) -> mujoco.Renderer:
    """An offscreen renderer without shadows, reflections and skybox (fast on CPU). When MuJoCo cannot open an
    OpenGL context with the backend of MUJOCO_GL: a RuntimeError that names it and the backends to try."""
    try:
        renderer = mujoco.Renderer(model, height, width)
    except ValueError:  # a frame larger than the model's offscreen buffer: mujoco's own message says so
        raise
    except Exception as error:  # mujoco.FatalError, or the backend's ImportError, RuntimeError or GLError
        raise RuntimeError(
            f"MuJoCo cannot render with MUJOCO_GL={os.environ.get('MUJOCO_GL', '')!r} ({type(error).__name__}: "
            f"{error}); set MUJOCO_GL before the job starts to a backend this machine has: egl (headless; libEGL "
            "from a GPU driver or Mesa), osmesa (headless, on the CPU; libOSMesa) or glfw (a display)"
        ) from error
    for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
        renderer.scene.flags[flag] = False
    return renderer


@dataclass
class Layout:
    """One episode's scene: object colours and positions, and which object/zone the instruction names."""

    colours: list[str]  # of the objects drawn from the palette (Carry: none)
    positions: np.ndarray  # (n, 2)
    target: int
    zone_colours: list[str]
    zone_positions: np.ndarray  # (m, 2); empty for Reach
    zone: int
    ee_start: np.ndarray  # (2,)


class TabletopEnv(gym.Env):
    """Shared machinery: MuJoCo model, cameras, seeded layouts, success and progress bookkeeping."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}
    frame_skip = 5  # 0.05 s per env step

    def __init__(
        self,
        render_mode: str | None = None,
        width: int = 64,
        height: int = 64,
        camera: str = "top",
        reward_type: str = "sparse",
        terminate_on_success: bool = True,
        num_distractors: int = 2,
        table: str = "plain",
        marker_radius: float = MARKER_RADIUS,
        highlights: bool = True,
        palette: Sequence[str] | None = None,
        success_distance: float | None = None,
    ):
        """palette: the colours the task draws its objects' colours from (None: all of `COLOURS`).
        success_distance: how close to its goal counts as success (None: the task's own)."""
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode {render_mode!r}; expected None or 'rgb_array'")
        if camera not in CAMERAS:
            raise ValueError(f"camera {camera!r}; this env has cameras {CAMERAS}")
        if reward_type not in ("sparse", "dense"):
            raise ValueError(f"reward_type {reward_type!r}; expected 'sparse' or 'dense'")
        self.render_mode, self.width, self.height, self.camera = render_mode, width, height, camera
        self.reward_type, self.terminate_on_success = reward_type, terminate_on_success
        self.num_distractors, self.table, self.marker_radius = num_distractors, table, marker_radius
        self.palette = self._checked_palette(palette)
        if success_distance is not None:
            if not 0 < success_distance < WORKSPACE:
                raise ValueError(f"success_distance {success_distance}; expected 0 < distance < {WORKSPACE}")
            self.success_distance = success_distance
        self.model = self._build_model()
        if not highlights:
            self.model.light_specular[:] = 0.0
            self.model.vis.headlight.specular[:] = 0.0
        self.data = mujoco.MjData(self.model)
        self._renderer: mujoco.Renderer | None = None
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        size = len(self._observation())
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(size,), dtype=np.float32)

    def _checked_palette(self, palette: Sequence[str] | None) -> tuple[str, ...]:
        palette = tuple(COLOURS if palette is None else palette)
        if not set(palette) <= COLOURS.keys() or len(set(palette)) != len(palette):
            raise ValueError(f"palette {list(palette)}; expected distinct colours from {list(COLOURS)}")
        if len(palette) < self.num_colours:
            raise ValueError(
                f"palette {list(palette)} has {len(palette)} colours; this scene colours {self.num_colours} "
                f"objects (num_distractors={self.num_distractors})"
            )
        return palette

    # --------------------------------------------------------------- task-specific hooks

    @property
    def num_colours(self) -> int:
        """How many distinct colours one layout uses."""
        raise NotImplementedError

    def _build_model(self) -> mujoco.MjModel:
        raise NotImplementedError

    def _sample_layout(self, rng: np.random.Generator) -> Layout:
        raise NotImplementedError

    def _progress_and_success(self) -> tuple[float, bool]:
        raise NotImplementedError

    @property
    def instruction(self) -> str:
        raise NotImplementedError

    stage_budgets: tuple[float, ...] = (1.0,)  # progress share of each stage, for stage-based labels

    def _after_physics(self) -> None:
        """Task rules applied after each step's physics (Carry's pick-up)."""

    def _stage(self, success: bool) -> int:
        """Stages completed so far (len(stage_budgets) on success)."""
        return len(self.stage_budgets) if success else 0

    # --------------------------------------------------------------- gymnasium API

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.layout = self._sample_layout(self.np_random)
        self._apply_layout(self.layout)
        self._start = self._distances()
        return self._observation(), self._info()

    def step(self, action):
        action = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        self.data.ctrl[:] = action * MAX_SPEED
        mujoco.mj_step(self.model, self.data, nstep=self.frame_skip)
        self._after_physics()
        info = self._info()
        success = info["is_success"]
        reward = info["dense_reward"] if self.reward_type == "dense" else float(success)
        terminated = bool(success and self.terminate_on_success)
        return self._observation(), reward, terminated, False, info

    def _info(self) -> dict:
        progress, success = self._progress_and_success()
        return {
            "is_success": bool(success),
            "stage": self._stage(success),
            "progress": float(progress),
            "dense_reward": float(progress) - 1.0,
            "instruction": self.instruction,
        }

    # --------------------------------------------------------------- rendering

    def render(self, camera: str | None = None) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        return self._render_camera(camera or self.camera)

    def render_cameras(self, cameras: tuple[str, ...] = CAMERAS) -> dict[str, np.ndarray]:
        """Frames of several cameras of the current state: name -> (H, W, 3) uint8."""
        return {name: self._render_camera(name) for name in cameras}

    def render_goal(self, camera: str | None = None) -> np.ndarray:
        """The scene of this episode with the task solved (the named object at its goal); the state is kept.
        Mocap bodies are saved with the joints: Carry's block is one."""
        saved_qpos, saved_mocap = self.data.qpos.copy(), self.data.mocap_pos.copy()
        self._pose_solved()
        mujoco.mj_forward(self.model, self.data)
        frame = self._render_camera(camera or self.camera)
        self.data.qpos[:], self.data.mocap_pos[:] = saved_qpos, saved_mocap
        mujoco.mj_forward(self.model, self.data)
        return frame

    def _render_camera(self, camera: str) -> np.ndarray:
        if camera not in CAMERAS:
            raise ValueError(f"camera {camera!r}; this env has cameras {CAMERAS}")
        if self._renderer is None:
            self._renderer = open_renderer(self.model, self.height, self.width)
        self._renderer.update_scene(self.data, camera=camera)
        return self._renderer.render().copy()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    # --------------------------------------------------------------- state helpers

    @property
    def ee_position(self) -> np.ndarray:
        return self.data.qpos[0:2].copy()

    def place_effector(self, position: np.ndarray) -> dict:
        """Put the effector at `position` (x, y), at rest, the rest of the scene as it is; the new state's info
        (progress, is_success). A probe of a reward over the workspace (`vlm_rewards.robotics.potential_map`)."""
        self.data.qpos[0:2] = position
        self.data.qvel[0:2] = 0.0
        mujoco.mj_forward(self.model, self.data)
        return self._info()

    def _set_rgba(self, geom: str, colour: str) -> None:
        self.model.geom_rgba[self.model.geom(geom).id] = (*COLOURS[colour], 1.0)

    def _set_marker(self, body: str, position: np.ndarray) -> None:
        self.data.mocap_pos[self.model.body(body).mocapid[0]] = (*position, 0.002)

    def _observation(self) -> np.ndarray:
        raise NotImplementedError

    def _distances(self) -> np.ndarray:
        raise NotImplementedError


def _spread_positions(rng: np.random.Generator, count: int, min_gap: float, avoid=()) -> np.ndarray:
    """`count` points in the workspace at least `min_gap` apart (and from the points in `avoid`)."""
    points = list(avoid)
    chosen = []
    while len(chosen) < count:
        candidate = rng.uniform(-WORKSPACE, WORKSPACE, size=2)
        if all(np.linalg.norm(candidate - p) >= min_gap for p in points):
            points.append(candidate)
            chosen.append(candidate)
    return np.array(chosen)


def _first_fit(draw: Callable[[], np.ndarray], fits: Callable[[np.ndarray], bool], attempts: int = 100):
    """The first of `attempts` draws that fits; None if none does (the caller draws its layout again)."""
    for _ in range(attempts):
        candidate = draw()
        if fits(candidate):
            return candidate
    return None


def _unit(angle: float) -> np.ndarray:
    return np.array([np.cos(angle), np.sin(angle)])


def _one_hot(index: int, size: int) -> np.ndarray:
    vector = np.zeros(size)
    vector[index] = 1.0
    return vector


def reach_instruction(colour: str) -> str:
    """The Reach instruction naming the `colour` target."""
    return f"reach the {colour} target"


class ReachEnv(TabletopEnv):
    """Move the end-effector onto the named coloured target; success within 0.04 of its centre."""

    success_distance = 0.04

    @property
    def num_targets(self) -> int:
        return 1 + self.num_distractors

    @property
    def num_colours(self) -> int:
        return self.num_targets

    def _build_model(self) -> mujoco.MjModel:
        return build_model(
            [(f"target{i}", "disc") for i in range(self.num_targets)],
            blocks=[],
            table=self.table,
            marker_radius=self.marker_radius,
        )

    def _sample_layout(self, rng: np.random.Generator) -> Layout:
        names = self.palette
        colours = [names[i] for i in rng.choice(len(names), self.num_targets, replace=False)]
        ee_start = rng.uniform(-WORKSPACE, WORKSPACE, size=2)
        positions = _spread_positions(rng, self.num_targets, 0.15, avoid=[ee_start])
        return Layout(colours, positions, int(rng.integers(self.num_targets)), [], np.zeros((0, 2)), 0, ee_start)

    def _apply_layout(self, layout: Layout) -> None:
        mujoco.mj_resetData(self.model, self.data)
        for i, (colour, position) in enumerate(zip(layout.colours, layout.positions)):
            self._set_rgba(f"target{i}", colour)
            self._set_marker(f"target{i}", position)
        self.data.qpos[0:2] = layout.ee_start
        mujoco.mj_forward(self.model, self.data)
        self._target_start = np.linalg.norm(layout.positions - layout.ee_start, axis=1)

    @property
    def instruction(self) -> str:
        return reach_instruction(self.layout.colours[self.layout.target])

    def _info(self) -> dict:
        """Adds, for relabelling (`vlmr collect` with relabel_targets), every target's instruction, geometric
        progress toward it and offset from the effector in workspace units: `target_instructions`
        ("|"-joined), `target_progress` and `target_offsets`; `goal_offset` is the named target's offset."""
        info = super()._info()
        if hasattr(self, "layout"):
            offsets = self.layout.positions - self.ee_position
            distances = np.linalg.norm(offsets, axis=1)
            progress = np.clip(1.0 - distances / np.maximum(self._target_start, 1e-6), 0.0, 1.0)
            info["target_progress"] = np.where(distances < self.success_distance, 1.0, progress)
            info["target_offsets"] = offsets / WORKSPACE
            info["goal_offset"] = info["target_offsets"][self.layout.target]
            info["target_instructions"] = "|".join(reach_instruction(colour) for colour in self.layout.colours)
        return info

    @property
    def goal_position(self) -> np.ndarray:
        return self.layout.positions[self.layout.target]

    def _distances(self) -> np.ndarray:
        return np.array([np.linalg.norm(self.ee_position - self.goal_position)])

    def _progress_and_success(self) -> tuple[float, bool]:
        distance = self._distances()[0]
        progress = np.clip(1.0 - distance / max(self._start[0], 1e-6), 0.0, 1.0)
        success = distance < self.success_distance
        return (1.0 if success else float(progress)), bool(success)

    def _pose_solved(self) -> None:
        self.data.qpos[0:2] = self.goal_position

    def _observation(self) -> np.ndarray:
        if not hasattr(self, "layout"):  # before the first reset: the right size, zeros
            return np.zeros(6 + 3 * self.num_targets, dtype=np.float32)
        parts = [self.ee_position, self.data.qvel[0:2], self.layout.positions.ravel(),
                 _one_hot(self.layout.target, self.num_targets), self.goal_position - self.ee_position]  # fmt: skip
        return np.concatenate(parts).astype(np.float32)


class PushEnv(TabletopEnv):
    """Push the named block into the named goal zone; success with its centre within 0.05 of the zone's."""

    success_distance = 0.05
    approach_share = 0.2  # progress budget of getting to the block; the rest is the block's way to the zone
    stage_budgets = (approach_share, 1 - approach_share)
    contact_distance = EE_RADIUS + BLOCK_HALF + 0.01

    def __init__(
        self, *args, push_distance: tuple[float, float] | None = None, start_angle: float | None = None, **kwargs
    ):
        """push_distance: (low, high) the named block starts this far from the named zone's centre (None:
        anywhere at least 0.17 from every zone). start_angle: the effector starts 3–8 cm past contact on the
        block's far side from the zone, within this many degrees of the push line (30: a straight push; 180:
        anywhere around the block); None: anywhere in the workspace."""
        if push_distance is not None and not 0 < push_distance[0] <= push_distance[1] < WORKSPACE:
            raise ValueError(f"push_distance {push_distance}; expected 0 < low <= high < {WORKSPACE}")
        if start_angle is not None and not 0 < start_angle <= 180:
            raise ValueError(f"start_angle {start_angle}; expected degrees in (0, 180]")
        self.push_distance, self.start_angle = push_distance, start_angle
        super().__init__(*args, **kwargs)

    def _stage(self, success: bool) -> int:
        return 2 if success else int(self._distances()[0] == 0.0)

    @property
    def num_blocks(self) -> int:
        return 1 + (self.num_distractors + 1) // 2

    @property
    def num_zones(self) -> int:
        return 1 + self.num_distractors // 2

    @property
    def num_colours(self) -> int:
        return self.num_blocks + self.num_zones

    def _build_model(self) -> mujoco.MjModel:
        markers = [(f"zone{i}", "square") for i in range(self.num_zones)]
        return build_model(markers, blocks=[f"block{i}" for i in range(self.num_blocks)], table=self.table)

    def _sample_layout(self, rng: np.random.Generator) -> Layout:
        layout = self._draw_layout(rng)
        while layout is None:  # a short push or a start behind the block did not fit this draw
            layout = self._draw_layout(rng)
        return layout

    def _draw_layout(self, rng: np.random.Generator) -> Layout | None:
        names = self.palette
        order = rng.permutation(len(names))
        colours = [names[i] for i in order[: self.num_blocks]]
        zone_colours = [names[i] for i in order[self.num_blocks : self.num_blocks + self.num_zones]]
        zone_positions = _spread_positions(rng, self.num_zones, 0.25)
        # blocks stay off the zones and away from the walls so that every block can be pushed anywhere
        limit = WORKSPACE - 0.05
        positions = []
        while len(positions) < self.num_blocks:
            candidate = rng.uniform(-limit, limit, size=2)
            near = [*zone_positions, *positions]
            if all(np.linalg.norm(candidate - p) >= 0.17 for p in near):
                positions.append(candidate)
        ee_start = _spread_positions(rng, 1, 0.12, avoid=positions)[0]
        target, zone = int(rng.integers(self.num_blocks)), int(rng.integers(self.num_zones))
        positions = np.array(positions)
        if self.push_distance is not None:
            block = self._near_zone(rng, zone_positions, zone, np.delete(positions, target, axis=0))
            if block is None:
                return None
            positions[target] = block
            ee_start = _spread_positions(rng, 1, 0.12, avoid=positions)[0]
        if self.start_angle is not None:
            ee_start = self._behind(rng, positions[target], zone_positions[zone])
            if ee_start is None:
                return None
        return Layout(colours, positions, target, zone_colours, zone_positions, zone, ee_start)

    def _behind(self, rng: np.random.Generator, block: np.ndarray, zone: np.ndarray) -> np.ndarray | None:
        """An effector start 0.03–0.08 beyond contact, within `start_angle` of the line from the zone through
        the block, inside the walls."""
        away, spread = np.arctan2(*(block - zone)[::-1]), np.deg2rad(self.start_angle)

        def draw() -> np.ndarray:
            angle = away + rng.uniform(-spread, spread)
            return block + (self.contact_distance + rng.uniform(0.03, 0.08)) * _unit(angle)

        return _first_fit(draw, lambda point: np.all(np.abs(point) <= WORKSPACE))

    def _near_zone(
        self, rng: np.random.Generator, zones: np.ndarray, zone: int, blocks: np.ndarray
    ) -> np.ndarray | None:
        """A start for the named block `push_distance` from its zone, clear of the walls and other objects."""
        limit = WORKSPACE - 0.05
        others = [*np.delete(zones, zone, axis=0), *blocks]

        def fits(point: np.ndarray) -> bool:
            return np.all(np.abs(point) <= limit) and all(np.linalg.norm(point - p) >= 0.17 for p in others)

        def draw() -> np.ndarray:
            angle = rng.uniform(0, 2 * np.pi)
            return zones[zone] + rng.uniform(*self.push_distance) * _unit(angle)

        return _first_fit(draw, fits)

    def _apply_layout(self, layout: Layout) -> None:
        mujoco.mj_resetData(self.model, self.data)
        for i, (colour, position) in enumerate(zip(layout.zone_colours, layout.zone_positions)):
            self._set_rgba(f"zone{i}", colour)
            self._set_marker(f"zone{i}", position)
        for i, colour in enumerate(layout.colours):
            self._set_rgba(f"block{i}", colour)
        self.data.qpos[0:2] = layout.ee_start
        self.data.qpos[2:] = layout.positions.ravel()  # slide joints hold offsets from the origin
        mujoco.mj_forward(self.model, self.data)

    @property
    def instruction(self) -> str:
        layout = self.layout
        return f"push the {layout.colours[layout.target]} block to the {layout.zone_colours[layout.zone]} zone"

    @property
    def block_positions(self) -> np.ndarray:
        return self.data.qpos[2:].reshape(self.num_blocks, 2).copy()

    @property
    def goal_position(self) -> np.ndarray:
        return self.layout.zone_positions[self.layout.zone]

    def _distances(self) -> np.ndarray:
        block = self.block_positions[self.layout.target]
        approach = max(np.linalg.norm(self.ee_position - block) - self.contact_distance, 0.0)
        return np.array([approach, np.linalg.norm(block - self.goal_position)])

    def _progress_and_success(self) -> tuple[float, bool]:
        approach, to_goal = self._distances()
        start_approach, start_to_goal = np.maximum(self._start, 1e-6)
        approach_progress = np.clip(1.0 - approach / start_approach, 0.0, 1.0)
        push_progress = np.clip(1.0 - to_goal / start_to_goal, 0.0, 1.0)
        success = to_goal < self.success_distance
        progress = self.approach_share * approach_progress + (1 - self.approach_share) * push_progress
        return (1.0 if success else float(progress)), bool(success)

    def _pose_solved(self) -> None:
        blocks = self.block_positions
        blocks[self.layout.target] = self.goal_position
        self.data.qpos[2:] = blocks.ravel()
        direction = self.goal_position - self.layout.positions[self.layout.target]
        direction /= max(np.linalg.norm(direction), 1e-6)
        self.data.qpos[0:2] = self.goal_position - direction * self.contact_distance

    def _observation(self) -> np.ndarray:
        if not hasattr(self, "layout"):
            return np.zeros(8 + 3 * self.num_blocks + 3 * self.num_zones, dtype=np.float32)
        layout = self.layout
        block = self.block_positions[layout.target]
        parts = [self.ee_position, self.data.qvel[0:2], self.block_positions.ravel(), layout.zone_positions.ravel(),
                 _one_hot(layout.target, self.num_blocks), _one_hot(layout.zone, self.num_zones),
                 block - self.ee_position, self.goal_position - block]  # fmt: skip
        return np.concatenate(parts).astype(np.float32)


def carry_instruction(zone_colour: str) -> str:
    """The Carry instruction naming the `zone_colour` zone."""
    return f"carry the block to the {zone_colour} zone"


class CarryEnv(TabletopEnv):
    """Pick up the block and carry it into the named zone; success with its centre within 0.05 of the zone's.

    The effector picks the block up when their centres come within `grasp_distance` (a magnet: no grip
    action) and holds it from then on, drawn on top of the effector. Progress is half the way to the block,
    then half the block's way to the zone, so the two stages are two reaches: the second names a colour,
    the first does not. The block is white, a shade no colour word names.
    """

    success_distance = 0.05
    grasp_distance = 0.04
    pick_share = 0.5
    stage_budgets = (pick_share, 1 - pick_share)
    block_colour = (0.95, 0.95, 0.95)
    block_heights = (0.006, 0.06)  # the block's drawn height on the table and held (above the effector)

    @property
    def num_zones(self) -> int:
        return 1 + self.num_distractors

    @property
    def num_colours(self) -> int:
        return self.num_zones

    def _build_model(self) -> mujoco.MjModel:
        markers = [(f"zone{i}", "square") for i in range(self.num_zones)] + [("block", "block")]
        return build_model(markers, blocks=[], table=self.table)

    def _sample_layout(self, rng: np.random.Generator) -> Layout:
        names = self.palette
        zone_colours = [names[i] for i in rng.choice(len(names), self.num_zones, replace=False)]
        zone_positions = _spread_positions(rng, self.num_zones, 0.2)
        block = _spread_positions(rng, 1, 0.15, avoid=zone_positions)
        ee_start = _spread_positions(rng, 1, 0.1, avoid=[*zone_positions, *block])[0]
        zone = int(rng.integers(self.num_zones))
        return Layout([], block, 0, zone_colours, zone_positions, zone, ee_start)  # the block is white, not drawn

    def _apply_layout(self, layout: Layout) -> None:
        mujoco.mj_resetData(self.model, self.data)
        for i, (colour, position) in enumerate(zip(layout.zone_colours, layout.zone_positions)):
            self._set_rgba(f"zone{i}", colour)
            self._set_marker(f"zone{i}", position)
        self.model.geom_rgba[self.model.geom("block").id] = (*self.block_colour, 1.0)
        self.data.qpos[0:2] = layout.ee_start
        self.held = False
        self._place_block(layout.positions[0])
        self._zone_start = np.linalg.norm(layout.zone_positions - layout.positions[0], axis=1)

    def _place_block(self, position: np.ndarray) -> None:
        body = self.model.body("block").mocapid[0]
        self.data.mocap_pos[body] = (*position, self.block_heights[self.held])
        mujoco.mj_forward(self.model, self.data)

    def _after_physics(self) -> None:
        if not self.held and np.linalg.norm(self.ee_position - self.block_position) < self.grasp_distance:
            self.held = True
        if self.held:
            self._place_block(self.ee_position)

    @property
    def block_position(self) -> np.ndarray:
        return self.data.mocap_pos[self.model.body("block").mocapid[0], :2].copy()

    @property
    def instruction(self) -> str:
        return carry_instruction(self.layout.zone_colours[self.layout.zone])

    @property
    def goal_position(self) -> np.ndarray:
        return self.layout.zone_positions[self.layout.zone]

    def _stage(self, success: bool) -> int:
        return 2 if success else int(self.held)

    def _distances(self) -> np.ndarray:
        """Effector to the block (past grasping reach) and the block to the named zone."""
        approach = max(np.linalg.norm(self.ee_position - self.block_position) - self.grasp_distance, 0.0)
        return np.array([0.0 if self.held else approach, np.linalg.norm(self.block_position - self.goal_position)])

    def _zone_progress(self) -> np.ndarray:
        """Geometric progress toward each zone (pick, then carry), 1 where the block is within success."""
        pick = 1.0 if self.held else np.clip(1.0 - self._distances()[0] / max(self._start[0], 1e-6), 0.0, 1.0)
        to_zones = np.linalg.norm(self.layout.zone_positions - self.block_position, axis=1)
        carry = np.clip(1.0 - to_zones / np.maximum(self._zone_start, 1e-6), 0.0, 1.0)
        progress = self.pick_share * pick + (1 - self.pick_share) * carry
        return np.where(to_zones < self.success_distance, 1.0, progress)

    def _progress_and_success(self) -> tuple[float, bool]:
        success = self._distances()[1] < self.success_distance
        return float(self._zone_progress()[self.layout.zone]), bool(success)

    def _info(self) -> dict:
        """Adds every zone's instruction, progress toward it and offset of where the effector heads next, for
        relabelling (as Reach does per target): `target_offsets` is the block's offset from the effector until
        it is held, then each zone's, in workspace units; `goal_offset` is the named zone's row."""
        info = super()._info()
        if hasattr(self, "layout"):
            heading = np.where(self.held, self.layout.zone_positions, self.block_position)  # (zones, 2)
            info["target_progress"] = self._zone_progress()
            info["target_offsets"] = (heading - self.ee_position) / WORKSPACE
            info["goal_offset"] = info["target_offsets"][self.layout.zone]
            info["target_instructions"] = "|".join(carry_instruction(c) for c in self.layout.zone_colours)
        return info

    def _pose_solved(self) -> None:
        self.data.qpos[0:2] = self.goal_position
        self.data.mocap_pos[self.model.body("block").mocapid[0]] = (*self.goal_position, self.block_heights[1])

    def _observation(self) -> np.ndarray:
        if not hasattr(self, "layout"):
            return np.zeros(11 + 3 * self.num_zones, dtype=np.float32)
        layout, block = self.layout, self.block_position
        parts = [self.ee_position, self.data.qvel[0:2], block, layout.zone_positions.ravel(),
                 _one_hot(layout.zone, self.num_zones), [float(self.held)],
                 block - self.ee_position, self.goal_position - block]  # fmt: skip
        return np.concatenate(parts).astype(np.float32)


TASKS = {"vlmr/Reach-v0": (ReachEnv, 50), "vlmr/Push-v0": (PushEnv, 100), "vlmr/Carry-v0": (CarryEnv, 60)}


def register_tasks() -> None:
    """Register the suite with gymnasium (idempotent); importing `vlm_rewards.robotics.tasks` does it."""
    for env_id, (cls, max_steps) in TASKS.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=f"{cls.__module__}:{cls.__name__}", max_episode_steps=max_steps)


register_tasks()
