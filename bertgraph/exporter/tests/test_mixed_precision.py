"""Mixed precision: train_step_bfloat16 / train_step_float16 (matrix products in that dtype, the
rest float32) and the in-graph loss scale apply_gradients keeps (LossScaleOptimizer's rules)."""
import numpy as np
import pytest
import tensorflow as tf

from bertgraph.exporter import contract, export
from bertgraph.exporter.tests.test_signatures import LABELS, SEQ, _apply, _batch, _state

SEED = tf.constant([1, 2], tf.int64)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return export.export_tiny(tmp_path_factory.mktemp("amp") / "model", LABELS, SEQ,
                              dropout=False, seed=3, log=lambda s: None)


@pytest.fixture(scope="module")
def dropout_model_dir(tmp_path_factory):
    return export.export_tiny(tmp_path_factory.mktemp("amp_dropout") / "model", LABELS, SEQ,
                              dropout=True, seed=3, log=lambda s: None)


def _grads(m, c, key, batch):
    out = m.signatures[key](**batch, dropout_seed=SEED)
    return float(out["loss"]), [out[v["gradient_key"]].numpy() for v in c["variables"]]


def _set_scale(m, scale, growth_interval):
    out = m.signatures[contract.SET_LOSS_SCALE](
        loss_scale=tf.constant(scale, tf.float32),
        growth_interval=tf.constant(growth_interval, tf.int64))
    return float(out["loss_scale"])


def _flat(grads):
    return np.concatenate([g.ravel() for g in grads]).astype(np.float64)


def _dtypes_of(m, key):
    """{op type: set of dtypes (attr T)} over the signature's graph and the functions it calls."""
    graph = m.signatures[key].graph.as_graph_def()
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    out = {}
    for n in nodes:
        if "T" in n.attr and n.attr["T"].type:
            out.setdefault(n.op, set()).add(tf.dtypes.as_dtype(n.attr["T"].type).name)
    return out


# The ops (attr T; Cast carries SrcT/DstT) that run in each compute dtype (model.py's docstring):
# the products; Sum, Reshape and Shape, BatchMatMulV2's gradient summing over broadcast batch
# dimensions (none here: a reshape of the product); attention's query, key and value biases and
# the heads' transposes. In bfloat16 also the scores' mask (AddV2), softmax and dropout
# (SelectV2, Size), and their gradients' Identity and ZerosLike. Any other op there would be
# element-wise work (Mul, Erf, LayerNorm's moments...) the policy keeps float32.
PRODUCT_OPS = {"MatMul", "BatchMatMulV2", "Sum", "Reshape", "Shape", "BiasAdd", "BiasAddGrad",
               "Transpose"}
LOW_PRECISION_OPS = {
    "float16": PRODUCT_OPS,
    "bfloat16": PRODUCT_OPS | {"AddV2", "Softmax", "SelectV2", "Size", "Identity", "ZerosLike"},
}


@pytest.mark.parametrize("dropout", [False, True])
@pytest.mark.parametrize("dtype", sorted(contract.MIXED_TRAIN_STEPS))
def test_only_products_and_attention_run_in_the_compute_dtype(model_dir, dropout_model_dir, dtype,
                                                             dropout):
    m = tf.saved_model.load(str(dropout_model_dir if dropout else model_dir))
    ops = _dtypes_of(m, contract.MIXED_TRAIN_STEPS[dtype])
    low = sorted(op for op, types in ops.items() if dtype in types)
    assert {"MatMul", "BatchMatMulV2", "BiasAdd", "Transpose"} <= set(low), low
    assert set(low) <= LOW_PRECISION_OPS[dtype], low
    if dtype == "bfloat16":
        assert "Softmax" in low and ("SelectV2" in low) == dropout, low
    # The output layer (and its gradient) stays float32: its logits feed the loss directly.
    assert "float32" in ops["MatMul"], ops["MatMul"]
    assert "bfloat16" not in str(_dtypes_of(m, contract.TRAIN_STEP))
    assert "float16" not in str(_dtypes_of(m, contract.TRAIN_STEP))


@pytest.mark.parametrize("dtype,rtol", [("bfloat16", 0.05), ("float16", 0.01)])
def test_mixed_gradients_are_float32_and_close(model_dir, dtype, rtol):
    """The mixed step's loss and gradients, against float32's: within the rounding of an 8-bit
    (bfloat16) or 11-bit (float16) significand over a few products, but not equal."""
    c = contract.read(model_dir)
    m = tf.saved_model.load(str(model_dir))
    batch = _batch()
    loss32, g32 = _grads(m, c, contract.TRAIN_STEP, batch)
    loss, g = _grads(m, c, contract.MIXED_TRAIN_STEPS[dtype], batch)
    assert all(x.dtype == np.float32 for x in g)
    # float32 in value, not only in dtype: gradients rounded to the compute dtype (then cast
    # back) would lose what the float32 sums of the backward pass keep.
    rounded = tf.cast(tf.cast(_flat(g), dtype), tf.float64).numpy()
    assert not np.array_equal(rounded, _flat(g))
    assert abs(loss - loss32) < rtol * loss32
    a, b = _flat(g32), _flat(g)
    assert np.linalg.norm(a - b) < rtol * np.linalg.norm(a)
    assert not np.array_equal(a, b)


