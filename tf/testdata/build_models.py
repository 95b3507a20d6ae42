"""Builds the SavedModels and checkpoints the Go tests of package tf load, and records what
Python TensorFlow computes on them, so the Go results are checked against TensorFlow itself.

    python build_models.py OUT_DIR

writes under OUT_DIR:
  tf2/          TF2 SavedModel: signatures predict, train (stateful: updates w, b, step), dtypes
  tf1/          TF1-style SavedModel (graph, placeholders, sharded Saver): serving_default, train,
                spin (a while loop of n steps)
  tf2_trained   checkpoint of the TF2 model's variables after the reference call sequence
  tf1_trained   the same for the TF1 model, written by its own Saver
  ckpt_tf2      tf.train.Checkpoint of variables of every dtype
  ckpt_tf1      tf.compat.v1 Saver checkpoint with BERT-style variable names
  expected.json every call made in Python with its inputs and outputs, each SavedModel's
                signatures and SaverDef as parsed by TensorFlow's protobuf classes, and every
                checkpoint's variables (name, dtype, shape, value); tensors as dtype, shape and base64 of
                their little-endian bytes (strings: base64 of each element).
"""

import base64
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# Same threading as the Go side, so reductions happen in the same order.
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

RNG = np.random.default_rng(20261129)
W0 = RNG.standard_normal((4, 3)).astype(np.float32)
B0 = (RNG.standard_normal(3) * 0.1).astype(np.float32)
X = RNG.standard_normal((5, 4)).astype(np.float32)
Y = np.array([0, 2, 1, 2, 0], dtype=np.int32)
LR = np.float32(0.25)


def encode(value):
    a = np.asarray(value)
    if a.dtype == object or a.dtype.kind in "SU":
        flat = [v if isinstance(v, bytes) else str(v).encode() for v in a.reshape(-1)]
        return {"dtype": "string", "shape": list(a.shape),
                "strings": [base64.b64encode(v).decode() for v in flat]}
    name = {np.float32: "float32", np.float64: "float64", np.int32: "int32", np.int64: "int64",
            np.bool_: "bool", np.float16: "float16", np.uint8: "uint8"}[a.dtype.type]
    return {"dtype": name, "shape": list(a.shape),
            "data": base64.b64encode(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()).decode()}


