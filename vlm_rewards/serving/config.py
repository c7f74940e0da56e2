"""`vlmr serve` settings: which reward, where to listen, batching, replicas, limits.

Kept apart from `server.py` so that the CLI can validate a config before importing ray.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from typing import Any, Literal

import pydantic

from vlm_rewards.config import JobConfig, Settings

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
HOST_EXAMPLES = "e.g. 127.0.0.1, ::1, 0.0.0.0, :: or localhost"


class BatchingConfig(Settings):
    max_batch_size: int = pydantic.Field(32, ge=1)
    """Most items per `reward.score` call, gathered across concurrent requests (`serve.batch`)."""
    wait_timeout_s: float = pydantic.Field(0.005, ge=0)
    """Seconds a batch waits to fill before it is scored."""


class ReplicasConfig(Settings):
    count: int | Literal["per_gpu"] = 1
    """Replicas to run: a number, or `per_gpu` for one per GPU of the Ray cluster."""
    num_cpus: float = pydantic.Field(1.0, ge=0)
    """CPUs each replica reserves in Ray."""
    num_gpus: float = pydantic.Field(0.0, ge=0)
    """GPUs each replica reserves in Ray; `count: per_gpu` makes it 1 unless set."""
    max_ongoing_requests: int = pydantic.Field(256, ge=1)
    """HTTP requests in flight per replica (at least `batching.max_batch_size`); more wait in Serve's proxy."""
    health_check_period_s: float = pydantic.Field(2.0, gt=0)
    """Seconds between Serve's health checks of each replica."""


class SessionsConfig(Settings):
    max_open: int = pydantic.Field(16, ge=1)
    """Streaming sessions one replica holds at once; opening one more gets HTTP 429 (nothing is evicted)."""
    idle_s: float = pydantic.Field(300.0, gt=0)
    """Seconds a session may go unused before its replica drops it (and its cache); later calls get HTTP 404."""


class ServeConfig(JobConfig):
    reward: str = "goal_pixel_progress"
    """The reward to serve: a reward YAML path or a config name in configs/rewards/."""
    host: str = "127.0.0.1"
    """Address to listen on: an IP address or a host name; any non-loopback host needs a bearer token."""
    port: int = pydantic.Field(8000, ge=0, le=65535)
    """TCP port to listen on."""
    token_env: str = "VLMR_SERVE_TOKEN"
    """Environment variable that holds the bearer token clients must send."""
    app_name: str = "vlmr-reward"
    """Name of the Serve application (one Ray cluster can run several)."""
    route_prefix: str = "/"
    """URL path the endpoints are served under, starting with '/'."""
    max_payload_bytes: int = pydantic.Field(64 << 20, ge=1024)
    """Largest request body in bytes; larger bodies get HTTP 413."""
    max_pixels_per_item: int = pydantic.Field(16 << 20, ge=1)
    """Most frame pixels (T×H×W over frames, reference and views) one item may decode to; more gets HTTP 422.
    Counted after decoding, so items whose arrays point to the same bytes count each time."""
    max_pixels_per_request: int = pydantic.Field(64 << 20, ge=1)
    """Most frame pixels the items of one request may decode to together; more gets HTTP 413 (split the batch).
    The default admits every body of `max_payload_bytes` whose arrays do not repeat bytes."""
    body_timeout_s: float = pydantic.Field(30.0, gt=0)
    """Seconds a request body may take to arrive in full; a slower one gets HTTP 408 and frees its slot."""
    max_body_reads: int = pydantic.Field(64, ge=1)
    """Request bodies a replica reads at once; more get HTTP 503 at once (clients retry), so that stalled
    uploads cannot take every request slot of a replica (`replicas.max_ongoing_requests`) from /healthz."""
    batching: BatchingConfig = BatchingConfig()
    """How items of concurrent requests are gathered into one reward call."""
    replicas: ReplicasConfig = ReplicasConfig()
    """How many copies of the reward serve, and what each reserves."""
    sessions: SessionsConfig = SessionsConfig()
    """Streaming sessions (RL): how many a replica holds, and how long an unused one lives."""
    ray_address: str | None = None
    """An existing Ray cluster to join ("auto", "ray://head:10001"); None: $RAY_ADDRESS, else a local instance."""
    num_cpus: int | None = None
    """CPUs of a local Ray instance; None: all of this machine's."""

    @pydantic.field_validator("host", mode="before")
    @classmethod
    def _host_is_text(cls, value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(
                f"expected a host name or IP address ({HOST_EXAMPLES}), got {type(value).__name__} {value!r}; "
                "values are read as YAML, so quote an IPv6 address such as `::` (host='\"::\"')"
            )
        return value

    @pydantic.field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not is_host(value):
            raise ValueError(f"{value!r} is not a host name or IP address ({HOST_EXAMPLES}){_host_hint(value)}")
        return value

    @pydantic.field_validator("route_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value

    @pydantic.model_validator(mode="after")
    def _body_reads_leave_slots(self) -> ServeConfig:
        if self.max_body_reads >= self.max_ongoing_requests():
            raise ValueError(
                f"max_body_reads={self.max_body_reads} must be below the {self.max_ongoing_requests()} requests a "
                "replica takes at once (replicas.max_ongoing_requests, at least batching.max_batch_size), or "
                "stalled uploads can take every slot from /healthz"
            )
        return self

    def max_ongoing_requests(self) -> int:
        """Requests in flight per replica: `replicas.max_ongoing_requests`, and never fewer than a batch."""
        return max(self.replicas.max_ongoing_requests, self.batching.max_batch_size)

    def token(self) -> str | None:
        return os.environ.get(self.token_env) or None

    def check_exposure(self) -> None:
        """Refuse to listen off loopback without a bearer token (ValueError naming what to set)."""
        if not is_loopback(self.host) and not self.token():
            raise ValueError(
                f"host {self.host!r} is not loopback: set a bearer token in ${self.token_env} "
                "(clients pass it as RemoteReward(url, token=...)), or serve on 127.0.0.1"
            )

    def check_bindable(self) -> None:
        """With a local Ray instance (no `ray_address`, no $RAY_ADDRESS), refuse a host this machine cannot
        listen on, or a port in use, before Ray starts: Serve's proxy would retry the bind forever."""
        if self.ray_address or os.environ.get("RAY_ADDRESS"):
            return  # the proxy listens on the cluster's head node, not necessarily here
        try:
            family, kind, proto, _, address = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0]
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the proxy's server does
                probe.bind(address)
        except OSError as error:
            raise ValueError(
                f"cannot listen on host {self.host!r} port {self.port} on this machine ({error.strerror or error}); "
                "pick an address of this machine (127.0.0.1, 0.0.0.0) and a free port"
            ) from None


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_host(text: str) -> bool:
    """An IP address (IPv4, IPv6 without brackets) or a host name of dot-separated labels (RFC 1123)."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    labels = text.removesuffix(".").split(".")
    return (
        0 < len(text) <= 253
        and all(_HOST_LABEL.fullmatch(label) for label in labels)
        and not labels[-1].isdigit()  # 999.1.1.1 is a bad IPv4 address, not a name
    )


def _host_hint(text: str) -> str:
    if text.startswith("[") and text.endswith("]"):
        return "; write an IPv6 address without brackets"
    if "://" in text or "/" in text:
        return "; give the host alone, not a URL"
    if text.count(":") == 1:
        return "; set the port with port=..."
    return ""


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
