"""The reward server's wire format (API v1): raw array buffers plus a JSON header, never pickle.

A request body (content type `application/x-vlmr-frames`) is

    b"VLMR" | format version (1 byte, = 1) | header length (uint32, little endian) | header | blob

The header is UTF-8 JSON; every array (frames, reference, views, frame_index) in it is a reference
`{"$array": i}` into the header's `arrays` table, whose entries say `dtype` (numpy dtype string),
`shape`, `offset` and `nbytes` of the array's raw bytes in `blob`. So frames travel as their raw
uint8 bytes (no base64, no compression, so no decompression bombs), decode is one copy, and
nothing is ever unpickled. Allowed dtypes are plain numerics; the server then checks each item
against the served spec (uint8 frames, shapes, limits), so a float or NaN clip is refused per item.

Responses are JSON: per item either `{"result": RewardResult.to_json(), ...}` or
`{"error": message, "status": code}`; see `vlm_rewards.serving.server`.

This module imports only numpy and the standard library (the client installs without ray/torch).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vlm_rewards.interface import RewardRequest, SampleKey

API_VERSION = "v1"
CONTENT_TYPE = "application/x-vlmr-frames"
MAGIC = b"VLMR"
FORMAT_VERSION = 1
_PREAMBLE = struct.Struct("<4sBI")  # magic, format version, header length
MAX_HEADER_BYTES = 16 << 20
MAX_RANK = 8
ALLOWED_DTYPES = frozenset(
    np.dtype(name).str
    for name in (
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
        "float16", "float32", "float64", "bool",
    )
)  # fmt: skip
REQUEST_ID_HEADER = "X-Request-Id"
VERSION_HEADER = "X-Reward-Version"


class WireError(ValueError):
    """The body as a whole cannot be decoded (HTTP 400)."""


class ItemError(ValueError):
    """One item cannot be decoded or is invalid (that item gets the error, HTTP 422)."""


@dataclass
class DecodedBody:
    """A decoded request body: the header's fields and the raw blob the arrays point into."""

    header: dict[str, Any]
    blob: bytearray

    @property
    def api(self) -> str | None:
        return self.header.get("api")

    def items(self, field: str = "items") -> list[Any]:
        items = self.header.get(field)
        if not isinstance(items, list):
            raise WireError(f"header.{field}: expected a list, got {type(items).__name__}")
        return items

    def array(self, reference: Any, where: str) -> np.ndarray:
        """The array a `{"$array": i}` reference names; ItemError naming `where` if it is malformed."""
        if not isinstance(reference, Mapping) or set(reference) != {"$array"} or type(reference["$array"]) is not int:
            raise ItemError(f"{where}: expected an array reference {{'$array': index}}, got {_short(reference)}")
        table = self.header.get("arrays")
        index = reference["$array"]
        if not isinstance(table, list) or not 0 <= index < len(table):
            raise ItemError(f"{where}: array reference {index} is not in the arrays table")
        entry = table[index]
        if not isinstance(entry, Mapping):
            raise ItemError(f"{where}: arrays[{index}] is not a mapping")
        dtype_name, shape = entry.get("dtype"), entry.get("shape")
        offset, nbytes = entry.get("offset"), entry.get("nbytes")
        try:
            dtype = np.dtype(dtype_name) if isinstance(dtype_name, str) else None
        except TypeError:
            dtype = None
        if dtype is None or dtype.str not in ALLOWED_DTYPES:
            raise ItemError(f"{where}: dtype {dtype_name!r} is not allowed; send uint8 frames (numeric dtypes only)")
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_RANK
            or not all(type(side) is int and side >= 0 for side in shape)
        ):
            raise ItemError(f"{where}: shape {_short(shape)} is not a list of at most {MAX_RANK} non-negative ints")
        expected = math.prod(shape) * dtype.itemsize
        if type(offset) is not int or type(nbytes) is not int or nbytes != expected:
            raise ItemError(f"{where}: nbytes {nbytes!r} does not match dtype {dtype} and shape {shape} ({expected})")
        if offset < 0 or offset + nbytes > len(self.blob):
            raise ItemError(f"{where}: bytes {offset}..{offset + nbytes} lie outside the {len(self.blob)}-byte blob")
        return np.frombuffer(self.blob, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)

    def optional_array(self, reference: Any, where: str) -> np.ndarray | None:
        return None if reference is None else self.array(reference, where)

    def request(self, item: Any, where: str) -> RewardRequest:
        """One item as a RewardRequest; ItemError naming the field if it is malformed."""
        if not isinstance(item, Mapping):
            raise ItemError(f"{where}: expected a mapping, got {type(item).__name__}")
        unknown = set(item) - {"frames", "text", "reference", "views", "key", "frame_index"}
        if unknown:
            raise ItemError(f"{where}: unknown fields {sorted(unknown)}")
        if "frames" not in item:
            raise ItemError(f"{where}.frames: missing")
        if "text" not in item:
            raise ItemError(f"{where}.text: missing; expected the instruction or prompt")
        if not isinstance(item["text"], str):
            raise ItemError(f"{where}.text: expected a string, got {type(item['text']).__name__}")
        check_unicode(item["text"], f"{where}.text")
        views = item.get("views") or {}
        if not isinstance(views, Mapping):
            raise ItemError(f"{where}.views: expected a mapping of view name -> array reference")
        for name in views:
            check_unicode(name, f"{where}.views name")
        return RewardRequest(
            frames=self.array(item["frames"], f"{where}.frames"),
            text=item["text"],
            reference=self.optional_array(item.get("reference"), f"{where}.reference"),
            views={str(name): self.array(view, f"{where}.views[{name!r}]") for name, view in views.items()},
            key=decode_key(item.get("key"), f"{where}.key"),
            frame_index=self.optional_array(item.get("frame_index"), f"{where}.frame_index"),
        )


