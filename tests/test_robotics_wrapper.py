import math

import numpy as np
import pytest
import torch
from stable_baselines3 import SAC
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

from vlm_rewards.fingerprint import fingerprint
from vlm_rewards.interface import BaseReward, RewardResult, RewardSpec
from vlm_rewards.registry import build_reward
from vlm_rewards.robotics.callbacks import RewardCallback
from vlm_rewards.robotics.config import EnvConfig
from vlm_rewards.robotics.envs import make_env, make_gym_vector
from vlm_rewards.robotics.reward_wrapper import GymVectorReward, RewardStreams, RewardWrapperConfig, SB3VecReward

SMALL = EnvConfig(id="vlmr/Reach-v0", num_envs=3, width=16, height=16, max_episode_steps=6)


class Counting:
    """Wraps a reward, counting `score` calls (a RescoringSession makes one per append)."""

    def __init__(self, reward):
        self.inner, self.spec, self.calls = reward, reward.spec, 0

    def score(self, requests):
        self.calls += 1
        return self.inner.score(requests)

    async def ascore(self, requests):
        return self.score(requests)

    def prefer(self, a, b):
        return self.inner.prefer(a, b)

    def open_session(self, texts, references=None):
        from vlm_rewards.interface import RescoringSession

        return RescoringSession(self, texts, references)


class PixelProgress(BaseReward):
    """Causal toy reward: progress of a frame = its mean pixel / 255 (optionally NaN); each frame's
    value is computed alone, so it is bit-identical however the frames are batched."""

    def __init__(self, causal=True, nan=False):
        self.nan = nan
        self.spec = RewardSpec("pixel", fingerprint("pixel"), (0.0, 1.0), dense=True, causal=causal)

    def _score(self, requests):
        results = []
        for request in requests:
            progress = request.frames.reshape(request.num_frames, -1).mean(1) / 255
            if self.nan:
                results.append(RewardResult(math.nan, np.full_like(progress, math.nan), error="broken"))
            else:
                results.append(RewardResult(float(progress[-1]), progress))
        return results


def frame_info(value: int, success=False, text="reach the red target") -> dict:
    frame = np.full((4, 4, 3), value, np.uint8)
    return {"frames": {"top": frame}, "instruction": text, "is_success": success, "dense_reward": value / 255 - 1}


def goal_reward():
    return Counting(build_reward("goal_pixel_progress"))


def test_shaping_matches_a_hand_computation():
    config = RewardWrapperConfig(mode="shaping", gamma=0.9, scale=2.0, success_bonus=5.0)
    streams = RewardStreams(PixelProgress(), config, num_envs=2)
    streams.begin_episodes([0, 1], [frame_info(10), frame_info(20)])
    rewards = streams.add_step([frame_info(50), frame_info(60)], np.array([0.0, 1.0]), np.array([False, False]))
    phi = lambda v: v / 255  # noqa: E731
    expected = [2 * (0.9 * phi(50) - phi(10)), 1 + 2 * (0.9 * phi(60) - phi(20))]
    np.testing.assert_allclose(rewards, expected)
    # env 0 terminates with success: Φ(terminal) = 0; env 1 is truncated: Φ(s') is predicted
    rewards = streams.add_step(
        [frame_info(90, success=True), frame_info(30)], np.array([1.0, 0.0]), np.array([True, False])
    )
    np.testing.assert_allclose(rewards, [1 + 2 * (0 - phi(50)) + 5, 2 * (0.9 * phi(30) - phi(60))])
    streams.begin_episodes([0, 1], [frame_info(100), frame_info(40)])  # env 1 truncated, both restart
    rewards = streams.add_step([frame_info(110), frame_info(45)], np.zeros(2), np.array([False, False]))
    np.testing.assert_allclose(rewards, [2 * (0.9 * phi(110) - phi(100)), 2 * (0.9 * phi(45) - phi(40))])


@pytest.mark.parametrize("mode, expected", [("replace", 3 * 50 / 255), ("add", 1 + 3 * 50 / 255)])
def test_replace_and_add(mode, expected):
    streams = RewardStreams(PixelProgress(), RewardWrapperConfig(mode=mode, scale=3.0), num_envs=1)
    streams.begin_episodes([0], [frame_info(10)])
    np.testing.assert_allclose(streams.add_step([frame_info(50)], np.array([1.0]), np.array([False])), [expected])


