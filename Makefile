# Two entry points for a fresh machine: `make serve` and `make test`.
# Each creates .venv on first use and re-installs when pyproject.toml changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8080
PYTEST_ARGS ?=
# Test-only packages (verl's client files), apart from the serve environment.
TEST_VENDOR := $(VENV)/test-vendor

.PHONY: serve test test-fast lint typecheck bench clean runtime docs docs-serve

# Venvs and installs go through mocksandbox/runtime/installer.py (standard library only, run from
# this checkout): by uv where it is on PATH or pip can get it into .venv (seconds), else by pip (a
# minute or more), with the same pins and indexes either way, and a line of progress. INSTALLER=pip
# (or uv) decides instead; the full output of each install is in .venv/install.log.
INSTALLER ?= auto
INSTALL := $(BIN)/python -m mocksandbox.runtime.installer --installer $(INSTALLER) install $(VENV)

$(BIN)/python:
	$(PYTHON) -m mocksandbox.runtime.installer --installer $(INSTALLER) venv $(VENV)

# The stamp records which extras were installed against which pyproject.toml (and this file, which
# names them). `serve` answers /run_jupyter as SandboxFusion does: the server side of Jupyter
# (jupyter_client) is here; the kernels run in the runtime's venv, with user code.
$(VENV)/.installed-serve: pyproject.toml Makefile | $(BIN)/python
	$(INSTALL) --what "mocksandbox with extras runtime,jupyter" -- -e '.[runtime,jupyter]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(INSTALL) --what "mocksandbox with the test extras" -- -e '.[dev,docs,jupyter,ray,fleet,stress,docker]'
	# verl's SandboxFusion client, for the compatibility tests: only its pure-Python files (its
	# full dependency set is torch and friends), loaded by path by tests/server/test_client_compat.py.
	# It goes into a directory of its own, not into the venv, so that pip never checks (and
	# complains about) verl's dependencies when `make serve` installs; an older venv's copy goes.
	$(BIN)/python -m pip uninstall --quiet --yes verl 2>/dev/null || true
	rm -rf $(TEST_VENDOR)
	$(BIN)/python -m pip install --quiet --no-deps --target $(TEST_VENDOR) 'verl==0.9.1'
	touch $@

# User code gets an environment of its own, apart from the server's venv: SandboxFusion's pinned
# Python runtime (numpy, pandas, pytest 7.4, ipykernel, ...) on a CPython 3.10 as production's (found
# on PATH, in pyenv, uv or conda; else this Python, and the banner says so) in the runtime dir, once
# (idempotent: a check after that). The server then runs user Python and Jupyter kernels with it.
serve: $(VENV)/.installed-serve
	$(BIN)/mocksandbox runtime install --languages python --installer $(INSTALLER)
	$(BIN)/mocksandbox serve --host $(HOST) --port $(PORT)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check mocksandbox tests contract_tests benchmarks examples docs
	$(BIN)/ruff format --check mocksandbox

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

# The documentation site (docs/, mkdocs.yml) into site/: strict, so a broken link, a missing page or
# an unresolved reference fails the build. docs-serve serves it on 127.0.0.1:8000 as you edit.
# (The variables silence a notice Material prints about a future MkDocs 2.)
MKDOCS := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs
$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(INSTALL) --what "mocksandbox with extras docs" -- -e '.[docs]'
	touch $@

docs: $(VENV)/.installed-docs
	$(MKDOCS) build --strict --quiet

docs-serve: $(VENV)/.installed-docs
	$(MKDOCS) serve --strict --dev-addr 127.0.0.1:8000

# The project's own tests (tests/, examples/, the examples in docs/), then the contract suite against a mock it starts.
# --dist loadgroup keeps tests marked xdist_group("ray") on one worker: one Ray cluster, not two.
# Three workers on CI's two cores: with two, the cores were idle a quarter of the time (tests
# waiting on programs' timeouts, servers starting, Ray); with three, 96% busy and the suite takes
# about a minute and a half less.
test: lint typecheck browser docs
	$(BIN)/python -m pytest -n 3 --dist loadgroup $(PYTEST_ARGS)
	$(BIN)/python -m pytest contract_tests -n 2 -p no:cacheprovider
	# ... and against a mock of two worker processes over one control state (serve --workers 2).
	MOCKSANDBOX_WORKERS=2 $(BIN)/python -m pytest contract_tests -n 2 -p no:cacheprovider
	# ... and against one whose runs share the host (isolation none, SandboxFusion's own mode).
	MOCKSANDBOX_ISOLATION=none $(BIN)/python -m pytest contract_tests -n 2 -p no:cacheprovider

# The same without the slow suites (pytester runs, Ray clusters), for a quick local loop.
test-fast: lint typecheck
	$(BIN)/python -m pytest -n 3 -m "not slow" $(PYTEST_ARGS)

# Toolchains (Debian packages, as root; otherwise it prints the sudo line) and SandboxFusion's
# runtime libraries (jars, node_modules, Go sources, a Python venv) for every language this
# machine can get, into the runtime dir (MOCKSANDBOX_RUNTIME_DIR, default ~/.local/share/...).
# Idempotent: a second run checks and does nothing. `make test` then runs the per-language tests.
runtime: $(VENV)/.installed-serve
	$(BIN)/mocksandbox runtime install --all --installer $(INSTALLER)
	$(BIN)/mocksandbox languages

# The web console's browser tests drive Debian's chromium through chromium-driver: installed here
# when missing (as root, or with passwordless sudo). Where that cannot be done those tests are
# skipped, saying how to install them (under .ci/run, which requires them, they fail instead).
.PHONY: browser
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); export DEBIAN_FRONTEND=noninteractive; \
	  $$sudo apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 || \
	  { $$sudo apt-get update -qq >/dev/null 2>&1 && \
	    $$sudo apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; } || \
	  echo "make: could not install chromium chromium-driver (apt-get as root): browser tests skip"; }

# The cgroup v2 host shape (issue 50): the hostile and host-shape suites in a QEMU guest booting
# Debian 12's kernel 6.1 with pure cgroup v2 (tests/vm/, tests/vm/run-in-cgroup2-vm.sh). Apart from
# `make test` (about 11 minutes under software emulation on 2 cores): `make test-cg2vm`, which
# .ci/run runs after `make test`. The packages are installed here when missing (as root, or with
# passwordless sudo); without them tests/vm fails under .ci/run and skips elsewhere, saying why.
CG2VM_PACKAGES := qemu-system-x86 linux-image-amd64 busybox-static e2fsprogs
.PHONY: cg2vm test-cg2vm
cg2vm:
	@command -v qemu-system-x86_64 >/dev/null && ls /boot/vmlinuz-6.1.* >/dev/null 2>&1 && \
	  command -v busybox >/dev/null && command -v mke2fs >/dev/null || { \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  install="$$sudo env DEBIAN_FRONTEND=noninteractive INITRD=No apt-get install -y -qq --no-install-recommends $(CG2VM_PACKAGES)"; \
	  $$install >/dev/null 2>&1 || { $$sudo apt-get update -qq >/dev/null 2>&1 && $$install >/dev/null 2>&1; } || \
	  echo "make: could not install $(CG2VM_PACKAGES): tests/vm skips (fails under .ci/run)"; }

test-cg2vm: $(VENV)/.installed-test cg2vm
	CG2VM_MEM=3G $(BIN)/python -m pytest tests/vm $(PYTEST_ARGS)

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_run_code.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build site *.egg-info
