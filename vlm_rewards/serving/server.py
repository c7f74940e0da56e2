"""The reward server: any configured reward on Ray Serve, with dynamic batching across requests.

Endpoints (JSON responses; request bodies in the raw-buffer format of `vlm_rewards.serving.wire`):

    GET  /healthz      liveness (no auth)
    GET  /readyz       200 once the reward is built and warmed up, else 503 (no auth)
    GET  /v1/spec      {"api", "spec": RewardSpec.to_json(), "version", "replica", "batching"}
    GET  /metrics      this replica's latency percentiles, achieved batch sizes, queue depth, counts
    POST /v1/score     items -> per item {"result": RewardResult.to_json(), "batch_size"} or {"error", "status"}
    POST /v1/prefer    pairs -> per pair {"p": P(a > b), "batch_size"} or {"error", "status"}

Streaming sessions (RL; see `vlm_rewards.serving.sessions`): each call after the open carries the session
id in Serve's session header too (`SESSION_HEADER`), by which `SessionRouter` reaches the replica holding it.

    POST   /v1/sessions              texts, references -> {"session", "replica", "streams"}
    POST   /v1/sessions/{id}/append  per stream its new frames (and views) -> {"values", "components", "num_frames"}
    POST   /v1/sessions/{id}/reset   index, text, reference -> {"num_frames"}
    GET    /v1/sessions/{id}         {"num_frames", "frames_received", "idle_s", "replica"}
    DELETE /v1/sessions/{id}         closes it

The replica holds the served reward's own `open_session(...)` (a trained RM's KV cache), so an append
costs the new frames only, on the wire and, for rewards that cache, in compute. Session statuses: 404
unknown, closed or expired session (`sessions.idle_s`); 429 the replica holds `sessions.max_open`; 422
the session refused the input (it is unchanged); 400 the session header is missing or differs from the
path. A retried append (same request id) gets the first attempt's response without appending again.

Every item is decoded and checked against the served spec (`validate_request`) *before* it joins a
batch, so one bad item gets its own error while its batch-mates are scored. Items of all concurrent
requests are gathered by `@serve.batch` into one `reward.score` call (up to `max_batch_size`, waiting
at most `wait_timeout_s`). Status codes: 200 all items scored; 422 some item was invalid (the body
still holds every other item's result); 400 the body cannot be decoded (or the API version in it is
unknown); 404 unknown API version in the path; 401 missing/wrong bearer token; 408 the body did not
arrive within `body_timeout_s`; 409 the client pinned another reward version; 413 body over
`max_payload_bytes`, or items that decode to more than `max_pixels_per_request` pixels (an item over
`max_pixels_per_item` gets its own 422); 503 the replica is already reading `max_body_reads` bodies
(clients retry); 500 the reward failed (the item's error says how; clients retry). A replica keeps
serving after any of these: stalled uploads hold at most `max_body_reads` of its request slots, each
for at most `body_timeout_s`, so /healthz keeps answering.
"""

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve.config import RequestRouterConfig

from vlm_rewards.interface import RewardModel, RewardRequest, example_texts_of, json_safe, validate_request
from vlm_rewards.serving.config import ServeConfig
from vlm_rewards.serving.sessions import (
    SESSION_HEADER,
    SessionEntry,
    SessionRouter,
    SessionsFull,
    SessionTable,
    UnknownSession,
)
from vlm_rewards.serving.wire import (
    API_VERSION,
    REQUEST_ID_HEADER,
    VERSION_HEADER,
    DecodedBody,
    WireError,
    decode_append,
    decode_body,
    decode_open,
    decode_reset,
)

logger = logging.getLogger(__name__)
LIMITS = ("max_payload_bytes", "max_pixels_per_item", "max_pixels_per_request", "body_timeout_s", "max_body_reads")
app = FastAPI(title="vlm-rewards reward server", docs_url=None, redoc_url=None, openapi_url=None)


class HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class Metrics:
    """Rolling per-replica figures (the last `window` requests and batches)."""

    def __init__(self, window: int = 10_000):
        self.started = time.time()
        self.latencies = {name: deque(maxlen=window) for name in ("score", "prefer", "append")}
        self.batch_sizes: deque[int] = deque(maxlen=window)
        self.batches = 0
        self.batched_items = 0
        self.requests: dict[str, int] = {}
        self.items = 0
        self.item_errors = 0
        self.queue_depth = 0  # items waiting for or in a reward call now
        self.max_queue_depth = 0

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests[f"{endpoint}:{status}"] = self.requests.get(f"{endpoint}:{status}", 0) + 1
        if endpoint in self.latencies:
            self.latencies[endpoint].append(seconds)

    def batch(self, size: int) -> None:
        self.batches += 1
        self.batched_items += size
        self.batch_sizes.append(size)

    def enqueue(self, count: int) -> None:
        self.queue_depth += count
        self.max_queue_depth = max(self.max_queue_depth, self.queue_depth)

    def to_json(self) -> dict[str, Any]:
        def percentiles(values: deque[float]) -> dict[str, float | None]:
            if not values:
                return {"count": 0, "p50_ms": None, "p90_ms": None, "p99_ms": None}
            p50, p90, p99 = np.percentile(np.asarray(values) * 1e3, [50, 90, 99])
            return {"count": len(values), "p50_ms": float(p50), "p90_ms": float(p90), "p99_ms": float(p99)}

        sizes = np.asarray(self.batch_sizes, dtype=np.float64)
        return {
            "uptime_s": time.time() - self.started,
            "requests": dict(sorted(self.requests.items())),
            "items": self.items,
            "item_errors": self.item_errors,
            "latency": {name: percentiles(values) for name, values in self.latencies.items()},
            "batches": {
                "count": self.batches,
                "items": self.batched_items,
                "mean_size": float(sizes.mean()) if sizes.size else None,
                "max_size": int(sizes.max()) if sizes.size else None,
                "histogram": {str(k): int(v) for k, v in zip(*np.unique(sizes.astype(int), return_counts=True))},
            },
            "queue_depth": self.queue_depth,
            "max_queue_depth": self.max_queue_depth,
        }


def _ok(result_json: dict[str, Any], batch_size: int) -> dict[str, Any]:
    return {"result": result_json, "batch_size": batch_size}


def _bad(status: int, message: str) -> dict[str, Any]:
    return {"error": message, "status": status}


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@contextlib.contextmanager
def _refused_input():
    """A ValueError raised inside (a malformed body, input the reward refuses) becomes HTTP 422."""
    try:
        yield
    except ValueError as error:
        raise HTTPError(422, str(error)) from None


def frame_pixels(request: RewardRequest) -> int:
    """Pixels (values over the 3 RGB channels) of a request's frames, reference and views as decoded."""
    clips = [request.frames, *request.views.values(), *([] if request.reference is None else [request.reference])]
    return sum(clip.size for clip in clips) // 3


