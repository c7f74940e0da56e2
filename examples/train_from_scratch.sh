#!/usr/bin/env bash
# Train tiny Qwen2.5-VL-architecture reward models from scratch (random init, the project's own
# tokenizer) on procedurally generated ShapesWorld data, on CPU, then evaluate them on held-out seeds.
# Run from the repository root after `make setup`. Figures from our runs: docs/benchmarks.md.
set -euo pipefail
VLMR=${VLMR:-.venv/bin/vlmr}

# Preference RM: prompt + image -> scalar, Bradley–Terry on pairs (~12 min on 2 cores).
$VLMR train-rm configs/train_rm/preference_tiny.yaml output_dir=runs/preference_tiny
$VLMR eval-rm configs/eval_rm/preference_tiny.yaml

# Progress RM: instruction + clip -> per-frame progress (one forward pass per clip), starting from the
# preference RM's backbone (~14 min on 2 cores).
$VLMR train-rm configs/train_rm/progress_tiny.yaml output_dir=runs/progress_tiny
$VLMR eval-rm configs/eval_rm/progress_tiny.yaml

# The language-blind pixel baseline on the same kind of held-out episodes, for comparison.
$VLMR eval-rm configs/eval_rm/goal_pixel_baseline.yaml
