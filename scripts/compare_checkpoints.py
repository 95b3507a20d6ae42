"""Compares two TensorFlow checkpoints variable by variable: `compare_checkpoints.py A B` prints
the number of variables and the largest absolute difference, and fails when their variables or
shapes differ or a value is not finite (NaN or infinity: a run that diverged). A and B are checkpoint prefixes or directories (their latest checkpoint)."""
import sys

import numpy as np
import tensorflow as tf


def open_checkpoint(path):
    latest = tf.train.latest_checkpoint(path) if tf.io.gfile.isdir(path) else path
    if latest is None:
        sys.exit(f"compare_checkpoints: {path}: no checkpoint")
    return latest, tf.train.load_checkpoint(latest)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: compare_checkpoints.py CHECKPOINT-A CHECKPOINT-B")
    (name_a, a), (name_b, b) = open_checkpoint(sys.argv[1]), open_checkpoint(sys.argv[2])
    shapes_a, shapes_b = a.get_variable_to_shape_map(), b.get_variable_to_shape_map()
    if shapes_a != shapes_b:
        differ = sorted({(k, tuple(v)) for k, v in shapes_a.items()} ^ {(k, tuple(v)) for k, v in shapes_b.items()})
        sys.exit(f"compare_checkpoints: {name_a} and {name_b} differ in variables: {differ[:5]}")
    worst, worst_name, not_finite = 0.0, "", []
    for name in sorted(shapes_a):
        x, y = np.asarray(a.get_tensor(name)), np.asarray(b.get_tensor(name))  # bytes for a string scalar
        if x.dtype.kind not in "fiu":
            continue
        x, y = x.astype(np.float64), y.astype(np.float64)
        # A NaN would make the difference NaN, which no comparison counts as the largest.
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            not_finite.append(name)
            continue
        diff = float(np.max(np.abs(x - y), initial=0.0))
        if diff > worst:
            worst, worst_name = diff, name
    print(f"{name_a} vs {name_b}: {len(shapes_a)} variables, max abs difference {worst:g}"
          + (f" ({worst_name})" if worst_name else "")
          + (f"; {len(not_finite)} with values not finite: {not_finite[:5]}" if not_finite else ""))
    if not_finite:
        sys.exit(1)


if __name__ == "__main__":
    main()
