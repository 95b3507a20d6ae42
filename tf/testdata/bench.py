"""Per-call overhead of Session.Run from Go against Python TensorFlow on the same SavedModel.

    GO=go python tf/testdata/bench.py

Builds two SavedModels with the same two signatures, trivial (x + 1 on a scalar) and matmul
([8,64] x [64,64] variable): "graph", a TF1-style graph of plain ops, and "function", a TF2
tf.Module whose signatures call functions. Then, in one run: Go's BenchmarkSessionRun
(Session.Run, reading the output back) on both; Python's session.run on both, loaded with the
TF1 loader (the graph Go runs); and Python's call of the TF2 concrete functions. Prints
microseconds per call and the ratio Go / Python (below 1: Go is faster).
"""

import os
import re
import subprocess
import sys
import tempfile
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INPUTS = {"trivial": np.float32(0), "matmul": np.zeros((8, 64), np.float32)}
W = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)


class Bench(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(W)

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32, name="x")])
    def trivial(self, x):
        return {"y": x + 1}

    @tf.function(input_signature=[tf.TensorSpec([8, 64], tf.float32, name="x")])
    def matmul(self, x):
        return {"y": tf.matmul(x, self.w)}


def build_graph_model(path):
    with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g) as sess:
        w = tf.compat.v1.get_variable("w", initializer=W, use_resource=True)
        scalar = tf.compat.v1.placeholder(tf.float32, [], name="scalar")
        batch = tf.compat.v1.placeholder(tf.float32, [8, 64], name="batch")
        sess.run(tf.compat.v1.global_variables_initializer())
        sig = tf.compat.v1.saved_model.signature_def_utils.predict_signature_def
        builder = tf.compat.v1.saved_model.Builder(path)
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
            "trivial": sig({"x": scalar}, {"y": scalar + 1}),
            "matmul": sig({"x": batch}, {"y": tf.matmul(batch, w)})})
        builder.save()


def per_call_us(fn, seconds=2.0):
    """Best of 5 repeats of a loop sized to take about seconds/5, in microseconds per call."""
    fn()
    n, t = 1, 0.0
    while t < seconds / 25:
        n *= 2
        t = timeit.timeit(fn, number=n)
    n = max(1, int(n * (seconds / 5) / t))
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


def go_us(models):
    env = dict(os.environ, GOROVOD_TF_BENCH_MODELS=models)
    out = subprocess.run([os.environ.get("GO", "go"), "test", "-run", "^$", "-bench", "BenchmarkSessionRun",
                          "-benchtime", "1s", "-count", "3", "./tf"],
                         cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    found = {}  # best of the -count runs, as per_call_us takes the best of its repeats
    for k, v in re.findall(r"BenchmarkSessionRun/(\w+/\w+)\S*\s+\d+\s+([\d.]+) ns/op", out):
        key = tuple(k.split("/"))
        found[key] = min(found.get(key, float("inf")), float(v) / 1000)
    if set(found) != {(m, g) for m in ("graph", "function") for g in INPUTS}:
        sys.exit("go benchmark output not understood:\n" + out)
    return found


def session_us(model):
    out = {}
    with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], model)
        for name, x in INPUTS.items():
            s = meta.signature_def[name]
            fetch, feed = s.outputs["y"].name, {s.inputs["x"].name: x}
            out[name] = per_call_us(lambda: sess.run(fetch, feed))
    return out


def main():
    with tempfile.TemporaryDirectory() as tmp:
        build_graph_model(os.path.join(tmp, "graph"))
        m = Bench()
        tf.saved_model.save(m, os.path.join(tmp, "function"), signatures={"trivial": m.trivial, "matmul": m.matmul})
        go = go_us(tmp)
        session = {model: session_us(os.path.join(tmp, model)) for model in ("graph", "function")}
        loaded = tf.saved_model.load(os.path.join(tmp, "function"))
        concrete = {}
        for name, x in INPUTS.items():
            fn, arg = loaded.signatures[name], tf.constant(x)
            concrete[name] = per_call_us(lambda: fn(x=arg)["y"].numpy())

    print(f"Session.Run per-call overhead, Go vs Python, TensorFlow {tf.__version__}, {os.cpu_count()} cores")
    print(f"{'SavedModel':10} {'graph':8} {'Go Run':>9} {'Python reference':>30} {'Go/Python':>10}")
    rows = [(model, name, "session.run", session[model][name]) for model in ("graph", "function") for name in INPUTS]
    rows += [("function", name, "concrete function call", concrete[name]) for name in INPUTS]
    for model, name, how, py in rows:
        g = go[(model, name)]
        print(f"{model:10} {name:8} {g:7.1f}us {how:>22} {py:5.1f}us {g / py:10.2f}")


if __name__ == "__main__":
    main()
