# syntax=docker/dockerfile:1
#
# gorovod for GPUs: the GPU build of the pinned TensorFlow (its C library laid out by the same
# `make venv tflib` as on CPU machines, with TF_PACKAGE='tensorflow[and-cuda]'), the CUDA and
# NCCL wheels it depends on, OpenMPI, Go, and the gorovod binaries built inside.
#
#   make docker-gpu                       # docker build -f docker/gpu.Dockerfile -t gorovod:gpu .
#   docker run --gpus all --rm -it --ipc=host gorovod:gpu \
#     mpirun -np 8 finetune --do_train --do_eval --saved_model=... --data_dir=... --output_dir=...
#   (README, GPUs: the whole command with the image's paths)
#
# The CUDA user-space libraries come from the pip wheels TensorFlow pins (CUDA 12.x, cuDNN 9,
# NCCL 2.x), so the base image needs only the CUDA base layer; the driver and libnvidia-ml are
# mounted at run time by the NVIDIA container toolkit (--gpus). The base image's documented
# environment (NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES=compute,utility) is what
# NCCL (compute) and NVML (utility) need.

ARG CUDA_IMAGE=nvidia/cuda:12.9.1-base-ubuntu24.04
ARG GO_IMAGE=golang:1.26-bookworm

FROM ${GO_IMAGE} AS go

FROM ${CUDA_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Ubuntu packages: gcc, make and pkg-config for cgo (horovod/mpi finds OpenMPI through
# pkg-config) and the Makefile, Python for the TensorFlow wheel,
# OpenMPI for the MPI backend and mpirun (openssh-client: mpirun starts remote ranks over ssh).
# Versions follow the base image's Ubuntu release.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates gcc g++ make pkg-config git python3 python3-venv \
      openmpi-bin libopenmpi-dev openssh-client \
 && rm -rf /var/lib/apt/lists/*

COPY --from=go /usr/local/go /usr/local/go
# GOTOOLCHAIN=local: build with the Go copied above, never download another.
ENV PATH=/opt/gorovod/.venv/bin:/usr/local/go/bin:$PATH \
    GOFLAGS=-buildvcs=false \
    GOTOOLCHAIN=local \
    OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

WORKDIR /opt/gorovod

# The virtualenv and TensorFlow first: they change only with requirements.txt or the pinned
# version, so source edits do not re-download them. third_party/tensorflow/VERSION is the one
# place the version is written. -o debs: the Debian packages are installed above, and make's
# debs would add Node.js and npm (for `make data`, not run here: .cache is mounted).
COPY Makefile requirements.txt ./
COPY third_party/tensorflow/VERSION third_party/tensorflow/VERSION
RUN make -o debs venv tflib TF_PACKAGE='tensorflow[and-cuda]' \
 && rm -rf /root/.cache/pip

# TensorFlow's CUDA libraries and NCCL live in the nvidia-* wheels under site-packages/nvidia/*/lib.
# gorovod binaries load TensorFlow through the third_party/tensorflow/lib links, where the
# wheel's $ORIGIN-relative RUNPATH does not lead to them, so register them with the dynamic
# linker; package nccl then finds libnccl.so.2 and libcudart.so.12 by soname too. The cache's
# listing is searched from a file: `ldconfig -p | grep -q` under pipefail fails now and then
# though grep matched (ldconfig's next write after grep exits gets SIGPIPE).
RUN site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && ls -d "$site"/nvidia/*/lib > /etc/ld.so.conf.d/zz-nvidia-wheels.conf \
 && ldconfig \
 && ldconfig -p > /tmp/ld-cache.txt \
 && grep -q 'libnccl.so.2 ' /tmp/ld-cache.txt \
 && grep -q 'libcudart.so.12 ' /tmp/ld-cache.txt \
 && grep -q 'libcudnn.so.9 ' /tmp/ld-cache.txt \
 && rm /tmp/ld-cache.txt \
 && .venv/bin/python -c "import tensorflow as tf; b = tf.sysconfig.get_build_info(); assert b['is_cuda_build'], b; print('TensorFlow', tf.__version__, 'CUDA', b['cuda_version'], 'cuDNN', b['cudnn_version'])"

COPY go.mod go.sum ./
RUN go mod download

COPY . .
# The binaries, then the tests that need no GPU for the GPU packages (the GPU tests skip here:
# there is no GPU at build time; scripts/gpu-check.sh runs them in a container with one).
RUN go build -o /usr/local/bin/ ./cmd/... \
 && go test -count=1 ./nccl/ ./horovod/ncclbackend/ \
 && rm -rf /root/.cache/go-build

CMD ["/bin/bash"]
