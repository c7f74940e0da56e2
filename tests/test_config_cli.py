import importlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from vlm_rewards.cli import app
from vlm_rewards.config import apply_overrides, load_job_config, load_yaml_file, safe_load_strict
from vlm_rewards.demo import DemoConfig

runner = CliRunner()
REPO = Path(__file__).parents[1]


def test_overrides_set_nested_keys_and_parse_yaml_values():
    data = {"train": {"lr": 1e-3, "steps": 10}, "name": "x"}
    result = apply_overrides(data, ["train.lr=3e-4", "train.tags=[a, b]", "eval.every=5", "name="])
    assert result == {"train": {"lr": 3e-4, "steps": 10, "tags": ["a", "b"]}, "eval": {"every": 5}, "name": ""}
    assert data["train"]["lr"] == 1e-3  # the input is not modified


@pytest.mark.parametrize(
    "override, message", [("train.lr", "expected dotted.key=value"), ("name.x=1", "'name' is a value")]
)
def test_bad_overrides(override, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides({"name": "x"}, [override])


def test_job_config_errors_name_the_file_and_key(tmp_path):
    path = tmp_path / "demo.yaml"
    path.write_text("clips_per_policy: many\nseeed: 1\n")
    with pytest.raises(ValueError, match=r"demo.yaml: clips_per_policy: Input should be a valid integer.*seeed: Extra"):
        load_job_config(DemoConfig, path)


def test_overriding_one_nested_key_keeps_the_section_defaults():
    from vlm_rewards.training.config import TrainRMConfig

    config = load_job_config(TrainRMConfig, None, ["data.synthetic_eval.num_frames=8"])
    assert config.data.synthetic_eval.num_frames == 8
    assert config.data.synthetic_eval.seed == TrainRMConfig().data.synthetic_eval.seed == 1000


def test_missing_or_broken_config_files(tmp_path):
    with pytest.raises(ValueError, match="nope.yaml: no such config file"):
        load_job_config(DemoConfig, tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1,\n")
    with pytest.raises(ValueError, match="bad.yaml: not valid YAML"):
        load_job_config(DemoConfig, tmp_path / "bad.yaml")


def test_shipped_demo_config_equals_the_embedded_defaults():
    assert load_job_config(DemoConfig, "configs/demo.yaml") == DemoConfig()


def test_help_lists_the_jobs():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for job in ("demo", "score", "rewards", "train-rm", "eval-rm"):
        assert job in result.output


def test_demo_job_from_the_cli(tmp_path):
    result = runner.invoke(
        app, ["demo", "configs/demo.yaml", "clips_per_policy=2", "num_frames=4", f"output_dir={tmp_path}"]
    )
    assert result.exit_code == 0, result.output
    assert "expert" in result.output and (tmp_path / "rewards_by_policy.png").stat().st_size > 1000


def test_cli_bad_config_exits_with_a_message():
    result = runner.invoke(app, ["demo", "clips_per_policy=-x"])
    assert result.exit_code == 2 and "clips_per_policy" in result.output


def test_score_with_a_composite_from_the_cli(tmp_path, world):
    episode = world.rollout(np.random.default_rng(0), 6, "expert")
    np.savez(tmp_path / "clip.npz", frames=episode.frames)
    np.savez(tmp_path / "goal.npz", frames=episode.goal_frame)
    reward = tmp_path / "reward.yaml"
    reward.write_text(yaml.safe_dump({"kind": "composite", "components": [{"reward": "goal_pixel_progress"}]}))
    result = runner.invoke(
        app,
        [
            "score",
            str(reward),
            str(tmp_path / "clip.npz"),
            "--text",
            episode.instruction,
            "--reference",
            str(tmp_path / "goal.npz"),
        ],
    )
    assert result.exit_code == 0, result.output
    line = json.loads(result.output.strip().splitlines()[-1])
    assert line["clip"].endswith("clip.npz") and line["error"] is None and line["reward"] > 0.3


def test_score_reports_bad_input(tmp_path):
    np.savez(tmp_path / "clip.npz", frames=np.zeros((2, 8, 8, 3), np.float32))
    result = runner.invoke(app, ["score", "motion_penalty", str(tmp_path / "clip.npz"), "--text", "t"])
    assert result.exit_code == 2 and "expected dtype uint8" in result.output


def test_duplicate_yaml_keys_are_errors_naming_file_line_and_key(tmp_path):
    path = tmp_path / "demo.yaml"
    path.write_text("clips_per_policy: 2\nnum_frames: 4\nclips_per_policy: 3\n")
    with pytest.raises(ValueError, match=r"demo.yaml:3: duplicate key 'clips_per_policy' \(first given on line 1\)"):
        load_job_config(DemoConfig, path)
    nested = "a:\n  b: 1\n  c:\n    d: 1\n    d: 2\n"
    with pytest.raises(ValueError, match=r"x.yaml:5: duplicate key 'd'"):
        safe_load_strict(nested, "x.yaml")
    # a merge key may be overridden on purpose; only a mapping's own keys must be unique
    merged = safe_load_strict("base: &b {p: 1, q: 2}\nrun:\n  <<: *b\n  p: 3\n")
    assert merged["run"] == {"p": 3, "q": 2}
    assert safe_load_strict("a: [1, {b: 2}]\n") == {"a": [1, {"b": 2}]}


def test_a_config_extends_another_section_by_section(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "root.yaml").write_text("a: {x: 1, y: 2}\nitems: [1, 2]\nkeep: 0\n")
    (tmp_path / "base" / "middle.yaml").write_text("extends: root.yaml\na: {y: 3}\n")
    (tmp_path / "leaf.yaml").write_text("extends: base/middle.yaml\na: {z: 4}\nitems: [9]\n")
    assert load_yaml_file(tmp_path / "leaf.yaml") == {"a": {"x": 1, "y": 3, "z": 4}, "items": [9], "keep": 0}
    (tmp_path / "demo.yaml").write_text("extends: demo_base.yaml\nseed: 5\n")
    (tmp_path / "demo_base.yaml").write_text("seed: 1\nnum_frames: 4\n")
    config = load_job_config(DemoConfig, tmp_path / "demo.yaml")
    assert (config.seed, config.num_frames, config.clips_per_policy) == (5, 4, DemoConfig().clips_per_policy)


@pytest.mark.parametrize(
    "files, message",
    [
        ({"leaf.yaml": "extends: gone.yaml\n"}, r"leaf.yaml: extends gone.yaml: .*gone.yaml: no such config file"),
        ({"leaf.yaml": "extends: [a.yaml]\n"}, r"leaf.yaml: extends: expected the path of a YAML file"),
        ({"leaf.yaml": "extends: other.yaml\n", "other.yaml": "extends: leaf.yaml\n"}, r"extends makes a cycle"),
        ({"leaf.yaml": "extends: leaf.yaml\n"}, r"extends makes a cycle"),
        ({"leaf.yaml": "extends: bad.yaml\n", "bad.yaml": "- 1\n"}, r"bad.yaml: expected a YAML mapping"),
    ],
)
def test_bad_extends(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        load_yaml_file(tmp_path / "leaf.yaml")


JOB_CONFIGS = {
    "train-rm": "vlm_rewards.training.config:TrainRMConfig",
    "eval-rm": "vlm_rewards.evaluation.config:EvalRMConfig",
    "annotate": "vlm_rewards.annotation.config:AnnotateConfig",
    "collect": "vlm_rewards.robotics.config:CollectConfig",
    "rl": "vlm_rewards.robotics.config:RLConfig",
    "pipeline": "vlm_rewards.robotics.config:PipelineConfig",
    "grounding-sets": "vlm_rewards.robotics.config:GroundingConfig",
    "pretrain-backbone": "vlm_rewards.robotics.config:BackboneConfig",
}


def _configs_for_job() -> list[tuple[str, str]]:
    """Every shipped YAML whose first line names its command, `# vlmr <job> configs/...`."""
    found = []
    for path in sorted((REPO / "configs").rglob("*.yaml")):
        header = path.read_text().split("\n", 1)[0].split()  # "#", "vlmr", job, path, ...
        named_here = len(header) >= 4 and header[1] == "vlmr" and header[3] == str(path.relative_to(REPO))
        if named_here and header[2] in JOB_CONFIGS:
            found.append((header[2], header[3]))
    return found


@pytest.mark.parametrize("job, path", _configs_for_job())
def test_every_job_config_loads_into_its_job(job, path):
    module, name = JOB_CONFIGS[job].split(":")
    load_job_config(getattr(importlib.import_module(module), name), REPO / path)


def test_job_configs_are_found():
    jobs = {job for job, _ in _configs_for_job()}
    assert jobs == set(JOB_CONFIGS), f"no shipped config found for {set(JOB_CONFIGS) - jobs}"


def test_jobs_default_openmp_to_passive_waiting_and_keep_the_users_choice(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert runner.invoke(app, ["rewards"]).exit_code == 0
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert runner.invoke(app, ["rewards"]).exit_code == 0
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_openmp_contention_bench_runs_every_condition(tmp_path):
    from bench.omp_contention import measure

    result = measure(steps=2, width=32)
    assert set(result["conditions"]) == {"quiet/default", "quiet/passive", "busy/default", "busy/passive"}
    assert all(condition["seconds_per_step"] > 0 for condition in result["conditions"].values())
