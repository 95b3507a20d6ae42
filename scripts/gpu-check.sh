#!/usr/bin/env bash
# gpu-check.sh: prove the GPU path on a machine with an NVIDIA GPU, in under 5 minutes.
#
#   scripts/gpu-check.sh                                  # in a checkout, with Go
#   scripts/gpu-check.sh --prebuilt build/gpu-check       # in a checkout, without Go
#   docker run --gpus all --ipc=host --rm gorovod:gpu scripts/gpu-check.sh
#
# (--ipc=host: NCCL's processes share memory through /dev/shm, and Docker's default 64 MB is
# too small for it.)
#
# 1. builds gorovod (go vet, go build, and the test binaries of nccl and horovod/ncclbackend);
#    with --prebuilt DIR it takes those test binaries from DIR instead, for GPU hosts that have
#    no Go toolchain: `make gpu-check-bundle` makes DIR on a machine with Go, with the OpenMPI
#    libraries the backend's binary links in DIR/lib and the commit it was built from in
#    DIR/COMMIT (the verdict names it, and warns when it is not the checkout's HEAD).
#    DIR/lib is put on LD_LIBRARY_PATH for the test binaries only, and only where they do not
#    load without it: the host's own programs (mpirun, nvidia-smi) never see it. Those
#    libraries let the single-process tests load; they cannot start an MPI job (OpenMPI's
#    plugins are not bundled), so the multi-GPU step needs OpenMPI on the host. The bundle
#    needs a glibc no older than the one it was built against: `make gpu-check-bundle` prints
#    that floor (2.36 when built on Debian 12, whose libevent calls arc4random); to check by
#    hand, compare
#      objdump -T DIR/*.test DIR/lib/* | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1
#    on the build host with `ldd --version` on the GPU host. A host without gcc runs every
#    real-GPU test; only the tests over the fake libraries (built from nccl/testdata/fakelib.c)
#    skip, and the verdict counts them;
# 2. runs the GPU tests of package nccl with the real CUDA runtime and NCCL: placement by local
#    rank and the NVML description, pinned host <-> device staging, allreduce (sum, average,
#    min, max, product) of float32, float16, int32 and float64, broadcast, and with two or more
#    GPUs a two-rank allreduce with exact expected sums;
# 3. runs the NCCL backend's tests at size 1, which compare every collective against the CPU
#    (local) backend byte for byte, and with two or more GPUs (as CUDA counts them, so
#    CUDA_VISIBLE_DEVICES applies) a job of one rank per GPU (up to 8) comparing the NCCL
#    backend with the MPI backend;
# 4. measures host <-> device staging bandwidth (128 MiB, pinned), the fp16
#    compress -> stage -> allreduce -> stage -> decompress time for 128 MiB of float32
#    gradients, and the same staged allreduce for one BERT-base step's gradients (float32, fp16);
# 5. prints one verdict line: "gpu-check: PASS ..." or "gpu-check: FAIL ...". A failing step
#    does not stop the later ones: the verdict names every step that failed. Every command has
#    a time limit, so a wedged driver ends in a FAIL line rather than a hang.
#
# GOROVOD_REQUIRE_GPU=1 turns the tests' "no GPU: skip" into failures. The libraries are found
# as package nccl always finds them (GOROVOD_CUDART_LIBRARY / GOROVOD_NCCL_LIBRARY, sonames,
# the nvidia-* pip wheels); a failure lists every place looked.
set -uo pipefail

