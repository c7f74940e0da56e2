"""The reward server (Ray Serve, loopback) and its client `RemoteReward`.

One local Ray instance (2 CPUs) per test process serves three applications on a free port: the rule
reward `goal_pixel_progress` on 2 replicas, `motion_penalty` behind a bearer token under `/secure`,
and `push_marker_progress` (a reward that refuses generic texts) with small limits under `/limited`.
The fault test, last in the file, kills a replica mid-load.
"""

import asyncio
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import replace

import httpx
import numpy as np
import pydantic
import pytest

from tests.serving_fixtures import free_port, local_serve
from vlm_rewards.config import load_job_config
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
LIMITED = ServeConfig(  # small limits, so that a few connections and items reach them
    reward="push_marker_progress",
    max_pixels_per_item=8192,  # check_reward's clips of up to 6 frames of 32x32 fit
    max_pixels_per_request=32768,
    body_timeout_s=1.0,
    max_body_reads=4,
    batching={"max_batch_size": 8},
    replicas={"num_cpus": 0.25, "max_ongoing_requests": 16},
)


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


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ({":": None}, "quote an IPv6 address"),  # what YAML makes of an unquoted `host=::`
        ("[::1]", "without brackets"),
        ("http://0.0.0.0", "not a URL"),
        ("127.0.0.1:8000", "port=..."),
        ("bad_host!", "not a host name or IP address"),
        ("999.1.1.1", "not a host name or IP address"),
        ("", "not a host name or IP address"),
    ],
)
def test_serve_config_refuses_a_bad_host_by_name(host, message):
    with pytest.raises(pydantic.ValidationError, match=message):
        ServeConfig(host=host)


def test_serve_config_takes_hosts_and_explains_unquoted_ipv6():
    for host in ("::", "::1", "0.0.0.0", "fe80::1", "localhost", "reward-server.internal", "gpu-3"):
        assert ServeConfig(host=host).host == host
    with pytest.raises(ValueError, match=r"host: .*got dict .*host='\"::\"'"):
        load_job_config(ServeConfig, overrides=["host=::"])
    with pytest.raises(pydantic.ValidationError, match="max_body_reads=16 must be below the 16 requests"):
        ServeConfig(max_body_reads=16, batching={"max_batch_size": 8}, replicas={"max_ongoing_requests": 16})


def test_serve_refuses_a_host_or_port_it_cannot_listen_on_before_ray_starts(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ValueError, match=f"cannot listen on host '127.0.0.1' port {taken.getsockname()[1]}"):
            ServeConfig(port=taken.getsockname()[1]).check_bindable()
    ServeConfig(host="203.0.113.1", ray_address="auto").check_bindable()  # a cluster's head node listens, not us
    env = {**os.environ, "VLMR_SERVE_TOKEN": "secret"}
    env.pop("RAY_ADDRESS", None)
    cli = [sys.executable, "-m", "vlm_rewards.cli", "serve", "motion_penalty", "host=203.0.113.1"]  # not ours
    start = time.perf_counter()
    done = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and "cannot listen on host '203.0.113.1'" in done.stderr, done.stderr[-2000:]
    assert "Started a local Ray instance" not in done.stdout + done.stderr and time.perf_counter() - start < 60


LONE_SURROGATES = {
    "items[0].key[0]": lambda item: item.update(key=["\ud800", 0, 0]),
    "items[0].key[1]": lambda item: item.update(key=["ok", "ep\udfff", 0]),
    "items[0].text": lambda item: item.update(text="push \ud800"),
    "items[0].views name": lambda item: item.update(views={"\ud800": item["frames"]}),
}


@pytest.mark.parametrize("field", list(LONE_SURROGATES))
def test_wire_refuses_lone_surrogates_naming_the_field(field):
    body = decode_body(_tamper(lambda header: LONE_SURROGATES[field](header["items"][0])))
    with pytest.raises(ItemError, match=rf"{re.escape(field)}: not valid Unicode \(lone surrogate"):
        body.request(body.items()[0], "items[0]")


