"""save_checkpoint / restore_checkpoint write and read checkpoints keyed as Google BERT's
run_classifier keys them.  The reference is Google's own code: the variables run_classifier's
training graph holds are made by bert-tensorflow's run_classifier.create_model (modeling.BertModel
and the classifier's output layer) and optimization.create_optimizer (AdamWeightDecayOptimizer and
global_step), and tf.compat.v1's Saver of that graph reads what we write and writes what we read."""
import contextlib
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
from bert import optimization

from bertgraph.exporter import checkpoint, contract, export
from bertgraph.exporter.config import BertConfig
from bertgraph.exporter.tests.test_signatures import LABELS, SEQ, _apply, _slot, _variables


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return export.export_tiny(tmp_path_factory.mktemp("ckpt") / "model", LABELS, SEQ,
                              dropout=False, seed=5, log=lambda s: None)


def _trained(model_dir, steps=2, seed=0):
    """The model loaded and moved by ``steps`` updates (slots and global_step non-zero)."""
    c = contract.read(model_dir)
    m = tf.saved_model.load(str(model_dir))
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        grads = [rng.standard_normal(v["shape"]).astype(np.float32) for v in c["variables"]]
        assert bool(_apply(m, c, grads, 1.0)["applied"])
    return m, c


def _state(m, c):
    """{google name: value} of every training variable, read through the SavedModel."""
    out = dict(zip((v["name"] for v in c["variables"]), _variables(m, c)))
    for v in c["variables"]:
        for slot in ("adam_m", "adam_v"):
            out[f"{v['name']}/{slot}"] = _slot(m, slot, v["name"])
    out["global_step"] = m.signatures["read_variables"]()["global_step"].numpy()
    return out


def _save(m, prefix):
    out = m.signatures["save_checkpoint"](prefix=tf.constant(str(prefix)))
    assert out["prefix"].numpy().decode() == str(prefix)
    return str(prefix)


def _restore(m, prefix):
    return int(m.signatures["restore_checkpoint"](prefix=tf.constant(str(prefix)))["global_step"])


def _google_modeling():
    """bert-tensorflow's modeling and run_classifier. Two things they call are gone from
    TensorFlow 2.21: tf.contrib (modeling's layer_norm calls contrib's) and tf.compat.v1.layers.dense
    (Keras 3; the pooler's). The stand-ins compute as those did and make the variables those made,
    in the scope modeling gives them: LayerNorm/beta and LayerNorm/gamma; NAME/kernel and
    NAME/bias. Every other name comes from Google's code."""
    v1 = tf.compat.v1

    def layer_norm(inputs, begin_norm_axis=-1, begin_params_axis=-1, scope=None):
        with v1.variable_scope(scope, "LayerNorm", [inputs]):
            shape = inputs.shape[-1:]
            beta = v1.get_variable("beta", shape, inputs.dtype, v1.zeros_initializer())
            gamma = v1.get_variable("gamma", shape, inputs.dtype, v1.ones_initializer())
            mean, variance = tf.nn.moments(inputs, [begin_norm_axis], keepdims=True)
            return tf.nn.batch_normalization(inputs, mean, variance, beta, gamma, 1e-12)

    def dense(inputs, units, activation=None, kernel_initializer=None, name=None):
        with v1.variable_scope(name, "dense"):
            kernel = v1.get_variable("kernel", [inputs.shape[-1], units], initializer=kernel_initializer)
            bias = v1.get_variable("bias", [units], initializer=v1.zeros_initializer())
        out = tf.matmul(inputs, kernel) + bias
        return out if activation is None else activation(out)

    if "tensorflow.contrib" not in sys.modules:
        contrib = types.ModuleType("tensorflow.contrib")
        contrib.layers = types.ModuleType("tensorflow.contrib.layers")
        contrib.layers.layer_norm = layer_norm
        sys.modules.update({"tensorflow.contrib": contrib, "tensorflow.contrib.layers": contrib.layers})
    from bert import modeling, run_classifier
    modeling.tf.layers = types.SimpleNamespace(dense=dense)  # modeling's own tf.compat.v1 name
    return modeling, run_classifier


@contextlib.contextmanager
def _v1_tensor_shapes():
    """create_model reads a dimension's .value, as TF1's TensorShape had it."""
    tf.compat.v1.disable_v2_tensorshape()
    try:
        yield
    finally:
        tf.compat.v1.enable_v2_tensorshape()


def _run_classifier_graph(c):
    """run_classifier's training graph as its model_fn builds it for the contract's bert_config,
    max_seq_length and labels: create_model, then create_optimizer."""
    modeling, run_classifier = _google_modeling()
    config = modeling.BertConfig.from_dict(c["bert_config"])
    graph = tf.Graph()
    with graph.as_default(), _v1_tensor_shapes():
        ids = tf.compat.v1.placeholder(tf.int32, [2, c["max_seq_length"]])
        labels = tf.compat.v1.placeholder(tf.int32, [2])
        loss, *_ = run_classifier.create_model(config, True, ids, ids, ids, labels, c["num_labels"],
                                               False)
        optimization.create_optimizer(loss, 1e-3, num_train_steps=10, num_warmup_steps=1,
                                      use_tpu=False)
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    return graph, variables


