# Two entry points for a fresh machine: `make demo` (set up, then run the main job on embedded
# defaults: `vlmr pipeline`, collect -> train a progress RM -> RL -> report) and `make test` (set up,
# lint with ruff, then run the test suite). Setup is idempotent.
PYTHON := .venv/bin/python
VLMR := .venv/bin/vlmr

.PHONY: setup demo grpo-demo test lint
setup: .venv/.setup-done
.venv/.setup-done: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

demo: setup
	MUJOCO_GL=egl HF_HUB_OFFLINE=1 $(VLMR) pipeline

# A short version of the generation experiment (docs/results/generation.md): a from-scratch base
# generator, then GRPO with the gold verifier as reward; image grids and curves under runs/grpo_demo.
grpo-demo: setup
	$(VLMR) pretrain-generator configs/grpo/shapes_base.yaml output_dir=runs/grpo_demo/base steps=200 eval_every=200
	$(VLMR) grpo configs/grpo/shapes_verifier.yaml output_dir=runs/grpo_demo/grpo \
		model.trained_tiny=runs/grpo_demo/base/model train.epochs=2

test: setup
	.venv/bin/ruff check .
	MUJOCO_GL=egl HF_HUB_OFFLINE=1 $(PYTHON) -m pytest -n 2 -q

lint: setup
	.venv/bin/ruff check .
