# Two commands do all the set-up on a fresh machine (python3 >= 3.11, Java 17):
#   make run    creates .venv, installs requirements.txt, runs `python launch.py` (quickstart)
#   make test   creates .venv, installs requirements-test.txt, runs the default test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test test-slow bench venv sysdeps

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# pip byte-compiles the ~18,500 files it installs one by one (on CI about half of the
# install's time); compileall then does the same on every core. A file a package ships for
# a newer Python (torch has one) fails to compile in both, and is skipped in both.
PIP_INSTALL := $(BIN)/python -m pip install -q --no-compile
COMPILE_VENV := $(BIN)/python -m compileall -q -j 0 \
  "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  >/dev/null || true

# The wheels benchmarks/gpu_check.py carries to the GPU image (benchmarks/gpu_wheels.txt) are
# the versions this venv tests, so they pin the venv's transitive dependencies too: a new
# release of one (wcwidth, under prompt-toolkit) would otherwise make the two differ.
GPU_PINS := $(VENV)/gpu-wheel-pins.txt
$(GPU_PINS): benchmarks/gpu_wheels.txt | $(BIN)/python
	sed -E 's/^(replace|build) //' $< > $@

$(VENV)/.req-stamp: requirements.txt requirements-nodeps.txt $(GPU_PINS) | $(BIN)/python
	$(PIP_INSTALL) -r requirements.txt -c $(GPU_PINS)
	$(PIP_INSTALL) --no-deps -r requirements-nodeps.txt
	$(COMPILE_VENV)
	touch $@

$(VENV)/.test-stamp: requirements-test.txt $(VENV)/.req-stamp $(GPU_PINS)
	$(PIP_INSTALL) -r requirements-test.txt -c $(GPU_PINS)
	$(COMPILE_VENV)
	touch $@

venv: $(VENV)/.req-stamp

run: $(VENV)/.req-stamp
	$(BIN)/python launch.py $(ARGS)

# pytest exits 5 when it collected no test: that is a failure here, not a pass.
# TEST_WORKERS pytest-xdist processes, one test file each at a time (module fixtures such as
# a shared SFT run stay in one process); TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= 2
# Debian packages, installed when missing and apt-get can (as root); else the suite says what
# it lacks. bubblewrap: the swe environment's sandbox (environments/swe/sandbox.py); without it
# its bwrap tests fail. libjemalloc2: the allocator the suite's processes use (tests/xla_env.py:
# XLA's compiles spend about a sixth of their CPU in glibc's malloc); without it the suite runs
# on glibc's malloc, slower, with the same results.
APT_GET_INSTALL = [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
  { apt-get install -y -q $(1) >/dev/null 2>&1 || \
    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $(1) >/dev/null 2>&1; }; }
JEMALLOC_FOUND = ls /usr/lib/*-linux-gnu/libjemalloc.so.2 /usr/lib64/libjemalloc.so.2 2>/dev/null | grep -q .
sysdeps:
	@want=""; command -v bwrap >/dev/null || want=" bubblewrap"; \
	  $(JEMALLOC_FOUND) || want="$$want libjemalloc2"; \
	  if [ -n "$$want" ]; then $(call APT_GET_INSTALL,$$want) && echo "installed$$want"; fi; \
	  command -v bwrap >/dev/null || echo "bubblewrap could not be installed (apt-get install" \
	    "bubblewrap): the swe sandbox's bwrap tests will fail"; \
	  $(JEMALLOC_FOUND) || echo "libjemalloc2 could not be installed (apt-get install" \
	    "libjemalloc2): the suite runs on glibc's malloc, slower"

test: $(VENV)/.test-stamp sysdeps
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests ran: failing"; exit 1; fi; exit $$rc

test-slow: $(VENV)/.test-stamp sysdeps
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m slow $(PYTEST_ARGS)

BENCHMARKS ?= advantages sampler train_step algorithms iteration envpool alfworld_speed scienceworld_speed webshop_speed virtualhome_speed taubench_speed swe_speed
bench: $(VENV)/.test-stamp
	for b in $(BENCHMARKS); do echo "== $$b"; PYTHONPATH=. $(BIN)/python -m benchmarks.$$b || exit 1; done
