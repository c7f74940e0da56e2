"""Streaming sessions through `vlmr serve` (`RemoteReward.open_session`).

One local Ray instance (2 CPUs) serves three applications on a free port: the rule reward
`goal_pixel_progress` on 2 replicas under `/rule`, the same with small session limits under `/limited`,
and a tiny random progress RM (`trained_rm`, KV-cache session) under `/trained`. Remote session values
are compared with the in-process reward's own session, and the server's count of frames received shows
that each step sends one frame per stream.
"""

import time

import httpx
import numpy as np
import pytest
import torch
import yaml

from tests.serving_fixtures import local_serve
from vlm_rewards.interface import RewardSession
from vlm_rewards.registry import build_reward
from vlm_rewards.serving.client import RemoteReward, RemoteRewardError, RemoteSession
from vlm_rewards.serving.config import ServeConfig
from vlm_rewards.serving.wire import CONTENT_TYPE, REQUEST_ID_HEADER, encode_append

pytestmark = pytest.mark.xdist_group("serving")  # one Ray instance per process that runs these
SIDE = 32
IDLE_S = 3.0  # /limited's sessions.idle_s


def _clip(seed: int, frames: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, SIDE, SIDE, 3), dtype=np.uint8)


def _texts(count: int) -> list[str]:
    return [f"move the red circle to goal {i}" for i in range(count)]


# ---------------------------------------------------------------------------- no server needed


class _Held(RewardSession):
    def __init__(self):
        self.closed = False

    def append(self, frames, views=None):
        return []

    def reset(self, index, text, reference=None):
        pass

    @property
    def num_frames(self):
        return []

    def close(self):
        self.closed = True


def test_session_table_refuses_when_full_and_expires_idle_sessions():
    from vlm_rewards.serving.sessions import SessionsFull, SessionTable, UnknownSession, holder_of

    now = [0.0]
    table = SessionTable("replica-a", max_open=2, idle_s=10.0, clock=lambda: now[0])
    first, second, third = _Held(), _Held(), _Held()
    a = table.open(first)
    assert holder_of(a.id) == "replica-a"
    table.open(second)
    with pytest.raises(SessionsFull, match="max_open"):
        table.open(third)
    assert third.closed and not first.closed  # refused, and nothing was evicted
    now[0] = 8.0
    table.get(a.id)  # used: its idle time starts again
    now[0] = 15.0
    table.expire()  # each session call does this first
    assert table.entries.keys() == {a.id} and second.closed  # the other one idled past 10 s
    now[0] = 30.0
    with pytest.raises(UnknownSession, match=a.id):
        table.get(a.id)
    broken = _Held()
    b = table.open(broken)
    table.fail(b.id, "session b failed and was closed: RuntimeError: boom")
    with pytest.raises(UnknownSession, match="RuntimeError: boom"):  # a retry learns why, not just "unknown"
        table.get(b.id)
    assert first.closed and broken.closed and table.to_json() | {"idle_s": 0} == {
        "open": 0, "max_open": 2, "idle_s": 0, "opened": 3, "closed": 0, "expired": 2, "failed": 1, "refused": 1,
        "frames_received": 0,
    }  # fmt: skip


def test_serve_config_has_session_limits():
    assert ServeConfig(sessions={"max_open": 3, "idle_s": 1.5}).sessions.max_open == 3
    with pytest.raises(ValueError, match="max_open"):
        ServeConfig(sessions={"max_open": 0})


# ---------------------------------------------------------------------------- server


