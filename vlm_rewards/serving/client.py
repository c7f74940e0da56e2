"""`RemoteReward`: a reward served by `vlmr serve`, behind the same `RewardModel` interface.

    reward = RemoteReward("http://127.0.0.1:8000")      # fetches and pins the served spec and version
    results = reward.score(requests)                    # one HTTP call per batch
    results = await reward.ascore(requests)             # native async (httpx.AsyncClient)
    with reward.open_session(texts, references) as session:   # held on one replica (RL)
        values = session.append(new_frames)             # one frame per stream crosses the wire

or from YAML (`kind: remote`, `url: ...`), so every consumer runs unchanged against a server.
Requests are checked locally against the pinned spec before they are sent (bad input is a
ValueError naming the field, as in-process); the server checks them again. Connection errors,
timeouts, 408 and 5xx are retried with exponential backoff for up to `retry_budget_s` seconds after
a call's first failure (60 by default: long enough for Serve to restart its HTTP proxy); other 4xx
never are. A retry resends the same body under the same request id, and rewards are pure functions
of their requests, so a retry cannot change a result, and each request gets exactly one result. If
the server starts serving another reward version, calls fail with `RewardVersionError` instead of
mixing outputs of two versions. A session lives on the replica that opened it (the served reward's own
session: a trained RM keeps its KV cache there); an append sends only the new frames, and a retried
append is answered from the server's record of it, never appended twice.

Imports only numpy, pydantic, the standard library and httpx: no torch, no ray.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import numpy as np
import pydantic

from vlm_rewards.config import Settings
from vlm_rewards.interface import (
    EXAMPLE_TEXTS,
    BaseReward,
    RewardRequest,
    RewardResult,
    RewardSession,
    RewardSpec,
    append_views,
    stream_references,
    validate_requests,
    validate_results,
)
from vlm_rewards.registry import register
from vlm_rewards.serving.wire import (
    API_VERSION,
    CONTENT_TYPE,
    REQUEST_ID_HEADER,
    VERSION_HEADER,
    encode_append,
    encode_open,
    encode_prefer,
    encode_reset,
    encode_score,
)

RETRY_STATUSES = frozenset({408, 500, 502, 503, 504})


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

    class Params(Settings):
        url: str
        """The server, e.g. http://127.0.0.1:8000 (plus its route prefix, if any)."""
        token: str | None = None
        """Bearer token; None reads `token_env`."""
        token_env: str = "VLMR_SERVE_TOKEN"
        """Environment variable holding the bearer token when `token` is None."""
        timeout: float = pydantic.Field(60.0, gt=0)
        """Seconds per HTTP attempt."""
        retry_budget_s: float = pydantic.Field(60.0, ge=0)
        """Seconds after its first failure a call keeps retrying connection errors, timeouts, 408 and 5xx."""
        retries: int | None = pydantic.Field(None, ge=0)
        """Most extra attempts per call, within `retry_budget_s`; None: as many as the budget allows."""
        backoff: float = pydantic.Field(0.1, ge=0)
        """First retry delay in seconds; it doubles each retry, up to 5 s, with ±50% jitter."""
        version: str | None = None
        """Refuse to start unless the server serves this reward version."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 60.0,
        retry_budget_s: float = 60.0,
        retries: int | None = None,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
        version: str | None = None,
    ):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout, self.retry_budget_s, self.retries = timeout, retry_budget_s, retries
        self.backoff, self.max_backoff = backoff, max_backoff
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
        return cls(
            params.url,
            token,
            params.timeout,
            params.retry_budget_s,
            params.retries,
            params.backoff,
            version=params.version,
        )

    def example_texts(self) -> tuple[str, ...]:
        """The served reward's own (the server lists them in /v1/spec)."""
        return tuple(self.server_info.get("example_texts") or EXAMPLE_TEXTS)

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

    def open_session(
        self, texts: Sequence[str], references: Sequence[np.ndarray | None] | None = None
    ) -> RemoteSession:
        """A session held by the server (see `RemoteSession`); close it when done, or it expires there."""
        return RemoteSession(self, texts, references)

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
        request_id = uuid.uuid4().hex  # the same id on every retry: one logical request
        url, client = f"{self.url}/{API_VERSION}/{endpoint}", self._async_client()
        headers = self._headers(request_id)
        retry = self._retry_budget()
        while True:
            self.attempts += 1
            try:
                outcome = await client.post(url, content=body, headers=headers)
            except httpx.TransportError as error:
                outcome = error
            delay = retry.delay(outcome)
            if delay is None:
                return self._json(self._response(outcome, retry), endpoint, request_id)
            await asyncio.sleep(delay)

    def _retrying(self, send) -> httpx.Response:
        retry = self._retry_budget()
        while True:
            self.attempts += 1
            try:
                outcome = send()
            except httpx.TransportError as error:
                outcome = error
            delay = retry.delay(outcome)
            if delay is None:
                return self._response(outcome, retry)
            time.sleep(delay)

    def _retry_budget(self) -> RetryBudget:
        return RetryBudget(self.retry_budget_s, self.retries, self.backoff, self.max_backoff)

    def _response(self, outcome: httpx.Response | httpx.TransportError, retry: RetryBudget) -> httpx.Response:
        """The final attempt's response, or RemoteRewardError if it never got one."""
        if isinstance(outcome, httpx.Response):
            return outcome
        raise RemoteRewardError(
            f"{self.url}: {type(outcome).__name__}: {outcome} (after {retry.attempts} attempts, retried for "
            f"{retry.retried_for():.1f} s of retry_budget_s={self.retry_budget_s}; is `vlmr serve` running?)"
        ) from outcome

    def _json(self, response: httpx.Response, endpoint: str, request_id: str | None = None) -> dict[str, Any]:
        data = _body(response)
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

    def _session_call(self, method: str, path: str, body: bytes | None = None, session: str | None = None) -> dict:
        """One call of the session endpoints (retried like `_post`); a session the server does not hold
        (closed, expired, its replica restarted) is a RemoteRewardError naming it."""
        request_id = uuid.uuid4().hex  # the same id on every retry: the server answers a retried append once
        url, headers = f"{self.url}/{API_VERSION}/{path}", self._headers(request_id)
        if session is not None:
            headers[self.server_info["sessions"]["header"]] = session  # Serve routes by it to the holding replica
        response = self._retrying(lambda: self._sync_client().request(method, url, content=body, headers=headers))
        if response.status_code == 404 and session is not None:
            raise RemoteRewardError(f"{url}: session {session!r} is gone: {_body(response).get('error')}", 404)
        data = self._json(response, path, request_id)
        self._check_version(data)
        return data

    def __repr__(self) -> str:
        return f"RemoteReward({self.url!r}, {self.spec.name!r}, version={self.spec.version!r})"


