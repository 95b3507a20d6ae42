"""Horovod's side of `make bench-peer`: the collectives gorovod's bench times with -peer.

Run under mpirun with the peer virtualenv (Horovod built with MPI, TensorFlow):

    mpirun -np 2 .cache/peer/venv-.../bin/python scripts/bench_peer/horovod_collectives.py 4K,1M,64M

For every size (bytes per rank, float32): allreduce Sum, Average, Average with fp16 compression,
Adasum (on a power-of-two job: Horovod refuses the others),
allgather (every rank sends the size), broadcast from rank 0, reducescatter Sum and Average,
alltoall with even splits, each through horovod.tensorflow in eager mode, one tensor per call, a
new result per call, and grouped_reducescatter Sum and grouped_allgather of the size in 64
tensors as one group. With --process-sets, instead: allreduce Sum in a process set of the
first and the last rank (Horovod initialized with that set, hvd.init(process_sets=...); on 2
ranks, its global set, since it refuses a second set of every rank), a run of its own, since
every set costs Horovod's background loop a negotiation per cycle.
Reducescatter's and alltoall's tensor splits its one dimension in equal blocks, one per rank: the
size's first elements that are a multiple of the ranks, as gorovod's bench and raw MPI take them
(a grouped reducescatter's 64 tensors each so; a grouped allgather's too). Timed as gorovod's bench times its calls: one warm-up call, then
batches of calls each after a barrier; a batch's mean per call, the best batch, the slowest rank.
Rank 0 prints tab-separated lines: horovod, collective, bytes, seconds per call.
"""

import argparse
import os
import re
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

COLLECTIVES = ["allreduce_sum", "allreduce_average", "allreduce_average_fp16", "allreduce_adasum", "allgather", "broadcast",
               "reducescatter_sum", "reducescatter_average", "alltoall", "grouped_reducescatter_sum", "grouped_allgather"]

# SET_COLLECTIVES run with --process-sets only, as gorovod's bench runs them with
# HOROVOD_DYNAMIC_PROCESS_SETS=1 only.
SET_COLLECTIVES = ["process_set_allreduce_sum"]

# GROUP is how many tensors of equal size a grouped row splits its bytes into.
GROUP = 64


def parse_sizes(text):
    sizes = []
    for f in text.split(","):
        mult = {"K": 1 << 10, "M": 1 << 20}.get(f[-1:], 1)
        n = int(f[:-1] if mult > 1 else f) * mult
        if n <= 0 or n % 4:
            raise SystemExit(f"horovod_collectives.py: size {f!r}: want a positive multiple of 4 bytes, with K or M")
        sizes.append(n)
    return sizes


def iters_for(size):
    """About 64 MiB of calls per batch, as gorovod's bench makes them."""
    return max(1, min(300, (64 << 20) // size))


def barrier(ps):
    """horovod.tensorflow has no barrier: a one-element allreduce waits for every rank of ps."""
    hvd.allreduce(tf.zeros([1]), op=hvd.Sum, name="bench.barrier", process_set=ps)


def timed(call, batches, iters, ps=None):
    """One warm-up call, then batches of iters calls, each batch after a barrier, among the ranks
    of process set ps (the whole job where None): the slowest member's best batch mean, on every
    rank of the job."""
    best = 0.0
    if ps is None or ps.included():
        ps = ps or hvd.global_process_set
        call()
        best = float("inf")
        for _ in range(batches):
            barrier(ps)
            start = time.perf_counter()
            for _ in range(iters):
                call()
            best = min(best, (time.perf_counter() - start) / iters)
    slowest = hvd.allreduce(tf.constant([best], tf.float64), op=hvd.Max, name="bench.time")
    return float(slowest.numpy()[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", help="comma-separated bytes per rank, with K or M (e.g. 4K,1M,64M)")
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--only", default="", help="only the collectives whose name matches this regular expression "
                    "(as the Go bench's -only)")
    ap.add_argument("--process-sets", action="store_true",
                    help="the process-set rows instead of the others (Horovod initialized with the set)")
    args = ap.parse_args()
    ps = None
    members = sorted({0, int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) - 1})
    if args.process_sets and len(members) < int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")):
        ps = hvd.ProcessSet(members)
        hvd.init(process_sets=[ps])
    else:
        hvd.init()
        if args.process_sets:
            # The set is the whole job, which Horovod refuses as a second set of the same ranks
            # ("mismatching numbers of process sets"): its global set is that set.
            ps = hvd.global_process_set
    rows = []
    for size in parse_sizes(args.sizes):
        x = tf.zeros([size // 4], tf.float32)
        xs = tf.zeros([size // 4 // hvd.size() * hvd.size()], tf.float32)
        parts = [tf.zeros([size // 4 // GROUP // hvd.size() * hvd.size()], tf.float32) for _ in range(GROUP)]
        calls = {
            "allreduce_sum": lambda: hvd.allreduce(x, op=hvd.Sum, name="t"),
            "allreduce_average": lambda: hvd.allreduce(x, op=hvd.Average, name="t"),
            "allreduce_average_fp16": lambda: hvd.allreduce(
                x, op=hvd.Average, compression=hvd.Compression.fp16, name="t"),
            "allreduce_adasum": lambda: hvd.allreduce(x, op=hvd.Adasum, name="t"),
            "allgather": lambda: hvd.allgather(x, name="t"),
            "broadcast": lambda: hvd.broadcast(x, 0, name="t"),
            "reducescatter_sum": lambda: hvd.reducescatter(xs, op=hvd.Sum, name="t"),
            "reducescatter_average": lambda: hvd.reducescatter(xs, op=hvd.Average, name="t"),
            "alltoall": lambda: hvd.alltoall(xs, name="t"),
            "grouped_reducescatter_sum": lambda: hvd.grouped_reducescatter(parts, op=hvd.Sum),
            "grouped_allgather": lambda: hvd.grouped_allgather(parts, name="g"),
            "process_set_allreduce_sum": lambda: hvd.allreduce(x, op=hvd.Sum, name="t", process_set=ps),
        }
        for what in SET_COLLECTIVES if ps else COLLECTIVES:
            if args.only and not re.search(args.only, what):
                continue
            if what == "allreduce_adasum" and hvd.size() & (hvd.size() - 1):
                continue  # Horovod refuses Adasum on a job that is not a power of two
            rows.append((what, size, timed(calls[what], args.batches, iters_for(size), ps)))
    if hvd.rank() == 0:
        for what, size, secs in rows:
            print(f"horovod\t{what}\t{size}\t{secs:.9f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
