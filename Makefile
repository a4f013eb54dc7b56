# One virtual environment serves every target. torch is installed first from TORCH_SPEC so that
# the dependency ranges of torchrl/tensordict are already met (no multi-GB CUDA wheels on CPU hosts).
# It has the bench extra (Stable-Baselines3, sb3-contrib) too, so that CI runs the tests of the
# Stable-Baselines3 runs (settings, checkpoint and resume of the MinAtar and MuJoCo grids' SB3
# baselines) instead of skipping them.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: venv test lint run docs bench bench-learning bench-throughput bench-functional bench-ppo bench-a2c bench-acer bench-minatar bench-mujoco clean

$(BIN)/activate: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test,ray,minatar,mujoco,bench,docs]"
	touch $(BIN)/activate

venv: $(BIN)/activate

lint: venv
	$(BIN)/ruff check $(wildcard ac_extensions tests benchmarks examples)

# Two pytest workers: most tests wait on subprocesses, interpreter starts or one Python thread,
# so two at once took 822 s where one at a time took 1,178 s (full suite, this 2-core machine).
# The Ray tests stay on one worker (one local cluster).
test: venv lint
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=25

# The API reference (docstrings) with the README as its front page; warnings are errors.
docs: venv
	$(BIN)/python -m sphinx -W -q -b html docs docs/_build/html
	@echo "open docs/_build/html/index.html"

run: venv
	$(BIN)/python benchmarks/run.py --quick

bench: venv
	$(BIN)/python benchmarks/run.py

bench-learning: venv
	$(BIN)/python benchmarks/run.py --only learning

bench-throughput: venv
	$(BIN)/python benchmarks/run.py --only throughput

bench-ppo: venv
	$(BIN)/pip install --quiet -e ".[bench]"
	$(BIN)/python benchmarks/ppo_vs_sb3.py --seeds 1 2 3 4 5 6 7 8 9 10

bench-a2c: venv
	$(BIN)/pip install --quiet -e ".[bench]"
	$(BIN)/python benchmarks/a2c_vs_sb3.py --seeds 1 2 3 4 5 6 7 8 9 10

bench-acer: venv
	$(BIN)/python benchmarks/acer_update.py
	$(BIN)/python benchmarks/acer_vs_ppo.py --seeds 1 2 3

bench-minatar: venv
	$(BIN)/pip install --quiet -e ".[bench,minatar]"
	$(BIN)/python benchmarks/minatar_grid.py

bench-mujoco: venv
	$(BIN)/pip install --quiet -e ".[bench,mujoco]"
	$(BIN)/python benchmarks/mujoco_grid.py

bench-functional: venv
	$(BIN)/python benchmarks/functional_ops.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
