# Two entry points for a fresh machine (Python 3.11, pip, Node; Chromium for UI tests):
#   make demo   -> venv + package with TensorFlow, trains the demo, serves TensorBoard
#   make test   -> venv + everything, runs all tests
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOGDIR ?= runs/demo

.PHONY: demo test install benchmark clean

$(VENV)/.installed: setup.py pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[tensorflow-cpu,test]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) demo/train.py --logdir $(LOGDIR) --serve

test: install
	node --test frontend/test/
	$(PY) -m pytest -q tests

benchmark: install
	$(PY) benchmarks/summary_overhead.py
	$(PY) benchmarks/keras_overhead.py
	$(PY) benchmarks/route_latency.py --encoding base64
	$(PY) benchmarks/frontend_paint.py

clean:
	rm -rf $(VENV) build dist *.egg-info runs
