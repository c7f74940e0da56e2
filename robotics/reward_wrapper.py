"""A learned reward in the RL loop: one core (`RewardStreams`), two thin adapters.

- `GymVectorReward`: a gymnasium `VectorWrapper` (autoreset mode NEXT_STEP, gymnasium's default).
- `SB3VecReward`: a stable-baselines3 `VecEnvWrapper` (SB3 resets an env in the step that ends it).

Each env is wrapped in `vlm_rewards.robotics.frames.CameraFrames`, so frames arrive in `info` (rendered in the
env workers). The core keeps one `RewardSession` stream per env and makes ONE batched
`session.append` per reward call, every frame of every stream in it; a causal reward's session
does O(1) model work per frame.

The reward of a transition s -> s' with Φ = the reward's progress (or scalar reward) of a frame:

    replace: r' = scale·Φ(s')                           + bonus·success
    add:     r' = r_env + scale·Φ(s')                   + bonus·success
    shaping: r' = r_env + scale·(γ·Φ(s') − Φ(s))        + bonus·success

where success is the env's `is_success`, or with `success_threshold` the reward's own `success` component
at the step's frame ≥ the threshold (LeRobot's reward classifier; read through the session's
`last_components`, so any reward whose spec lists a `success` component, e.g. a trained RM with a success
head); `terminate_on_success` then also ends the episode there (terminated: Φ = 0 under shaping; the SB3
wrapper resets that env and puts its last observation in `info["terminal_observation"]`, as SB3 does),
then divided by the running std of r' when `normalize` is on (`RunningMeanStd`, frozen in
evaluation). Shaping: Φ of a *terminal* state is 0 (`terminal_potential: zero`, Ng et al. 1999;
Grześ 2017 shows that only Φ(terminal) = 0 leaves the optimal policy of an episodic task unchanged);
a time-limit truncation is not terminal, so there Φ(s') is the reward's prediction, as for any
other state. `terminal_potential: predicted` keeps the prediction at terminal states too.
With no reward model (`reward=None`, the oracle condition) Φ is the env's true progress, `info["progress"]`.

When the reward is called (`reward_every`):
- 1: every step, the rewards are returned by that step (sync), or with `async_inference` the call
  runs in a worker thread while the envs step on and the rewards are delivered by `flush()`;
- k > 1: every k steps, and at every episode end; 0: only at episode ends and at `flush()`
  (rollout-end relabel). Both need a causal reward (so later frames cannot change earlier values)
  and give the same values as calling every step, normalised ones too (the statistics are updated
  one env step at a time). Deferred rewards are returned as 0 by `step`
  and delivered by `flush()` as (step, env, reward); `vlm_rewards.robotics.callbacks.RewardCallback` adds them
  into SB3's rollout buffer (PPO) or replay buffer (SAC) at rollout end, before the update.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorWrapper
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper

from vlm_rewards.interface import REFERENCE, RewardModel, RewardSession
from vlm_rewards.normalization import RunningMeanStd
from vlm_rewards.robotics.config import RewardWrapperConfig

logger = logging.getLogger("vlm_rewards.robotics.reward")


@dataclass
class _Frame:
    frames: dict[str, np.ndarray]
    slot: tuple[int, int] | None  # (step, env) of the transition this frame ends; None: an episode's first frame
    env_reward: float = 0.0
    terminated: bool = False
    success: bool = False
    true_reward: float = math.nan
    progress: float = math.nan  # the env's true progress (`info["progress"]`): Φ of the oracle
    predicted_success: bool = False  # the reward's success component reached `success_threshold` here


@dataclass
class MonitorRecord:
    """One scored transition, for the reward-hacking monitor."""

    potential: float
    reward: float
    env_reward: float
    true_reward: float
    success: bool


@dataclass
class _Call:
    """One batched reward call: the frames of every stream since the last call, and the resets after it."""

    frames: list[list[_Frame]]
    resets: list[tuple[int, str, np.ndarray | None]] = field(default_factory=list)


class RewardStreams:
    """The core: per env a stream of frames, one batched reward call per step (or per k steps); with
    `reward=None`, Φ is the env's true progress (the oracle) and no model is called."""

    def __init__(self, reward: RewardModel | None, config: RewardWrapperConfig, num_envs: int):
        if reward is not None and config.reward_every != 1 and not reward.spec.causal:
            raise ValueError(
                f"reward {reward.spec.name!r} is not causal (spec.causal=False), so its values for a frame may change "
                f"as later frames arrive: reward_every={config.reward_every} needs a causal reward; use reward_every=1"
            )
        if config.success_threshold is not None and (reward is None or "success" not in reward.spec.components):
            name = "the oracle (no reward model)" if reward is None else f"reward {reward.spec.name!r}"
            raise ValueError(
                f"success_threshold reads the reward's 'success' component, but {name} has none "
                f"(components {list(reward.spec.components) if reward else []}); use a reward with a success "
                "output (e.g. a trained RM with model.reward.success_head) or leave success_threshold unset"
            )
        self.reward, self.config, self.num_envs = reward, config, num_envs
        self.normalizer = RunningMeanStd()
        self.session: RewardSession | None = None
        self.step_count = 0
        self.calls = 0
        self._buffer: list[list[_Frame]] = [[] for _ in range(num_envs)]
        self._since_call = 0
        self._last_potential = np.full(num_envs, math.nan)
        self._texts: list[str | None] = [None] * num_envs
        self._references: list[np.ndarray | None] = [None] * num_envs
        self._ready: list[tuple[int, int, float]] = []
        self._futures: list[Future] = []
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="reward") if config.async_inference else None
        self.monitor: list[MonitorRecord] = []
        self.predicted_success = np.zeros(num_envs, bool)  # per env: the last call predicted success at its step

    @property
    def deferred(self) -> bool:
        return self.config.reward_every != 1 or self.config.async_inference

    def begin_episodes(self, indices: Sequence[int], infos: Sequence[dict]) -> None:
        """Envs `indices` started new episodes; `infos` are their reset infos (from `CameraFrames`)."""
        indices = [int(i) for i in indices]  # sessions take Python ints, not numpy integers
        if not indices:
            return
        if any(self._buffer[i] for i in indices):
            self._call()  # the old episode's frames go to the old stream before it is reset
        resets = []
        for i, info in zip(indices, infos):
            text, reference = _instruction(info), self._reference(info)
            self._texts[i], self._references[i] = text, reference
            self._buffer[i].append(_Frame(_frames(info), slot=None, progress=info.get("progress", math.nan)))
            resets.append((i, text, reference))
        if self.reward is None:
            return
        if self.session is None and all(text is not None for text in self._texts):
            self.session = self.reward.open_session(list(self._texts), list(self._references))
        else:
            self._submit(_Call([], resets))

    def add_step(
        self,
        infos: Sequence[dict],
        env_rewards: np.ndarray,
        terminated: np.ndarray,
        active: np.ndarray | None = None,
    ) -> np.ndarray:
        """One vector step: per env its step info (frames, is_success), env reward and termination.

        `active[i]` False: env i made no transition this step (a NEXT_STEP reset step). Returns the
        rewards of this step (zeros in deferred modes: `flush()` delivers them).
        """
        active = np.ones(self.num_envs, bool) if active is None else np.asarray(active, bool)
        step = self.step_count
        self.step_count += 1
        self.predicted_success[:] = False
        for i in np.flatnonzero(active):
            info = infos[i]
            true_reward = float(info.get(self.config.monitor_key, env_rewards[i]))
            self._buffer[i].append(
                _Frame(
                    _frames(info),
                    (step, int(i)),
                    float(env_rewards[i]),
                    bool(terminated[i]),
                    bool(info.get("is_success", False)),
                    true_reward,
                    info.get("progress", math.nan),
                )  # fmt: skip
            )
        self._since_call += 1
        every = self.config.reward_every
        if every == 1 or (every > 1 and self._since_call >= every):
            self._call()
        if self.deferred:
            return np.zeros(self.num_envs)
        rewards = np.zeros(self.num_envs)
        for _step, env, value in self._take_ready():
            rewards[env] = value
        return rewards

    def flush(self) -> list[tuple[int, int, float]]:
        """Score what is buffered, wait for running calls; return every (step, env, reward) not yet delivered."""
        if any(self._buffer):
            self._call()
        return self._take_ready()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self.session is not None:
            self.session.close()

    # ------------------------------------------------------------------ internals

    def _reference(self, info: dict) -> np.ndarray | None:
        reference = info.get("reference")
        if reference is None and self.reward is not None and REFERENCE in self.reward.spec.requires:
            raise ValueError(
                f"reward {self.reward.spec.name!r} needs a reference (goal) image; set goal_image: true in the reward "
                "wrapper config (the env must have render_goal())"
            )
        return reference

    def _call(self) -> None:
        if not any(self._buffer):
            return
        if not all(self._buffer):
            empty = [i for i, frames in enumerate(self._buffer) if not frames]
            raise RuntimeError(f"reward call with no new frames for envs {empty}; every env must step between calls")
        call, self._buffer, self._since_call = _Call(self._buffer), [[] for _ in range(self.num_envs)], 0
        self._submit(call)

    def _submit(self, call: _Call) -> None:
        if self._executor is None:
            self._ready.extend(self._run(call))
        else:
            self._futures.append(self._executor.submit(self._run, call))

    def _take_ready(self) -> list[tuple[int, int, float]]:
        for future in self._futures:
            self._ready.extend(future.result())
        self._futures = []
        ready, self._ready = self._ready, []
        return ready

    def _run(self, call: _Call) -> list[tuple[int, int, float]]:
        """Runs in the caller's thread or, with async_inference, in the reward worker (all session use is there)."""
        results = []
        if call.frames:
            potentials = self._append(call.frames)
            results = self._transition_rewards(call.frames, potentials)
        for i, text, reference in call.resets:
            self.session.reset(i, text, reference)
        return results

    def _append(self, frames: list[list[_Frame]]) -> list[np.ndarray]:
        if self.reward is None:
            return [_true_progress(stream) for stream in frames]
        camera, views = self.config.camera, self.config.views
        clips = [np.stack([f.frames[camera] for f in stream]) for stream in frames]
        view_clips = [{name: np.stack([f.frames[name] for f in stream]) for name in views} for stream in frames]
        self.calls += 1
        try:
            potentials = self.session.append(clips, view_clips if views else None)
            _check_potentials(potentials, clips, self.reward.spec.name)
        except ValueError as error:
            if self.config.on_error == "raise":
                raise
            logger.warning("reward call failed (%s); this call falls back to the env reward", error)
            return [np.full(len(clip), math.nan) for clip in clips]
        if self.config.success_threshold is not None:
            self._read_success(frames)
        return potentials

    def _read_success(self, frames: list[list[_Frame]]) -> None:
        """Marks each stream's last new frame (this step's) with the reward's predicted success."""
        components = self.session.last_components
        if components is None or any("success" not in values for values in components):
            raise ValueError(
                f"reward {self.reward.spec.name!r}: its session ({type(self.session).__name__}) reports no 'success' "
                "component per stream (last_components), which success_threshold reads"
            )
        for i, (stream, values) in enumerate(zip(frames, components)):
            success = bool(values["success"] >= self.config.success_threshold)
            stream[-1].predicted_success = success
            stream[-1].terminated |= success and self.config.terminate_on_success
            self.predicted_success[i] = success

    def _transition_rewards(self, frames: list[list[_Frame]], potentials: list[np.ndarray]) -> list:
        results = []
        for i, (stream, values) in enumerate(zip(frames, potentials)):
            for frame, potential in zip(stream, values):
                previous, self._last_potential[i] = self._last_potential[i], potential
                if frame.slot is None:
                    continue
                total = self._combine(frame, previous, potential)
                results.append((*frame.slot, total))
                self.monitor.append(MonitorRecord(potential, total, frame.env_reward, frame.true_reward, frame.success))
        return self._normalize(results) if self.config.normalize else results

    def _normalize(self, results: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
        """Scales the rewards by the running std (centred first with normalize_center) one env step at a time,
        in step order: each step's rewards enter the statistics, then are scaled, so a call that covers several
        steps (reward_every != 1) gives the values that calls every step give."""
        by_step: dict[int, list[tuple[int, float]]] = {}
        for step, env, value in results:
            by_step.setdefault(step, []).append((env, value))
        normalized = []
        for step in sorted(by_step):
            envs, values = zip(*by_step[step])
            self.normalizer.update(np.array(values))
            scaled = self.normalizer.normalize(np.array(values), center=self.config.normalize_center)
            normalized += [(step, env, float(value)) for env, value in zip(envs, scaled)]
        return normalized

    def _combine(self, frame: _Frame, previous: float, potential: float) -> float:
        config = self.config
        success = frame.predicted_success if config.success_threshold is not None else frame.success
        bonus = config.success_bonus * success
        if math.isnan(potential) or math.isnan(previous):  # a failed call under on_error=env_reward
            return frame.env_reward + bonus
        if config.mode == "replace":
            return config.scale * potential + bonus
        if config.mode == "add":
            return frame.env_reward + config.scale * potential + bonus
        next_potential = 0.0 if frame.terminated and config.terminal_potential == "zero" else potential
        return frame.env_reward + config.scale * (config.gamma * next_potential - previous) + bonus


def _instruction(info: dict) -> str:
    text = info.get("instruction")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"reset info has no instruction text (got {text!r}); wrap each env in CameraFrames")
    return text


