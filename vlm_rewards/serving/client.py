"""`RemoteReward`: a reward served by `vlmr serve`, behind the same `RewardModel` interface.

    reward = RemoteReward("http://127.0.0.1:8000")      # fetches and pins the served spec and version
    results = reward.score(requests)                    # one HTTP call per batch
    results = await reward.ascore(requests)             # native async (httpx.AsyncClient)

or from YAML (`kind: remote`, `url: ...`), so every consumer runs unchanged against a server.
Requests are checked locally against the pinned spec before they are sent (bad input is a
ValueError naming the field, as in-process); the server checks them again. Connection errors,
timeouts and 5xx are retried with exponential backoff (rewards are pure functions of their requests,
so a retry cannot change a result); 4xx never are. If the server starts serving another reward
version, calls fail with `RewardVersionError` instead of mixing outputs of two versions.

Imports only numpy, pydantic, the standard library and httpx: no torch, no ray.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np
import pydantic

from vlm_rewards.interface import (
    BaseReward,
    RewardRequest,
    RewardResult,
    RewardSpec,
    validate_requests,
    validate_results,
)
from vlm_rewards.registry import register
from vlm_rewards.serving.wire import (
    API_VERSION,
    CONTENT_TYPE,
    REQUEST_ID_HEADER,
    VERSION_HEADER,
    encode_prefer,
    encode_score,
)

RETRY_STATUSES = frozenset({500, 502, 503, 504})


class RemoteRewardError(RuntimeError):
    """The server could not be reached or failed after all retries (or refused the token)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class RewardVersionError(RemoteRewardError):
    """The server now serves another reward version than the one this client pinned."""


class ItemErrors(ValueError):
    """Some items were refused (HTTP 422); `errors` maps item index -> message, `outcomes` holds the
    other items' results (RewardResult for a score, float for a prefer)."""

    def __init__(self, message: str, errors: dict[int, str], outcomes: list[Any]):
        super().__init__(message)
        self.errors, self.outcomes = errors, outcomes


