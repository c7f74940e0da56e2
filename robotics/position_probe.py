"""Does a backbone's vision tower know where things are, finer than one image token? A linear probe.

Reach frames go through the backbone's vision tower; for every named thing a frame shows, the merged image
token whose patch holds it is taken (layer-normed, as the scene readout reads it), and a ridge-regularised
linear map from those tokens to the thing's offset within the patch (x and y, in patch widths) is fitted
on one set of rendered episodes and scored on another. R² near 1: a reward model fine-tuned on the
backbone can read sub-token positions from its image tokens; near 0: the tokens are cell indicators.

    python -m vlm_rewards.robotics.position_probe data/models/simworld-backbone runs/backbone_offsets/model

prints, and writes to --output (position_probe.json), each backbone's R² per named thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
import typer

from vlm_rewards.io import write_json
from vlm_rewards.robotics.config import ReachSource
from vlm_rewards.robotics.questions import ReachQuestions, build_reach_pool

MIN_SHOWN = 20  # a name shown in fewer frames of either set is left out: too few points to fit or score
RIDGE = 1.0  # on the unit-scale (layer-normed) features: keeps names shown in few frames from overfitting


def probe_r2(
    features: np.ndarray, presence: np.ndarray, offsets: np.ndarray,
    test_features: np.ndarray, test_presence: np.ndarray, test_offsets: np.ndarray, names: Sequence[str],
) -> dict[str, float]:  # fmt: skip
    """R² on the test tokens of a ridge-regularised linear map (with bias) fitted on the training tokens, per
    name: features (tokens, D), presence (tokens, names) 0/1, offsets (tokens, names, 2); a name counts where
    present."""
    fit_inputs = np.hstack([features, np.ones((len(features), 1))])
    test_inputs = np.hstack([test_features, np.ones((len(test_features), 1))])
    penalty = RIDGE * np.diag([1.0] * features.shape[1] + [0.0])  # the bias is not penalised
    scores = {}
    for column, name in enumerate(names):
        shown, test_shown = presence[:, column] > 0, test_presence[:, column] > 0
        if shown.sum() < MIN_SHOWN or test_shown.sum() < MIN_SHOWN:
            continue
        inputs = fit_inputs[shown]
        weights = np.linalg.solve(inputs.T @ inputs + penalty, inputs.T @ offsets[shown, column])
        truth = test_offsets[test_shown, column]
        error = np.square(test_inputs[test_shown] @ weights - truth).sum()
        spread = np.square(truth - offsets[shown, column].mean(0)).sum()
        scores[name] = float(1 - error / spread)
    return scores


@torch.no_grad()
def image_tokens(
    model, processor, questions: list, names: Sequence[str], batch_size: int = 16
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The layer-normed merged image tokens of the questions' frames, with the scene readout's targets
    (columns: `names`)."""
    from vlm_rewards.training.pretrain import QuestionBatches, SceneReadout

    batches = QuestionBatches(processor)
    readout = SceneReadout(model.config.text_config.hidden_size, names)
    features, presence, offsets = [], [], []
    for begin in range(0, len(questions), batch_size):
        chunk = questions[begin : begin + batch_size]
        inputs, _ = batches(chunk)
        tokens = model.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"]).pooler_output
        shown, offset = readout.targets(chunk, inputs["image_grid_thw"])
        features.append(readout.norm(tokens))
        presence.append(shown)
        offsets.append(offset)
    return tuple(torch.cat(part).numpy() for part in (features, presence, offsets))


app = typer.Typer(add_completion=False)


@app.command()
def main(
    backbones: Annotated[list[Path], typer.Argument(help="Backbone folders (a run's model/, the shipped one).")],
    output: Annotated[Path, typer.Option(help="Folder of position_probe.json.")] = Path("runs/position_probe"),
    fit_episodes: Annotated[int, typer.Option(help="Rendered Reach episodes the probe is fitted on.")] = 300,
    test_episodes: Annotated[int, typer.Option(help="Other episodes it is scored on.")] = 100,
    frames: Annotated[int, typer.Option(help="Frames (questions) drawn from each set.")] = 3000,
    seed: Annotated[int, typer.Option(help="First reset seed of the fit set; test: +10,000.")] = 60_000,
) -> None:  # fmt: skip
    """Fit and score the probe for each backbone on the same frames."""
    from vlm_rewards.models.backbones import load_backbone

    source = ReachSource()
    pools = [
        build_reach_pool(source.env, episodes, source.num_frames, source.steps_per_frame, start, None)
        for episodes, start in ((fit_episodes, seed), (test_episodes, seed + 10_000))
    ]
    rng = np.random.default_rng(seed)
    fit_questions, test_questions = ([ReachQuestions(pool).presence(rng) for _ in range(frames)] for pool in pools)
    names = ReachQuestions(pools[0]).object_names
    results = {}
    for backbone in backbones:
        model, processor = load_backbone(backbone, dtype=torch.float32)
        model.eval()
        fitted, tested = (
            image_tokens(model, processor, questions, names) for questions in (fit_questions, test_questions)
        )
        results[str(backbone)] = probe_r2(*fitted, *tested, names)
        typer.echo(f"{backbone}: " + ", ".join(f"{name} {r2:.2f}" for name, r2 in results[str(backbone)].items()))
    write_json(output / "position_probe.json", results)


if __name__ == "__main__":
    app()
