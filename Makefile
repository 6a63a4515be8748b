# SPDX-License-Identifier: Apache-2.0
# The two commands of the README:
#   make demo   install what is missing, build, run the main job on the local store: the codec on
#               a generated guest-memory image, then a real guest suspended and resumed
#   make test   install what is missing, check formatting, build and run every test twice
#               (-Werror build, then ASan+UBSan build)
#   make fuzz   run every fuzz target for a while (FUZZ_SECONDS) and report
.PHONY: all deps build build-asan test test-normal test-asan format format-check demo fuzz bench clean

BUILD      ?= build
BUILD_ASAN ?= build-asan
JOBS       ?= $(shell nproc)
CTEST_ARGS ?= --output-on-failure -j$(JOBS)

all: build

# Each command installs only the Debian packages it needs (scripts/deps.sh groups).
deps:
	@scripts/deps.sh all

build:
	@scripts/deps.sh
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVMSNAP_WERROR=ON >/dev/null
	cmake --build $(BUILD)

build-asan:
	@scripts/deps.sh
	cmake -S . -B $(BUILD_ASAN) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DVMSNAP_WERROR=ON \
	      -DVMSNAP_SANITIZE=ON -DCMAKE_C_COMPILER=clang -DVMSNAP_FUZZ=ON >/dev/null
	cmake --build $(BUILD_ASAN)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

format-check:
	@scripts/deps.sh
	@bad=$$(for f in $$(git ls-files -co --exclude-standard -- 'include/*.h' 'lib/*.[ch]' 'cli/*.[ch]' 'tests/*.[ch]' 'bench/*.[ch]' 'guest/*.[ch]' 'daemon/*.[ch]'); do \
	    clang-format --dry-run -Werror "$$f" >/dev/null 2>&1 || echo "$$f"; done); \
	if [ -n "$$bad" ]; then echo "not clang-formatted (run 'make format'):"; echo "$$bad"; exit 1; fi; \
	echo "format-check: ok"
	@python3 scripts/check-structure.py && echo "check-structure: ok"

test-normal: build
	@scripts/deps.sh test s3 vm
	cd $(BUILD) && ctest $(CTEST_ARGS)

test-asan: build-asan
	@scripts/deps.sh test s3 vm
	cd $(BUILD_ASAN) && VMSNAP_SANITIZED=1 \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest $(CTEST_ARGS)

test: format-check
	$(MAKE) test-normal
	$(MAKE) test-asan

demo: build
	@scripts/deps.sh vm
	scripts/demo.sh $(BUILD)/vmsnap
	guest/demo.sh $(BUILD)/vmsnap

# every libFuzzer target for FUZZ_SECONDS each (default 60) on a copy of its corpus: executions,
# new corpus entries and findings per target; fails on any finding
FUZZ_SECONDS ?= 60
fuzz: deps
	scripts/fuzz.sh $(FUZZ_SECONDS)

bench: build
	@scripts/deps.sh bench
	bench/codec.sh $(BUILD)/vmsnap

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) build-fuzz
