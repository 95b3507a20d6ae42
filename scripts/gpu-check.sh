#!/usr/bin/env bash
# gpu-check.sh: prove the GPU path on a machine with an NVIDIA GPU, in under 5 minutes.
#
#   scripts/gpu-check.sh                                  # in a checkout after `make setup`
#   docker run --gpus all --rm gorovod:gpu scripts/gpu-check.sh
#
# 1. builds gorovod (go vet and go build of every package);
# 2. runs the GPU tests of package nccl with the real CUDA runtime and NCCL: placement by local
#    rank and the NVML description, pinned host <-> device staging, allreduce (sum, average,
#    min, max, product) of float32, float16, int32 and float64, broadcast, and with two or more
#    GPUs a two-rank allreduce with exact expected sums;
# 3. runs the NCCL backend's tests at size 1, which compare every collective against the CPU
#    (local) backend byte for byte, and with two or more GPUs a job of one rank per GPU (up to
#    8) comparing the NCCL backend with the MPI backend;
# 4. measures host <-> device staging bandwidth (128 MiB, pinned) and the fp16
#    compress -> stage -> allreduce -> stage -> decompress time for 128 MiB of float32 gradients;
# 5. prints one verdict line: "gpu-check: PASS ..." or "gpu-check: FAIL ...".
#
# GOROVOD_REQUIRE_GPU=1 turns the tests' "no GPU: skip" into failures. The libraries are found
# as package nccl always finds them (GOROVOD_CUDART_LIBRARY / GOROVOD_NCCL_LIBRARY, sonames,
# the nvidia-* pip wheels); a failure lists every place looked.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export GOROVOD_REQUIRE_GPU=1
GO=${GO:-go}
log=$(mktemp -d /tmp/gpu-check.XXXXXX)
start=$SECONDS

fail() {
	echo "gpu-check: FAIL at $1 after $((SECONDS - start))s (logs: $log)"
	exit 1
}

# step NAME SECONDS CMD...: run CMD with a time limit (never past the 5-minute budget), its
# output in $log/NAME.log and on screen.
step() {
	local name=$1 limit=$2 left=$((300 - (SECONDS - start)))
	shift 2
	[ "$left" -gt 0 ] || fail "the 5-minute budget, before $name"
	[ "$limit" -le "$left" ] || limit=$left
	echo "== $name"
	timeout "$limit" "$@" 2>&1 | tee "$log/$name.log"
	local rc=${PIPESTATUS[0]}
	[ "$rc" -eq 0 ] || fail "$name (exit $rc)"
}

gpu="unknown GPU"
if command -v nvidia-smi >/dev/null; then
	gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
	echo "== GPUs"
	nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,driver_version --format=csv
fi

step vet 120 "$GO" vet ./nccl/... ./horovod/ncclbackend/...
if [ -e third_party/tensorflow/lib/libtensorflow_cc.so ]; then
	step build 150 "$GO" build ./...
else
	echo "== build: third_party/tensorflow is not laid out (run make setup); building the GPU packages only"
	step build 120 "$GO" build ./nccl/... ./horovod/ncclbackend/...
fi
step nccl-gpu-tests 90 "$GO" test -count=1 -v -run 'GPU' ./nccl/
step backend-tests 90 "$GO" test -count=1 -v ./horovod/ncclbackend/
# With two or more GPUs: a real job, one rank per GPU, comparing the NCCL backend with the MPI
# backend on rank-dependent data (allreduce of every dtype and op, broadcast from every root,
# allgatherv with uneven counts).
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
multi="not run (fewer than 2 GPUs)"
if [ "${ngpu:-0}" -ge 2 ]; then
	np=$((ngpu < 8 ? ngpu : 8))
	if [ "$(id -u)" = 0 ]; then
		export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
	fi
	step backend-test-binary 120 "$GO" test -c -o "$log/ncclbackend.test" ./horovod/ncclbackend/
	step backend-vs-mpi 120 mpirun -np "$np" --bind-to none -x GOROVOD_REQUIRE_GPU \
		"$log/ncclbackend.test" -test.run UnderMpirun -test.v
	multi="$np ranks agree with MPI"
fi
step staging-bench 60 "$GO" test -count=1 -run '^$' -bench 'GPUStaging' -benchtime 20x ./nccl/
step fp16-bench 90 "$GO" test -count=1 -run '^$' -bench 'FP16Pipeline|Staging' -benchtime 5x ./horovod/ncclbackend/

# Benchmark lines: "BenchmarkGPUStaging/HostToDevice-16  20  5312345 ns/op  25265.12 MB/s".
mbps() { awk -v b="$1" '$1 ~ b { for (i = 1; i <= NF; i++) if ($i == "MB/s") printf "%.1f", $(i-1) / 1000 }' "$2"; }
msop() { awk -v b="$1" '$1 ~ b { for (i = 1; i <= NF; i++) if ($i == "ns/op") printf "%.1f", $(i-1) / 1e6 }' "$2"; }
h2d=$(mbps 'HostToDevice' "$log/staging-bench.log")
d2h=$(mbps 'DeviceToHost' "$log/staging-bench.log")
fp16=$(msop '^BenchmarkFP16Pipeline' "$log/fp16-bench.log")
stage=$(msop '^BenchmarkStaging' "$log/fp16-bench.log")
placed=$(grep -m1 -o 'GPU 0 .*' "$log/nccl-gpu-tests.log" || true)
[ -n "$h2d" ] && [ -n "$d2h" ] && [ -n "$fp16" ] && [ -n "$stage" ] || fail "reading the benchmark figures"

elapsed=$((SECONDS - start))
echo "== figures ($(date -u +%F), $gpu)"
echo "   $placed"
echo "   pinned staging, 128 MiB: host->device ${h2d} GB/s, device->host ${d2h} GB/s"
echo "   NCCL backend allreduce of 128 MiB float32 at size 1 (Go copy -> pinned -> device -> pinned -> Go): ${stage} ms"
echo "   fp16 compress -> stage -> allreduce -> stage -> decompress, 128 MiB of float32 gradients: ${fp16} ms"
[ "$elapsed" -lt 300 ] || fail "the 5-minute budget (${elapsed}s)"
echo "gpu-check: PASS in ${elapsed}s on ${gpu} (multi-GPU: ${multi}): H2D ${h2d} GB/s, D2H ${d2h} GB/s, fp16 pipeline 128 MiB ${fp16} ms, staged allreduce 128 MiB ${stage} ms"
