# GPU path: the GPU image, the linters that keep its Dockerfile and the GPU check script correct
# on machines without Docker or a GPU, and the GPU check itself. The CPU tests of packages nccl
# and horovod/ncclbackend run in go-test like every other package.

.PHONY: docker-gpu lint-gpu gpu-check
TEST_TARGETS += lint-gpu

DOCKER    ?= docker
GPU_IMAGE ?= gorovod:gpu

# Needs a Docker engine with BuildKit (docker/gpu.Dockerfile.dockerignore is read by BuildKit).
docker-gpu:
	DOCKER_BUILDKIT=1 $(DOCKER) build -f $(ROOT)/docker/gpu.Dockerfile -t $(GPU_IMAGE) $(ROOT)

# hadolint and shellcheck come from the virtualenv (requirements.txt).
lint-gpu: $(VENV_STAMP)
	$(VENV)/bin/hadolint $(ROOT)/docker/gpu.Dockerfile
	$(VENV)/bin/shellcheck $(ROOT)/scripts/gpu-check.sh

# On a machine with a GPU (or inside the image: docker run --gpus all $(GPU_IMAGE) scripts/gpu-check.sh).
gpu-check:
	$(ROOT)/scripts/gpu-check.sh
