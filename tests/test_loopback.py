"""Consumers run unchanged against a served reward (issue #11, item 3): the annotator, the RL wrapper
and the GRPO reward set each give the same outputs with `RemoteReward` as with the in-process reward.

One local Ray instance (2 CPUs) serves, for the whole module, one rule reward that suits every
consumer: `tests.annotation_fixtures:brightness_progress` as a dense, causal `function` reward (no
weights, no reference needed; a one-frame clip is an image). The replica imports it from the driver's
sys.path, the way Ray propagates it to its workers.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.annotation_fixtures import make_video_folder, write_reward_yaml
from tests.serving_fixtures import local_serve
from vlm_rewards.registry import build_reward
from vlm_rewards.serving.client import RemoteReward

pytestmark = pytest.mark.xdist_group("serving")  # one Ray instance per process that runs these


@pytest.fixture(scope="module")
def reward_yaml(tmp_path_factory):
    # causal: progress[t] = brightness of frame t, so it depends on frames <= t only
    return write_reward_yaml(tmp_path_factory.mktemp("reward") / "brightness.yaml", "brightness_progress", causal=True)


@pytest.fixture(scope="module")
def server(reward_yaml):
    serve = pytest.importorskip("ray.serve")
    from vlm_rewards.serving.config import ServeConfig
    from vlm_rewards.serving.server import build_app

    with local_serve() as port:
        config = ServeConfig(
            reward=str(reward_yaml),
            port=port,
            batching={"max_batch_size": 16, "wait_timeout_s": 0.005},
            replicas={"count": 1, "num_cpus": 0.5, "health_check_period_s": 0.5},
        )
        serve.run(build_app(config), name="loopback", route_prefix="/", blocking=False)
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def remote_yaml(server, tmp_path_factory):
    path = tmp_path_factory.mktemp("remote") / "remote.yaml"
    path.write_text(f"kind: remote\nurl: {server}\ntimeout: 30\nretries: 2\n")
    return path


def test_served_reward_pins_the_local_version(reward_yaml, remote_yaml):
    local, remote = build_reward(str(reward_yaml)), build_reward(str(remote_yaml))
    assert isinstance(remote, RemoteReward)
    assert remote.spec == local.spec and remote.spec.version == local.spec.version


# ---------------------------------------------------------------------------- annotation


def test_annotation_remote_equals_in_process(tmp_path, reward_yaml, remote_yaml):
    from vlm_rewards.annotation import AnnotateConfig, run_annotation

    root = make_video_folder(tmp_path / "videos", lengths=(6, 9, 7, 8))
    source = {"kind": "videos", "path": str(root), "instructions": str(root / "instructions.json")}

    def job(reward, out: str):
        config = AnnotateConfig.model_validate(
            {
                "reward": str(reward),
                "source": source,
                "output_dir": str(tmp_path / out),
                "batch_size": 3,
                "sampling": {"mode": "stride", "stride": 2},
                "report": {"enabled": False},
                "decode": {"workers": 2, "backend": "thread"},
            }
        )
        return run_annotation(config)  # the reward is built from config.reward: a YAML path either way

    local, remote = job(reward_yaml, "local"), job(remote_yaml, "remote")
    assert (local.num_annotated, local.num_failed) == (remote.num_annotated, remote.num_failed) == (4, 0)
    assert remote.fingerprint == local.fingerprint  # same reward name and version: the same job
    for name in ("frames.parquet", "episodes.parquet"):
        a, b = pq.read_table(local.output_dir / name), pq.read_table(remote.output_dir / name)
        assert a.num_rows > 0 and a.equals(b), name
    frames = pq.read_table(local.output_dir / "frames.parquet").to_pandas()
    assert frames.scored.any() and not frames.scored.all()  # strided: frame_index went over the wire
    for name in ("manifest.json", "failures.json", "job.json"):  # same source path, fingerprint, counts
        assert (local.output_dir / name).read_bytes() == (remote.output_dir / name).read_bytes(), name


# ---------------------------------------------------------------------------- RL wrapper


def _rollout(reward, steps: int = 20):
    from vlm_rewards.robotics.config import EnvConfig
    from vlm_rewards.robotics.envs import make_gym_vector
    from vlm_rewards.robotics.reward_wrapper import GymVectorReward, RewardWrapperConfig

    env_config = EnvConfig(id="vlmr/Reach-v0", num_envs=2, width=16, height=16, max_episode_steps=7)
    wrapper = RewardWrapperConfig(mode="shaping", gamma=0.9, scale=2.0, success_bonus=1.0)
    envs = GymVectorReward(make_gym_vector(env_config), reward, wrapper)
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    rewards, ends = [], []
    for _ in range(steps):
        _, reward_batch, terminated, truncated, _ = envs.step(rng.uniform(-1, 1, (env_config.num_envs, 2)))
        rewards.append(reward_batch)
        ends.append(terminated | truncated)
    envs.close()
    return np.array(rewards), np.array(ends)


def test_rl_wrapper_remote_equals_in_process(reward_yaml, remote_yaml):
    local, local_ends = _rollout(build_reward(str(reward_yaml)))
    remote, remote_ends = _rollout(build_reward(str(remote_yaml)))
    assert local_ends.any() and np.array_equal(local_ends, remote_ends)  # episode ends and autoresets inside
    assert np.abs(local).max() > 0 and len(np.unique(local)) > 2  # a signal worth comparing
    np.testing.assert_allclose(remote, local, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- GRPO rewards


def test_grpo_reward_set_remote_equals_in_process(reward_yaml, server):
    rewards = pytest.importorskip("vlm_rewards.generation.rewards")

    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (6, 24, 24, 3), dtype=np.uint8)
    prompts = [f"a bright image {i}" for i in range(len(images))]
    local = rewards.RewardSet.build({"brightness": (str(reward_yaml), 1.0)}, gold={"gold": str(reward_yaml)})
    remote = rewards.RewardSet.build(
        {"brightness": ({"kind": "remote", "url": server}, 1.0)}, gold={"gold": {"kind": "remote", "url": server}}
    )
    assert isinstance(remote.trained["brightness"], RemoteReward)
    expected, got = asyncio.run(local.ascore(images, prompts)), asyncio.run(remote.ascore(images, prompts))
    assert got.trained.keys() == expected.trained.keys() == {"brightness"} and got.gold.keys() == {"gold"}
    np.testing.assert_array_equal(got.trained["brightness"], expected.trained["brightness"])
    np.testing.assert_array_equal(got.gold["gold"], expected.gold["gold"])
    np.testing.assert_array_equal(expected.trained["brightness"], images.reshape(6, -1).mean(axis=1) / 255.0)