usage() {
	echo "gpu-check: usage: $0 [--prebuilt DIR]${1:+ ($1)}" >&2
	exit 2
}
# fail_early MESSAGE: the verdict for an error found before any step runs.
fail_early() {
	echo "gpu-check: FAIL: $1"
	exit 1
}
prebuilt=
case "$#:${1:-}" in
0:) ;;
2:--prebuilt)
	[ -n "$2" ] || usage "--prebuilt needs a directory"
	# Relative to where the script was called from, before the cd below.
	case $2 in
	/*) prebuilt=$2 ;;
	*) prebuilt=$PWD/$2 ;;
	esac
	[ -d "$prebuilt" ] || fail_early "--prebuilt $2: no such directory"
	for b in nccl.test ncclbackend.test; do
		[ -x "$prebuilt/$b" ] || fail_early "--prebuilt $2: no executable $b in it (make gpu-check-bundle makes it)"
	done
	prebuilt=$(cd "$prebuilt" && pwd) || fail_early "--prebuilt $2: cannot enter it"
	;;
1:--prebuilt) usage "--prebuilt needs a directory" ;;
*) usage "unexpected arguments: $*" ;;
esac

cd "$(dirname "$0")/.." || fail_early "cannot enter the checkout"
root=$PWD
export GOROVOD_REQUIRE_GPU=1
GO=${GO:-go}
log=$(mktemp -d -t gpu-check.XXXXXX) || fail_early "cannot make a log directory"
start=$SECONDS
failed=()
notes=()

# reason RC SECONDS: why a command run under `timeout -k 10 SECONDS` failed with exit status RC.
reason() {
	case $1 in
	124 | 137) echo "timed out after ${2}s" ;;
	*) echo "exit $1" ;;
	esac
}

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
	timeout -k 10 "$limit" "$@" 2>&1 | tee "$log/$name.log"
	local rc=${PIPESTATUS[0]}
	[ "$rc" -eq 0 ] && return 0
	failed+=("$name ($(reason "$rc" "$limit"))")
	return 1
}

# join ITEMS...: the items separated by "; ".
join() {
	local out=$1
	shift
	for s in "$@"; do out+="; $s"; done
	echo "$out"
}

# nvidia-smi with a time limit: a wedged driver hangs it. The table goes to the screen, the
# first GPU's name, memory and driver to $gpu.
gpu=
if command -v nvidia-smi >/dev/null; then
	echo "== GPUs"
	timeout -k 10 20 nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,driver_version --format=csv,noheader >"$log/nvidia-smi.log"
	rc=$?
	cat "$log/nvidia-smi.log"
	if [ "$rc" -eq 0 ]; then
		gpu=$(head -1 "$log/nvidia-smi.log" | cut -d, -f2,4,5 | sed 's/^ *//')
	else
		failed+=("nvidia-smi ($(reason "$rc" 20))")
	fi
fi

