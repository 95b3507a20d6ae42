#!/bin/sh
# Allreduce over shaped links between simulated machines: `bench-network.sh BENCH [NODES...]`
# runs horovod/internal/bench -network (MiniLM's gradients in float32, fp16 and bf16, 64 MiB, 4 KiB,
# each against raw MPI_Allreduce) on 2 and 4 machines (or the NODES counts given) of one rank
# each, their links shaped to 1 and 10 Gbit/s with 0.2 ms of delay (mpirun.sh,
# GOROVOD_FAKE_NODES_MBIT and _DELAY). Needs root, as mpirun.sh does. Every job is bounded. The
# simulated machines share this one's cores, which OpenMPI on each cannot see: a rank waiting for
# the wire yields its core (mpi_yield_when_idle) instead of spinning on it, so that with more ranks
# than cores the others still compute.
set -eu
if [ $# -lt 1 ]; then
	echo "usage: $0 BENCH-BINARY [NODES...]" >&2
	exit 2
fi
bench=$1
shift
[ $# -gt 0 ] || set -- 2 4
here=$(cd "$(dirname "$0")" && pwd)
for nodes in "$@"; do
	layout=$(seq -f 'node%g:1' -s , 1 "$nodes")
	for mbit in 1000 10000; do
		echo "== $nodes machines x 1 rank, links of $mbit Mbit/s, 0.2 ms delay"
		GOROVOD_FAKE_NODES_MBIT=$mbit GOROVOD_FAKE_NODES_DELAY=0.2ms timeout -k 10 600 \
			"$here/mpirun.sh" "$layout" --mca mpi_yield_when_idle 1 "$bench" -network -rounds 2 -batches 2 -big-iters 2 -small-iters 100
	done
done
