# Two commands for a fresh machine (Python 3.11 and git assumed):
#   make run    train the embedded default (PPO on torch-native Pendulum, about a minute on 2 cores)
#   make test   run the test suite
# Both create or reuse the virtual environment in $(VENV) and install what they need; torch is held to the
# CPU wheel through .ci/constraints.txt.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ctrl_rl-installed

.PHONY: run test test-slow lint docs bench bench-offline clean

# d3rlpy 2.8.1 pins gymnasium 1.0.0, which would downgrade ctrl_rl's gymnasium: it is installed without its
# dependency pins, with the packages it imports listed here.
D3RLPY_DEPS := gym scikit-learn structlog colorama dataclasses-json click tqdm h5py

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): setup.cfg pyproject.toml .ci/constraints.txt | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c .ci/constraints.txt -e ".[test]"
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m ctrl_rl train ppo

# the default suite in TEST_WORKERS processes (pytest-xdist), a test file per worker so that its module fixtures are
# built once (2026-11-27: 971 s on this 2-core machine, quiet; the serial suite had taken most of CI's 40 minutes)
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

# the slow learning tests, also a file per worker (2026-11-27, beside two study runs on the 2 cores: 945 s with two
# workers; the PPO learning file alone, 830 s of it, holds one worker while the other runs the rest)
test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow -n $(TEST_WORKERS) --dist loadfile --durations=10

# ruff over the package, tests and experiments, and pyright over the package (basic; strict on core/); settings in
# pyproject.toml
lint: $(STAMP)
	$(PY) -m pip install -q -c .ci/constraints.txt -e ".[test,lint]"
	$(PY) -m ruff check ctrl_rl tests experiments
	$(PY) -m pyright

# the documentation site (mkdocs.yml, docs/), built strictly into site/
docs: $(STAMP)
	$(PY) -m pip install -q -c .ci/constraints.txt -e ".[test,docs]"
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

bench: $(STAMP)
	$(PY) -m pip install -q -c .ci/constraints.txt -e ".[test,bench]"
	$(PY) experiments/massive_parallel/massive_parallel.py
	$(PY) experiments/ppo_halfcheetah_sps/ppo_halfcheetah_sps.py
	$(PY) experiments/time_to_3000/time_to_3000.py

bench-offline: $(STAMP)
	$(PY) -m pip install -q -c .ci/constraints.txt $(D3RLPY_DEPS)
	$(PY) -m pip install -q --no-deps d3rlpy==2.8.1
	$(PY) experiments/offline_updates/offline_updates.py

clean:
	rm -rf $(VENV) runs site
