"""`vlmr serve` settings: which reward, where to listen, batching, replicas, limits.

Kept apart from `server.py` so that the CLI can validate a config before importing ray.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Literal

import pydantic

from vlm_rewards.config import JobConfig

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


class BatchingConfig(pydantic.BaseModel, extra="forbid"):
    max_batch_size: int = pydantic.Field(32, ge=1)  # items per reward.score call (serve.batch)
    wait_timeout_s: float = pydantic.Field(0.005, ge=0)  # how long a batch waits to fill


class ReplicasConfig(pydantic.BaseModel, extra="forbid"):
    count: int | Literal["per_gpu"] = 1  # N replicas, or one per GPU of the Ray cluster
    num_cpus: float = pydantic.Field(1.0, ge=0)  # Ray resources each replica reserves
    num_gpus: float = pydantic.Field(0.0, ge=0)  # 1 with count=per_gpu
    max_ongoing_requests: int = pydantic.Field(256, ge=1)  # HTTP requests in flight per replica
    health_check_period_s: float = pydantic.Field(2.0, gt=0)


class ServeConfig(JobConfig):
    reward: str = "goal_pixel_progress"  # a reward YAML path or a name in configs/rewards/
    host: str = "127.0.0.1"  # any non-loopback host requires a bearer token
    port: int = pydantic.Field(8000, ge=0, le=65535)
    token_env: str = "VLMR_SERVE_TOKEN"  # environment variable holding the bearer token
    app_name: str = "vlmr-reward"
    route_prefix: str = "/"
    max_payload_bytes: int = pydantic.Field(64 << 20, ge=1024)  # larger request bodies get 413
    batching: BatchingConfig = BatchingConfig()
    replicas: ReplicasConfig = ReplicasConfig()
    ray_address: str | None = None  # an existing cluster ("auto", "ray://..."); None: RAY_ADDRESS or local
    num_cpus: int | None = None  # CPUs of a local Ray instance (None: all)

    @pydantic.field_validator("route_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value

    def token(self) -> str | None:
        return os.environ.get(self.token_env) or None

    def check_exposure(self) -> None:
        """Refuse to listen off loopback without a bearer token (ValueError naming what to set)."""
        if not is_loopback(self.host) and not self.token():
            raise ValueError(
                f"host {self.host!r} is not loopback: set a bearer token in ${self.token_env} "
                "(clients pass it as RemoteReward(url, token=...)), or serve on 127.0.0.1"
            )


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_job_args(args: list[str] | None) -> list[str]:
    """`vlmr serve REWARD [overrides]`: a first argument that names a reward (a shipped name, or a YAML
    with a `kind:`) becomes the override `reward=REWARD`; a serve config YAML (no `kind:`) stays."""
    args = list(args or [])
    if not args or "=" in args[0]:
        return args
    first = args[0]
    if "/" in first or first.endswith((".yaml", ".yml")):
        from vlm_rewards.config import load_yaml_file

        if "kind" not in load_yaml_file(first):
            return args
    return [f"reward={first}", *args[1:]]


def run_serve_job(config: ServeConfig) -> None:
    """The `vlmr serve` job: ray and the server load only once the config is valid."""
    check_reward_config(config.reward)
    from vlm_rewards.serving.server import run_serve

    run_serve(config)


def check_reward_config(reference: str) -> None:
    """Fail fast, before Ray starts: the reward config exists, names a known kind, and its parameters
    validate (the replicas build the reward itself)."""
    from vlm_rewards.config import load_yaml_file
    from vlm_rewards.registry import format_validation_error, resolve_reward_path, reward_class

    path = resolve_reward_path(reference)
    config = load_yaml_file(path)
    if "kind" not in config:
        raise ValueError(f"{path}: missing `kind`; is this a reward config?")
    try:
        reward_class(str(config["kind"])).Params.model_validate({k: v for k, v in config.items() if k != "kind"})
    except pydantic.ValidationError as error:
        raise ValueError(f"{path} (kind {config['kind']!r}): {format_validation_error(error)}") from None