def test_loss_scale_scales_train_step_and_apply_unscales(model_dir):
    c = contract.read(model_dir)
    ref = tf.saved_model.load(str(model_dir))
    m = tf.saved_model.load(str(model_dir))
    batch = _batch()
    key = contract.MIXED_TRAIN_STEPS["float16"]
    loss1, g1 = _grads(m, c, key, batch)
    assert _set_scale(m, 1024.0, 0) == 1024.0
    loss, g = _grads(m, c, key, batch)
    assert loss == loss1  # the reported loss is unscaled
    a, b = _flat(g1), _flat(g) / 1024
    assert np.linalg.norm(a - b) < 0.01 * np.linalg.norm(a)
    # apply(g, loss scale 1024) is apply(g / 1024, loss scale 1): powers of two, exact.
    out, want = _apply(m, c, g, 0.5), _apply(ref, c, [x / 1024 for x in g], 0.5)
    assert float(out["global_norm"]) == float(want["global_norm"])
    np.testing.assert_allclose(float(out["global_norm"]), 0.5 * np.linalg.norm(a), rtol=0.01)
    assert float(out["loss_scale"]) == 1024.0  # static: growth interval 0
    for x, y in zip(_state(m, c), _state(ref, c)):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-9)


def test_overflow_skips_the_step_and_halves_the_scale(model_dir):
    """A scale that overflows float16 (65504) makes the gradients infinite: nothing moves, and the
    scale is halved, once per skipped step."""
    c = contract.read(model_dir)
    m = tf.saved_model.load(str(model_dir))
    _set_scale(m, 2.0 ** 40, 2000)
    before = _state(m, c)
    step = int(m.signatures["read_variables"]()["global_step"])
    for i in (1, 2):
        _, g = _grads(m, c, contract.MIXED_TRAIN_STEPS["float16"], _batch())
        assert not np.all(np.isfinite(_flat(g)))
        out = _apply(m, c, g, 1.0)
        assert not bool(out["applied"]) and int(out["global_step"]) == step
        assert float(out["loss_scale"]) == 2.0 ** (40 - i)
    for x, y in zip(before, _state(m, c)):
        np.testing.assert_array_equal(x, y)


def test_scale_grows_after_growth_interval_finite_steps_and_never_drops_below_one(model_dir):
    c = contract.read(model_dir)
    m = tf.saved_model.load(str(model_dir))
    rng = np.random.default_rng(4)
    finite = [rng.standard_normal(v["shape"]).astype(np.float32) * 1e-3 for v in c["variables"]]
    nan = [g.copy() for g in finite]
    nan[2][0] = np.nan
    _set_scale(m, 4.0, 3)
    scales = [float(_apply(m, c, g, 1.0)["loss_scale"])
              for g in (finite, finite, finite, finite, nan, finite, finite, finite)]
    # Doubled after 3 finite steps; an overflow halves it and restarts the count.
    assert scales == [4, 4, 8, 8, 4, 4, 4, 8]
    # Setting the scale restarts the count of finite steps (here one already counted).
    _apply(m, c, finite, 1.0)
    _set_scale(m, 4.0, 3)
    assert [float(_apply(m, c, finite, 1.0)["loss_scale"]) for _ in range(3)] == [4, 4, 8]
    _set_scale(m, 1.0, 3)
    assert float(_apply(m, c, nan, 1.0)["loss_scale"]) == 1.0
    # Doubling 2^127 overflows float32: the scale stays, as LossScaleOptimizer's does, rather
    # than turning infinite (every later step would then overflow and be skipped).
    _set_scale(m, 2.0 ** 127, 1)
    assert float(_apply(m, c, finite, 1.0)["loss_scale"]) == 2.0 ** 127
    _set_scale(m, 4.0, 0)  # static: never changes
    assert [float(_apply(m, c, g, 1.0)["loss_scale"]) for g in (nan, finite, finite, finite)] \
        == [4.0] * 4


def test_the_loss_scale_is_not_in_training_checkpoints(model_dir, tmp_path):
    """A float16 run's checkpoint restores into a float32 one (and back): same float32 names."""
    c = contract.read(model_dir)
    m = tf.saved_model.load(str(model_dir))
    _set_scale(m, 8.0, 2)
    prefix = str(tmp_path / "ckpt")
    m.signatures["save_checkpoint"](prefix=tf.constant(prefix))
    dtypes = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
    assert not [k for k in dtypes if "loss_scale" in k or "good_steps" in k]
    assert {d for k, d in dtypes.items() if k != "global_step"} == {tf.float32}
    assert c["loss_scale"] == {"initial": 32768.0, "growth_interval": 2000,
                               "note": c["loss_scale"]["note"]}
