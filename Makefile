# Two entry points for a fresh machine: `make demo` (set up, then run the main job on embedded
# defaults: `vlmr pipeline`, collect -> train a progress RM -> RL -> report) and `make test` (set up,
# lint with ruff, then run the test suite). Setup is idempotent.
PYTHON := .venv/bin/python
VLMR := .venv/bin/vlmr

.PHONY: setup demo test lint
setup: .venv/.setup-done
.venv/.setup-done: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

demo: setup
	MUJOCO_GL=egl HF_HUB_OFFLINE=1 $(VLMR) pipeline

test: setup
	.venv/bin/ruff check .
	MUJOCO_GL=egl HF_HUB_OFFLINE=1 $(PYTHON) -m pytest -n 2 -q

lint: setup
	.venv/bin/ruff check .
