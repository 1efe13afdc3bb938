# smddp — the two commands a developer types:
#   make demo   the main job: a 4-process training run with backend="smddp", beside gloo
#   make test   everything CI checks (see tools/test-all)
# Both do their own set-up on a fresh Debian machine (host packages, hermetic torch roots).

.PHONY: all build test demo bench clean devenv-down format torch-suite gpu-check

all: build

build:
	tools/host-deps
	cmake -S . -B build/host -G Ninja -DSMDDP_BUILD_TESTS=ON -DSMDDP_BUILD_BENCHMARKS=ON
	cmake --build build/host

test:
	tools/test-all

demo:
	tools/demo

# torch's own distributed suite for gloo and smddp, both Debian suites, w=2 and 3: the table in
# docs/torch-suite.md (long; make test runs a fixed part of it).
torch-suite:
	tools/torch-suite

# The GPU suite on a machine with a GPU (docs/gpu.md); without one it fails, saying the tests skipped.
gpu-check:
	tools/gpu-check

clean:
	rm -rf build

# Unmount the devenv roots' kernel filesystems (they stay mounted between runs for speed).
devenv-down:
	tools/devenv down --all

format:
	find include src tests benchmarks python -name '*.h' -o -name '*.cc' -o -name '*.cu' | xargs clang-format -i
