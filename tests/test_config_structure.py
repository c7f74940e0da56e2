"""The settings modules: each job's config is torch-free and documents every field where it is declared."""

import importlib
import json
import subprocess
import sys
import types
import typing
from pathlib import Path

import pydantic
import pytest

from vlm_rewards.config import JobConfig, Settings
from vlm_rewards.registry import _BUILTIN_KINDS, build_reward, reward_class

# every job's settings, by the module that declares them (these modules must import no heavy stack)
JOB_CONFIGS = {
    "demo": "vlm_rewards.demo:DemoConfig",
    "train-rm": "vlm_rewards.training.config:TrainRMConfig",
    "eval-rm": "vlm_rewards.evaluation.config:EvalRMConfig",
    "annotate": "vlm_rewards.annotation.config:AnnotateConfig",
    "serve": "vlm_rewards.serving.config:ServeConfig",
    "collect": "vlm_rewards.robotics.config:CollectConfig",
    "rl": "vlm_rewards.robotics.config:RLConfig",
    "pipeline": "vlm_rewards.robotics.config:PipelineConfig",
    "grounding-sets": "vlm_rewards.robotics.config:GroundingConfig",
    "pretrain-backbone": "vlm_rewards.robotics.config:BackboneConfig",
    "grpo": "vlm_rewards.generation.config:GRPOConfig",
    "rwr": "vlm_rewards.generation.config:RWRConfig",
    "nft": "vlm_rewards.generation.config:NFTConfig",
    "pretrain-generator": "vlm_rewards.generation.config:PretrainConfig",
    "generation-benchmark": "vlm_rewards.generation.config:BenchmarkConfig",
}
HEAVY_MODULES = ("torch", "transformers", "diffusers", "ray", "stable_baselines3", "accelerate")


def load(target: str) -> type[pydantic.BaseModel]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def settings_classes(model: type[pydantic.BaseModel], seen: set | None = None) -> list[type[pydantic.BaseModel]]:
    """`model` and every settings class nested in its fields (through lists, unions and optionals)."""
    seen = set() if seen is None else seen
    if model in seen:
        return []
    seen.add(model)
    found = [model]
    for field in model.model_fields.values():
        for inner in _types_in(field.annotation):
            if isinstance(inner, type) and issubclass(inner, pydantic.BaseModel):
                found += settings_classes(inner, seen)
    return found


def _types_in(annotation) -> list:
    args = typing.get_args(annotation)
    if not args or isinstance(annotation, types.GenericAlias) and annotation.__origin__ is type:
        return [annotation]
    return [inner for arg in args for inner in _types_in(arg)]


def test_job_settings_modules_load_without_the_heavy_stack():
    modules = sorted({target.partition(":")[0] for target in JOB_CONFIGS.values()})
    code = (
        "import json, sys\n"
        f"for name in {modules!r}: __import__(name)\n"
        f"print(json.dumps([m for m in {HEAVY_MODULES!r} if m in sys.modules]))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(loaded) == []


def undocumented_fields(model: type[pydantic.BaseModel]) -> list[str]:
    return [
        f"{cls.__name__}.{name}"
        for cls in settings_classes(model)
        for name, field in cls.model_fields.items()
        if not (field.description or "").strip()
    ]


@pytest.mark.parametrize("job", sorted(JOB_CONFIGS))
def test_every_job_setting_is_documented_where_it_is_declared(job):
    assert undocumented_fields(load(JOB_CONFIGS[job])) == []


@pytest.mark.parametrize("kind", sorted(_BUILTIN_KINDS))
def test_every_reward_parameter_is_documented(kind):
    assert undocumented_fields(reward_class(kind).Params) == []


def test_an_undocumented_nested_field_is_found():
    class Section(Settings):
        documented: int = 0
        """A documented field."""
        bare: int = 0

    class Job(JobConfig):
        section: list[Section] | None = None
        """Sections."""

    assert undocumented_fields(Job) == ["Section.bare"]


def test_configs_naming_the_old_top_level_packages_are_refused_with_the_new_path():
    with pytest.raises(ValueError, match=r"name it 'vlm_rewards\.generation\.rule_rewards:redness'"):
        build_reward({"kind": "function", "function": "generation.rule_rewards:redness"})


@pytest.mark.parametrize("package", ["robotics", "generation"])
def test_the_checkout_folders_import_only_under_the_project_namespace(package):
    repo = Path(__file__).parents[1]
    code = f"import {package}"
    result = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True)
    assert result.returncode != 0 and f"import vlm_rewards.{package}" in result.stderr
    assert importlib.import_module(f"vlm_rewards.{package}").__name__ == f"vlm_rewards.{package}"