@serve.deployment
@serve.ingress(app)
class RewardDeployment:
    """One replica: builds the reward, validates items, batches them across requests, scores."""

    def __init__(self, reward: str, settings: dict[str, Any]):
        from vlm_rewards.registry import build_reward

        self.reward: RewardModel = build_reward(reward)
        self.spec = self.reward.spec
        self.limits = {name: settings[name] for name in LIMITS}
        self.body_reads = 0  # request bodies being received now
        self.token_hash: str | None = settings.get("token_sha256")
        self.batching = {"max_batch_size": settings["max_batch_size"], "wait_timeout_s": settings["wait_timeout_s"]}
        for method in (self._score_batch, self._prefer_batch):
            method.set_max_batch_size(settings["max_batch_size"])
            method.set_batch_wait_timeout_s(settings["wait_timeout_s"])
        try:
            self.replica = serve.get_replica_context().replica_id.unique_id
        except Exception:  # noqa: BLE001 - outside a Serve replica (unit use)
            self.replica = f"pid-{os.getpid()}"
        self.metrics = Metrics()
        self.sessions = SessionTable(self.replica, settings["max_sessions"], settings["session_idle_s"])
        self.ready_error: str | None = None
        self._warm_up()

    def _warm_up(self) -> None:
        from vlm_rewards.testing import example_requests

        try:
            self.reward.score(example_requests(self.reward, count=1, max_frames=2))
        except Exception as error:  # noqa: BLE001 - reported by /readyz
            self.ready_error = f"warm-up failed: {type(error).__name__}: {error}"
            logger.exception("reward warm-up failed")

    # ------------------------------------------------------------------ plain endpoints

    @app.get("/healthz")
    async def healthz(self) -> dict[str, Any]:
        return {"status": "ok", "replica": self.replica}

    @app.get("/readyz")
    async def readyz(self) -> JSONResponse:
        if self.ready_error:
            return JSONResponse({"ready": False, "error": self.ready_error, "replica": self.replica}, status_code=503)
        return JSONResponse({"ready": True, "version": self.spec.version, "replica": self.replica})

    @app.get("/metrics")
    async def metrics(self, request: Request) -> JSONResponse:
        return await self._guard(request, "metrics", lambda: self._metrics_body())

    async def _metrics_body(self) -> dict[str, Any]:
        metrics = self.metrics.to_json()
        return {"replica": self.replica, "version": self.spec.version, **metrics, "sessions": self.sessions.to_json()}

    @app.get("/{api}/spec")
    async def spec_endpoint(self, api: str, request: Request) -> JSONResponse:
        return await self._guard(request, "spec", lambda: self._spec_body(api))

    async def _spec_body(self, api: str) -> dict[str, Any]:
        self._check_api(api)
        return {
            "api": API_VERSION,
            "spec": self.spec.to_json(),
            "version": self.spec.version,
            "replica": self.replica,
            "batching": self.batching,
            **self.limits,
            "example_texts": list(example_texts_of(self.reward)),
            "sessions": {"header": SESSION_HEADER, "max_open": self.sessions.max_open, "idle_s": self.sessions.idle_s},
        }

    # ------------------------------------------------------------------ scoring

    @app.post("/{api}/score")
    async def score(self, api: str, request: Request) -> JSONResponse:
        return await self._guard(request, "score", lambda: self._score_body(api, request))

    @app.post("/{api}/prefer")
    async def prefer(self, api: str, request: Request) -> JSONResponse:
        return await self._guard(request, "prefer", lambda: self._prefer_body(api, request))

    async def _score_body(self, api: str, request: Request) -> tuple[dict[str, Any], int]:
        body = await self._decode(api, request)
        items = body.items("items")
        outcomes: list[dict[str, Any] | None] = [None] * len(items)
        pending: dict[int, RewardRequest] = {}
        for i, item in enumerate(items):
            where = f"items[{i}]"
            try:
                decoded = self._item(body, item, where)
            except ValueError as error:
                outcomes[i] = _bad(422, str(error))
                continue
            pending[i] = decoded
        self._check_request_pixels(pending.values())
        for i, outcome in zip(pending, await self._run_batched(self._score_batch, list(pending.values()))):
            outcomes[i] = outcome
        for outcome, item in zip(outcomes, items):
            if "result" in outcome:
                outcome["key"] = item.get("key")
        return self._respond(outcomes)

    async def _prefer_body(self, api: str, request: Request) -> tuple[dict[str, Any], int]:
        body = await self._decode(api, request)
        pairs = body.items("pairs")
        outcomes: list[dict[str, Any] | None] = [None] * len(pairs)
        pending: dict[int, tuple[RewardRequest, RewardRequest]] = {}
        for i, pair in enumerate(pairs):
            try:
                if not isinstance(pair, dict) or set(pair) != {"a", "b"}:
                    raise ValueError(f"pairs[{i}]: expected {{'a': item, 'b': item}}")
                a, b = (self._item(body, pair[side], f"pairs[{i}].{side}") for side in "ab")
            except ValueError as error:
                outcomes[i] = _bad(422, str(error))
                continue
            pending[i] = (a, b)
        self._check_request_pixels([request for pair in pending.values() for request in pair])
        for i, outcome in zip(pending, await self._run_batched(self._prefer_batch, list(pending.values()))):
            outcomes[i] = outcome
        return self._respond(outcomes)

    def _item(self, body: DecodedBody, item: Any, where: str) -> RewardRequest:
        """One item decoded and checked: its pixels (before any per-pixel work), then the served spec."""
        request = body.request(item, where)
        pixels, limit = frame_pixels(request), self.limits["max_pixels_per_item"]
        if pixels > limit:
            raise ValueError(
                f"{where}: frames, reference and views decode to {pixels} pixels; this server takes at most "
                f"{limit} per item (max_pixels_per_item)"
            )
        validate_request(request, self.spec, where)
        return request

    def _check_request_pixels(self, requests: Iterable[RewardRequest]) -> None:
        self._check_pixel_count(sum(map(frame_pixels, requests)), "the items")

    def _check_pixels(self, arrays: Iterable[np.ndarray]) -> None:
        self._check_pixel_count(sum(array.size for array in arrays) // 3, "the arrays")

    def _check_pixel_count(self, pixels: int, what: str) -> None:
        limit = self.limits["max_pixels_per_request"]
        if pixels > limit:
            raise HTTPError(
                413,
                f"{what} decode to {pixels} pixels; this server takes at most {limit} per request "
                "(max_pixels_per_request); split the batch",
            )

    async def _run_batched(self, method: Callable, items: list) -> list[dict[str, Any]]:
        """Submit each item on its own to the batched method, so items of all requests batch together."""
        if not items:
            return []
        self.metrics.enqueue(len(items))
        try:
            return list(await asyncio.gather(*(method(item) for item in items)))
        finally:
            self.metrics.queue_depth -= len(items)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def _score_batch(self, requests: list[RewardRequest]) -> list[dict[str, Any]]:
        self.metrics.batch(len(requests))
        return await asyncio.to_thread(self._score_now, requests, len(requests))

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def _prefer_batch(self, pairs: list[tuple[RewardRequest, RewardRequest]]) -> list[dict[str, Any]]:
        self.metrics.batch(len(pairs))
        return await asyncio.to_thread(self._prefer_now, pairs, len(pairs))

    def _score_now(self, requests: list[RewardRequest], batch_size: int) -> list[dict[str, Any]]:
        """Per request its result or error: a ValueError of the batch is retried item by item, so one
        request the reward itself refuses does not sink its batch-mates."""
        try:
            return [_ok(result.to_json(), batch_size) for result in self.reward.score(requests)]
        except ValueError as error:
            if len(requests) == 1:
                return [_bad(422, str(error))]
            return [self._score_now([request], batch_size)[0] for request in requests]
        except Exception as error:  # noqa: BLE001 - reported per item as 500; the replica keeps serving
            logger.exception("reward.score failed")
            return [_bad(500, f"reward failed: {type(error).__name__}: {error}")] * len(requests)

    def _prefer_now(self, pairs: list[tuple[RewardRequest, RewardRequest]], batch_size: int) -> list[dict[str, Any]]:
        try:
            probabilities = self.reward.prefer([a for a, _ in pairs], [b for _, b in pairs])
            return [{"p": None if np.isnan(p) else float(p), "batch_size": batch_size} for p in probabilities]
        except ValueError as error:
            if len(pairs) == 1:
                return [_bad(422, str(error))]
            return [self._prefer_now([pair], batch_size)[0] for pair in pairs]
        except Exception as error:  # noqa: BLE001
            logger.exception("reward.prefer failed")
            return [_bad(500, f"reward failed: {type(error).__name__}: {error}")] * len(pairs)

    # ------------------------------------------------------------------ streaming sessions

    @app.post("/{api}/sessions")
    async def open_session(self, api: str, request: Request) -> JSONResponse:
        return await self._guard(request, "open", lambda: self._open_body(api, request))

    @app.post("/{api}/sessions/{session_id}/append")
    async def append(self, api: str, session_id: str, request: Request) -> JSONResponse:
        return await self._guard(request, "append", lambda: self._append_body(api, session_id, request))

    @app.post("/{api}/sessions/{session_id}/reset")
    async def reset(self, api: str, session_id: str, request: Request) -> JSONResponse:
        return await self._guard(request, "reset", lambda: self._reset_body(api, session_id, request))

    @app.get("/{api}/sessions/{session_id}")
    async def session_info(self, api: str, session_id: str, request: Request) -> JSONResponse:
        return await self._guard(request, "session", lambda: self._info_body(api, session_id, request))

    @app.delete("/{api}/sessions/{session_id}")
    async def close_session(self, api: str, session_id: str, request: Request) -> JSONResponse:
        return await self._guard(request, "close", lambda: self._close_body(api, session_id, request))

    async def _open_body(self, api: str, request: Request) -> dict[str, Any]:
        body = await self._decode(api, request)
        with _refused_input():
            texts, references = decode_open(body)
            self._check_pixels([reference for reference in references if reference is not None])
            session = await asyncio.to_thread(self.reward.open_session, texts, references)
        try:
            entry = self.sessions.open(session)
        except SessionsFull as error:
            raise HTTPError(429, str(error)) from None
        return {**self._session_json(entry), "streams": len(texts)}

    async def _append_body(self, api: str, session_id: str, request: Request) -> dict[str, Any]:
        body = await self._decode(api, request)
        async with self._session(session_id, request) as entry:
            request_id = request.headers.get(REQUEST_ID_HEADER)
            if entry.last_append is not None and request_id is not None and entry.last_append[0] == request_id:
                return entry.last_append[1]  # a retry of the append that was done last: not again
            with _refused_input():
                frames, views = decode_append(body)
                self._check_pixels([*frames, *(view for named in views for view in named.values())])
            values = await self._in_session(entry, lambda: entry.session.append(frames, views))
            received = sum(len(new) for new in frames)
            entry.frames_received += received
            self.sessions.counts["frames_received"] += received
            response = {
                **self._session_json(entry),
                "values": json_safe(values),
                "components": json_safe(entry.session.last_components),
            }
            entry.last_append = (request_id, response)
            return response

    async def _reset_body(self, api: str, session_id: str, request: Request) -> dict[str, Any]:
        body = await self._decode(api, request)
        async with self._session(session_id, request) as entry:
            with _refused_input():
                index, text, reference = decode_reset(body)
                self._check_pixels([] if reference is None else [reference])
            await self._in_session(entry, lambda: entry.session.reset(index, text, reference))
            return self._session_json(entry)

    async def _info_body(self, api: str, session_id: str, request: Request) -> dict[str, Any]:
        self._check_api(api)
        async with self._session(session_id, request) as entry:
            return self._session_json(entry)

    async def _close_body(self, api: str, session_id: str, request: Request) -> dict[str, Any]:
        self._check_api(api)
        async with self._session(session_id, request) as entry:
            closed = {**self._session_json(entry), "closed": True}
            self.sessions.close(entry.id)
            return closed

    @contextlib.asynccontextmanager
    async def _session(self, session_id: str, request: Request):
        """The open session `session_id`, locked for this call (404 if unknown, 400 without its header)."""
        header = request.headers.get(SESSION_HEADER)
        if header != session_id:
            raise HTTPError(
                400,
                f"session {session_id!r}: header {SESSION_HEADER} is {header!r}; send the session id in it too, "
                "so that Serve routes the call to the replica that holds the session",
            )
        try:
            entry = self.sessions.get(session_id)
            async with entry.lock:
                if self.sessions.entries.get(session_id) is not entry:  # closed while this call waited
                    raise UnknownSession(f"session {session_id!r}: closed while this call waited for it")
                yield entry
        except UnknownSession as error:
            raise HTTPError(404, str(error)) from None

    async def _in_session(self, entry: SessionEntry, call: Callable) -> Any:
        """Run a session call in a worker thread: its ValueError is a 422 (the session is unchanged); any
        other error closes the session (its state is unknown) and is a 500."""
        try:
            return await asyncio.to_thread(call)
        except ValueError as error:
            raise HTTPError(422, f"session {entry.id!r}: {error}") from None
        except Exception as error:  # noqa: BLE001 - reported; the replica keeps serving
            logger.exception("session call failed")
            message = f"session {entry.id!r} failed and was closed: {type(error).__name__}: {error}"
            self.sessions.fail(entry.id, message)  # a retry of this call gets 404 with this message
            raise HTTPError(500, message) from None

    def _session_json(self, entry: SessionEntry) -> dict[str, Any]:
        return {
            "api": API_VERSION,
            "version": self.spec.version,
            "replica": self.replica,
            "session": entry.id,
            "num_frames": list(entry.session.num_frames),
            "frames_received": entry.frames_received,
        }

    # ------------------------------------------------------------------ plumbing

    def _respond(self, outcomes: list[dict[str, Any]]) -> tuple[dict[str, Any], int]:
        statuses = [outcome["status"] for outcome in outcomes if "error" in outcome]
        self.metrics.items += len(outcomes)
        self.metrics.item_errors += len(statuses)
        status = 200 if not statuses else (500 if 500 in statuses else max(statuses))
        return {"api": API_VERSION, "version": self.spec.version, "replica": self.replica, "results": outcomes}, status

    async def _guard(self, request: Request, endpoint: str, handler: Callable) -> JSONResponse:
        """Auth, timing, request-id echo and errors as JSON {"error": ...} with their status code."""
        start = time.perf_counter()
        request_id = request.headers.get(REQUEST_ID_HEADER)
        try:
            self._check_auth(request)
            outcome = await handler()
            body, status = outcome if isinstance(outcome, tuple) else (outcome, 200)
        except HTTPError as error:
            body, status = {"api": API_VERSION, "error": error.message, "replica": self.replica}, error.status
        except WireError as error:
            body, status = {"api": API_VERSION, "error": str(error), "replica": self.replica}, 400
        except Exception as error:  # noqa: BLE001 - a bug here must not take the replica down
            logger.exception("request failed")
            body, status = {"api": API_VERSION, "error": f"internal error: {type(error).__name__}: {error}"}, 500
        if request_id is not None:
            body["request_id"] = request_id
        self.metrics.request(endpoint, status, time.perf_counter() - start)
        return JSONResponse(body, status_code=status)

    def _check_auth(self, request: Request) -> None:
        if self.token_hash is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(_token_hash(token.strip()), self.token_hash):
            raise HTTPError(401, "missing or wrong bearer token (Authorization: Bearer <token>)")

    def _check_api(self, api: str) -> None:
        if api != API_VERSION:
            raise HTTPError(404, f"unknown API version {api!r}; this server speaks {API_VERSION} (/{API_VERSION}/...)")

    async def _decode(self, api: str, request: Request) -> DecodedBody:
        self._check_api(api)
        expected = request.headers.get(VERSION_HEADER)
        if expected is not None and expected != self.spec.version:
            raise HTTPError(409, f"client pinned reward version {expected!r}; this server serves {self.spec.version!r}")
        limit = self.limits["max_payload_bytes"]
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HTTPError(413, f"payload of {declared} bytes; this server takes at most {limit}")
        body = decode_body(await self._read_body(request))
        if body.api != API_VERSION:
            raise WireError(f"header.api {body.api!r}: unknown API version; this server speaks {API_VERSION}")
        return body

    async def _read_body(self, request: Request) -> bytes:
        """The body, received within `body_timeout_s`, with at most `max_body_reads` bodies received at once:
        a stalled upload holds a request slot of this replica only so long, and only so many of them. (Serve's
        proxy forwards a request before its body arrives; its `request_timeout_s` bounds the whole request,
        scoring included, and a client may lift it per request with a header, so the bound is here.)"""
        if self.body_reads >= self.limits["max_body_reads"]:
            raise HTTPError(503, f"already receiving {self.body_reads} request bodies (max_body_reads); retry")
        self.body_reads += 1
        try:
            return await asyncio.wait_for(self._receive(request), self.limits["body_timeout_s"])
        except TimeoutError:
            timeout = self.limits["body_timeout_s"]
            raise HTTPError(408, f"the request body did not arrive within {timeout} s (body_timeout_s)") from None
        finally:
            self.body_reads -= 1

    async def _receive(self, request: Request) -> bytes:
        limit = self.limits["max_payload_bytes"]
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"payload over {limit} bytes; split the batch")
            chunks.append(chunk)
        return b"".join(chunks)


