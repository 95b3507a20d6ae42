"""scripts/compare_checkpoints.py, which the fault runs (scripts/fake-nodes/faults.sh) use to hold a
run's weights to an undisturbed one: the largest difference, and a failure for values that are
not finite, which a difference cannot rank (NaN is larger than nothing)."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import tensorflow as tf

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts/compare_checkpoints.py"


def write(path, **variables):
    """A checkpoint as TensorFlow's object-based saver writes it (with its object graph, a string)."""
    tf.train.Checkpoint(**{k: tf.Variable(np.array(v, np.float32)) for k, v in variables.items()}).write(str(path))
    return str(path)


def compare(a, b):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, str(SCRIPT), a, b], capture_output=True, text=True, env=env, timeout=300)


def test_largest_difference_and_values_not_finite(tmp_path):
    ref = write(tmp_path / "ref", w=[1.0, 2.0, 3.0], b=[0.5])
    moved = write(tmp_path / "moved", w=[1.0, 2.25, 3.0], b=[0.5])
    diverged = write(tmp_path / "diverged", w=[1.0, float("nan"), 3.0], b=[0.5])
    overflowed = write(tmp_path / "overflowed", w=[1.0, 2.0, 3.0], b=[float("inf")])

    r = compare(ref, moved)
    assert r.returncode == 0, r.stderr
    assert "max abs difference 0.25 (w/.ATTRIBUTES/VARIABLE_VALUE)" in r.stdout

    for bad, name in ((diverged, "w"), (overflowed, "b")):
        r = compare(ref, bad)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"1 with values not finite: ['{name}/.ATTRIBUTES/VARIABLE_VALUE']" in r.stdout


def test_variables_that_differ_fail(tmp_path):
    r = compare(write(tmp_path / "a", w=[1.0, 2.0]), write(tmp_path / "b", w=[1.0, 2.0, 3.0]))
    assert r.returncode == 1 and "differ in variables" in r.stderr