class Encoder:
    """Builds a request body: `ref(array)` appends an array's bytes and returns its reference."""

    def __init__(self) -> None:
        self.arrays: list[dict[str, Any]] = []
        self.chunks: list[bytes | memoryview] = []
        self.size = 0

    def ref(self, array: np.ndarray) -> dict[str, int]:
        array = np.ascontiguousarray(array)
        self.arrays.append(
            {"dtype": array.dtype.str, "shape": list(array.shape), "offset": self.size, "nbytes": array.nbytes}
        )
        self.chunks.append(memoryview(array).cast("B") if array.nbytes else b"")
        self.size += array.nbytes
        return {"$array": len(self.arrays) - 1}

    def optional_ref(self, array: np.ndarray | None) -> dict[str, int] | None:
        return None if array is None else self.ref(np.asarray(array))

    def item(self, request: RewardRequest) -> dict[str, Any]:
        return {
            "frames": self.ref(np.asarray(request.frames)),
            "text": request.text,
            "reference": self.optional_ref(request.reference),
            "views": {name: self.ref(np.asarray(view)) for name, view in dict(request.views).items()},
            "key": encode_key(request.key),
            "frame_index": self.optional_ref(request.frame_index),
        }

    def body(self, header: Mapping[str, Any]) -> bytes:
        text = json.dumps({**header, "arrays": self.arrays}, allow_nan=False).encode()
        return b"".join([_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(text)), text, *self.chunks])


def encode_score(requests: Sequence[RewardRequest], api: str = API_VERSION) -> bytes:
    """The body of a `/v1/score` request."""
    encoder = Encoder()
    items = [encoder.item(request) for request in requests]
    return encoder.body({"api": api, "items": items})


def encode_prefer(a: Sequence[RewardRequest], b: Sequence[RewardRequest], api: str = API_VERSION) -> bytes:
    """The body of a `/v1/prefer` request: pairs {"a": item, "b": item}."""
    encoder = Encoder()
    pairs = [{"a": encoder.item(x), "b": encoder.item(y)} for x, y in zip(a, b, strict=True)]
    return encoder.body({"api": api, "pairs": pairs})


def encode_open(texts: Sequence[str], references: Sequence[np.ndarray | None], api: str = API_VERSION) -> bytes:
    """The body of a `/v1/sessions` request (open a session): per stream its text and reference or None."""
    encoder = Encoder()
    refs = [encoder.optional_ref(reference) for reference in references]
    return encoder.body({"api": api, "texts": list(texts), "references": refs})


def encode_append(
    frames: Sequence[np.ndarray], views: Sequence[Mapping[str, np.ndarray]], api: str = API_VERSION
) -> bytes:
    """The body of a `/v1/sessions/{id}/append` request: per stream its new frames and views."""
    encoder = Encoder()
    frame_refs = [encoder.ref(np.asarray(new)) for new in frames]
    view_refs = [{name: encoder.ref(np.asarray(view)) for name, view in dict(named).items()} for named in views]
    return encoder.body({"api": api, "frames": frame_refs, "views": view_refs})


def encode_reset(index: int, text: str, reference: np.ndarray | None, api: str = API_VERSION) -> bytes:
    """The body of a `/v1/sessions/{id}/reset` request: restart stream `index`."""
    encoder = Encoder()
    return encoder.body({"api": api, "index": index, "text": text, "reference": encoder.optional_ref(reference)})