@pytest.fixture(scope="module")
def trained_yaml(tmp_path_factory):
    from vlm_rewards.models.backbones import build_tiny_backbone
    from vlm_rewards.models.config import RewardNetworkConfig
    from vlm_rewards.models.reward_network import RewardNetwork

    root = tmp_path_factory.mktemp("session_rm")
    backbone = build_tiny_backbone("qwen2_5_vl", root / "backbone", num_layers=1)
    torch.manual_seed(0)
    small = {"min_pixels": 4 * 28 * 28, "max_pixels": 4 * 32 * 32}  # about 4 tokens per frame
    RewardNetwork.from_backbone(backbone, RewardNetworkConfig(max_frames=6, **small)).save_pretrained(root / "rm")
    path = root / "trained.yaml"
    path.write_text(yaml.safe_dump({"kind": "trained_rm", "model": str(root / "rm"), "device": "cpu"}))
    return path


@pytest.fixture(scope="module")
def server(trained_yaml):
    serve = pytest.importorskip("ray.serve")
    from vlm_rewards.serving.server import build_app

    replicas = {"num_cpus": 0.25, "health_check_period_s": 0.5}
    apps = {
        "rule": ServeConfig(reward="goal_pixel_progress", replicas={**replicas, "count": 2}),
        "limited": ServeConfig(reward="goal_pixel_progress", replicas=replicas, sessions={"max_open": 2, "idle_s": 3}),
        "trained": ServeConfig(reward=str(trained_yaml), replicas=replicas),
    }
    with local_serve() as port:
        targets = [serve.RunTarget(build_app(config), name, f"/{name}") for name, config in apps.items()]
        serve.run_many(targets)  # the replicas start side by side
        yield f"http://127.0.0.1:{port}"


def _open_on_both_replicas(remote: RemoteReward, references: list) -> list:
    """Sessions until one is held by each of the 2 replicas (the router spreads opens at random)."""
    held, extra = {}, []
    for _ in range(16):
        session = remote.open_session(_texts(2), references)
        (extra if session.replica in held else held.setdefault(session.replica, [])).append(session)
        if len(held) == 2:
            break
    for session in extra:
        session.close()
    assert len(held) == 2, "16 opens all landed on one replica"
    return [sessions[0] for sessions in held.values()]


def test_sessions_on_2_replicas_equal_in_process_and_send_one_frame_per_step(server):
    remote, local = RemoteReward(server + "/rule"), build_reward("goal_pixel_progress")
    references = [_clip(100), _clip(101)]
    remotes = _open_on_both_replicas(remote, references)
    locals_ = [local.open_session(_texts(2), references) for _ in remotes]
    steps = 6
    for step in range(steps):
        if step == 3:  # stream 1 starts a new episode in every session
            for session in (*remotes, *locals_):
                session.reset(1, "move the red circle to the new goal", _clip(102))
        for n, (there, here) in enumerate(zip(remotes, locals_)):  # the two replicas' calls interleave
            frames = [_clip(1000 * n + 10 * step + i) for i in range(2)]
            got, expected = there.append(frames), here.append(frames)
            assert all(np.array_equal(g, e) for g, e in zip(got, expected)), (step, n, got, expected)
    for session in remotes:
        info = session.info()
        assert info["replica"] == session.replica and info["num_frames"] == [steps, steps - 3]
        assert info["frames_received"] == 2 * steps  # one frame per stream per step, never the prefix
        session.close()
    with pytest.raises(RemoteRewardError, match="closed"):
        remotes[0].append([_clip(0), _clip(1)])


def test_trained_rm_session_equals_its_kv_cache_session(server, trained_yaml):
    from vlm_rewards.models.streaming import KVCacheSession

    remote, local = RemoteReward(server + "/trained"), build_reward(str(trained_yaml))
    texts = _texts(2)
    here = local.open_session(texts)
    assert isinstance(here, KVCacheSession)
    with remote.open_session(texts) as there:
        for step in range(4):
            frames = [_clip(10 * step + i) for i in range(2)]
            got, expected = there.append(frames), here.append(frames)
            for g, e in zip(got, expected):
                np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
        assert there.info()["frames_received"] == 8 and there.num_frames == [4, 4]
    metrics = httpx.get(server + "/trained/metrics", timeout=30).json()
    assert metrics["sessions"]["frames_received"] == 8 and metrics["latency"]["append"]["count"] == 4