def test_bert_config_defaults_are_googles():
    # A bert_config.json that leaves a field out means Google's default (type_vocab_size 16, not
    # HF's 2, which convert_hf sets itself): modeling.BertConfig's, field by field.
    modeling, _ = _google_modeling()
    assert BertConfig(vocab_size=30522).to_dict() == vars(modeling.BertConfig(vocab_size=30522))


def test_checkpoint_holds_exactly_run_classifiers_variables(model_dir, tmp_path):
    m, c = _trained(model_dir)
    prefix = _save(m, tmp_path / "model.ckpt-2")
    graph, reference = _run_classifier_graph(c)
    want = {name: (v.shape.as_list(), v.dtype.base_dtype) for name, v in reference.items()}
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    got = {name: (shape, dtypes[name]) for name, shape in tf.train.list_variables(prefix)}
    assert got == want
    assert len(want) == 3 * len(c["variables"]) + 1
    # The values are the variables', read through the SavedModel.
    state = _state(m, c)
    assert set(state) == set(got)
    for name, value in state.items():
        np.testing.assert_array_equal(reader.get_tensor(name), value, err_msg=name)
    assert state["global_step"] == 2
    assert np.abs(state["output_weights/adam_v"]).max() > 0
    # run_classifier's own Saver restores it (what --init_checkpoint and a resumed run do).
    with graph.as_default(), tf.compat.v1.Session() as sess:
        tf.compat.v1.train.Saver().restore(sess, prefix)
        for name, v in reference.items():
            np.testing.assert_array_equal(sess.run(v), state[name], err_msg=name)


def test_restore_round_trips_every_variable_and_reads_run_classifiers_checkpoints(
        model_dir, tmp_path):
    a, c = _trained(model_dir, steps=3, seed=1)
    prefix = _save(a, tmp_path / "a.ckpt")
    b = tf.saved_model.load(str(model_dir))
    assert _restore(b, prefix) == 3
    want = _state(a, c)
    for name, value in _state(b, c).items():
        np.testing.assert_array_equal(value, want[name], err_msg=name)
    # Training goes on identically from the restored state.
    grads = [np.full(v["shape"], 0.01, np.float32) for v in c["variables"]]
    _apply(a, c, grads, 1.0)
    _apply(b, c, grads, 1.0)
    after = _state(a, c)
    for name, value in _state(b, c).items():
        np.testing.assert_array_equal(value, after[name], err_msg=name)

    # A checkpoint written by run_classifier's Saver restores into the model.
    graph, reference = _run_classifier_graph(c)
    rng = np.random.default_rng(2)
    with graph.as_default(), tf.compat.v1.Session() as sess:
        values = {name: rng.standard_normal(v.shape.as_list()).astype(np.float32)
                  for name, v in reference.items() if name != "global_step"}
        values["global_step"] = np.int64(17)
        for name, v in reference.items():
            v.load(values[name], sess)
        google = tf.compat.v1.train.Saver().save(sess, str(tmp_path / "google" / "model.ckpt"))
    fresh = tf.saved_model.load(str(model_dir))
    assert _restore(fresh, google) == 17
    for name, value in _state(fresh, c).items():
        np.testing.assert_array_equal(value, values[name], err_msg=name)


def test_restore_refuses_what_does_not_fit_and_changes_nothing(model_dir, tmp_path):
    a, c = _trained(model_dir, steps=1)
    good = checkpoint.read(_save(a, tmp_path / "good.ckpt"))
    m = tf.saved_model.load(str(model_dir))
    before = _state(m, c)
    missing = dict(good)
    del missing["output_bias/adam_v"]
    wrong_dtype = dict(good, global_step=np.float32(1))
    # output_bias comes after most variables in the checkpoint's (sorted) order.
    wrong_shape = dict(good, output_bias=np.zeros([LABELS + 1], np.float32))
    # A scalar's slice spec carries no shape: global_step of shape [1] used to be refused only
    # by its own assignment, after the others had run.
    wrong_scalar = dict(good, global_step=np.array([1], np.int64))
    for case, values, want in (("missing", missing, "output_bias/adam_v"),
                               ("dtype", wrong_dtype, "global_step"),
                               ("shape", wrong_shape, "tensor_name = output_bias; shape"),
                               ("scalar shape", wrong_scalar, "restore_global_step")):
        prefix = checkpoint.write(str(tmp_path / f"{case}.ckpt"), values)
        with pytest.raises(tf.errors.OpError, match=want):
            _restore(m, prefix)
        for name, value in _state(m, c).items():
            np.testing.assert_array_equal(value, before[name], err_msg=f"{case}: {name}")
