"""A reward from a plain Python function of one request."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pydantic

from vlm_rewards.fingerprint import fingerprint
from vlm_rewards.interface import BaseReward, OutputKind, RewardRequest, RewardResult, RewardSpec
from vlm_rewards.registry import register

RewardFunction = Callable[[RewardRequest], "float | RewardResult"]


def import_callable(target: str) -> Callable:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"function {target!r}: expected 'package.module:function'")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"function {target!r} could not be imported: {error}") from None
    if not callable(function):
        raise ValueError(f"function {target!r} is not callable")
    return function


@register("function")
class FunctionReward(BaseReward):
    """Wraps `function(request) -> float | RewardResult`, called once per request."""

    class Params(pydantic.BaseModel, extra="forbid"):
        function: str
        name: str | None = None
        output: OutputKind = "scalar"
        value_range: tuple[float, float] = (float("-inf"), float("inf"))

    def __init__(
        self,
        function: RewardFunction,
        name: str | None = None,
        output: OutputKind = "scalar",
        value_range: tuple[float, float] = (float("-inf"), float("inf")),
    ):
        self.function = function
        qualified = f"{function.__module__}:{getattr(function, '__qualname__', repr(function))}"
        self.spec = RewardSpec(
            name=name or getattr(function, "__name__", "function"),
            version=fingerprint(qualified, output, value_range),
            output=output,
            value_range=value_range,
        )

    @classmethod
    def from_params(cls, params: Params) -> FunctionReward:
        return cls(import_callable(params.function), params.name, params.output, params.value_range)

    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        results = []
        for request in requests:
            value = self.function(request)
            results.append(value if isinstance(value, RewardResult) else RewardResult(reward=float(value)))
        return results
