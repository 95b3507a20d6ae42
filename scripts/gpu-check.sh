#!/usr/bin/env bash
# gpu-check.sh: prove the GPU path on a machine with an NVIDIA GPU, in under 5 minutes.
#
#   scripts/gpu-check.sh                                  # in a checkout, with Go
#   scripts/gpu-check.sh --prebuilt build/gpu-check       # in a checkout, without Go
#   docker run --gpus all --rm gorovod:gpu scripts/gpu-check.sh
#
# 1. builds gorovod (go vet, go build, and the test binaries of nccl and horovod/ncclbackend);
#    with --prebuilt DIR it takes those test binaries from DIR instead (`make gpu-check-bundle`
#    makes DIR on a machine with Go, with the OpenMPI libraries the backend's binary links in
#    DIR/lib), for GPU hosts that have no Go toolchain;
# 2. runs the GPU tests of package nccl with the real CUDA runtime and NCCL: placement by local
#    rank and the NVML description, pinned host <-> device staging, allreduce (sum, average,
#    min, max, product) of float32, float16, int32 and float64, broadcast, and with two or more
#    GPUs a two-rank allreduce with exact expected sums;
# 3. runs the NCCL backend's tests at size 1, which compare every collective against the CPU
#    (local) backend byte for byte, and with two or more GPUs a job of one rank per GPU (up to
#    8) comparing the NCCL backend with the MPI backend;
# 4. measures host <-> device staging bandwidth (128 MiB, pinned), the fp16
#    compress -> stage -> allreduce -> stage -> decompress time for 128 MiB of float32
#    gradients, and the same staged allreduce for one BERT-base step's gradients (float32, fp16);
# 5. prints one verdict line: "gpu-check: PASS ..." or "gpu-check: FAIL ...". A failing step
#    does not stop the later ones: the verdict names every step that failed.
#
# GOROVOD_REQUIRE_GPU=1 turns the tests' "no GPU: skip" into failures. The libraries are found
# as package nccl always finds them (GOROVOD_CUDART_LIBRARY / GOROVOD_NCCL_LIBRARY, sonames,
# the nvidia-* pip wheels); a failure lists every place looked.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
export GOROVOD_REQUIRE_GPU=1
GO=${GO:-go}
prebuilt=
case "${1:-}" in
--prebuilt)
	[ -n "${2:-}" ] || { echo "gpu-check: --prebuilt needs a directory" >&2; exit 2; }
	prebuilt=$(cd "$2" && pwd) || exit 2
	;;
"") ;;
*) echo "usage: $0 [--prebuilt DIR]" >&2; exit 2 ;;
esac
log=$(mktemp -d /tmp/gpu-check.XXXXXX)
start=$SECONDS
failed=()

# step NAME SECONDS CMD...: run CMD with a time limit (never past the 5-minute budget), its
# output in $log/NAME.log and on screen; a failure is recorded and the check goes on.
step() {
	local name=$1 limit=$2 left=$((300 - (SECONDS - start)))
	shift 2
	if [ "$left" -le 0 ]; then
		failed+=("$name (no time left)")
		return 1
	fi
	[ "$limit" -le "$left" ] || limit=$left
	echo "== $name"
	timeout "$limit" "$@" 2>&1 | tee "$log/$name.log"
	local rc=${PIPESTATUS[0]}
	[ "$rc" -eq 0 ] && return 0
	failed+=("$name (exit $rc)")
	return 1
}

gpu="unknown GPU"
if command -v nvidia-smi >/dev/null; then
	gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
	echo "== GPUs"
	nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,driver_version --format=csv
fi

bin=$prebuilt
if [ -n "$prebuilt" ]; then
	echo "== test binaries from $prebuilt (no build)"
	export LD_LIBRARY_PATH="$prebuilt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
	bin=$log
	step vet 120 "$GO" vet ./nccl/... ./horovod/ncclbackend/...
	if [ -e third_party/tensorflow/lib/libtensorflow_cc.so ]; then
		step build 150 "$GO" build ./...
	else
		echo "== build: third_party/tensorflow is not laid out (run make setup); building the GPU packages only"
		step build 120 "$GO" build ./nccl/... ./horovod/ncclbackend/...
	fi
	step test-binaries 120 sh -c "$GO test -c -o $bin/nccl.test ./nccl/ && $GO test -c -o $bin/ncclbackend.test ./horovod/ncclbackend/"
