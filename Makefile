# memtrade — two commands do everything on a fresh machine:
#   make run    set up, build, run the main job (results under out/)
#   make test   set up, build, run every test
# Other targets: build, bench, peer (PyTorch comparison), format, format-check, clean.
BUILD      ?= build
CMAKE_ARGS ?=
JOBS       ?= $(shell nproc)
PYTHON     := /usr/bin/python3
SHELL      := /bin/bash
.SHELLFLAGS := -o pipefail -c

.PHONY: all setup configure build test run bench peer format format-check clean

all: build

setup:
	@bash ci/setup.sh

$(BUILD)/CMakeCache.txt: | setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) > $(BUILD).configure.log 2>&1 \
	  || { cat $(BUILD).configure.log; exit 1; }
	@grep -E "memtrade:" $(BUILD).configure.log || true

configure: setup $(BUILD)/CMakeCache.txt

build: configure
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory \
	  | { grep -vE "^\[ *[0-9]+%\] (Built target|Building|Linking)|^Consolidate compiler" || true; }

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

# Placeholder main job until the harness lands (issue 4): one point of each model family on the
# best backend present, with its peak memory, breakdown and step time, JSON under out/.
run: build
	@mkdir -p out
	@for m in mlp-tiny gpt-tiny cnn-tiny; do \
	  ./$(BUILD)/memtrade run --model $$m --batch-size 8 --optimizer adam --warmup 2 --steps 8 \
	    --out out/$$m.json || exit 1; done
	@echo "results: out/*.json"

bench: build
	@for b in $(BUILD)/bench/*; do $$b --benchmark_min_time=0.2 || exit 1; done

peer: build
	@$(PYTHON) bench/peers/compare_cpu.py --memtrade $(BUILD)/memtrade

format:
	@clang-format -i $$(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')

format-check:
	@clang-format --dry-run -Werror $$(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')

clean:
	@rm -rf $(BUILD) $(BUILD).configure.log out
