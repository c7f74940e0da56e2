"""Rewards that name hub ids fail at once on an offline machine, with a message that says what to do."""

import time

import pytest

from vlm_rewards.config import load_yaml_file
from vlm_rewards.models import hub
from vlm_rewards.registry import build_reward, resolve_reward_path, reward_class


@pytest.fixture(params=["offline_flag", "unreachable"])
def offline(request, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    if request.param == "offline_flag":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=3.0: False)


@pytest.mark.parametrize(
    "config, model_id",
    [
        ("vlm_judge", "Qwen/Qwen2.5-VL-3B-Instruct"),
        ("gvl_progress", "Qwen/Qwen2.5-VL-3B-Instruct"),
        ("embedding_goal", "openai/clip-vit-base-patch32"),
    ],
)
def test_shipped_hub_configs_fail_at_once_naming_the_id_and_the_fix(offline, config, model_id):
    reward_class(load_yaml_file(resolve_reward_path(config))["kind"])  # imports the model stack before timing
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"offline.*--local-dir DIR") as error:
        build_reward(config)
    assert model_id in str(error.value)
    assert time.perf_counter() - start < 5


def test_a_local_folder_or_a_missing_path_never_needs_the_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=3.0: pytest.fail("the network was asked"))
    assert hub.resolve_checkpoint(tmp_path, "a model") == str(tmp_path)
    with pytest.raises(ValueError, match="no such folder"):
        hub.resolve_checkpoint(tmp_path / "missing", "a model")
