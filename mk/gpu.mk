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
test-gpu-agreement:
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	gcc -shared -fPIC -DFAKE_CUDA -o $$tmp/libcudart.so $(ROOT)/nccl/testdata/fakelib.c; \
	gcc -shared -fPIC -DFAKE_NCCL -o $$tmp/libnccl.so $(ROOT)/nccl/testdata/fakelib.c; \
	$(GO) test -c -o $$tmp/ncclbackend.test $(ROOT)/horovod/ncclbackend; \
	run="env GOROVOD_TEST_SETUP_AGREEMENT=1 FAKE_CUDA_DEVICES=2 GOROVOD_NCCL_LIBRARY=$$tmp/libnccl.so"; \
	timeout 120 $(MPIRUN) \
	  -np 1 $$run GOROVOD_CUDART_LIBRARY=$$tmp/libcudart.so $$tmp/ncclbackend.test -test.run SetupAgreementUnderMpirun : \
	  -np 1 $$run GOROVOD_CUDART_LIBRARY=/nonexistent/libcudart.so.12 $$tmp/ncclbackend.test -test.run SetupAgreementUnderMpirun

# On a machine with a GPU (or inside the image: docker run --gpus all $(GPU_IMAGE) scripts/gpu-check.sh).
gpu-check:
	$(ROOT)/scripts/gpu-check.sh

# For a GPU host without Go: the check's test binaries and the OpenMPI libraries the backend's
# binary links (ldd's list minus the C library's own), for scripts/gpu-check.sh --prebuilt
# $(GPU_CHECK_BUNDLE) in a checkout there. NCCL and CUDA are the host's: they are dlopened.
GPU_CHECK_BUNDLE ?= $(ROOT)/build/gpu-check
gpu-check-bundle:
	rm -rf $(GPU_CHECK_BUNDLE) && mkdir -p $(GPU_CHECK_BUNDLE)/lib
	$(GO) test -c -o $(GPU_CHECK_BUNDLE)/nccl.test $(ROOT)/nccl
	$(GO) test -c -o $(GPU_CHECK_BUNDLE)/ncclbackend.test $(ROOT)/horovod/ncclbackend
	ldd $(GPU_CHECK_BUNDLE)/ncclbackend.test | awk '$$2 == "=>" && $$3 ~ /^\// { print $$3 }' \
	  | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' \
	  | xargs -r cp -L -t $(GPU_CHECK_BUNDLE)/lib
	@du -sh $(GPU_CHECK_BUNDLE)
