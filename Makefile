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

# A short version of the generation experiment (docs/generation.md, "The demo"): reward-weighted regression (RWR,
# the algorithm whose rise on never-trained pairs replicated over seeds) from the shipped base generator
# (data/models/shapes-base) on the held-out `grpo` colour-shape pairs with the verifier as reward, then every
# checkpoint evaluated on the `grpo`, `unseen` (never trained on) and `train` splits: runs/grpo_demo/report.md with
# the table, curves.png and the image grids. `make grpo-demo DEMO_ALGORITHM=grpo` (or nft) runs Flow-GRPO
# (DiffusionNFT) instead: configs/<algorithm>/shapes_demo.yaml.
DEMO_ALGORITHM := rwr
grpo-demo: setup
	$(VLMR) $(DEMO_ALGORITHM) configs/$(DEMO_ALGORITHM)/shapes_demo.yaml
	$(PYTHON) -m vlm_rewards.generation.demo runs/grpo_demo/$(DEMO_ALGORITHM) --output runs/grpo_demo

test: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	MUJOCO_GL=egl HF_HUB_OFFLINE=1 $(PYTHON) -m pytest -n 2 -q

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
