import hashlib
import json
from typing import Any


def fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-serialisable parts: weights ids, preprocessing, prompts."""
    payload = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(payload).hexdigest()[:12]
