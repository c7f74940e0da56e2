"""A local Ray Serve instance on a free loopback port, for tests that serve rewards."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def local_serve() -> Iterator[int]:
    """Start Ray (2 CPUs, unless already running) and Serve's HTTP proxy; yield its port; shut down after."""
    import ray
    from ray import serve

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = start_proxy(serve)
    try:
        yield port
    finally:
        serve.shutdown()
        if started:
            ray.shutdown()


def start_proxy(serve) -> int:
    """`serve.start` on a free port, tried twice: on a loaded machine the HTTP proxy can miss Serve's fixed
    60 s start timeout (Serve then kills it), and a second try gets a fresh port and proxy."""
    import ray

    try:
        return start_on_free_port(serve)
    except ray.exceptions.RayError:
        serve.shutdown()
        return start_on_free_port(serve)


def start_on_free_port(serve) -> int:
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    return port
