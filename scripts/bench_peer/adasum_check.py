"""Horovod's side of `make bench-peer`'s Adasum check: Horovod's Adasum of known inputs, which
gorovod's bench (-peer-adasum) then computes and compares.

    mpirun -np 2 .cache/peer/venv-.../bin/python scripts/bench_peer/adasum_check.py OUT

Every rank allreduces, with op=hvd.Adasum, float32 tensors of ADASUM_LENGTHS elements whose
element i of tensor k on rank r is float32(sin(0.37 i + 7.919 r + k)); rank 0 writes the results,
back to back, as little-endian float32, to OUT. Horovod runs Adasum on power-of-two jobs only.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

# ADASUM_LENGTHS are the tensors' lengths, as adasumLengths in horovod/internal/bench.
ADASUM_LENGTHS = [1, 37, 1000, 65536]


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    hvd.init()
    results = []
    for k, n in enumerate(ADASUM_LENGTHS):
        x = np.sin(0.37 * np.arange(n, dtype=np.float64) + 7.919 * hvd.rank() + k).astype(np.float32)
        results.append(hvd.allreduce(tf.constant(x), op=hvd.Adasum, name=f"adasum{k}").numpy())
    if hvd.rank() == 0:
        np.concatenate(results).astype("<f4").tofile(sys.argv[1])
    hvd.shutdown()


if __name__ == "__main__":
    main()