def _true_progress(stream: list[_Frame]) -> np.ndarray:
    values = np.array([frame.progress for frame in stream])
    if not np.all(np.isfinite(values)):
        raise ValueError("the oracle potential needs the env's true progress, info['progress'], on reset and step")
    return values


def _frames(info: dict) -> dict[str, np.ndarray]:
    frames = info.get("frames")
    if not isinstance(frames, dict):
        raise ValueError("step info has no 'frames'; wrap each env in vlm_rewards.robotics.frames.CameraFrames")
    return frames


def _check_potentials(potentials: Sequence[np.ndarray], clips: list[np.ndarray], name: str) -> None:
    if len(potentials) != len(clips):
        raise ValueError(f"reward {name!r}: session returned {len(potentials)} streams for {len(clips)} envs")
    for i, (values, clip) in enumerate(zip(potentials, clips)):
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (len(clip),):
            raise ValueError(f"reward {name!r}: stream {i} got values of shape {values.shape}, expected ({len(clip)},)")
        if not np.all(np.isfinite(values)):
            raise ValueError(f"reward {name!r}: stream {i} got non-finite values {values}")


def unstack_infos(infos: dict, num_envs: int) -> list[dict]:
    """gymnasium's dict-of-arrays vector info -> one dict per env (present keys only)."""
    per_env: list[dict] = [{} for _ in range(num_envs)]
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}", np.ones(num_envs, bool))
        for i in np.flatnonzero(mask):
            per_env[i][key] = unstack_infos(value, num_envs)[i] if isinstance(value, dict) else value[i]
    return per_env


