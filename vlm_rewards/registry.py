"""Build any reward model from a YAML file (`kind: ...` plus that kind's parameters).

Each reward class declares a pydantic `Params` model and a `from_params` constructor, and registers
under a kind name. Built-in kinds are listed lazily so that `import vlm_rewards` stays light and the
heavy VLM modules load only when a config asks for them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

import pydantic

from vlm_rewards.config import format_validation_error, load_yaml_file
from vlm_rewards.interface import RewardModel
from vlm_rewards.resources import reward_configs

REWARDS_DIR = reward_configs()  # configs/rewards/, shipped as package data

_BUILTIN_KINDS = {
    "function": "vlm_rewards.rewards.function:FunctionReward",
    "goal_pixel_progress": "vlm_rewards.rewards.rules:GoalPixelProgress",
    "motion_penalty": "vlm_rewards.rewards.rules:MotionPenalty",
    "marker_progress": "vlm_rewards.rewards.rules:MarkerProgress",
    "composite": "vlm_rewards.rewards.composite:CompositeReward",
    "frame_window": "vlm_rewards.rewards.window:FrameWindowReward",
    "shift_average": "vlm_rewards.rewards.shift_average:ShiftAverageReward",
    "embedding_goal": "vlm_rewards.models.embedding:EmbeddingGoalReward",
    "trained_rm": "vlm_rewards.models.trained_reward:TrainedRewardModel",
    "vlm_judge": "vlm_rewards.models.judge:YesNoJudge",
    "gvl_progress": "vlm_rewards.models.judge:GVLProgressJudge",
    "pickscore": "vlm_rewards.models.image_scores:PickScore",
    "clip_score": "vlm_rewards.models.image_scores:CLIPScore",
    "hpsv2": "vlm_rewards.models.image_scores:HPSv2",
    "aesthetic": "vlm_rewards.models.image_scores:AestheticScore",
    "topreward": "vlm_rewards.models.robot_scores:TOPReward",
    "robometer": "vlm_rewards.models.robot_scores:Robometer",
    "sarm": "vlm_rewards.models.sarm:SARMReward",
    "remote": "vlm_rewards.serving.client:RemoteReward",
}
_registered: dict[str, type] = {}
_BUILDING: ContextVar[tuple[Path, ...]] = ContextVar("reward_configs_being_built", default=())

T = TypeVar("T", bound=type)


def register(kind: str) -> Callable[[T], T]:
    """Class decorator: make `kind: <kind>` in a reward YAML build this class."""

    def decorator(cls: T) -> T:
        for attribute in ("Params", "from_params"):
            if not hasattr(cls, attribute):
                raise TypeError(f"reward class {cls.__name__} needs a `{attribute}` to be registered")
        _registered[kind] = cls
        return cls

    return decorator


def register_builtin(kind: str, target: str) -> None:
    """Name a reward class by import path ("module:Class"); it is imported on first use."""
    _BUILTIN_KINDS[kind] = target


def known_kinds() -> list[str]:
    return sorted(set(_BUILTIN_KINDS) | set(_registered))


def reward_class(kind: str) -> type:
    if kind not in _registered:
        if kind not in _BUILTIN_KINDS:
            raise ValueError(f"unknown reward kind {kind!r}; known kinds: {', '.join(known_kinds())}")
        module_name, class_name = _BUILTIN_KINDS[kind].split(":")
        importlib.import_module(module_name)  # registers the class via @register
        if kind not in _registered:
            raise RuntimeError(f"{module_name} did not register reward kind {kind!r} ({class_name})")
    return _registered[kind]


def resolve_reward_path(reference: str | Path, relative_to: Path | None = None) -> Path:
    """A reward config: a bare name ("demo_composite") is a shipped config in configs/rewards/; anything
    with a slash or a .yaml/.yml suffix is a path, relative to `relative_to` (the folder of the YAML
    that names it) or else to the current directory. There is no fallback from one to the other."""
    candidate = Path(reference)
    if "/" not in str(reference) and candidate.suffix not in (".yaml", ".yml"):
        shipped = REWARDS_DIR / f"{candidate}.yaml"
        if not shipped.is_file():
            names = ", ".join(sorted(path.stem for path in REWARDS_DIR.glob("*.yaml")))
            raise ValueError(f"reward config {str(reference)!r} is not a shipped config (known: {names})")
        return shipped
    path = candidate if candidate.is_absolute() or relative_to is None else relative_to / candidate
    if not path.is_file():
        raise ValueError(f"reward config {str(reference)!r} not found (looked for {path})")
    return path


def build_reward(config: str | Path | Mapping[str, Any], relative_to: Path | None = None) -> RewardModel:
    """Build a reward from a YAML path, a shipped config name, or an already-loaded mapping.

    A reward that names other rewards (a composite) resolves their paths relative to its own YAML.
    """
    if not isinstance(config, str | Path):
        return _build_from_mapping(config, origin="reward config")
    path = resolve_reward_path(config, relative_to).resolve()
    chain = _BUILDING.get()
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain[chain.index(path) :], path))
        raise ValueError(f"reward config {path} includes itself: {cycle}")
    token = _BUILDING.set((*chain, path))
    try:
        return _build_from_mapping(load_yaml_file(path), origin=str(path))
    finally:
        _BUILDING.reset(token)


def check_reward_config(reference: str | Path) -> None:
    """Check a reward config without building it: it exists, names a known kind, and its parameters
    validate (a server checks this before Ray starts; its replicas build the reward)."""
    path = resolve_reward_path(reference)
    config = load_yaml_file(path)
    if "kind" not in config:
        raise ValueError(f"{path}: missing `kind`; is this a reward config?")
    try:
        reward_class(str(config["kind"])).Params.model_validate({k: v for k, v in config.items() if k != "kind"})
    except pydantic.ValidationError as error:
        raise ValueError(f"{path} (kind {config['kind']!r}): {format_validation_error(error)}") from None


def current_config_folder() -> Path | None:
    """The folder of the reward YAML being built (for resolving the rewards it names), if any."""
    chain = _BUILDING.get()
    return chain[-1].parent if chain else None


def _build_from_mapping(config: Mapping[str, Any], origin: str) -> RewardModel:
    if not isinstance(config, Mapping):
        raise ValueError(f"{origin}: expected a mapping with a `kind` key, got {type(config).__name__}")
    if "kind" not in config:
        raise ValueError(f"{origin}: missing `kind`; known kinds: {', '.join(known_kinds())}")
    params = {key: value for key, value in config.items() if key != "kind"}
    cls = reward_class(str(config["kind"]))
    try:
        validated = cls.Params.model_validate(params)
    except pydantic.ValidationError as error:
        raise ValueError(f"{origin} (kind {config['kind']!r}): {format_validation_error(error)}") from None
    return cls.from_params(validated)