def test_terminal_potential_predicted():
    config = RewardWrapperConfig(mode="shaping", gamma=1.0, terminal_potential="predicted")
    streams = RewardStreams(PixelProgress(), config, num_envs=1)
    streams.begin_episodes([0], [frame_info(0)])
    np.testing.assert_allclose(streams.add_step([frame_info(255)], np.zeros(1), np.array([True])), [1.0])


def run_sb3(reward, config: RewardWrapperConfig, steps: int, env_config=SMALL, monitor=False):
    venv = DummyVecEnv([lambda: make_env(env_config, goal_image=True) for _ in range(env_config.num_envs)])
    venv.seed(0)
    env = SB3VecReward(VecMonitor(venv) if monitor else venv, reward, config)
    env.reset()
    rng = np.random.default_rng(0)
    rewards, dones = [], []
    for _ in range(steps):
        env.step_async(rng.uniform(-1, 1, (env.num_envs, 2)))
        _, reward_batch, done, _ = env.step_wait()
        rewards.append(reward_batch)
        dones.append(done)
    delivered = env.streams.flush()
    env.close()
    return np.array(rewards), np.array(dones), delivered, env.streams


def test_sb3_wrapper_makes_one_reward_call_per_step():
    reward = goal_reward()
    rewards, dones, _, streams = run_sb3(reward, RewardWrapperConfig(mode="replace", goal_image=True), steps=14)
    assert dones.any()  # episodes of 6 steps: the resets happen inside the 14 steps
    assert reward.calls == 14 == streams.calls
    assert np.all((rewards >= 0) & (rewards <= 1))


def test_sb3_wrapper_reads_reset_infos_through_a_vec_env_wrapper():
    """A VecEnvWrapper between (here VecMonitor) has empty reset infos of its own: the reward wrapper reads
    the innermost VecEnv's, at the first reset and at every autoreset."""
    config = RewardWrapperConfig(mode="replace", goal_image=True)
    direct, dones, *_ = run_sb3(goal_reward(), config, steps=14)
    monitored, *_ = run_sb3(goal_reward(), config, steps=14, monitor=True)
    assert dones.any()
    np.testing.assert_array_equal(monitored, direct)


def test_session_rewards_equal_scoring_the_whole_prefix():
    """Replace mode returns Φ(s') = progress of the newest frame; for a causal reward this must equal
    `score` on the whole episode prefix (frames since reset), across autoresets."""
    reward = build_reward("goal_pixel_progress")
    envs = GymVectorReward(make_gym_vector(SMALL, goal_image=True), reward, RewardWrapperConfig(mode="replace"))
    obs, infos = envs.reset(seed=0)
    episodes = [[infos["frames"]["top"][i]] for i in range(SMALL.num_envs)]
    references = list(infos["reference"])
    restarting, restarts = np.zeros(SMALL.num_envs, bool), 0
    rng = np.random.default_rng(1)
    from vlm_rewards.interface import RewardRequest

    for _ in range(15):
        obs, rewards, terminated, truncated, infos = envs.step(rng.uniform(-1, 1, (SMALL.num_envs, 2)))
        for i in range(SMALL.num_envs):
            frame = infos["frames"]["top"][i]
            if restarting[i]:
                episodes[i], references[i], restarts = [frame], infos["reference"][i], restarts + 1
                assert rewards[i] == 0.0
                continue
            episodes[i].append(frame)
            request = RewardRequest(np.stack(episodes[i]), "reach the target", reference=references[i])
            assert rewards[i] == pytest.approx(reward.score([request])[0].progress[-1], abs=1e-6)
        restarting = terminated | truncated
    assert restarts >= SMALL.num_envs  # autoresets happened and the streams followed them
    envs.close()


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("schedule", [{"reward_every": 4}, {"reward_every": 0}, {"async_inference": True}])
def test_deferred_and_async_rewards_equal_per_step_rewards(schedule, normalize):
    base = RewardWrapperConfig(mode="shaping", goal_image=True, success_bonus=1.0, normalize=normalize)
    sync, *_ = run_sb3(goal_reward(), base, steps=13)
    reward = goal_reward()
    immediate, _, delivered, streams = run_sb3(reward, base.model_copy(update=schedule), steps=13)
    assert np.all(immediate == 0)
    deferred = np.zeros_like(sync)
    for step, env, value in delivered:
        deferred[step, env] = value
    np.testing.assert_allclose(deferred, sync, atol=1e-6)
    if schedule.get("reward_every") == 4:
        assert streams.calls < 13  # fewer, larger calls (one more at each episode end)


