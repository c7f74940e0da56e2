"""Where a progress reward puts its value over the workspace: the potential that shaping climbs, as a map.

For a few reset layouts of a `vlmr/*` task, the effector is placed at every point of a grid over the
workspace (nothing else moves) and each point's frame is scored as the clip [the layout's first frame,
the frame], the clip the pipeline's frame-by-frame reward scores at every RL step. Beside each map, the
env's true progress at the same points, and two correlations with it over the grid: of the values, and of
the steps between neighbouring points (the slope, what shaping pays a move). A potential that rises toward
the named target everywhere is what shaping pays for; a map of flat plateaus (e.g. one per vision token)
can correlate well in value yet gives the critic a signal only where the plateaus meet, which its slope
correlation shows.

    python -m vlm_rewards.robotics.potential_map runs/pipeline/rm/reward.yaml --config runs/pipeline/config.yaml

writes potential_map.png and potential_map.json beside the reward YAML (or in --output).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from vlm_rewards.interface import RewardModel, RewardRequest
from vlm_rewards.io import write_json
from vlm_rewards.robotics.config import EnvConfig, PipelineConfig


@dataclass
class PotentialMap:
    """One layout: the reward's and the env's progress at each grid point (rows: y, columns: x)."""

    seed: int
    instruction: str
    learned: np.ndarray
    true: np.ndarray

    @property
    def correlation(self) -> float:
        return float(np.corrcoef(self.learned.ravel(), self.true.ravel())[0, 1])

    @property
    def slope_correlation(self) -> float:
        """Correlation of the steps between neighbouring grid points (along x and along y), learned vs true."""
        return float(np.corrcoef(_neighbour_steps(self.learned), _neighbour_steps(self.true))[0, 1])


def _neighbour_steps(grid: np.ndarray) -> np.ndarray:
    return np.concatenate([np.diff(grid, axis=0).ravel(), np.diff(grid, axis=1).ravel()])


def potential_maps(
    reward: RewardModel, env_config: EnvConfig, camera: str, seeds: list[int], points: int
) -> list[PotentialMap]:
    """The map of every layout (reset seed), `points` x `points` effector positions over the workspace."""
    from vlm_rewards.robotics.envs import make_env
    from vlm_rewards.robotics.tasks import WORKSPACE

    env = make_env(env_config, cameras=[camera])
    task = env.unwrapped
    if not hasattr(task, "place_effector"):
        raise ValueError(f"potential map: {env_config.id} cannot place its effector; expected a vlmr/* task")
    grid = np.linspace(-WORKSPACE, WORKSPACE, points)
    maps = []
    for seed in seeds:
        _, info = env.reset(seed=seed)
        first, requests, true = info["frames"][camera], [], []
        for y in grid:
            for x in grid:
                true.append(task.place_effector(np.array([x, y]))["progress"])
                frame = task.render_cameras((camera,))[camera]
                requests.append(RewardRequest(np.stack([first, frame]), task.instruction))
        learned = [result.progress[-1] for result in reward.score(requests)]
        shape = (points, points)
        maps.append(PotentialMap(seed, task.instruction, np.reshape(learned, shape), np.reshape(true, shape)))
    env.close()
    return maps


def plot_maps(maps: list[PotentialMap], path: Path) -> None:
    from matplotlib.figure import Figure

    from vlm_rewards.evaluation.plots import save_png

    figure = Figure(figsize=(3.6 * len(maps), 7))
    axes = figure.subplots(2, len(maps), squeeze=False)
    for column, layout in enumerate(maps):
        for row, (values, title) in enumerate(
            [
                (layout.learned, f"reward: {layout.instruction}"),
                (
                    layout.true,
                    f"true progress (corr {layout.correlation:.2f}, slope {layout.slope_correlation:.2f})",
                ),
            ]
        ):
            axis = axes[row, column]
            image = axis.imshow(values, origin="lower", vmin=0, vmax=1, extent=(-1, 1, -1, 1))
            axis.set_title(title, fontsize=9)
            axis.set_xticks([])
            axis.set_yticks([])
    figure.colorbar(image, ax=axes, shrink=0.6, label="progress")
    save_png(figure, path)


app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)


@app.command()
def main(
    reward: Annotated[Path, typer.Argument(help="a reward YAML, e.g. a pipeline run's rm/reward.yaml")],
    config: Annotated[Path | None, typer.Option(help="the pipeline run's config.yaml (env, camera)")] = None,
    output: Annotated[Path | None, typer.Option(help="the folder of the PNG and JSON; default: the reward's")] = None,
    seed_start: Annotated[int, typer.Option(help="the first layout's reset seed")] = 50_000,
    layouts: Annotated[int, typer.Option(help="layouts (reset seeds) to map")] = 3,
    points: Annotated[int, typer.Option(help="grid points per axis")] = 15,
) -> None:
    """Map the reward over the workspace for a few layouts, with the true progress beside it."""
    from vlm_rewards.config import load_job_config
    from vlm_rewards.registry import build_reward

    pipeline = load_job_config(PipelineConfig, config) if config else PipelineConfig()
    seeds = list(range(seed_start, seed_start + layouts))
    maps = potential_maps(build_reward(reward), pipeline.env, pipeline.rl.reward.wrapper.camera, seeds, points)
    folder = output or reward.parent
    folder.mkdir(parents=True, exist_ok=True)
    plot_maps(maps, folder / "potential_map.png")
    summary = {
        "reward": str(reward),
        "points": points,
        "layouts": [
            {
                "seed": m.seed,
                "instruction": m.instruction,
                "correlation": m.correlation,
                "slope_correlation": m.slope_correlation,
                "learned": m.learned.round(4).tolist(),
                "true": m.true.round(4).tolist(),
            }
            for m in maps
        ],
    }
    write_json(folder / "potential_map.json", summary)
    print(
        json.dumps(
            {m.instruction: {"value": round(m.correlation, 3), "slope": round(m.slope_correlation, 3)} for m in maps}
        )
    )


if __name__ == "__main__":
    app()
