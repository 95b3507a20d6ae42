"""Horovod's side of `make bench-peer`'s Adasum check: Horovod's Adasum of known inputs, which
gorovod's bench (-peer-adasum) then computes and compares.

    mpirun -np 2 .cache/peer/venv-.../bin/python scripts/bench_peer/adasum_check.py OUT

Every rank allreduces, with op=hvd.Adasum, tensors of ADASUM_LENGTHS elements whose element i
of tensor k on rank r is sin(0.37 i + 7.919 r + k), rounded to float32, then again rounded to
float16; rank 0 writes the results, back to back, little-endian, to OUT: the float32 ones, then
the float16 ones. Horovod runs Adasum on power-of-two jobs only.
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
    out = b""
    for dtype, wire in ((np.float32, "<f4"), (np.float16, "<f2")):
        for k, n in enumerate(ADASUM_LENGTHS):
            x = np.sin(0.37 * np.arange(n, dtype=np.float64) + 7.919 * hvd.rank() + k).astype(dtype)
            y = hvd.allreduce(tf.constant(x), op=hvd.Adasum, name=f"adasum/{np.dtype(dtype).name}/{k}")
            out += y.numpy().astype(wire).tobytes()
    if hvd.rank() == 0:
        with open(sys.argv[1], "wb") as f:
            f.write(out)
    hvd.shutdown()


if __name__ == "__main__":
    main()
