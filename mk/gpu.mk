# GPU path: the GPU image, the linters that keep its Dockerfile and the GPU check script correct
# on machines without Docker or a GPU, and the GPU check itself. The CPU tests of packages nccl
# and horovod/ncclbackend run in go-test like every other package.

.PHONY: docker-gpu lint-gpu test-gpu-agreement gpu-check gpu-check-bundle
TEST_TARGETS += lint-gpu test-gpu-agreement

DOCKER    ?= docker
GPU_IMAGE ?= gorovod:gpu

# Needs a Docker engine with BuildKit (docker/gpu.Dockerfile.dockerignore is read by BuildKit).
docker-gpu:
	DOCKER_BUILDKIT=1 $(DOCKER) build -f $(ROOT)/docker/gpu.Dockerfile -t $(GPU_IMAGE) $(ROOT)

# hadolint and shellcheck come from the virtualenv (requirements.txt).
lint-gpu: $(VENV_STAMP)
	$(VENV)/bin/hadolint $(ROOT)/docker/gpu.Dockerfile
	$(VENV)/bin/shellcheck $(ROOT)/scripts/gpu-check.sh

# A two-rank job where rank 0 can set up NCCL (over nccl/testdata/fakelib.c, built here) and
# rank 1 cannot: both must fail Open with the same account of who failed, and neither may hang.
# Its test binary links Open MPI, which make debs installs.
test-gpu-agreement: debs
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	gcc -shared -fPIC -DFAKE_CUDA -o $$tmp/libcudart.so $(ROOT)/nccl/testdata/fakelib.c; \
	gcc -shared -fPIC -DFAKE_NCCL -o $$tmp/libnccl.so $(ROOT)/nccl/testdata/fakelib.c; \
	$(GO) test -c -o $$tmp/ncclbackend.test $(ROOT)/horovod/ncclbackend; \
	run="env GOROVOD_TEST_SETUP_AGREEMENT=1 FAKE_CUDA_DEVICES=2 GOROVOD_NCCL_LIBRARY=$$tmp/libnccl.so"; \
	timeout 120 $(MPIRUN) \
	  -np 1 $$run GOROVOD_CUDART_LIBRARY=$$tmp/libcudart.so $$tmp/ncclbackend.test -test.run SetupAgreementUnderMpirun : \
	  -np 1 $$run GOROVOD_CUDART_LIBRARY=/nonexistent/libcudart.so.12 $$tmp/ncclbackend.test -test.run SetupAgreementUnderMpirun

# On a machine with a GPU, or inside the image:
#   docker run --gpus all --ipc=host --rm $(GPU_IMAGE) scripts/gpu-check.sh
# (--ipc=host: NCCL's processes share memory through /dev/shm, beyond Docker's default 64 MB).
gpu-check:
	$(ROOT)/scripts/gpu-check.sh

# For a GPU host without Go: the check's test binaries, the OpenMPI libraries the backend's
# binary links, and COMMIT (the commit built, "-dirty" when the directories of the packages
# built in have changes or new files), for scripts/gpu-check.sh --prebuilt $(GPU_CHECK_BUNDLE) in a checkout there. NCCL and
# CUDA are the host's: they are dlopened. The libraries are an allow-list: OpenMPI's own and
# the hwloc and libevent it links; the C library, libudev (for hwloc) and libz (for
# libopen-rte) are the host's, as every Debian/Ubuntu image with apt has them (libapt-pkg
# depends on libudev1 and zlib1g), CUDA's base images included. The bundle runs on a glibc no
# older than this machine's (printed at the end; Debian 12's libevent needs 2.36).
# The directory is removed before a build only when it holds the bundle's marker file (so an
# overridden GPU_CHECK_BUNDLE never empties anything else).
GPU_CHECK_BUNDLE ?= $(ROOT)/build/gpu-check
GPU_CHECK_BUNDLE_MARKER = .gorovod-gpu-check-bundle
gpu-check-bundle: debs
	@dir='$(GPU_CHECK_BUNDLE)'; \
	if [ -z "$$dir" ]; then echo 'gpu-check-bundle: GPU_CHECK_BUNDLE is empty' >&2; exit 1; \
	elif [ -f "$$dir/$(GPU_CHECK_BUNDLE_MARKER)" ]; then rm -rf "$$dir"; \
	elif [ -e "$$dir" ] && [ -n "$$(ls -A "$$dir")" ]; then \
	  echo "gpu-check-bundle: $$dir is not empty and has no $(GPU_CHECK_BUNDLE_MARKER): not a bundle, left alone" >&2; exit 1; \
	fi; \
	mkdir -p "$$dir/lib" && touch "$$dir/$(GPU_CHECK_BUNDLE_MARKER)"
	$(GO) test -c -o $(GPU_CHECK_BUNDLE)/nccl.test $(ROOT)/nccl
	$(GO) test -c -o $(GPU_CHECK_BUNDLE)/ncclbackend.test $(ROOT)/horovod/ncclbackend
	$(GO) test -c -o $(GPU_CHECK_BUNDLE)/horovod.test $(ROOT)/horovod
	@deps=$$(ldd '$(GPU_CHECK_BUNDLE)/ncclbackend.test') || exit 1; \
	if echo "$$deps" | grep 'not found'; then echo 'gpu-check-bundle: ncclbackend.test has unresolved libraries (above)' >&2; exit 1; fi; \
	echo "$$deps" | awk '$$2 == "=>" && $$3 ~ /^\// { n = split($$3, p, "/"); \
	  if (p[n] ~ /^lib(mpi|open-rte|open-pal|hwloc)\.so|^libevent[^\/]*\.so/) print $$3 }' \
	  | xargs -r cp -L -t '$(GPU_CHECK_BUNDLE)/lib' && ls '$(GPU_CHECK_BUNDLE)'/lib/libmpi.so.* >/dev/null
	@cd $(ROOT) && pkgs=$$($(GO) list -deps -test -f '{{with .Module}}{{if .Main}}{{$$.Dir}}{{end}}{{end}}' ./nccl ./horovod/ncclbackend) || exit 1; \
	if ! commit=$$(git rev-parse HEAD 2>/dev/null); then : no checkout, no commit; \
	elif git diff --quiet HEAD -- $$pkgs && [ -z "$$(git ls-files --others --exclude-standard -- $$pkgs)" ]; then echo "$$commit"; \
	else echo "$$commit-dirty"; fi > '$(GPU_CHECK_BUNDLE)/COMMIT'
	@glibc=$$(objdump -T '$(GPU_CHECK_BUNDLE)'/*.test '$(GPU_CHECK_BUNDLE)'/lib/* | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1); \
	echo "gpu-check-bundle: $(GPU_CHECK_BUNDLE), $$(du -sh '$(GPU_CHECK_BUNDLE)' | cut -f1), commit $$(cat '$(GPU_CHECK_BUNDLE)/COMMIT'), needs glibc >= $${glibc#GLIBC_}"