class GymVectorReward(VectorWrapper):
    """The learned reward on a gymnasium vector env (autoreset NEXT_STEP; each env in `CameraFrames`).

    Rewards of reset steps (an env that ended last step restarts this step) are 0, as gymnasium's.
    """

    def __init__(self, env: gym.vector.VectorEnv, reward: RewardModel | None, config: RewardWrapperConfig):
        super().__init__(env)
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if mode != AutoresetMode.NEXT_STEP:
            raise ValueError(f"GymVectorReward needs autoreset_mode NEXT_STEP, the env has {mode}")
        if config.terminate_on_success:
            raise ValueError("GymVectorReward cannot end episodes itself: terminate_on_success needs SB3VecReward")
        self.streams = RewardStreams(reward, config, env.num_envs)
        self._restarting = np.zeros(env.num_envs, bool)

    def reset(self, **kwargs):
        obs, infos = self.env.reset(**kwargs)
        self.streams.begin_episodes(range(self.num_envs), unstack_infos(infos, self.num_envs))
        self._restarting[:] = False
        return obs, infos

    def step(self, actions):
        obs, env_rewards, terminated, truncated, infos = self.env.step(actions)
        per_env = unstack_infos(infos, self.num_envs)
        restarting = np.flatnonzero(self._restarting)
        self.streams.begin_episodes(restarting, [per_env[i] for i in restarting])
        rewards = self.streams.add_step(per_env, env_rewards, terminated, active=~self._restarting)
        self._restarting = terminated | truncated
        return obs, rewards.astype(np.float32), terminated, truncated, infos

    def close(self, **kwargs):
        self.streams.close()
        return super().close(**kwargs)


