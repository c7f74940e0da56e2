"""The reward server (Ray Serve, loopback) and its client `RemoteReward`.

One local Ray instance (2 CPUs) per test process serves two applications on a free port: the rule
reward `goal_pixel_progress` on 2 replicas, and `motion_penalty` behind a bearer token under
`/secure`. The fault test, last in the file, kills a replica mid-load.
"""

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace

import httpx
import numpy as np
import pytest

from tests.serving_fixtures import free_port, local_serve
from vlm_rewards.interface import RewardRequest, SampleKey
from vlm_rewards.registry import build_reward
from vlm_rewards.serving.client import RemoteReward, RemoteRewardError, RewardVersionError
from vlm_rewards.serving.config import ServeConfig, serve_job_args
from vlm_rewards.serving.wire import (
    CONTENT_TYPE,
    ItemError,
    WireError,
    decode_body,
    encode_score,
)
from vlm_rewards.testing import check_reward

pytestmark = pytest.mark.xdist_group("serving")  # one Ray instance per process that runs these
TOKEN = "test-token-123"
MAX_PAYLOAD = 512 * 1024


def _requests(count: int, seed: int = 0, frames: int = 4, side: int = 16, key: str = "test") -> list[RewardRequest]:
    rng = np.random.default_rng(seed)
    return [
        RewardRequest(
            frames=rng.integers(0, 256, (frames, side, side, 3), dtype=np.uint8),
            text=f"push block {i}",
            reference=rng.integers(0, 256, (1, side, side, 3), dtype=np.uint8),
            key=SampleKey(key, i),
        )
        for i in range(count)
    ]


def _same(a, b) -> bool:
    return a.reward == b.reward and np.array_equal(a.progress, b.progress) and a.error == b.error


# ---------------------------------------------------------------------------- no server needed