fi

# Test binaries run in their package's directory: they read testdata relative to it.
step nccl-gpu-tests 90 env -C "$root/nccl" "$bin/nccl.test" -test.count=1 -test.v -test.run GPU
step backend-tests 90 env -C "$root/horovod/ncclbackend" "$bin/ncclbackend.test" -test.count=1 -test.v
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
	if step backend-vs-mpi 120 env -C "$root/horovod/ncclbackend" mpirun -np "$np" --bind-to none \
		-x GOROVOD_REQUIRE_GPU -x LD_LIBRARY_PATH "$bin/ncclbackend.test" -test.run UnderMpirun -test.v; then
		multi="$np ranks agree with MPI"
	else
		multi="FAILED with $np ranks"
	fi
fi
step staging-bench 60 env -C "$root/nccl" "$bin/nccl.test" -test.count=1 -test.run '^$' -test.bench GPUStaging -test.benchtime 20x
step fp16-bench 120 env -C "$root/horovod/ncclbackend" "$bin/ncclbackend.test" -test.count=1 -test.run '^$' \
	-test.bench 'FP16Pipeline|Staging|BERTBaseStep' -test.benchtime 5x

# Benchmark lines: "BenchmarkGPUStaging/HostToDevice-16  20  5312345 ns/op  25265.12 MB/s".
mbps() { awk -v b="$1" '$1 ~ b { for (i = 1; i <= NF; i++) if ($i == "MB/s") printf "%.1f", $(i-1) / 1000 }' "$2" 2>/dev/null; }
msop() { awk -v b="$1" '$1 ~ b { for (i = 1; i <= NF; i++) if ($i == "ns/op") printf "%.1f", $(i-1) / 1e6 }' "$2" 2>/dev/null; }
h2d=$(mbps 'HostToDevice' "$log/staging-bench.log")
d2h=$(mbps 'DeviceToHost' "$log/staging-bench.log")
fp16=$(msop '^BenchmarkFP16Pipeline' "$log/fp16-bench.log")
stage=$(msop '^BenchmarkStaging' "$log/fp16-bench.log")
bert32=$(msop '^BenchmarkBERTBaseStep/float32' "$log/fp16-bench.log")
bert16=$(msop '^BenchmarkBERTBaseStep/fp16' "$log/fp16-bench.log")
placed=$(grep -m1 -o 'GPU 0 .*' "$log/nccl-gpu-tests.log" 2>/dev/null || true)
[ -n "$h2d" ] && [ -n "$d2h" ] && [ -n "$fp16" ] && [ -n "$stage" ] && [ -n "$bert32" ] && [ -n "$bert16" ] ||
	failed+=("reading the benchmark figures")

elapsed=$((SECONDS - start))
echo "== figures ($(date -u +%F), $gpu)"
echo "   $placed"
echo "   pinned staging, 128 MiB: host->device ${h2d:-?} GB/s, device->host ${d2h:-?} GB/s"
echo "   NCCL backend allreduce of 128 MiB float32 at size 1 (Go copy -> pinned -> device -> pinned -> Go): ${stage:-?} ms"
echo "   fp16 compress -> stage -> allreduce -> stage -> decompress, 128 MiB of float32 gradients: ${fp16:-?} ms"
echo "   one BERT-base step's gradients (109,483,778 float32) through the same path: ${bert32:-?} ms, fp16-compressed ${bert16:-?} ms"
[ "$elapsed" -lt 300 ] || failed+=("the 5-minute budget (${elapsed}s)")
if [ ${#failed[@]} -gt 0 ]; then
	echo "gpu-check: FAIL after ${elapsed}s on ${gpu}: $(IFS=';'; echo "${failed[*]}") (logs: $log)"
	exit 1
fi
echo "gpu-check: PASS in ${elapsed}s on ${gpu} (multi-GPU: ${multi}): H2D ${h2d} GB/s, D2H ${d2h} GB/s, fp16 pipeline 128 MiB ${fp16} ms, staged allreduce 128 MiB ${stage} ms, BERT-base step ${bert32} ms (fp16 ${bert16} ms)"
