# memtrade — two commands do everything on a fresh machine:
#   make run    set up, build, run the main job (results under out/)
#   make test   set up, build, run every test
# Other targets: build, docs, bench, peer (PyTorch comparison), whole-step (the whole step's peak
# against PyTorch's, docs/pytorch.md), format, format-check, clean.
BUILD      ?= build
CMAKE_ARGS ?=
JOBS       ?= $(shell nproc)
PYTHON     := /usr/bin/python3
SHELL      := /bin/bash
.SHELLFLAGS := -o pipefail -c

.PHONY: all setup configure build test run docs bench peer whole-step format format-check clean

all: build

setup:
	@bash ci/setup.sh

$(BUILD)/CMakeCache.txt: | setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) > $(BUILD).configure.log 2>&1 \
	  || { cat $(BUILD).configure.log; exit 1; }
	@grep -E "memtrade:" $(BUILD).configure.log || true

configure: setup $(BUILD)/CMakeCache.txt

# Progress in a dozen lines (every 10%, with the target being built), compiler messages in full.
build: configure
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory | awk -v start=$$(date +%s) ' \
	  /^\[ *[0-9]+%\] / { p = substr($$0, 2, 3) + 0; \
	    if (match($$0, /CMakeFiles\/[^\/]+\.dir/)) tgt = substr($$0, RSTART + 11, RLENGTH - 15); \
	    else if (match($$0, /Built target .*/)) tgt = substr($$0, RSTART + 13); \
	    if (p >= next_p) { printf "build: %3d%%  %s\n", p, tgt; fflush(); next_p = p - p % 10 + 10 } \
	    next } \
	  /^Consolidate compiler/ { next } \
	  { print; fflush() } \
	  END { if (next_p > 0) printf "build: done in %ds\n", systime() - start }'

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

# The main job: the smoke grid on the CPU, or the nightly grid where a CUDA device is usable;
# results in out/<grid>.json, one step's allocator trace, and the charts in out/report/.
run: build
	@mkdir -p out
	@if ./$(BUILD)/memtrade devices | grep -qE '^cuda +usable'; then grid=nightly; else grid=smoke; fi; \
	  ./$(BUILD)/memtrade run --grid ci/grids/$$grid.toml --out out/$$grid.json; rc=$$?; \
	  [ $$rc -le 1 ] || exit $$rc; \
	  first=$$(./$(BUILD)/memtrade run --grid ci/grids/$$grid.toml --list | head -n 1); \
	  ./$(BUILD)/memtrade run --grid ci/grids/$$grid.toml --select "$$first" --quiet \
	    --trace out/trace.json --out out/trace-point.json; \
	  ./$(BUILD)/memtrade report out/$$grid.json --trace out/trace.json -o out/report \
	    --title "memtrade $$grid grid" && echo "report: out/report/index.html"; \
	  exit $$rc

# The docs page: ci/grids/docs.toml on the CPU, charts and index in docs/ (committed), the
# knob table of docs/design.md, docs/pytorch.md (memtrade's memory against PyTorch's) and
# docs/advise.md ("What to turn when you run out of memory", memtrade advise on the atlas models)
# and docs/atlas.md (the memory atlas of GPT-2 and Llama sizes and of Qwen2.5, Mistral, Gemma 2 and
# Mixtral config files, from the CUDA memory model).
PYTORCH_POINTS := $(shell for m in gpt-mini:8 gpt-small:8 mlp-small:8 cnn-small:8; do \
  for c in 0 1 0.5 sqrt selective; do printf '%s:%s,%s:%s:bf16:torch-cpu,' $$m $$c $$m $$c; done; \
  done; printf 'llama-mini:8:0,llama-mini:8:1,llama-mini:8:0:bf16:torch-cpu')
docs: build
	@$(PYTHON) ci/knob_table_doc.py $(BUILD)/memtrade docs/design.md
	@$(PYTHON) ci/advise_doc.py $(BUILD)/memtrade docs
	@$(PYTHON) ci/atlas.py $(BUILD)/memtrade docs --gpu h100
	@./$(BUILD)/memtrade run --grid ci/grids/docs.toml --backend cpu --out docs/results-cpu.json
	@first=$$(./$(BUILD)/memtrade run --grid ci/grids/docs.toml --list | head -n 1); \
	  ./$(BUILD)/memtrade run --grid ci/grids/docs.toml --select "$$first" --quiet \
	    --trace docs/trace-cpu.json --out /tmp/memtrade-docs-trace-point.json
	@./$(BUILD)/memtrade report docs/results-cpu.json --trace docs/trace-cpu.json -o docs \
	  --title "memtrade trade-offs (CPU backend, $$(nproc) cores)"
	@$(PYTHON) bench/peers/saved_bytes.py --memtrade $(BUILD)/memtrade --no-mallinfo \
	  --markdown docs/pytorch.md --points $(PYTORCH_POINTS) > /dev/null
	@$(PYTHON) -m pip download -q --no-deps apache-otava==0.8.0 -d $(BUILD)/otava-wheel 2>/dev/null \
	  && $(PYTHON) -m zipfile -e $$(ls $(BUILD)/otava-wheel/*.whl | head -n 1) $(BUILD)/otava \
	  || echo "docs: Apache Otava not downloadable here: docs/changes.md leaves its columns out"
	@$(PYTHON) bench/gate_quality.py --bin $(BUILD)/memtrade --otava $(BUILD)/otava \
	  --markdown docs/changes.md --chart docs/changes.png > /dev/null

# Passive OpenMP waits, as memtrade itself and `make peer` run: spinning threads on a shared
# machine measure the neighbours (gpt-small's step: 1.7-2.2 s spinning, 0.9 s passive).
bench: build
	@for b in $(BUILD)/bench/*; do OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-passive} $$b \
	  --benchmark_min_time=0.2 || exit 1; done

# PEER_ARGS: more flags for compare_cpu.py, e.g. --isa avx2 (both sides kept off AVX-512) or --cpu.
peer: build
	@$(PYTHON) bench/peers/compare_cpu.py --memtrade $(BUILD)/memtrade $(PEER_ARGS)

# The whole step's peak against PyTorch eager's (docs/pytorch.md, "The whole step"): every model
# × checkpoint × precision × optimizer × accumulation × zero_grad with for-loop optimizers, plus
# SGD and Adam foreach/forloop at b1 × a2. `make test` runs a subset (tests/python/test_whole_step.py).
WHOLE_STEP_MODELS ?= gpt-tiny,llama-tiny,mlp-tiny,cnn-tiny
whole-step: build
	@OMP_WAIT_POLICY=passive $(PYTHON) bench/peers/whole_step.py --memtrade $(BUILD)/memtrade \
	  --models $(WHOLE_STEP_MODELS) --warmup 1 --threads 1 --foreach-rows \
	  --json $(BUILD)/whole-step.json --markdown docs/pytorch.md

format:
	@clang-format -i $$(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')

format-check:
	@clang-format --dry-run -Werror $$(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')

clean:
	@rm -rf $(BUILD) $(BUILD).configure.log out
