"""A `vlmr rl` run's logs, continued from its checkpoint: what a killed run logged after it is dropped.

A run restarts from its last checkpoint, at step N (0 without one). Everything logged after N came
from a policy the restarted run discards, so each log keeps its entries up to N and is appended to
after them; every step is then logged once, by the run that continues:

- `eval.jsonl`, `monitor.jsonl`: the entries with `timesteps` <= N;
- `progress.csv`: the rows with `time/total_timesteps` <= N, continued by SB3's CSV writer (which on
  its own starts the file afresh);
- tensorboard: the new event file starts with a purge marker at step N + 1, so TensorBoard drops the
  earlier files' events from that step on (what `SummaryWriter(purge_step=...)` writes);
- `videos/eval_<steps>.mp4` after N are deleted.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from stable_baselines3.common.logger import CSVOutputFormat, Logger, TensorBoardOutputFormat
from tensorboard.compat.proto.event_pb2 import Event, SessionLog

from vlm_rewards.io import atomic_path

CSV_STEP = "time/total_timesteps"  # the env step of a progress.csv row (SB3 logs it in every row)
JSONL_LOGS = ("eval.jsonl", "monitor.jsonl")


def continue_logs(run_dir: Path, step: int) -> Logger:
    """Cuts every log of `run_dir` back to `step` and returns the SB3 logger (csv, tensorboard) that goes on."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in JSONL_LOGS:
        _truncate_jsonl(run_dir / name, step)
    for video in (run_dir / "videos").glob("eval_*.mp4"):
        steps = video.stem.removeprefix("eval_")
        if steps.isdigit() and int(steps) > step:
            video.unlink()
    board = TensorBoardOutputFormat(str(run_dir))
    board.writer.file_writer.add_event(Event(step=step + 1, session_log=SessionLog(status=SessionLog.START)))
    return Logger(str(run_dir), [ContinuedCSV(run_dir / "progress.csv", step), board])


class ContinuedCSV(CSVOutputFormat):
    """SB3's progress.csv writer, starting from the file's rows up to `step`."""

    def __init__(self, path: Path, step: int):
        kept = _csv_lines_up_to(path, step)
        super().__init__(str(path))  # truncates the file
        if kept:
            self.keys = next(csv.reader(kept[:1]))
            self.file.writelines(kept)
            self.file.flush()


def _csv_lines_up_to(path: Path, step: int) -> list[str]:
    """The header and the rows logged at env steps <= `step`; none without a file or its step column."""
    lines = [line if line.endswith("\n") else line + "\n" for line in _lines(path)]
    header = next(csv.reader(lines[:1]), [])
    if CSV_STEP not in header:
        return []
    column = header.index(CSV_STEP)
    return [lines[0], *(line for line in lines[1:] if _csv_step(line, column) <= step)]


def _csv_step(line: str, column: int) -> float:
    row = next(csv.reader([line]))
    try:
        return float(row[column])
    except (IndexError, ValueError):  # a row cut short by the kill
        return math.inf


def _truncate_jsonl(path: Path, step: int) -> None:
    if not path.is_file():
        return
    kept = [line.rstrip("\n") + "\n" for line in _lines(path) if _jsonl_step(line) <= step]
    with atomic_path(path) as temporary:
        temporary.write_text("".join(kept))


def _jsonl_step(line: str) -> float:
    try:
        return float(json.loads(line)["timesteps"])
    except (json.JSONDecodeError, KeyError, TypeError):  # a line cut short by the kill
        return math.inf


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True) if path.is_file() else []