class RemoteSession(RewardSession):
    """B streams held by the server: `vlmr serve` keeps the served reward's own session on one replica, so
    each `append` sends the new frames only and costs what the served session costs (a trained RM: the new
    frames, with its KV cache). Values equal the served reward's in-process session."""

    def __init__(
        self, reward: RemoteReward, texts: Sequence[str], references: Sequence[np.ndarray | None] | None = None
    ):
        references = stream_references(texts, references)
        self.reward = reward
        data = reward._session_call("POST", "sessions", encode_open(texts, references))
        self.id, self.replica = data["session"], data["replica"]
        self._num_frames: list[int] = data["num_frames"]
        self._closed = False

    @property
    def num_frames(self) -> list[int]:
        return list(self._num_frames)

    def append(
        self, frames: Sequence[np.ndarray], views: Sequence[Mapping[str, np.ndarray]] | None = None
    ) -> list[np.ndarray]:
        views = append_views(frames, views, len(self._num_frames))
        data = self._call("POST", "append", encode_append(frames, views))
        self.last_components = data["components"]
        return [np.array([math.nan if v is None else v for v in values], dtype=np.float64) for values in data["values"]]

    def reset(self, index: int, text: str, reference: np.ndarray | None = None) -> None:
        self._call("POST", "reset", encode_reset(index, text, reference))

    def info(self) -> dict[str, Any]:
        """The server's view: frames per stream, frames received in all, the replica that holds it."""
        return self._call("GET", "")

    def close(self) -> None:
        """Close it on the server (a session the server already dropped counts as closed)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call("DELETE", "")
        except RemoteRewardError as error:
            if error.status != 404:
                raise

    def _call(self, method: str, action: str, body: bytes | None = None) -> dict[str, Any]:
        if self._closed and method != "DELETE":
            raise RemoteRewardError(f"session {self.id!r} is closed")
        path = f"sessions/{self.id}/{action}".rstrip("/")
        data = self.reward._session_call(method, path, body, session=self.id)
        self._num_frames = data.get("num_frames", self._num_frames)
        return data


class RetryBudget:
    """When to retry one call: after a connection error, a timeout or a retryable status, with exponential
    backoff and jitter, for up to `budget_s` seconds after its first failure (and at most `retries` extra
    attempts, if set). No retry starts after that deadline."""

    def __init__(self, budget_s: float, retries: int | None, backoff: float, max_backoff: float):
        self.budget_s, self.retries, self.backoff, self.max_backoff = budget_s, retries, backoff, max_backoff
        self.attempts = 0
        self.first_failure: float | None = None

    def retried_for(self) -> float:
        """Seconds since the call's first failure (0 before it failed)."""
        return 0.0 if self.first_failure is None else time.monotonic() - self.first_failure

    def delay(self, outcome: httpx.Response | httpx.TransportError) -> float | None:
        """Seconds to wait before the next attempt after `outcome`, or None to stop with it."""
        self.attempts += 1
        if isinstance(outcome, httpx.Response) and outcome.status_code not in RETRY_STATUSES:
            return None
        if self.first_failure is None:
            self.first_failure = time.monotonic()
        left = self.budget_s - self.retried_for()
        if left <= 0 or (self.retries is not None and self.attempts > self.retries):
            return None
        backoff = min(self.max_backoff, self.backoff * 2 ** (self.attempts - 1)) * (0.5 + random.random())
        return min(backoff, left)


def _body(response: httpx.Response) -> dict[str, Any]:
    """A response's JSON object, or {"error": its text} if it is not one."""
    try:
        data = response.json()
    except ValueError:
        return {"error": response.text[:500]}
    return data if isinstance(data, dict) else {"error": repr(data)[:500]}


def _count(items: Any) -> str:
    return str(len(items)) if isinstance(items, list) else type(items).__name__