class FlakyServer:
    """A fake transport for a server whose HTTP proxy is down for `outage_s`: connections are refused,
    then requests are answered (the first one after the outage with a 503, as a proxy that failed after
    the replica scored). Records each scored request's id and keys."""

    def __init__(self, outage_s: float):
        self.spec = build_reward("motion_penalty").spec
        self.up_at = time.monotonic() + outage_s
        self.scored: list[tuple[str, list]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if time.monotonic() < self.up_at:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path.endswith("/spec"):
            return httpx.Response(200, json={"api": "v1", "spec": self.spec.to_json(), "version": self.spec.version})
        body = decode_body(request.content)
        keys = [item["key"] for item in body.items()]
        self.scored.append((request.headers["X-Request-Id"], keys))
        if len(self.scored) == 1:
            return httpx.Response(503, json={"error": "proxy restarting"})
        result = {"reward": -0.5, "progress": None, "components": {}, "info": {}, "error": None}
        return httpx.Response(
            200, json={"version": self.spec.version, "results": [{"result": result, "key": key} for key in keys]}
        )


def test_client_retries_for_a_time_budget_through_a_proxy_restart(monkeypatch):
    assert RemoteReward.Params(url="http://x").retry_budget_s >= 60  # Serve's proxy took 24 s to come back
    server = FlakyServer(outage_s=1.0)
    transport = httpx.MockTransport(server)
    monkeypatch.setattr(RemoteReward, "_sync_client", lambda self: httpx.Client(transport=transport))
    monkeypatch.setattr(RemoteReward, "_async_client", lambda self: httpx.AsyncClient(transport=transport))
    reward = RemoteReward("http://test", retry_budget_s=10, backoff=0.05, max_backoff=0.2)  # waits out the outage
    assert reward.attempts > 2
    requests = _requests(3)
    assert [r.reward for r in reward.score(requests)] == [-0.5] * 3
    server.up_at = time.monotonic() + 1.0
    assert [r.reward for r in asyncio.run(reward.ascore(requests))] == [-0.5] * 3
    keys = [["test", i, 0] for i in range(3)]
    assert [keys for _, keys in server.scored] == [keys] * 3  # the refused attempts never reached it
    first, second, third = (request_id for request_id, _ in server.scored)
    assert first == second != third  # the retry after the 503 is the same request: its result is given once


def test_client_gives_up_when_the_retry_budget_is_spent(monkeypatch):
    server = FlakyServer(outage_s=math.inf)
    monkeypatch.setattr(RemoteReward, "_sync_client", lambda self: httpx.Client(transport=httpx.MockTransport(server)))
    start = time.perf_counter()
    with pytest.raises(RemoteRewardError, match=r"ConnectError.*retried for 0\.[3-9] s of retry_budget_s=0\.3"):
        RemoteReward("http://test", retry_budget_s=0.3, backoff=0.05, max_backoff=0.1)
    assert 0.3 <= time.perf_counter() - start < 5


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
        serve.run(build_app(LIMITED), name="limited", route_prefix="/limited", blocking=False)
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
    "lone surrogate in a key": (
        _tamper(lambda h: h["items"][0].update(key=["\ud800", 0, 0])),
        "/v1/score",
        422,
        "items[0].key[0]: not valid Unicode",
    ),
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


def _stalled_upload(url: str, path: str) -> socket.socket:
    """A connection that sends the headers and 5 bytes of a declared 1 MB body, then nothing."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    sock = socket.create_connection((host, port), timeout=10)
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: 1000000\r\n\r\n"
    sock.sendall(head.encode() + b"VLMR\x01")
    return sock


def test_stalled_uploads_time_out_and_healthz_keeps_answering(server):
    limited = server + "/limited"
    stalled = [_stalled_upload(server, "/limited/v1/score") for _ in range(2 * LIMITED.max_ongoing_requests())]
    try:
        time.sleep(0.5)
        health = httpx.get(limited + "/healthz", timeout=5)  # before: a ReadTimeout, every slot held by a stall
        assert health.status_code == 200
        statuses = [int(sock.recv(64).split()[1]) for sock in stalled]  # each answered: none is held open
    finally:
        for sock in stalled:
            sock.close()
    # the first max_body_reads are read for body_timeout_s, then refused; the others are refused at once or,
    # on a loaded machine, read once a slot frees
    assert statuses.count(408) >= LIMITED.max_body_reads
    assert statuses.count(408) + statuses.count(503) == len(stalled)  # the rest refused: none held open
    text = RemoteReward(limited).example_texts()[0]
    assert RemoteReward(limited).score([replace(_requests(1)[0], text=text)])[0].ok


def test_pixel_limits_bound_the_work_of_items_that_share_one_array(server):
    """Items whose arrays all point to the same bytes: small on the wire, large once decoded."""
    one = _requests(1)[0]  # 4 frames and a reference of 16x16: 1280 pixels
    body = decode_body(encode_score([one]))
    item = body.items()[0]

    def aliased(items: list) -> bytes:
        header = {**body.header, "items": items}
        text = json.dumps(header).encode()
        return b"VLMR\x01" + len(text).to_bytes(4, "little") + text + bytes(body.blob)

    views = {f"camera{i}": item["frames"] for i in range(7)}  # 7 x 1024 more: over 8192 per item
    response = _post(server, aliased([item, {**item, "views": views}]), "/limited/v1/score")
    assert response.status_code == 422, response.text
    assert "items[1]: frames, reference and views decode to 8448 pixels" in response.json()["results"][1]["error"]
    assert "max_pixels_per_item" in response.json()["results"][1]["error"]
    response = _post(server, aliased([item] * 2000), "/limited/v1/score")  # 2000 x 1280 pixels, 32768 taken
    assert response.status_code == 413 and "2560000 pixels" in response.json()["error"]
    assert "max_pixels_per_request" in response.json()["error"]


def test_reward_with_its_own_texts_turns_ready_and_conforms_remotely(server):
    """push_marker_progress refuses generic texts: its warm-up and check_reward use the texts it declares."""
    ready = httpx.get(server + "/limited/readyz")
    assert ready.status_code == 200, ready.text
    remote = RemoteReward(server + "/limited")
    assert remote.example_texts() == build_reward("push_marker_progress").example_texts()
    check_reward(remote)


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
