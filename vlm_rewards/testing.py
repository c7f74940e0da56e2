"""`check_reward`: what gymnasium's `check_env` is to envs, for rewards.

It builds random requests that fit the reward's spec, with texts the reward accepts (its
`example_texts()`), and checks that the reward keeps the promises its spec makes: result shapes and
ranges, batch invariance, determinism, causal prefix equality, a session equal to full scoring (causal
rewards), `ascore` equal to `score`, `prefer` in [0, 1], JSON round trips of spec and results, and
clear errors for bad input. Any reward kind gets it for free:

    from vlm_rewards.testing import check_reward
    check_reward(build_reward("my_reward"))
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from vlm_rewards.interface import (
    EXAMPLE_TEXTS,
    REFERENCE,
    VIEW_PREFIX,
    RewardModel,
    RewardRequest,
    RewardResult,
    RewardSpec,
    example_texts_of,
    validate_results,
)


class ConformanceError(AssertionError):
    """A reward broke a promise of its spec; the message names the check."""


def random_requests(
    spec: RewardSpec,
    rng: np.random.Generator,
    count: int = 3,
    frame_side: int | None = None,
    max_frames: int = 6,
    texts: Sequence[str] = EXAMPLE_TEXTS,
) -> list[RewardRequest]:
    """`count` requests of 1..max_frames random frames that satisfy `spec` (sizes, budget, requirements)."""
    side = frame_side or _frame_side(spec)
    longest = min(max_frames, spec.max_frames or max_frames)
    views = [entry.removeprefix(VIEW_PREFIX) for entry in spec.requires if entry.startswith(VIEW_PREFIX)]
    requests = []
    for i in range(count):
        length = int(rng.integers(1, longest + 1)) if i else longest
        requests.append(
            RewardRequest(
                frames=_random_clip(rng, length, side),
                text=texts[i % len(texts)],
                reference=_random_clip(rng, 1, side) if REFERENCE in spec.requires or i % 2 else None,
                views={name: _random_clip(rng, length, side) for name in views},
            )
        )
    return requests


def example_requests(reward: RewardModel, count: int = 3, seed: int = 0, max_frames: int = 6) -> list[RewardRequest]:
    """`count` requests `reward` accepts: random frames that fit its spec, with its `example_texts()`."""
    return random_requests(
        reward.spec, np.random.default_rng(seed), count, max_frames=max_frames, texts=example_texts_of(reward)
    )


def check_reward(
    reward: RewardModel,
    requests: Sequence[RewardRequest] | None = None,
    seed: int = 0,
    atol: float = 1e-5,
) -> None:
    """Run every check on `reward`, on `requests` (default: `example_requests(reward, seed=seed)`); raise
    `ConformanceError` naming the first promise it breaks."""
    spec = reward.spec
    if not isinstance(spec, RewardSpec):
        raise ConformanceError(f"spec: expected a RewardSpec, got {type(spec).__name__}")
    requests = list(requests) if requests is not None else example_requests(reward, seed=seed)
    results = reward.score(requests)
    _check("results match requests and spec", lambda: validate_results(results, requests, spec))
    _check_json(spec, results)
    if spec.deterministic:
        _expect_equal("deterministic: scoring twice", results, reward.score(requests), atol)
    if spec.batch_invariant:
        alone = [reward.score([request])[0] for request in requests]
        _expect_equal("batch_invariant: scored alone vs in a batch", results, alone, atol)
        order = list(reversed(range(len(requests))))
        shuffled = reward.score([requests[i] for i in order])
        _expect_equal("batch_invariant: batch order", [results[i] for i in order], shuffled, atol)
    if spec.causal:
        _check_causal(reward, requests, results, atol)
        _check_session(reward, requests, results, atol)
    if spec.deterministic:
        _expect_equal("ascore equals score", results, asyncio.run(reward.ascore(requests)), atol)
    _check_prefer(reward, requests)
    _check_bad_inputs(reward, requests[0])


def _check_causal(reward: RewardModel, requests: Sequence[RewardRequest], results: list[RewardResult], atol: float):
    """progress[:t] of the whole clip equals the progress of the clip cut after frame t."""
    longest = max(range(len(requests)), key=lambda i: requests[i].num_frames)
    request, full = requests[longest], results[longest].progress
    prefixes = [request.prefix(length) for length in range(1, request.num_frames + 1)]
    for length, result in zip(range(1, request.num_frames + 1), reward.score(prefixes)):
        if not np.allclose(result.progress, full[:length], atol=atol, equal_nan=True):
            raise ConformanceError(
                f"causal: progress of the first {length} frames {result.progress} differs from the whole clip's "
                f"{full[:length]}"
            )


def _check_session(reward: RewardModel, requests: Sequence[RewardRequest], results: list[RewardResult], atol: float):
    """A session fed the clips in uneven chunks gives the full-clip progress, also after a reset: each
    stream plays its clip twice, restarting when it ends as an env starts a new episode."""
    texts = [request.text for request in requests]
    references = [request.reference for request in requests]
    chunk_sizes = itertools.cycle([1, 2, 1, 3])
    passes: list[list[list[float]]] = [[] for _ in requests]
    current: list[list[float]] = [[] for _ in requests]
    with reward.open_session(texts, references) as session:
        while min(len(done) for done in passes) < 2:
            size = next(chunk_sizes)
            pieces = [slice(len(current[i]), min(len(current[i]) + size, r.num_frames)) for i, r in enumerate(requests)]
            frames = [request.frames[piece] for request, piece in zip(requests, pieces)]
            views = [{name: view[piece] for name, view in r.views.items()} for r, piece in zip(requests, pieces)]
            for i, values in enumerate(session.append(frames, views)):
                current[i].extend(values)
                if len(current[i]) == requests[i].num_frames:
                    passes[i].append(current[i])
                    current[i] = []
                    session.reset(i, texts[i], references[i])
    for i, result in enumerate(results):
        for episode, streamed in enumerate(passes[i][:2]):
            if not np.allclose(streamed, result.progress, atol=atol, equal_nan=True):
                raise ConformanceError(
                    f"session: streamed progress {np.round(streamed, 6)} (request {i}, episode {episode}) differs "
                    f"from scoring the whole clip {np.round(result.progress, 6)}"
                )


def _check_prefer(reward: RewardModel, requests: Sequence[RewardRequest]) -> None:
    a, b = list(requests), list(requests[1:]) + list(requests[:1])
    probabilities = reward.prefer(a, b)
    if not isinstance(probabilities, np.ndarray) or probabilities.shape != (len(a),):
        raise ConformanceError(f"prefer: expected a ({len(a)},) array, got {getattr(probabilities, 'shape', None)}")
    finite = probabilities[~np.isnan(probabilities)]
    if np.any((finite < 0) | (finite > 1)):
        raise ConformanceError(f"prefer: probabilities {probabilities} outside [0, 1]")


def _check_bad_inputs(reward: RewardModel, good: RewardRequest) -> None:
    bad_inputs: dict[str, list] = {
        "an empty batch": [],
        "float frames": [replace(good, frames=good.frames.astype(np.float32))],
        "frames without a time axis": [replace(good, frames=good.frames[0])],
        "an empty text": [replace(good, text=" ")],
        "views with another T": [replace(good, views={"extra": np.concatenate([good.frames, good.frames])})],
    }
    if REFERENCE in reward.spec.requires:
        bad_inputs["a missing reference"] = [replace(good, reference=None)]
    for what, batch in bad_inputs.items():
        try:
            reward.score(batch)
        except ValueError:
            continue
        except Exception as error:  # noqa: BLE001 - the point is to report which exception it was
            raise ConformanceError(f"bad input ({what}) raised {type(error).__name__}, expected ValueError") from error
        raise ConformanceError(f"bad input ({what}) was accepted; expected a ValueError naming the field")


def _check_json(spec: RewardSpec, results: list[RewardResult]) -> None:
    text = json.dumps(spec.to_json(), allow_nan=False)
    if RewardSpec.from_json(json.loads(text)) != spec:
        raise ConformanceError(f"JSON round trip changed the spec: {text}")
    for i, result in enumerate(results):
        text = json.dumps(result.to_json(), allow_nan=False)
        _expect_equal(f"JSON round trip of result {i}", [result], [RewardResult.from_json(json.loads(text))], 0.0)


def _expect_equal(what: str, expected: list[RewardResult], actual: list[RewardResult], atol: float) -> None:
    for i, (x, y) in enumerate(zip(expected, actual, strict=True)):
        same = (
            np.allclose(x.reward, y.reward, atol=atol, equal_nan=True)
            and (x.progress is None) == (y.progress is None)
            and (x.progress is None or np.allclose(x.progress, y.progress, atol=atol, equal_nan=True))
            and list(x.components) == list(y.components)
            and np.allclose(list(x.components.values()), list(y.components.values()), atol=atol, equal_nan=True)
            and x.error == y.error
        )
        if not same:
            raise ConformanceError(f"{what}: result {i} differs:\n  {x}\n  {y}")


def _check(what: str, check: Callable[[], None]) -> None:
    try:
        check()
    except ValueError as error:
        raise ConformanceError(f"{what}: {error}") from error


def _frame_side(spec: RewardSpec) -> int:
    if spec.frame_size is None:
        return 32
    low, high = spec.frame_size
    return min(max(low, 32), high)


def _random_clip(rng: np.random.Generator, length: int, side: int) -> np.ndarray:
    return rng.integers(0, 256, size=(length, side, side, 3), dtype=np.uint8)
