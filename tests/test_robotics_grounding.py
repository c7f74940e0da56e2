"""`vlmr grounding-sets`: the colour-binding probe sets are labelled from the scene each episode was reset to."""

import numpy as np
import pytest
from typer.testing import CliRunner

from vlm_rewards.cli import app
from vlm_rewards.data.episodes import EpisodeDataset
from vlm_rewards.robotics.collect import collect
from vlm_rewards.robotics.config import CollectConfig
from vlm_rewards.robotics.grounding import GroundingConfig, build_grounding_set, scenes
from vlm_rewards.robotics.tasks import COLOURS

ENV = {"num_envs": 2, "width": 16, "height": 16, "max_episode_steps": 8}


@pytest.fixture(scope="module")
def reach_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("grounding") / "reach"
    config = CollectConfig(output=str(out), env=ENV, episodes={"expert": 3, "wrong_object": 2, "random": 1},
                           views=[], frame_stride=1, seed=5)  # fmt: skip
    return collect(config)


def colour_of(instruction: str) -> str:
    return instruction.split()[2]


def test_presence_names_the_target_a_distractor_and_an_absent_colour(reach_set, tmp_path):
    probe = build_grounding_set(GroundingConfig(source=reach_set.root, output=tmp_path / "p", frames_per_episode=3))
    episodes = list(probe)
    source = list(scenes(reach_set))
    assert len(episodes) == 3 * len(source)
    for (record, colours, named), variants in zip(source, (episodes[i : i + 3] for i in range(0, len(episodes), 3))):
        own, distractor, absent = variants
        assert colour_of(own.instruction) == named and own.instruction == record.instruction
        assert colour_of(distractor.instruction) in colours and colour_of(distractor.instruction) != named
        assert colour_of(absent.instruction) in COLOURS and colour_of(absent.instruction) not in colours
        assert [float(v.progress[0]) for v in variants] == [1.0, 1.0, 0.0]
        assert all(v.frames.shape == (3, 16, 16, 3) and len(set(v.progress)) == 1 for v in variants)
        assert np.array_equal(own.frames, record.frames[[0, 4, 8]]) and np.array_equal(absent.frames, own.frames)
        assert (own.policy, absent.policy) == (record.policy, f"{record.policy}_absent")


def test_pixels_keeps_one_colour_and_text_labels_the_word(reach_set, tmp_path):
    colour = colour_of(reach_set[0].instruction)
    cli = ["grounding-sets", "configs/robotics/grounding_sets.yaml", f"source={reach_set.root}"]
    result = CliRunner().invoke(app, [*cli, f"output={tmp_path / 'px'}", "kind=pixels", f"pixel_colour={colour}"])
    assert result.exit_code == 0, result.output
    pixels = list(EpisodeDataset(tmp_path / "px"))
    assert pixels and all(colour_of(e.instruction) == colour for e in pixels)
    text = build_grounding_set(
        GroundingConfig(source=reach_set.root, output=tmp_path / "t", kind="text", text_colours=[colour])
    )
    assert len(text) == len(reach_set)
    assert all(e.progress[0] == float(colour_of(e.instruction) == colour) for e in text)


def test_refuses_data_whose_scenes_it_cannot_recover(reach_set, tmp_path):
    relabelled = CollectConfig(output=str(tmp_path / "relabel"), env=ENV, episodes={"expert": 1}, views=[],
                               relabel_targets=True, goal_reference=False)  # fmt: skip
    collect(relabelled)
    with pytest.raises(ValueError, match="relabelled"):
        build_grounding_set(GroundingConfig(source=tmp_path / "relabel", output=tmp_path / "out"))
    other_seed = reach_set.root.parent / "moved"
    meta = (reach_set.root / "meta.json").read_text().replace('"seed": 5', '"seed": 6')
    other_seed.mkdir()
    for item in reach_set.root.iterdir():
        (other_seed / item.name).symlink_to(item)
    (other_seed / "meta.json").unlink()
    (other_seed / "meta.json").write_text(meta)
    with pytest.raises(ValueError, match="says .* but its reset seed"):
        build_grounding_set(GroundingConfig(source=other_seed, output=tmp_path / "out2"))
    with pytest.raises(ValueError, match="pixel_colour"):
        GroundingConfig(pixel_colour="magenta")
