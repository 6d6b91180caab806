# hybrid: a thin wrapper over CMake.
#   make deps   install missing Debian packages (apt-get; root or sudo), or say what to install
#   make        build; the programs land at the repository root (./hybrid, ./hybrid-compare, ...)
#   make test   deps + format-check + build + every test (ctest), plus the CPU tests under ASan/UBSan
#   make demo   deps + build the hybrid program alone (for this machine) + run the bundled model on a prompt
#   make format        clang-format -i over the C/C++/CUDA sources (.clang-format at the root)
#   make format-check  fail, listing them, if any of those sources is not formatted (clang-format --dry-run -Werror)
# Variables: BUILD (build dir), JOBS, CMAKE_ARGS (extra -D flags, e.g. -DHY_CUDA=OFF), ASAN_TESTS (the Catch2 test
# spec make test runs under the sanitizers: '~[gpu]', the whole CPU suite, by default; e.g. [loader] for a quick run).

BUILD ?= build
ASAN_BUILD ?= build-asan
DEMO_BUILD ?= build-demo
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
PROGRAMS := hybrid hybrid-compare hybrid-tokenize hybrid-bench hybrid-server hybrid-server-bench hybrid-perplexity

# Debian packages the build needs (binary name -> package is checked by dpkg-query).
DEB_PACKAGES := cmake g++ make pkg-config catch2 libcxxopts-dev nlohmann-json3-dev libpcre2-dev \
                libutf8proc-dev libreadline-dev clang-format libcpp-httplib-dev

# The sources `make format` and `make format-check` cover: every tracked C/C++/CUDA file (tests/data is test data).
FORMAT_FILES = $(shell git ls-files '*.h' '*.cpp' '*.c' '*.cu' '*.cuh' ':!:tests/data/**' 2>/dev/null)

.PHONY: all build deps test demo clean format format-check asan-test

all: build

deps:
	@missing=""; \
	for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then echo "deps: all present"; exit 0; fi; \
	echo "deps: installing$$missing"; \
	if [ "$$(id -u)" = 0 ]; then SUDO=""; \
	elif command -v sudo >/dev/null 2>&1; then SUDO="sudo"; \
	else echo "deps: missing packages:$$missing -- run as root: apt-get install$$missing" >&2; exit 1; fi; \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

# (CMAKE_ARGS given to a build folder already configured: applied to it too, not silently ignored)
build: $(BUILD)/CMakeCache.txt
	@if [ -n "$(strip $(CMAKE_ARGS))" ]; then cmake -S . -B $(BUILD) $(CMAKE_ARGS) >/dev/null || exit 1; fi
	cmake --build $(BUILD) -j $(JOBS)
	@for p in $(PROGRAMS); do [ -f $(BUILD)/$$p ] && ln -sf $(BUILD)/$$p $$p || true; done

# Tests run one at a time: each one already uses every core (the CPU backend's thread pool), and two at once would
# oversubscribe them. format-check runs after deps (which installs clang-format) and before the build.
test: deps format-check build asan-test
	cd $(BUILD) && ctest --output-on-failure --timeout 1800

# The CPU test suite under AddressSanitizer (leaks included) and UndefinedBehaviorSanitizer: 2 min 31 s to 2 min 47
# s of running on 2 cores (the [cli] tests need the programs, which this build leaves out, and skip);
# ASAN_TESTS=[loader] runs only the loader's tests (12 s).
ASAN_TESTS ?= ~[gpu]
asan-test:
	@[ -f $(ASAN_BUILD)/CMakeCache.txt ] || cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug \
	    -DHY_SANITIZE=ON -DHY_CUDA=OFF -DHY_TESTS_ONLY=ON $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target hybrid-tests
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	    ./hybrid-tests "$(ASAN_TESTS)"

# The bundled tiny model continues a Python prompt (greedy); --verbose prints the timing summary on stderr even
# when it is not a terminal. Only the hybrid program is built (not the tests and tools): in $(BUILD) when it is
# configured already, else in $(DEMO_BUILD), configured for this machine: CUDA code for the local GPU's architecture
# alone when nvidia-smi lists a GPU, no CUDA without one (make test and CI configure $(BUILD) with every
# architecture).
demo: deps
	@d=$(BUILD); \
	if [ ! -f $$d/CMakeCache.txt ]; then \
	  d=$(DEMO_BUILD); \
	  if [ ! -f $$d/CMakeCache.txt ]; then \
	    if command -v nvcc >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then \
	      cuda="-DCMAKE_CUDA_ARCHITECTURES=native"; \
	    else cuda="-DHY_CUDA=OFF"; fi; \
	    echo "cmake -S . -B $$d -DCMAKE_BUILD_TYPE=Release $$cuda $(CMAKE_ARGS)"; \
	    cmake -S . -B $$d -DCMAKE_BUILD_TYPE=Release $$cuda $(CMAKE_ARGS) || exit 1; \
	  fi; \
	fi; \
	cmake --build $$d -j $(JOBS) --target hybrid || exit 1; \
	ln -sf $$d/hybrid hybrid; \
	printf '%s\n' "./hybrid -m models/tiny -p 'def fibonacci(n):\n    ' -n 64 --temp 0 --verbose"; \
	./hybrid -m models/tiny -p 'def fibonacci(n):\n    ' -n 64 --temp 0 --verbose

format:
	@[ -n "$(FORMAT_FILES)" ] || { echo "format: no sources listed (not a git checkout?)" >&2; exit 1; }
	clang-format -i $(FORMAT_FILES)

# One clang-format call per file, so that every unformatted file is named. The formatting itself depends on the
# clang-format version: the tree is formatted with clang-format 14 (Debian 12's), and another major version only
# gets a note, not a failure (it would reformat lines that 14 leaves alone).
FORMAT_VERSION := 14
format-check:
	@[ -n "$(FORMAT_FILES)" ] || { echo "format-check: no sources listed (not a git checkout?)" >&2; exit 1; }
	@command -v clang-format >/dev/null 2>&1 || { echo "format-check: clang-format not found (make deps)" >&2; exit 1; }
	@v=$$(clang-format --version | sed -n 's/.*version \([0-9]*\).*/\1/p'); \
	if [ "$$v" != "$(FORMAT_VERSION)" ]; then \
	  echo "format-check: skipped: clang-format $$v, the tree is formatted with clang-format $(FORMAT_VERSION)"; exit 0; \
	fi; \
	bad=""; \
	for f in $(FORMAT_FILES); do \
	  clang-format --dry-run -Werror "$$f" >/dev/null 2>&1 || bad="$$bad $$f"; \
	done; \
	if [ -n "$$bad" ]; then \
	  echo "format-check: not formatted ($$(clang-format --version)); run make format:" >&2; \
	  for f in $$bad; do echo "  $$f" >&2; done; \
	  exit 1; \
	fi; \
	echo "format-check: $(words $(FORMAT_FILES)) files formatted"

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(DEMO_BUILD) $(PROGRAMS)