# ---------------------------------------------------------------------- deploying


def reward_reference(reference: str) -> str:
    """A reward name stays a name (shipped config, found on every node); a path becomes absolute."""
    if "/" in reference or Path(reference).suffix in (".yaml", ".yml"):
        return str(Path(reference).resolve())
    return reference


def build_app(config: ServeConfig):
    """The Serve application for `config` (replicas, resources, batching, limits, token hash)."""
    count = config.replicas.count
    num_gpus = config.replicas.num_gpus
    if count == "per_gpu":
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus == 0:
            raise ValueError("replicas.count=per_gpu, but the Ray cluster has no GPUs")
        count, num_gpus = gpus, num_gpus or 1.0
    token = config.token()
    settings = {
        **{name: getattr(config, name) for name in LIMITS},
        "max_batch_size": config.batching.max_batch_size,
        "wait_timeout_s": config.batching.wait_timeout_s,
        "token_sha256": None if token is None else _token_hash(token),  # replicas never see the token itself
        "max_sessions": config.sessions.max_open,
        "session_idle_s": config.sessions.idle_s,
    }
    deployment = RewardDeployment.options(
        num_replicas=count,
        ray_actor_options={"num_cpus": config.replicas.num_cpus, "num_gpus": num_gpus},
        max_ongoing_requests=config.max_ongoing_requests(),
        health_check_period_s=config.replicas.health_check_period_s,
        request_router_config=RequestRouterConfig(request_router_class=SessionRouter),  # sessions stay put
    )
    return deployment.bind(reward_reference(config.reward), settings)