def train_sac(config: RewardWrapperConfig, env_config=SMALL):
    venv = DummyVecEnv([lambda: make_env(env_config) for _ in range(env_config.num_envs)])
    env = SB3VecReward(venv, PixelProgress(), config)
    model = SAC("MlpPolicy", env, learning_starts=12, batch_size=16, train_freq=4, gradient_steps=4,
                buffer_size=24, policy_kwargs={"net_arch": [16]}, seed=0, device="cpu")  # fmt: skip
    model.learn(48, callback=RewardCallback(env.streams))  # 16 vector steps: the 8-row replay ring wraps
    env.close()
    return model, env.streams.calls


@pytest.mark.parametrize("schedule", [{"reward_every": 4}, {"reward_every": 0}, {"async_inference": True}])
def test_sac_with_deferred_rewards_trains_on_the_sync_rewards(schedule):
    """Deferred rewards reach the replay buffer at rollout end (train_freq steps), before the gradient
    steps: the run stores, trains on and so acts on exactly what a sync run does."""
    base = RewardWrapperConfig(mode="shaping", success_bonus=1.0)
    sync, sync_calls = train_sac(base)
    deferred, deferred_calls = train_sac(base.model_copy(update=schedule))
    assert np.any(sync.replay_buffer.rewards != 0)
    np.testing.assert_array_equal(deferred.replay_buffer.rewards, sync.replay_buffer.rewards)
    np.testing.assert_array_equal(deferred.replay_buffer.observations, sync.replay_buffer.observations)
    for trained, reference in zip(deferred.policy.parameters(), sync.policy.parameters()):
        assert torch.equal(trained, reference)
    if "reward_every" in schedule:
        assert deferred_calls < sync_calls  # one call per rollout of 4 steps (and at episode ends)


def test_normalized_rewards_use_running_std():
    config = RewardWrapperConfig(mode="replace", normalize=True)
    streams = RewardStreams(PixelProgress(), config, num_envs=2)
    streams.begin_episodes([0, 1], [frame_info(0), frame_info(0)])
    rewards = streams.add_step([frame_info(51), frame_info(102)], np.zeros(2), np.zeros(2, bool))
    values = np.array([51, 102]) / 255
    with_prior = np.concatenate([values, values, [-1, 1]])  # the prior weighs as -1 and 1 at half weight
    np.testing.assert_allclose(rewards, values / np.sqrt(with_prior.var() + 1e-8))
    streams.normalizer.freeze()
    before = streams.normalizer.state_dict()
    streams.add_step([frame_info(200), frame_info(3)], np.zeros(2), np.zeros(2, bool))
    assert streams.normalizer.state_dict() == before


def test_bad_rewards_fail_loudly_or_fall_back_with_a_log(caplog):
    with pytest.raises(ValueError, match="not causal"):
        RewardStreams(PixelProgress(causal=False), RewardWrapperConfig(reward_every=0), num_envs=1)
    streams = RewardStreams(PixelProgress(nan=True), RewardWrapperConfig(), num_envs=1)
    streams.begin_episodes([0], [frame_info(0)])
    with pytest.raises(ValueError, match="non-finite"):
        streams.add_step([frame_info(9)], np.zeros(1), np.zeros(1, bool))
    streams = RewardStreams(PixelProgress(nan=True), RewardWrapperConfig(on_error="env_reward"), num_envs=1)
    streams.begin_episodes([0], [frame_info(0)])
    assert streams.add_step([frame_info(9)], np.array([0.5]), np.zeros(1, bool))[0] == 0.5
    assert "falls back to the env reward" in caplog.text
    streams = RewardStreams(build_reward("goal_pixel_progress"), RewardWrapperConfig(), num_envs=1)
    with pytest.raises(ValueError, match="needs a reference"):
        streams.begin_episodes([0], [frame_info(0)])
