# Two entry points for a fresh machine (Python 3.11, pip, Node; Chromium for UI tests):
#   make demo   -> venv + package with TensorFlow and scikit-learn, trains the demo, serves TensorBoard
#   make test   -> venv + everything, runs all tests
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOGDIR ?= runs/demo

.PHONY: demo test install benchmark screenshot clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.installed-demo: setup.py pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e '.[demo]'
	touch $@

$(VENV)/.installed-test: setup.py pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e '.[demo,test]'
	touch $@

install: $(VENV)/.installed-test

demo: $(VENV)/.installed-demo
	$(PY) demo/train.py --logdir $(LOGDIR) --serve

test: $(VENV)/.installed-test
	node --test frontend/test/
	$(PY) -m pytest -q tests

benchmark: $(VENV)/.installed-test
	$(PY) benchmarks/summary_overhead.py
	$(PY) benchmarks/keras_overhead.py
	$(PY) benchmarks/route_latency.py --encoding base64
	$(PY) benchmarks/frontend_paint.py

screenshot: $(VENV)/.installed-test
	$(PY) docs/screenshot.py --logdir $(LOGDIR)

clean:
	rm -rf $(VENV) build dist *.egg-info runs