def start_server(config: ServeConfig) -> str:
    """Start (or join) Ray, start Serve's HTTP proxy on config.host:port and deploy; returns the URL.

    With `ray_address` (or $RAY_ADDRESS) set this joins that cluster; otherwise it starts a local Ray
    instance. On a cluster where Serve already runs, its existing HTTP options are kept.
    """
    config.check_exposure()
    if not ray.is_initialized():
        config.check_bindable()
        if config.ray_address or os.environ.get("RAY_ADDRESS"):
            ray.init(address=config.ray_address, include_dashboard=False)
        else:
            ray.init(num_cpus=config.num_cpus, include_dashboard=False)
    serve.start(http_options={"host": config.host, "port": config.port})
    try:
        serve.run(build_app(config), name=config.app_name, route_prefix=config.route_prefix, blocking=False)
    except RuntimeError:
        serve.delete(config.app_name)  # replicas that cannot start would otherwise be retried forever
        raise
    host = f"[{config.host}]" if ":" in config.host else config.host
    return f"http://{host}:{config.port}{config.route_prefix.rstrip('/')}"


def run_serve(config: ServeConfig) -> None:
    """`vlmr serve`: deploy and block until Ctrl-C or SIGTERM, then delete the application."""
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` and container stops shut down like Ctrl-C
    try:
        url = start_server(config)
        signal.signal(signal.SIGTERM, _interrupt)  # again: ray.init installs its own handler
        logger.info("serving %s at %s (/v1/spec, /metrics); Ctrl-C stops", config.reward, url)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if ray.is_initialized():  # else nothing started: deleting would start Ray just to find nothing
            with contextlib.suppress(Exception):  # Serve never started, or is already gone
                serve.delete(config.app_name)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