def decode_open(body: DecodedBody) -> tuple[list[str], list[np.ndarray | None]]:
    """`open_session`'s texts and references from a `/v1/sessions` body; ItemError naming the field."""
    texts, references = body.header.get("texts"), body.header.get("references")
    if not isinstance(texts, list) or not isinstance(references, list) or len(texts) != len(references):
        raise ItemError("texts, references: expected two lists of the same length, one entry per stream")
    for i, text in enumerate(texts):
        _check_text(text, f"texts[{i}]")
    return texts, [body.optional_array(reference, f"references[{i}]") for i, reference in enumerate(references)]


def decode_append(body: DecodedBody) -> tuple[list[np.ndarray], list[dict[str, np.ndarray]]]:
    """`append`'s frames and views from a `/v1/sessions/{id}/append` body; ItemError naming the field."""
    frames, views = body.header.get("frames"), body.header.get("views")
    if not isinstance(frames, list) or not isinstance(views, list) or len(frames) != len(views):
        raise ItemError("frames, views: expected two lists of the same length, one entry per stream")
    for i, named in enumerate(views):
        if not isinstance(named, Mapping):
            raise ItemError(f"views[{i}]: expected a mapping of view name -> array reference")
    return (
        [body.array(new, f"frames[{i}]") for i, new in enumerate(frames)],
        [
            {name: body.array(view, f"views[{i}][{name!r}]") for name, view in named.items()}
            for i, named in enumerate(views)
        ],
    )


def decode_reset(body: DecodedBody) -> tuple[int, str, np.ndarray | None]:
    """`reset`'s stream index, text and reference from a `/v1/sessions/{id}/reset` body."""
    index, text = body.header.get("index"), body.header.get("text")
    if type(index) is not int:
        raise ItemError(f"index: expected a stream index (int), got {_short(index)}")
    _check_text(text, "text")
    return index, text, body.optional_array(body.header.get("reference"), "reference")


def _check_text(text: Any, where: str) -> None:
    if not isinstance(text, str):
        raise ItemError(f"{where}: expected a string, got {type(text).__name__}")
    check_unicode(text, where)


def decode_body(body: bytes | bytearray | memoryview) -> DecodedBody:
    """Split a request body into its header and blob; WireError if it is not this format."""
    if len(body) < _PREAMBLE.size:
        raise WireError(f"body of {len(body)} bytes is too short for the {CONTENT_TYPE} preamble")
    magic, version, header_length = _PREAMBLE.unpack_from(body)
    if magic != MAGIC:
        raise WireError(f"body does not start with {MAGIC!r}; expected {CONTENT_TYPE} (see vlm_rewards.serving.wire)")
    if version != FORMAT_VERSION:
        raise WireError(f"wire format version {version}; this server reads version {FORMAT_VERSION}")
    if header_length > MAX_HEADER_BYTES or _PREAMBLE.size + header_length > len(body):
        raise WireError(f"header length {header_length} does not fit the {len(body)}-byte body")
    raw = bytes(body[_PREAMBLE.size : _PREAMBLE.size + header_length])
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise WireError(f"header is not valid UTF-8 JSON ({error})") from None
    if not isinstance(header, dict):
        raise WireError(f"header: expected a JSON object, got {type(header).__name__}")
    return DecodedBody(header=header, blob=bytearray(body[_PREAMBLE.size + header_length :]))


def encode_key(key: SampleKey | None) -> list[Any] | None:
    return None if key is None else [key.source, key.episode, key.frame]


def decode_key(data: Any, where: str = "key") -> SampleKey | None:
    if data is None:
        return None
    if (
        not isinstance(data, list)
        or len(data) != 3
        or not isinstance(data[0], str)
        or not isinstance(data[1], int | str)
        or type(data[2]) is not int
    ):
        raise ItemError(f"{where}: expected [source: str, episode: int | str, frame: int], got {_short(data)}")
    for index, part in enumerate(data[:2]):
        if isinstance(part, str):
            check_unicode(part, f"{where}[{index}]")
    return SampleKey(data[0], data[1], data[2])


def check_unicode(text: str, where: str) -> None:
    """ItemError naming `where` for text UTF-8 cannot encode: a lone surrogate such as "\\ud800", which a
    JSON escape can spell but no response can carry back."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ItemError(
            f"{where}: not valid Unicode (lone surrogate {text[error.start]!r} at character {error.start}); "
            "expected UTF-8 text"
        ) from None


def _refuse_constant(name: str) -> Any:
    raise WireError(f"header contains {name}; NaN and infinities are not valid JSON values")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