def test_a_refused_append_leaves_the_session_unchanged_and_a_retry_appends_once(server):
    remote, local = RemoteReward(server + "/rule"), build_reward("goal_pixel_progress")
    references = [_clip(7)]
    here = local.open_session(_texts(1), references)
    with remote.open_session(_texts(1), references) as there:
        with pytest.raises(ValueError, match=r"frames\[0\]"):
            there.append([_clip(1).astype(np.float32)])
        url = f"{server}/rule/v1/sessions/{there.id}/append"
        header = remote.server_info["sessions"]["header"]
        headers = {"Content-Type": CONTENT_TYPE, REQUEST_ID_HEADER: "same-id", header: there.id}
        body = encode_append([_clip(1)], [{}])
        first, retry = (httpx.post(url, content=body, headers=headers, timeout=30) for _ in range(2))
        assert first.status_code == retry.status_code == 200 and first.json()["values"] == retry.json()["values"]
        assert there.info()["num_frames"] == [1]
        here.append([_clip(1)])
        assert np.array_equal(there.append([_clip(2)])[0], here.append([_clip(2)])[0])
        unrouted = httpx.post(url, content=body, headers={"Content-Type": CONTENT_TYPE}, timeout=30)
        assert unrouted.status_code == 400 and header in unrouted.json()["error"]


def test_session_limits_refuse_when_full_and_expire_idle_sessions(server):
    remote = RemoteReward(server + "/limited")
    references = [_clip(5)]
    first, second = (remote.open_session(_texts(1), references) for _ in range(2))
    with pytest.raises(RemoteRewardError, match="max_open") as refused:
        remote.open_session(_texts(1), references)
    assert refused.value.status == 429
    first.close()
    third = remote.open_session(_texts(1), references)  # room again
    third.append([_clip(6)])
    time.sleep(IDLE_S + 0.5)
    with pytest.raises(RemoteRewardError, match=second.id) as gone:
        second.append([_clip(6)])
    assert gone.value.status == 404 and "idle" in str(gone.value)
    third.close()  # already expired there: closing is quiet
    counts = httpx.get(server + "/limited/metrics", timeout=30).json()["sessions"]
    assert counts["open"] == 0 and counts["refused"] == 1 and counts["expired"] == 2


def test_rl_through_the_server_sends_one_frame_per_env_step_and_matches_in_process(server):
    """The SB3 reward wrapper streams through `RemoteReward`'s session: the same rewards as the reward in
    process, and the server receives each env's frames once (rescoring would send every prefix again)."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from vlm_rewards.robotics.config import EnvConfig
    from vlm_rewards.robotics.envs import make_env
    from vlm_rewards.robotics.reward_wrapper import RewardWrapperConfig, SB3VecReward

    env_config = EnvConfig(id="vlmr/Reach-v0", num_envs=2, width=SIDE, height=SIDE, max_episode_steps=8)
    actions = np.random.default_rng(0).uniform(-1, 1, (12, 2, 2))

    def run(reward) -> tuple[np.ndarray, dict]:
        base = DummyVecEnv([lambda: make_env(env_config, goal_image=True) for _ in range(2)])
        venv = SB3VecReward(base, reward, RewardWrapperConfig())
        venv.seed(0)
        venv.reset()
        rewards = np.array([venv.step(action)[1] for action in actions])
        session = venv.streams.session
        info = session.info() if isinstance(session, RemoteSession) else {}  # the server's count, routed to its replica
        venv.close()
        return rewards, info

    remote, info = run(RemoteReward(server + "/rule"))
    np.testing.assert_array_equal(remote, run(build_reward("goal_pixel_progress"))[0])
    sent = info["frames_received"]
    # per env: the reset frame and 8 steps, then the next episode's reset frame and 4 steps
    assert sent == 2 * (1 + 8 + 1 + 4), sent
