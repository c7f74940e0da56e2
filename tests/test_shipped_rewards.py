"""Every shipped reward config passes `check_reward` with the requests it declares (issue #35, item 4).

`check_reward` builds its requests from the reward's own `example_texts()`, so a reward that refuses
generic texts (push_marker_progress names two palette colours) is checked like any other. Configs that
need weights (hub ids, runs/ folders) are checked with tiny random weights of the same kind: the
shipped config with its `model` replaced (and, for speed on CPU, its frames made small).
"""

from pathlib import Path

import pytest
import torch

from tests.test_conformance import SMALL_FRAMES
from tests.test_embedding_goal import _save_tiny_clip
from tests.test_published_rewards import published_stand_in
from vlm_rewards.config import load_yaml_file
from vlm_rewards.models.backbones import build_tiny_backbone
from vlm_rewards.models.config import RewardNetworkConfig
from vlm_rewards.models.reward_network import RewardNetwork
from vlm_rewards.registry import REWARDS_DIR, build_reward
from vlm_rewards.resources import shipped_configs
from vlm_rewards.rewards.composite import CompositeReward
from vlm_rewards.rewards.window import FrameWindowReward
from vlm_rewards.testing import check_reward

HUB_FAMILIES = {"Qwen/Qwen2.5-VL-3B-Instruct": "qwen2_5_vl"}  # the architecture of each hub id shipped
STAND_IN_FRAMES = {**SMALL_FRAMES, "max_frames": 4}


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    """A tiny random Qwen-VL backbone of a family, built once per family."""
    root, built = tmp_path_factory.mktemp("backbones"), {}

    def build(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny_backbone(family, root / family, num_layers=1)
        return built[family]

    return build


def stand_in(path: Path, config: dict, folder: Path, backbone) -> dict:
    """The overrides that give `config` tiny weights of the same kind (none for a config without weights)."""
    kind = config["kind"]
    if kind == "embedding_goal":
        return {"model": str(_save_tiny_clip(folder))}
    if kind in ("vlm_judge", "gvl_progress"):
        tokens = {"max_new_tokens": 8} if kind == "gvl_progress" else {}
        return {"model": str(backbone(HUB_FAMILIES[config["model"]])), **STAND_IN_FRAMES, **tokens}
    if kind == "trained_rm":  # the model `vlmr train-rm configs/train_rm/<name>.yaml` trains, untrained
        model = load_yaml_file(shipped_configs() / "train_rm" / path.name)["model"]
        network = RewardNetworkConfig(**{**model["reward"], **SMALL_FRAMES, "max_frames": 6})
        torch.manual_seed(0)
        RewardNetwork.from_backbone(backbone(model["tiny"]["family"]), network).save_pretrained(folder)
        return {"model": str(folder)}
    return published_stand_in(config, folder, backbone) or {}


@pytest.mark.parametrize("path", sorted(REWARDS_DIR.glob("*.yaml")), ids=lambda path: path.stem)
def test_every_shipped_reward_config_conforms(path, tmp_path, backbone, one_torch_thread):
    config = load_yaml_file(path)
    reward = build_reward(config | stand_in(path, config, tmp_path / "model", backbone))
    assert reward.spec.name == config["name"]
    check_reward(reward, atol=1e-4)  # judges: left padding moves logits by ~1e-6 between batch compositions


def test_wrappers_declare_the_texts_of_the_rewards_they_wrap():
    marker = build_reward("reach_marker_progress")  # refuses texts that name no palette colour
    composite = CompositeReward([build_reward("motion_penalty"), marker], [1.0, 1.0])
    for wrapper in (composite, FrameWindowReward(marker, window=2)):
        assert wrapper.example_texts() == marker.example_texts()
        check_reward(wrapper)
