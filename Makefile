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
# generator with colour-shape pairs held out, then GRPO on those prompts with the verifier as reward;
# image grids (grpo/eval/) and curves (curves.png) under runs/grpo_demo. The full run is the same two
# configs without the step and epoch overrides.
grpo-demo: setup
	$(VLMR) pretrain-generator configs/grpo/shapes_base_pairs.yaml output_dir=runs/grpo_demo/base steps=300 eval_every=300
	$(VLMR) grpo configs/grpo/shapes_verifier_pairs.yaml output_dir=runs/grpo_demo/grpo \
		model.trained_tiny=runs/grpo_demo/base/model train.epochs=4 eval_every=2 checkpoint_every=2
	$(PYTHON) -m vlm_rewards.generation.shapes_eval curves runs/grpo_demo/grpo --output runs/grpo_demo/curves.png

test: setup
	.venv/bin/ruff check .
	MUJOCO_GL=egl HF_HUB_OFFLINE=1 $(PYTHON) -m pytest -n 2 -q

lint: setup
	.venv/bin/ruff check .
