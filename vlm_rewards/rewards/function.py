"""A reward from a plain Python function of one request.

Configs are code: `kind: function` imports the module a config names and calls its function, so load
configs only from sources you trust. Builtins and functions of process- or file-handling modules
(`os:system`, `builtins:eval`, `subprocess:run`, ...) are refused as a guard against mistakes, not as
a sandbox.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from vlm_rewards.config import Settings
from vlm_rewards.fingerprint import fingerprint
from vlm_rewards.interface import BaseReward, RewardRequest, RewardResult, RewardSpec
from vlm_rewards.registry import register

RewardFunction = Callable[[RewardRequest], "float | RewardResult"]
REFUSED_MODULES = {
    "builtins", "os", "posix", "nt", "sys", "subprocess", "shutil", "importlib", "runpy", "pty", "socket",
    "pickle", "marshal", "ctypes", "code", "pathlib", "io", "tempfile",
}  # fmt: skip
MOVED_PACKAGES = {"robotics", "generation"}  # now vlm_rewards.robotics and vlm_rewards.generation


def import_callable(target: str) -> Callable:
    """`package.module:function` -> the function; refuses builtins and system modules."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"function {target!r}: expected 'package.module:function'")
    if module_name.split(".")[0] in MOVED_PACKAGES:
        raise ValueError(f"function {target!r}: {module_name.split('.')[0]} moved; name it 'vlm_rewards.{target}'")
    if module_name.split(".")[0] in REFUSED_MODULES:
        raise ValueError(f"function {target!r}: functions of {module_name!r} are refused; name a reward function")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"function {target!r} could not be imported: {error}") from None
    if not callable(function) or inspect.isbuiltin(function) or inspect.isclass(function):
        raise ValueError(f"function {target!r} is not a Python function")
    return function


@register("function")
class FunctionReward(BaseReward):
    """Wraps `function(request) -> float | RewardResult`, called once per request.

    The function gets read-only views of the caller's arrays. Its capability flags are declared (by
    the caller or the config), since nothing can check them here but the conformance checker.
    """

    class Params(Settings):
        function: str
        """The function to call, as 'package.module:function' (imported, so trust the config's source)."""
        name: str | None = None
        """The reward's name in results, logs and reports; None: the function's name."""
        value_range: tuple[float, float] = (-math.inf, math.inf)
        """The (low, high) the function's values stay within, declared in the reward's spec."""
        dense: bool = False
        """The function returns a RewardResult with per-frame progress."""
        causal: bool = False
        """Frame t's value depends only on frames 0..t (streams can be scored frame by frame)."""
        batch_invariant: bool = True
        """A request's result does not depend on the other requests of its call."""
        deterministic: bool = True
        """The same request always gets the same result."""
        requires: tuple[str, ...] = ()
        """Request fields the function needs besides frames and text (e.g. "reference")."""

    def __init__(
        self,
        function: RewardFunction,
        name: str | None = None,
        value_range: tuple[float, float] = (-math.inf, math.inf),
        **flags: bool | tuple[str, ...],
    ):
        self.function = function
        self.qualified_name = f"{function.__module__}:{getattr(function, '__qualname__', repr(function))}"
        self.spec = RewardSpec(
            name=name or getattr(function, "__name__", "function"),
            version=fingerprint(self.qualified_name, value_range, sorted(flags.items())),
            value_range=value_range,
            **flags,
        )

    @classmethod
    def from_params(cls, params: Params) -> FunctionReward:
        flags = params.model_dump(exclude={"function", "name", "value_range"})
        return cls(import_callable(params.function), params.name, params.value_range, **flags)

    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return [self._call(index, request) for index, request in enumerate(requests)]

    def _call(self, index: int, request: RewardRequest) -> RewardResult:
        value = self.function(_read_only(request))
        if isinstance(value, RewardResult):
            return value
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and not self.spec.dense:
            return RewardResult(reward=float(value))
        expected = "a RewardResult with progress" if self.spec.dense else "a real number or a RewardResult"
        raise ValueError(
            f"function {self.qualified_name} returned {type(value).__name__} {value!r:.80} for requests[{index}]; "
            f"expected {expected}"
        )


def _read_only(request: RewardRequest) -> RewardRequest:
    """The request with read-only views of its arrays, so a function cannot write into the caller's frames."""

    def frozen(array: np.ndarray | None) -> np.ndarray | None:
        if array is None:
            return None
        view = array.view()
        view.flags.writeable = False
        return view

    return replace(
        request,
        frames=frozen(request.frames),
        reference=frozen(request.reference),
        views={name: frozen(view) for name, view in request.views.items()},
    )
