"""Compares two TensorFlow checkpoints variable by variable: `compare_checkpoints.py A B` prints
the number of variables and the largest absolute difference, and fails when their variables or
shapes differ. A and B are checkpoint prefixes or directories (their latest checkpoint)."""
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
    worst, worst_name = 0.0, ""
    for name in sorted(shapes_a):
        x, y = a.get_tensor(name), b.get_tensor(name)
        if x.dtype.kind not in "fiu":
            continue
        diff = float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)), initial=0.0))
        if diff > worst:
            worst, worst_name = diff, name
    print(f"{name_a} vs {name_b}: {len(shapes_a)} variables, max abs difference {worst:g}"
          + (f" ({worst_name})" if worst_name else ""))


if __name__ == "__main__":
    main()
