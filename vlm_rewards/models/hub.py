"""Where a checkpoint named in a config comes from: a local folder, the Hugging Face cache, or the hub.

On an offline machine transformers would first try the network for a hub id (DNS, retries) and then
fail with a message about connections. `resolve_checkpoint` answers at once instead: a local folder or
a cached snapshot loads without the network; an id that is neither, while the hub is unreachable or
`HF_HUB_OFFLINE` is set, is a ValueError naming the id and how to point the config at a local copy.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError

TRUE_VALUES = {"1", "on", "yes", "true"}


def resolve_checkpoint(name_or_path: str | Path, expected: str) -> str:
    """A local folder for `name_or_path` when there is one (the folder itself or the cached snapshot of a
    hub id), else the hub id for transformers to download; a ValueError naming it and what was
    `expected` where nothing can load it."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return str(path)
    if path.is_absolute() or str(name_or_path).startswith((".", "~")) or len(path.parts) > 2:
        raise ValueError(f"{name_or_path}: no such folder, and not a hub id of the form org/name; expected {expected}")
    hub_id = str(name_or_path)
    try:
        return snapshot_download(hub_id, local_files_only=True)
    except LocalEntryNotFoundError:
        pass
    if hub_offline() or not hub_reachable():
        raise ValueError(
            f"{hub_id}: a hub id, but this machine is offline and the Hugging Face cache does not hold it "
            f"({expected}). Download it where there is network (`hf download {hub_id} --local-dir DIR`), copy "
            "DIR here and name DIR in the config instead of the id (or point HF_HOME at a cache that holds it)."
        )
    return hub_id


def hub_offline() -> bool:
    """`HF_HUB_OFFLINE` as huggingface_hub read it at import, or as it is set now."""
    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in TRUE_VALUES


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether a TCP connection to the hub's endpoint opens within `timeout_s`."""
    endpoint = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False
