# hybrid: a thin wrapper over CMake.
#   make deps   install missing Debian packages (apt-get; root or sudo), or say what to install
#   make        build; the programs land at the repository root (./hybrid, ./hybrid-compare, ...)
#   make test   deps + build + every test (ctest), plus the loader tests under ASan/UBSan
#   make demo   deps + build + run the bundled model on a prompt
# Variables: BUILD (build dir), JOBS, CMAKE_ARGS (extra -D flags, e.g. -DHY_CUDA=OFF).

BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
PROGRAMS := hybrid hybrid-compare hybrid-tokenize hybrid-bench

# Debian packages the build needs (binary name -> package is checked by dpkg-query).
DEB_PACKAGES := cmake g++ make pkg-config catch2 libcxxopts-dev nlohmann-json3-dev libpcre2-dev \
                libutf8proc-dev libreadline-dev

.PHONY: all build deps test demo clean format asan-test

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

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)
	@for p in $(PROGRAMS); do [ -f $(BUILD)/$$p ] && ln -sf $(BUILD)/$$p $$p || true; done

# Tests run one at a time: each one already uses every core (the CPU backend's thread pool), and two at once would
# oversubscribe them.
test: deps build asan-test
	cd $(BUILD) && ctest --output-on-failure --timeout 1800

# The safetensors/config/weights loader under AddressSanitizer and UndefinedBehaviorSanitizer.
asan-test:
	@[ -f $(ASAN_BUILD)/CMakeCache.txt ] || cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug \
	    -DHY_SANITIZE=ON -DHY_CUDA=OFF -DHY_TESTS_ONLY=ON $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target hybrid-tests
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	    ./hybrid-tests "[loader]"

# The bundled tiny model continues a Python prompt (greedy); --verbose prints the timing summary on stderr even
# when it is not a terminal.
demo: deps build
	./hybrid -m models/tiny -p 'def fibonacci(n):\n    ' -n 64 --temp 0 --verbose

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp' '*.c' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(PROGRAMS)