@register("remote")
class RemoteReward(BaseReward):
    """A reward served over HTTP by `vlmr serve`; see the module docstring."""

    class Params(pydantic.BaseModel, extra="forbid"):
        url: str  # e.g. http://127.0.0.1:8000 (plus the server's route prefix, if any)
        token: str | None = None  # bearer token; None reads token_env
        token_env: str = "VLMR_SERVE_TOKEN"
        timeout: float = pydantic.Field(60.0, gt=0)  # seconds per HTTP attempt
        retries: int = pydantic.Field(5, ge=0)  # extra attempts on connection errors, timeouts, 5xx
        backoff: float = pydantic.Field(0.1, ge=0)  # first retry delay; doubles each retry (max 5 s)
        version: str | None = None  # refuse to start unless the server serves this reward version

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 60.0,
        retries: int = 5,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
        version: str | None = None,
    ):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout, self.retries, self.backoff, self.max_backoff = timeout, retries, backoff, max_backoff
        self._client: httpx.Client | None = None
        self._async_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.attempts = 0  # HTTP attempts made (retries included), for monitoring and tests
        served = self._get_spec()
        self.spec: RewardSpec = RewardSpec.from_json(served["spec"])
        if version is not None and version != self.spec.version:
            raise RewardVersionError(
                f"{self.url} serves {self.spec.name!r} version {self.spec.version!r}; expected version {version!r}"
            )
        self.server_info = {key: value for key, value in served.items() if key != "spec"}

    @classmethod
    def from_params(cls, params: Params) -> RemoteReward:
        import os

        token = params.token or os.environ.get(params.token_env) or None
        return cls(params.url, token, params.timeout, params.retries, params.backoff, version=params.version)

    # ------------------------------------------------------------------ interface

    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return self._score_results(self._post("score", encode_score(requests)), len(requests))

    async def ascore(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        validate_requests(requests, self.spec)
        response = await self._apost("score", encode_score(list(requests)))
        results = self._score_results(response, len(requests))
        validate_results(results, requests, self.spec)
        return results

    def _prefer(self, a: list[RewardRequest], b: list[RewardRequest]) -> np.ndarray:
        data = self._post("prefer", encode_prefer(a, b))
        outcomes = self._outcomes(data, len(a), lambda item: math.nan if item["p"] is None else float(item["p"]))
        return np.asarray(outcomes, dtype=np.float64)

    def score_items(self, requests: Sequence[RewardRequest]) -> list[RewardResult | ValueError]:
        """Per request its RewardResult or the ValueError the server gave it, so that one bad request
        does not sink its batch-mates (for batch jobs); no local validation."""
        try:
            return self._score_results(self._post("score", encode_score(list(requests))), len(requests))
        except ItemErrors as error:
            return [ValueError(error.errors[i]) if i in error.errors else o for i, o in enumerate(error.outcomes)]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> RemoteReward:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:  # picklable for Ray tasks and worker processes
        state = dict(self.__dict__)
        state["_client"], state["_async_clients"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._async_clients = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------ responses

    def _score_results(self, data: dict[str, Any], count: int) -> list[RewardResult]:
        return self._outcomes(data, count, lambda item: RewardResult.from_json(item["result"]))

    def _outcomes(self, data: dict[str, Any], count: int, parse) -> list[Any]:
        self._check_version(data)
        items = data.get("results")
        if not isinstance(items, list) or len(items) != count:
            raise RemoteRewardError(f"{self.url}: expected {count} results, got {_count(items)}")
        outcomes, errors = [], {}
        for i, item in enumerate(items):
            if "error" in item:
                errors[i] = item["error"]
                outcomes.append(None)
            else:
                outcomes.append(parse(item))
        if errors:
            listed = "; ".join(f"[{i}] {message}" for i, message in errors.items())
            raise ItemErrors(f"{self.url} refused {len(errors)} of {count} items: {listed}", errors, outcomes)
        return outcomes

    def _check_version(self, data: dict[str, Any]) -> None:
        version = data.get("version")
        if version != self.spec.version:
            raise RewardVersionError(
                f"{self.url} now serves {self.spec.name!r} version {version!r}, but this client pinned "
                f"{self.spec.version!r}; outputs of different versions never mix — build a new RemoteReward"
            )

    # ------------------------------------------------------------------ HTTP

    def _headers(self, request_id: str) -> dict[str, str]:
        headers = {REQUEST_ID_HEADER: request_id, "Content-Type": CONTENT_TYPE}
        if getattr(self, "spec", None) is not None:
            headers[VERSION_HEADER] = self.spec.version
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _sync_client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout)
        return self._client

    def _async_client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop)
        if client is None:
            limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
            client = self._async_clients[loop] = httpx.AsyncClient(timeout=self.timeout, limits=limits)
        return client

    def _get_spec(self) -> dict[str, Any]:
        request_id = uuid.uuid4().hex
        response = self._retrying(
            lambda: self._sync_client().get(f"{self.url}/{API_VERSION}/spec", headers=self._headers(request_id))
        )
        return self._json(response, "spec")

    def _post(self, endpoint: str, body: bytes) -> dict[str, Any]:
        request_id = uuid.uuid4().hex  # the same id on every retry: one logical request
        url = f"{self.url}/{API_VERSION}/{endpoint}"
        headers = self._headers(request_id)
        response = self._retrying(lambda: self._sync_client().post(url, content=body, headers=headers))
        return self._json(response, endpoint, request_id)

    async def _apost(self, endpoint: str, body: bytes) -> dict[str, Any]:
        request_id = uuid.uuid4().hex
        url, client = f"{self.url}/{API_VERSION}/{endpoint}", self._async_client()
        for attempt in range(self.retries + 1):
            self.attempts += 1
            try:
                response = await client.post(url, content=body, headers=self._headers(request_id))
            except httpx.TransportError as error:
                if attempt == self.retries:
                    raise self._unreachable(error) from error
            else:
                if response.status_code not in RETRY_STATUSES or attempt == self.retries:
                    return self._json(response, endpoint, request_id)
            await asyncio.sleep(self._delay(attempt))
        raise AssertionError("unreachable")

    def _retrying(self, send) -> httpx.Response:
        for attempt in range(self.retries + 1):
            self.attempts += 1
            try:
                response = send()
            except httpx.TransportError as error:
                if attempt == self.retries:
                    raise self._unreachable(error) from error
            else:
                if response.status_code not in RETRY_STATUSES or attempt == self.retries:
                    return response
            time.sleep(self._delay(attempt))
        raise AssertionError("unreachable")

    def _delay(self, attempt: int) -> float:
        return min(self.max_backoff, self.backoff * 2**attempt) * (0.5 + random.random())

    def _unreachable(self, error: Exception) -> RemoteRewardError:
        return RemoteRewardError(
            f"{self.url}: {type(error).__name__}: {error} (after {self.retries + 1} attempts; is `vlmr serve` running?)"
        )

    def _json(self, response: httpx.Response, endpoint: str, request_id: str | None = None) -> dict[str, Any]:
        try:
            data = response.json()
        except ValueError:
            data = {"error": response.text[:500]}
        if not isinstance(data, dict):
            data = {"error": repr(data)[:500]}
        status = response.status_code
        if request_id is not None and data.get("request_id") not in (None, request_id):
            raise RemoteRewardError(f"{self.url}: response for request {data.get('request_id')}, sent {request_id}")
        if status == 200 or (status == 422 and isinstance(data.get("results"), list)):
            return data  # 422 with results: per-item errors, raised as ItemErrors by _outcomes
        message = f"{self.url}/{API_VERSION}/{endpoint}: HTTP {status}: {data.get('error', data)}"
        if status == 409:
            raise RewardVersionError(message, status)
        if status in (400, 404, 413, 422):
            raise ValueError(message)
        raise RemoteRewardError(message, status)

    def __repr__(self) -> str:
        return f"RemoteReward({self.url!r}, {self.spec.name!r}, version={self.spec.version!r})"


def _count(items: Any) -> str:
    return str(len(items)) if isinstance(items, list) else type(items).__name__