# The test binaries run with $prebuilt/lib on LD_LIBRARY_PATH only where they need it (testenv).
testenv=()
bin=$prebuilt
if [ -n "$prebuilt" ]; then
	echo "== test binaries from $prebuilt (no build)"
	built=$(head -1 "$prebuilt/COMMIT" 2>/dev/null) || built=
	checkout=$(git -C "$root" rev-parse HEAD 2>/dev/null) || checkout=
	if [ -z "$built" ]; then
		notes+=("bundle commit unknown (no COMMIT in it: built outside a git checkout, or by an older make gpu-check-bundle)")
	else
		# A warning, not a failure: the binaries carry their own code and take only testdata
		# from the checkout, and a bundle of uncommitted work is the usual way to try a fix.
		dirty=
		[[ $built != *-dirty ]] || dirty=" (uncommitted changes)"
		notes+=("bundle ${built:0:12}$dirty")
		if [ -n "$checkout" ] && [ "${built%-dirty}" != "$checkout" ]; then
			notes+=("warning: the bundle was built at ${built:0:12}, the checkout is at ${checkout:0:12}")
		fi
	fi
	if ! command -v ldd >/dev/null; then
		testenv=(LD_LIBRARY_PATH="$prebuilt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
	else
		# Searched whole: a quiet grep at the end of a pipe fails now and then under pipefail
		# (ldd's next write after grep's match gets SIGPIPE).
		if grep -q '=> not found' <<<"$(ldd "$prebuilt/ncclbackend.test" 2>&1)"; then
			testenv=(LD_LIBRARY_PATH="$prebuilt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
			echo "   with $prebuilt/lib on LD_LIBRARY_PATH: the test binaries do not load without it here"
		fi
		# What still does not load (a library neither here nor bundled, a glibc older than the
		# build host's) fails here, named, rather than as an exit 127 later.
		for b in nccl.test ncclbackend.test; do
			missing=$(env "${testenv[@]}" ldd "$prebuilt/$b" 2>&1 | grep 'not found' | sed 's/^[[:space:]]*//' | sort -u)
			if [ -n "$missing" ]; then
				echo "$missing"
				failed+=("$b does not load here: $(echo "$missing" | head -3 | paste -sd, -) (glibc here: $(ldd --version 2>/dev/null | head -1 | awk '{print $NF}'))")
			fi
		done
	fi
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
step nccl-gpu-tests 90 env -C "$root/nccl" "${testenv[@]}" "$bin/nccl.test" -test.count=1 -test.v -test.run GPU
step backend-tests 90 env -C "$root/horovod/ncclbackend" "${testenv[@]}" "$bin/ncclbackend.test" -test.count=1 -test.v
if ! command -v gcc >/dev/null; then
	skipped=$(grep -c 'gcc is not on PATH' "$log/backend-tests.log" 2>/dev/null)
	notes+=("no gcc: ${skipped:-0} backend tests over the fake libraries skipped")
fi
# With two or more GPUs: a real job, one rank per GPU, comparing the NCCL backend with the MPI
# backend on rank-dependent data (allreduce of every dtype and op, broadcast from every root,
# allgatherv with uneven counts). The count is CUDA's, from TestGPUDescribeAndPlace's log.
ngpu=$(grep -o -m1 'CUDA devices: [0-9]*' "$log/nccl-gpu-tests.log" 2>/dev/null | awk '{print $3}')
if [ -z "$ngpu" ]; then
	multi="not run (GPU count unknown: the nccl GPU tests did not report it)"
elif [ "$ngpu" -lt 2 ]; then
	multi="not run (CUDA sees $ngpu device; needs 2)"
elif ! command -v mpirun >/dev/null; then
	multi="not run: mpirun not found (multi-GPU needs OpenMPI on the host)"
else
	np=$((ngpu < 8 ? ngpu : 8))
	if [ "$(id -u)" = 0 ]; then
		export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
	fi
	# mpirun itself runs with the host's environment; only the ranks get the bundle's path.
	ranks_env=()
	[ ${#testenv[@]} -eq 0 ] || ranks_env=(-x "${testenv[0]}")
	if step backend-vs-mpi 120 env -C "$root/horovod/ncclbackend" mpirun --oversubscribe -np "$np" --bind-to none \
		-x GOROVOD_REQUIRE_GPU "${ranks_env[@]}" "$bin/ncclbackend.test" -test.run UnderMpirun -test.v; then
		multi="$np ranks agree with MPI"
	else
		multi="FAILED with $np ranks"
	fi
fi
step staging-bench 60 env -C "$root/nccl" "${testenv[@]}" "$bin/nccl.test" -test.count=1 -test.run '^$' -test.bench GPUStaging -test.benchtime 20x
step fp16-bench 120 env -C "$root/horovod/ncclbackend" "${testenv[@]}" "$bin/ncclbackend.test" -test.count=1 -test.run '^$' \
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
# Without nvidia-smi, the name CUDA's placement test logged ("GPU 0 NVIDIA H200 (PCI ...").
[ -n "$gpu" ] || gpu=$(echo "$placed" | sed -n 's/^GPU 0 \(.*\) (PCI .*/\1/p')

elapsed=$((SECONDS - start))
echo "== figures ($(date -u +%F), ${gpu:-unknown GPU})"
echo "   $placed"
echo "   pinned staging, 128 MiB: host->device ${h2d:-?} GB/s, device->host ${d2h:-?} GB/s"
echo "   NCCL backend allreduce of 128 MiB float32 at size 1 (Go copy -> pinned -> device -> pinned -> Go): ${stage:-?} ms"
echo "   fp16 compress -> stage -> allreduce -> stage -> decompress, 128 MiB of float32 gradients: ${fp16:-?} ms"
echo "   one BERT-base step's gradients (109,483,778 float32) through the same path: ${bert32:-?} ms, fp16-compressed ${bert16:-?} ms"
[ "$elapsed" -lt 300 ] || failed+=("the 5-minute budget (${elapsed}s)")
notes_text=
[ ${#notes[@]} -eq 0 ] || notes_text=" [$(join "${notes[@]}")]"
if [ ${#failed[@]} -gt 0 ]; then
	echo "gpu-check: FAIL after ${elapsed}s on ${gpu:-unknown GPU}: $(join "${failed[@]}") (multi-GPU: ${multi})${notes_text} (logs: $log)"
	exit 1
fi
# The logs stay (they hold the figures); the test binaries built here do not.
[ -n "$prebuilt" ] || rm -f "$log/nccl.test" "$log/ncclbackend.test"
echo "gpu-check: PASS in ${elapsed}s on ${gpu:-unknown GPU} (multi-GPU: ${multi})${notes_text}: H2D ${h2d} GB/s, D2H ${d2h} GB/s, fp16 pipeline 128 MiB ${fp16} ms, staged allreduce 128 MiB ${stage} ms, BERT-base step ${bert32} ms (fp16 ${bert16} ms)"
