"""The robotics settings: one module, read without torch, stable-baselines3 or MuJoCo, every field documented."""

import subprocess
import sys

import pytest

from vlm_rewards.config import Settings
from vlm_rewards.robotics import config

HEAVY = ("torch", "stable_baselines3", "mujoco")
SETTINGS = [
    cls
    for cls in vars(config).values()
    if isinstance(cls, type) and issubclass(cls, Settings) and cls.__module__ == config.__name__
]


def test_the_settings_and_the_pipeline_import_without_torch_sb3_or_mujoco():
    code = (
        "import sys\n"
        "import vlm_rewards.robotics.config, vlm_rewards.robotics.pipeline\n"
        f"print([name for name in {HEAVY!r} if name in sys.modules])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"importing the robotics config loaded {result.stdout.strip()}"


def test_every_robotics_settings_class_is_in_the_config_module():
    names = {cls.__name__ for cls in SETTINGS}
    assert {"CollectConfig", "RLConfig", "PipelineConfig", "GroundingConfig", "RewardWrapperConfig"} <= names
    assert {"EnvConfig", "CheckpointPolicy", "PPOParams", "SACParams", "RewardChoice", "EvalConfig"} <= names
    assert "RewardWindow" in names


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda cls: cls.__name__)
def test_every_field_is_documented(cls):
    undocumented = [name for name, field in cls.model_fields.items() if not field.description]
    assert not undocumented, f"{cls.__name__}: no docstring under {undocumented}"


def test_grounding_colours_are_checked_against_the_scene_palette():
    with pytest.raises(ValueError, match="pixel_colour 'mauve'; expected one of"):
        config.GroundingConfig(pixel_colour="mauve")
    with pytest.raises(ValueError, match=r"text_colours \[\]; expected a non-empty subset"):
        config.GroundingConfig(text_colours=[])


def test_negative_episode_counts_are_refused():
    with pytest.raises(ValueError, match=r"episodes\.expert\n.*greater than or equal to 0"):
        config.CollectConfig(episodes={"expert": -2, "random": 1})
    with pytest.raises(ValueError, match=r"eval_episodes: episodes\.noisy: .*greater than or equal to 0"):
        config.PipelineConfig(eval_episodes={"expert": 2, "noisy": -1})


def test_a_ppo_batch_larger_than_the_rollout_is_refused():
    message = r"ppo.batch_size=100000 is larger than a rollout of ppo.n_steps \* env.num_envs = 128 \* 4 = 512"
    with pytest.raises(ValueError, match=message):
        config.RLConfig(ppo={"batch_size": 100_000})
    config.RLConfig(ppo={"batch_size": 512})
    config.RLConfig(algo="sac", ppo={"batch_size": 100_000})  # the ppo section is unused
    rl = {"algo": "ppo", "ppo": {"n_steps": 64, "batch_size": 128}}  # fits the rl section's own 4 envs
    with pytest.raises(ValueError, match=r"rl: .*ppo.batch_size=128 is larger than .* = 64 transitions"):
        config.PipelineConfig(env={"num_envs": 1}, rl=rl)