def test_client_import_is_light():
    code = (
        "import sys; import vlm_rewards.serving.client, vlm_rewards.serving; "
        "heavy = [m for m in ('torch', 'ray', 'transformers', 'fastapi') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_wire_round_trip_and_refusals():
    requests = _requests(2)
    requests[1] = replace(requests[1], views={"wrist": requests[1].frames}, frame_index=np.array([0, 2, 5, 9]))
    body = decode_body(encode_score(requests))
    for i, request in enumerate(requests):
        decoded = body.request(body.items()[i], f"items[{i}]")
        assert np.array_equal(decoded.frames, request.frames) and decoded.frames.dtype == np.uint8
        assert decoded.text == request.text and decoded.key == request.key
        assert np.array_equal(decoded.reference, request.reference)
    assert np.array_equal(body.request(body.items()[1], "x").views["wrist"], requests[1].frames)
    assert body.request(body.items()[1], "x").frame_index.tolist() == [0, 2, 5, 9]
    with pytest.raises(WireError, match="VLMR"):
        decode_body(b"\x80\x04pickle-ish bytes")
    header = b'{"api": "v1", "items": [], "x": NaN}'
    with pytest.raises(WireError, match="NaN"):
        decode_body(b"VLMR\x01" + len(header).to_bytes(4, "little") + header)
    bad = decode_body(encode_score(requests[:1]))
    bad.header["arrays"][0]["dtype"] = "|O"  # object arrays (pickle) are never decoded
    with pytest.raises(ItemError, match="not allowed"):
        bad.request(bad.items()[0], "items[0]")
    bad.header["arrays"][0].update(dtype="|u1", offset=10**9)
    with pytest.raises(ItemError, match="outside"):
        bad.request(bad.items()[0], "items[0]")


def test_serve_config_refuses_public_host_without_token(monkeypatch):
    monkeypatch.delenv("VLMR_SERVE_TOKEN", raising=False)
    ServeConfig().check_exposure()  # loopback: fine
    with pytest.raises(ValueError, match="VLMR_SERVE_TOKEN"):
        ServeConfig(host="0.0.0.0").check_exposure()
    monkeypatch.setenv("VLMR_SERVE_TOKEN", "secret")
    ServeConfig(host="0.0.0.0").check_exposure()
    assert serve_job_args(["motion_penalty", "port=9000"]) == ["reward=motion_penalty", "port=9000"]
    assert serve_job_args(["configs/serve/default.yaml", "port=9000"])[0] == "configs/serve/default.yaml"


def test_client_retries_5xx_and_connection_errors_not_4xx(monkeypatch):
    with pytest.raises(RemoteRewardError, match="2 attempts"):  # nothing listening: retried, then an error
        RemoteReward(f"http://127.0.0.1:{free_port()}", retries=1, backoff=0.001)
    spec = build_reward("motion_penalty").spec
    replies: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/spec"):
            return httpx.Response(200, json={"api": "v1", "spec": spec.to_json(), "version": spec.version})
        status = replies.pop(0)
        if status == 200:
            result = {"reward": -0.5, "progress": None, "components": {}, "info": {}, "error": None}
            return httpx.Response(200, json={"version": spec.version, "results": [{"result": result}]})
        if status == 409:
            return httpx.Response(200, json={"version": "other", "results": [{"result": {}}]})
        return httpx.Response(status, json={"error": f"status {status}"})

    monkeypatch.setattr(RemoteReward, "_sync_client", lambda self: httpx.Client(transport=httpx.MockTransport(handler)))
    reward = RemoteReward("http://test", retries=3, backoff=0.001)
    request = _requests(1)[0]
    replies[:] = [503, 500, 200]
    reward.attempts = 0
    assert reward.score([request])[0].reward == -0.5 and reward.attempts == 3
    replies[:] = [400]
    reward.attempts = 0
    with pytest.raises(ValueError, match="HTTP 400"):
        reward.score([request])
    assert reward.attempts == 1  # never retried
    replies[:] = [503] * 4
    with pytest.raises(RemoteRewardError, match="HTTP 503"):
        reward.score([request])
    replies[:] = [409]
    with pytest.raises(RewardVersionError, match="now serves"):
        reward.score([request])


# ---------------------------------------------------------------------------- server


@pytest.fixture(scope="module")
def server():
    serve = pytest.importorskip("ray.serve")
    from vlm_rewards.serving.server import build_app

    with local_serve() as port:
        config = ServeConfig(
            reward="goal_pixel_progress",
            port=port,
            max_payload_bytes=MAX_PAYLOAD,
            batching={"max_batch_size": 16, "wait_timeout_s": 0.01},
            replicas={"count": 2, "num_cpus": 0.5, "health_check_period_s": 0.5},
        )
        serve.run(build_app(config), name="rewards", route_prefix="/", blocking=False)
        os.environ["VLMR_TEST_TOKEN"] = TOKEN
        secure = ServeConfig(reward="motion_penalty", token_env="VLMR_TEST_TOKEN", replicas={"num_cpus": 0.25})
        serve.run(build_app(secure), name="secure", route_prefix="/secure", blocking=False)
        yield f"http://127.0.0.1:{port}"


def _post(url: str, body: bytes, path: str = "/v1/score", headers: dict | None = None) -> httpx.Response:
    return httpx.post(url + path, content=body, headers={"Content-Type": CONTENT_TYPE, **(headers or {})}, timeout=30)


def test_round_trip_equals_in_process(server):
    local, remote = build_reward("goal_pixel_progress"), RemoteReward(server)
    assert remote.spec == local.spec
    requests = _requests(6, seed=1)
    for got, expected in zip(remote.score(requests), local.score(requests), strict=True):
        assert _same(got, expected)  # exact: raw uint8 bytes in, float64 JSON out
    for got, expected in zip(asyncio.run(remote.ascore(requests)), local.score(requests), strict=True):
        assert _same(got, expected)
    np.testing.assert_array_equal(remote.prefer(requests[:3], requests[3:]), local.prefer(requests[:3], requests[3:]))


def test_check_reward_remote(server):
    check_reward(RemoteReward(server))


def test_remote_kind_from_yaml(server, tmp_path):
    path = tmp_path / "remote.yaml"
    path.write_text(f"kind: remote\nurl: {server}\ntimeout: 10\nretries: 2\n")
    reward = build_reward(str(path))
    assert isinstance(reward, RemoteReward) and reward.spec.name == "goal_pixel_progress"
    requests = _requests(2, seed=3)
    assert all(_same(a, b) for a, b in zip(reward.score(requests), build_reward("goal_pixel_progress").score(requests)))
    with pytest.raises(RewardVersionError, match="expected version"):
        build_reward({"kind": "remote", "url": server, "version": "not-this-one"})


def test_health_ready_spec_metrics(server):
    assert httpx.get(server + "/healthz").json()["status"] == "ok"
    ready = httpx.get(server + "/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    spec = httpx.get(server + "/v1/spec").json()
    assert spec["spec"] == build_reward("goal_pixel_progress").spec.to_json()
    RemoteReward(server).score(_requests(4))
    metrics = httpx.get(server + "/metrics").json()
    assert {"latency", "batches", "queue_depth", "requests"} <= set(metrics)
    json.dumps(metrics, allow_nan=False)


def _good_body() -> bytes:
    return encode_score(_requests(1))


def _tamper(mutate) -> bytes:
    body = decode_body(_good_body())
    mutate(body.header)
    text = json.dumps(body.header).encode()
    return b"VLMR\x01" + len(text).to_bytes(4, "little") + text + bytes(body.blob)


BAD_INPUTS = {
    # name: (body, path, expected status, message fragment)
    "bad encoding": (b"\x80\x04\x95pickle", "/v1/score", 400, "VLMR"),
    "truncated header": (_good_body()[:20], "/v1/score", 400, "header"),
    "unknown API version (path)": (_good_body(), "/v2/score", 404, "unknown API version"),
    "unknown API version (header)": (_tamper(lambda h: h.update(api="v9")), "/v1/score", 400, "unknown API version"),
    "wrong dtype": (
        encode_score([replace(_requests(1)[0], frames=np.zeros((2, 16, 16, 3), np.float32))]),
        "/v1/score",
        422,
        "uint8",
    ),  # noqa: E501
    "wrong shape": (
        encode_score([replace(_requests(1)[0], frames=np.zeros((16, 16, 3), np.uint8))]),
        "/v1/score",
        422,
        "shape",
    ),  # noqa: E501
    "NaN frames": (
        encode_score([replace(_requests(1)[0], frames=np.full((2, 16, 16, 3), np.nan, np.float32))]),
        "/v1/score",
        422,
        "uint8",
    ),  # noqa: E501
    "NaN in header": (_good_body().replace(b'"frame_index": null', b'"frame_index": NaN '), "/v1/score", 400, "NaN"),
    "missing text": (_tamper(lambda h: h["items"][0].pop("text")), "/v1/score", 422, "text: missing"),
    "empty text": (encode_score([replace(_requests(1)[0], text=" ")]), "/v1/score", 422, "text"),
    "missing reference": (encode_score([replace(_requests(1)[0], reference=None)]), "/v1/score", 422, "reference"),
    "items not a list": (_tamper(lambda h: h.update(items=3)), "/v1/score", 400, "items"),
    "payload too large": (encode_score(_requests(1, frames=4, side=256)), "/v1/score", 413, "payload"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gets_4xx_and_server_keeps_serving(server, case):
    body, path, status, fragment = BAD_INPUTS[case]
    response = _post(server, body, path)
    assert response.status_code == status, response.text
    data = response.json()
    message = data["results"][0]["error"] if "results" in data else data["error"]
    assert fragment in message, message
    good = _post(server, _good_body())
    assert good.status_code == 200 and good.json()["results"][0]["result"]["reward"] is not None


def test_wrong_version_and_token(server):
    response = _post(server, _good_body(), headers={"X-Reward-Version": "old"})
    assert response.status_code == 409 and "pinned" in response.json()["error"]
    assert _post(server, _good_body(), "/secure/v1/score").status_code == 401
    assert httpx.get(server + "/secure/v1/spec", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.get(server + "/secure/healthz").status_code == 200  # liveness needs no token
    with pytest.raises(RemoteRewardError, match="401"):
        RemoteReward(server + "/secure")
    reward = RemoteReward(server + "/secure", token=TOKEN)
    assert reward.spec.name == "motion_penalty" and math.isfinite(reward.score(_requests(1))[0].reward)


def test_mixed_batch_one_bad_item(server):
    requests = _requests(3, seed=5)
    bad = replace(requests[1], frames=np.zeros((2, 16, 16, 3), np.float32))
    response = _post(server, encode_score([requests[0], bad, requests[2]]))
    assert response.status_code == 422
    results = response.json()["results"]
    assert "uint8" in results[1]["error"] and results[1]["status"] == 422
    local = build_reward("goal_pixel_progress").score([requests[0], requests[2]])
    assert results[0]["result"]["reward"] == local[0].reward and results[2]["result"]["reward"] == local[1].reward
    assert results[0]["key"] == ["test", 0, 0] and results[2]["key"] == ["test", 2, 0]
    outcomes = RemoteReward(server).score_items([requests[0], bad, requests[2]])
    assert _same(outcomes[0], local[0]) and isinstance(outcomes[1], ValueError) and _same(outcomes[2], local[1])
    # the reward itself refusing one item (goal of another size) leaves its batch-mates scored too
    odd = replace(requests[1], reference=np.zeros((1, 8, 8, 3), np.uint8))
    outcomes = RemoteReward(server).score_items([requests[0], odd, requests[2]])
    assert _same(outcomes[0], local[0]) and _same(outcomes[2], local[1])
    assert "expected the goal image's shape" in str(outcomes[1])


async def _load(url: str, clients: int, per_client: int, frames: int = 4) -> tuple[dict, list[float], int]:
    """`clients` concurrent RemoteRewards, each sending `per_client` keyed one-item requests; returns
    key -> result, the latencies and the total HTTP attempts."""
    requests = _requests(clients * per_client, seed=7, frames=frames, key="load")
    rewards = [RemoteReward(url, retries=8, backoff=0.05) for _ in range(clients)]
    results: dict = {}
    latencies: list[float] = []

    async def client(index: int) -> None:
        for request in requests[index::clients]:
            start = time.perf_counter()
            (result,) = await rewards[index].ascore([request])
            latencies.append(time.perf_counter() - start)
            assert request.key not in results, f"duplicate result for {request.key}"
            results[request.key] = result

    await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(clients))), timeout=60)
    return results, latencies, sum(reward.attempts for reward in rewards)


def _expected(count: int, frames: int = 4) -> dict:
    requests = _requests(count, seed=7, frames=frames, key="load")
    return {r.key: result for r, result in zip(requests, build_reward("goal_pixel_progress").score(requests))}


@pytest.mark.slow
def test_load_16_concurrent_clients(server):
    results, latencies, _ = asyncio.run(_load(server, clients=16, per_client=6))
    expected = _expected(96)
    assert results.keys() == expected.keys()
    assert all(_same(results[key], expected[key]) for key in expected)
    sizes = [httpx.get(server + "/metrics").json()["batches"]["max_size"] for _ in range(4)]
    assert max(size or 0 for size in sizes) > 1  # requests of different clients were batched together


def _replicas(app: str) -> list[str]:
    import ray

    return sorted(
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"].startswith(f"SERVE_REPLICA::{app}#")
    )


@pytest.mark.slow
def test_replica_killed_mid_load_is_restarted_and_nothing_lost(server):
    import ray

    before = _replicas("rewards")
    assert len(before) == 2

    async def load_and_kill():
        load = asyncio.create_task(_load(server, clients=8, per_client=12))
        await asyncio.sleep(0.3)
        assert not load.done(), "the load ended before the kill; raise per_client"
        ray.kill(ray.get_actor(before[0], namespace="serve"), no_restart=True)
        return await load

    results, _, attempts = asyncio.run(load_and_kill())
    expected = _expected(96)
    assert results.keys() == expected.keys()  # every request completed exactly once (duplicates assert)
    assert all(_same(results[key], expected[key]) for key in expected)
    deadline = time.time() + 40
    while time.time() < deadline:
        now = _replicas("rewards")
        if len(now) == 2 and before[0] not in now and httpx.get(server + "/readyz").status_code == 200:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"Serve did not replace the killed replica: {before} -> {_replicas('rewards')}")
    assert all(
        _same(a, b)
        for a, b in zip(
            RemoteReward(server).score(_requests(3)), build_reward("goal_pixel_progress").score(_requests(3))
        )
    )
    print(f"fault test: {attempts - 8} HTTP attempts for 96 requests")