class SB3VecReward(VecEnvWrapper):
    """The learned reward on an SB3 `VecEnv` (each env in `CameraFrames`; SB3 resets in the same step).

    Reset infos come from the innermost VecEnv (`venv.unwrapped`): a `VecEnvWrapper` between (VecMonitor,
    VecNormalize, ...) holds empty ones of its own.
    """

    def __init__(self, venv: VecEnv, reward: RewardModel | None, config: RewardWrapperConfig):
        super().__init__(venv)
        self.streams = RewardStreams(reward, config, venv.num_envs)

    def reset(self):
        obs = self.venv.reset()
        self.streams.begin_episodes(range(self.num_envs), self.venv.unwrapped.reset_infos)
        return obs

    def step_wait(self):
        obs, env_rewards, dones, infos = self.venv.step_wait()
        truncated = np.array([info.get("TimeLimit.truncated", False) for info in infos])
        rewards = self.streams.add_step(infos, env_rewards, dones & ~truncated)
        for info in infos:
            info.pop("frames", None)  # frames are not kept in SB3's info buffers
        reset_infos = list(self.venv.unwrapped.reset_infos)
        if self.streams.config.terminate_on_success:
            for i in np.flatnonzero(self.streams.predicted_success & ~dones):
                infos[i]["terminal_observation"] = obs[i]
                infos[i]["TimeLimit.truncated"] = False
                obs[i], reset_infos[i] = self.venv.env_method("reset", indices=[int(i)])[0]
                dones[i] = True
        done = np.flatnonzero(dones)
        self.streams.begin_episodes(done, [reset_infos[i] for i in done])
        return obs, rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        self.streams.close()
        self.venv.close()


def find_reward_streams(env) -> RewardStreams | None:
    """The `RewardStreams` of an SB3 VecEnv stack or gymnasium vector env, if it has one."""
    while env is not None:
        if isinstance(env, SB3VecReward | GymVectorReward):
            return env.streams
        env = getattr(env, "venv", None) or getattr(env, "env", None)
    return None