class Model(tf.Module):
    """A softmax classifier with a train step computed in-graph."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable(W0, name="w")
        self.b = tf.Variable(B0, name="b")
        self.step = tf.Variable(0, dtype=tf.int64, name="step")

    def logits(self, x):
        return tf.matmul(x, self.w) + self.b

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def predict(self, x):
        logits = self.logits(x)
        return {"logits": logits, "probs": tf.nn.softmax(logits), "label": tf.argmax(logits, axis=1, output_type=tf.int32)}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x"),
                                  tf.TensorSpec([None], tf.int32, name="y"),
                                  tf.TensorSpec([], tf.float32, name="lr")])
    def train(self, x, y, lr):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=self.logits(x)))
        gw, gb = tape.gradient(loss, [self.w, self.b])
        self.w.assign_sub(lr * gw)
        self.b.assign_sub(lr * gb)
        self.step.assign_add(1)
        return {"loss": loss, "step": self.step.read_value()}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float64, name="f64"),
                                  tf.TensorSpec([None], tf.int64, name="i64"),
                                  tf.TensorSpec([2, 2], tf.int32, name="i32"),
                                  tf.TensorSpec([None], tf.bool, name="flags"),
                                  tf.TensorSpec([None], tf.string, name="text"),
                                  tf.TensorSpec([None], tf.float16, name="half")])
    def dtypes(self, f64, i64, i32, flags, text, half):
        return {"f64": f64 * 2.0 + 0.5, "sum": tf.reduce_sum(f64), "i64": i64 * 3 - 1,
                "i32": tf.transpose(i32), "flags": tf.logical_not(flags),
                "text": tf.strings.join([text, "!"]), "len": tf.strings.length(text),
                "half": half * tf.constant(2, tf.float16)}


DTYPES_INPUTS = {
    "f64": np.array([1.5, -2.25, 1e300, 3.141592653589793], dtype=np.float64),
    "i64": np.array([1, -5, 2**40, 7], dtype=np.int64),
    "i32": np.array([[1, 2], [3, -4]], dtype=np.int32),
    "flags": np.array([True, False, True], dtype=np.bool_),
    "text": np.array([b"", b"short", b"a string longer than twenty-two bytes", b"\xff\x00bin"], dtype=object),
    "half": np.array([0.5, -1.25, 65504 / 4, 0.0001], dtype=np.float16),
}
TRAIN_INPUTS = {"x": X, "y": Y, "lr": LR}
TF2_CALLS = [("predict", {"x": X}), ("train", TRAIN_INPUTS), ("train", TRAIN_INPUTS),
             ("predict", {"x": X}), ("dtypes", DTYPES_INPUTS)]
TF1_CALLS = [("serving_default", {"x": X}), ("train", {"x": X, "y": Y}), ("train", {"x": X, "y": Y}),
             ("serving_default", {"x": X}), ("spin", {"n": np.int32(1000)})]


def record(name, inputs, outputs):
    return {"signature": name, "inputs": {k: encode(v) for k, v in inputs.items()},
            "outputs": {k: encode(v) for k, v in outputs.items()}}


def build_tf2(out):
    model = Model()
    path = os.path.join(out, "tf2")
    tf.saved_model.save(model, path, signatures={
        "predict": model.predict, "train": model.train, "dtypes": model.dtypes})
    # The reference: a fresh load, the calls in order, through the signatures.
    loaded = tf.saved_model.load(path)
    calls = []
    for name, inputs in TF2_CALLS:
        outs = loaded.signatures[name](**{k: tf.constant(v) for k, v in inputs.items()})
        calls.append(record(name, inputs, {k: v.numpy() for k, v in outs.items()}))
    tf.train.Checkpoint(w=loaded.w, b=loaded.b, step=loaded.step).write(os.path.join(out, "tf2_trained"))
    return calls


def build_tf1(out):
    path = os.path.join(out, "tf1")
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [None], name="y")
        w = tf.compat.v1.get_variable("dense/kernel", initializer=W0, use_resource=True)
        b = tf.compat.v1.get_variable("dense/bias", initializer=B0, use_resource=True)
        step = tf.compat.v1.train.get_or_create_global_step()
        logits = tf.matmul(x, w) + b
        probs = tf.nn.softmax(logits)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        train_op = tf.compat.v1.train.GradientDescentOptimizer(float(LR)).minimize(loss, global_step=step)
        with tf.control_dependencies([train_op]):
            loss_out = tf.identity(loss, name="train_loss")
            step_out = tf.identity(step.read_value(), name="train_step")
        # spin loops n times: a run that stays in flight for as long as a test needs.
        n = tf.compat.v1.placeholder(tf.int32, [], name="n")
        spun = tf.while_loop(lambda i: i < n, lambda i: i + 1, [tf.constant(0)])[0]
        saver = tf.compat.v1.train.Saver(sharded=True)
        sig = tf.compat.v1.saved_model.signature_def_utils.build_signature_def
        info = tf.compat.v1.saved_model.utils.build_tensor_info
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(sess, ["serve"], saver=saver, signature_def_map={
                "serving_default": sig({"x": info(x)}, {"logits": info(logits), "probs": info(probs)},
                                       "tensorflow/serving/predict"),
                "train": sig({"x": info(x), "y": info(y)}, {"loss": info(loss_out), "global_step": info(step_out)},
                             "train"),
                "spin": sig({"n": info(n)}, {"count": info(spun)}, "spin"),
            })
            builder.save()
    # The reference: TensorFlow's TF1 loader and session.run, the calls in order.
    calls = []
    with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], path)
        for name, inputs in TF1_CALLS:
            s = meta.signature_def[name]
            keys = sorted(s.outputs)
            vals = sess.run([s.outputs[k].name for k in keys],
                            {s.inputs[k].name: v for k, v in inputs.items()})
            calls.append(record(name, inputs, dict(zip(keys, vals))))
        saver = tf.compat.v1.train.Saver(saver_def=meta.saver_def)
        saver.save(sess, os.path.join(out, "tf1_trained"), write_meta_graph=False, write_state=False)
    return calls


def build_ckpt_tf2(out):
    values = {
        "f32": RNG.standard_normal((3, 5)).astype(np.float32),
        "f64": RNG.standard_normal(4),
        "i32": np.arange(-3, 3, dtype=np.int32).reshape(2, 3),
        "i64": np.array(2**50 + 3, dtype=np.int64),
        "flags": np.array([True, False], dtype=np.bool_),
        "half": RNG.standard_normal(6).astype(np.float16),
        "text": np.array([b"vocab", b"a string longer than twenty-two bytes"], dtype=object),
    }
    variables = {k: tf.Variable(v) for k, v in values.items()}
    return tf.train.Checkpoint(**variables).write(os.path.join(out, "ckpt_tf2"))


def build_ckpt_tf1(out):
    prefix = os.path.join(out, "ckpt_tf1")
    with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g) as sess:
        for name, shape in [("bert/embeddings/word_embeddings", (7, 4)),
                            ("bert/encoder/layer_0/attention/self/query/kernel", (4, 4)),
                            ("output_bias", (2,))]:
            tf.compat.v1.get_variable(name, initializer=RNG.standard_normal(shape).astype(np.float32))
        tf.compat.v1.train.get_or_create_global_step()
        sess.run(tf.compat.v1.global_variables_initializer())
        return tf.compat.v1.train.Saver().save(sess, prefix, write_meta_graph=False, write_state=False)


def checkpoint_contents(prefix):
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    return [{"name": name, "dtype": dtypes[name].name, "shape": list(shape),
             "value": encode(reader.get_tensor(name))}
            for name, shape in sorted(tf.train.list_variables(prefix))]


def meta_graph_contents(path):
    """The signatures and SaverDef as TensorFlow's own protobuf classes parse them."""
    from tensorflow.core.protobuf import saved_model_pb2
    sm = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        sm.ParseFromString(f.read())
    meta = sm.meta_graphs[0]

    def info(t):
        shape = None if t.tensor_shape.unknown_rank else [d.size for d in t.tensor_shape.dim]
        return {"name": t.name, "dtype": tf.as_dtype(t.dtype).name, "dtype_enum": t.dtype, "shape": shape}

    sd = meta.saver_def
    return {"tags": list(meta.meta_info_def.tags),
            "signatures": {k: {"method": s.method_name,
                               "inputs": {n: info(t) for n, t in s.inputs.items()},
                               "outputs": {n: info(t) for n, t in s.outputs.items()}}
                           for k, s in meta.signature_def.items() if not k.startswith("__saved_model")},
            "saver_def": {"filename_tensor": sd.filename_tensor_name, "save_tensor": sd.save_tensor_name,
                          "restore_op": sd.restore_op_name, "max_to_keep": sd.max_to_keep,
                          "sharded": sd.sharded, "version": sd.version}}


def main(out):
    os.makedirs(out, exist_ok=True)
    expected = {"tf_version": tf.__version__, "cuda_build": tf.test.is_built_with_cuda(), "tf2_calls": build_tf2(out), "tf1_calls": build_tf1(out)}
    expected["meta_graphs"] = {m: meta_graph_contents(os.path.join(out, m)) for m in ("tf1", "tf2")}
    expected["checkpoints"] = {
        "ckpt_tf2": checkpoint_contents(build_ckpt_tf2(out)),
        "ckpt_tf1": checkpoint_contents(build_ckpt_tf1(out)),
        "tf2_trained": checkpoint_contents(os.path.join(out, "tf2_trained")),
        "tf1_trained": checkpoint_contents(os.path.join(out, "tf1_trained")),
        "tf2_initial": checkpoint_contents(os.path.join(out, "tf2", "variables", "variables")),
        "tf1_initial": checkpoint_contents(os.path.join(out, "tf1", "variables", "variables")),
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
