"""The layers whose gradients the exporter writes out by hand (model.gelu, model.layer_norm,
model.softmax) and
the column sums they and the dense layers' biases use (model.column_sums), each against
TensorFlow's own differentiation of the plain formula and against central finite differences,
in float64 so that the bounds can be tight: the closed forms are exact, only rounding differs."""
import math

import numpy as np
import pytest
import tensorflow as tf

from bertgraph.exporter.model import LAYER_NORM_EPSILON, column_sums, gelu, layer_norm, softmax


def _reference_layer_norm(x, gamma, beta, epsilon):
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + epsilon) * gamma + beta


def _gradients(f, args, dy):
    args = [tf.constant(a) for a in args]
    with tf.GradientTape() as tape:
        tape.watch(args)
        y = f(*args)
    return y.numpy(), [g.numpy() for g in tape.gradient(y, args, output_gradients=tf.constant(dy))]


def _finite_difference(f, args, dy, direction, h=1e-6):
    """d/dt of sum(dy x f(args + t direction)) at t = 0, by central differences."""
    def at(t):
        return float(np.sum(dy * f(*[tf.constant(a + t * d) for a, d in zip(args, direction)]).numpy()))
    return (at(h) - at(-h)) / (2 * h)


def _reference_gelu(x):
    """HuggingFace's x (1 + erf(x / sqrt 2)) / 2, differentiated by TensorFlow op by op."""
    return 0.5 * x * (1.0 + tf.math.erf(x * tf.constant(math.sqrt(0.5), x.dtype)))


def test_gelu_is_the_exact_gelu_with_its_derivative():
    rng = np.random.default_rng(0)
    # The tails too: 1 + erf reaches 0 below about -8.3 in float64, and the derivative with it.
    x = np.concatenate([rng.standard_normal(4000) * 3, [-40.0, -27.0, -10.0, -1e-8, 0.0, 1e-8, 10.0, 40.0]])
    dy = rng.standard_normal(x.shape)
    y, (dx,) = _gradients(gelu, [x], dy)
    want_y, (want_dx,) = _gradients(_reference_gelu, [x], dy)
    # Against the exact x Phi(x) (erfc keeps Phi's relative precision in the negative tail, where
    # 1 + erf keeps the absolute one only: a few float64 ulps of 1, times |x|).
    exact = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x])
    np.testing.assert_allclose(y, exact, rtol=1e-12, atol=1e-15 * np.abs(x).max())
    np.testing.assert_allclose(y, want_y, rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-15)
    assert np.all(np.isfinite(dx))
    # Off the tails, the derivative is where the function's slope is; and 0 and 1 far out.
    direction = [rng.standard_normal(x.shape)]
    analytic = float(np.sum(dx * direction[0]))
    assert abs(_finite_difference(gelu, [x], dy, direction) - analytic) < 1e-6 * abs(analytic)
    _, (slope,) = _gradients(gelu, [np.array([-40.0, 40.0])], np.ones(2))
    assert slope[0] == 0.0 and slope[1] == 1.0


def test_gelu_float32_is_tensorflows():
    """Within float32 rounding of tf.nn.gelu (erfc): relatively where x >= 0 (Phi >= 1/2), and
    absolutely, a few ulps of 1 (1.2e-7) times |x|, everywhere: in the negative tail 1 + erf
    loses Phi's relative precision (Phi(-4) is 3e-5) but not its absolute one."""
    x = np.random.default_rng(5).standard_normal(10000).astype(np.float32) * 4
    want = tf.nn.gelu(tf.constant(x), approximate=False).numpy()
    got = gelu(tf.constant(x)).numpy()
    positive = x >= 0
    np.testing.assert_allclose(got[positive], want[positive], rtol=4e-7, atol=1e-30)
    assert np.all(np.abs(got - want) <= 4e-7 * np.abs(x))


def test_gelu_float32_matches_float64():
    x = np.random.default_rng(1).standard_normal(10000) * 4
    dy = np.ones_like(x)
    y32, (dx32,) = _gradients(gelu, [x.astype(np.float32)], dy.astype(np.float32))
    y64, (dx64,) = _gradients(gelu, [x], dy)
    np.testing.assert_allclose(y32, y64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx32, dx64, rtol=1e-5, atol=1e-6)


def test_softmax_gradient_is_tensorflows():
    rng = np.random.default_rng(6)
    # Attention's shape, with masked (-10000) positions whose probabilities are 0.
    x = rng.standard_normal((2, 3, 5, 7)) * 3
    x[..., -2:] -= 10000.0
    dy = rng.standard_normal(x.shape)
    y, (dx,) = _gradients(softmax, [x], dy)
    want_y, (want_dx,) = _gradients(tf.nn.softmax, [x], dy)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-15)
    direction = [rng.standard_normal(x.shape)]
    analytic = float(np.sum(dx * direction[0]))
    assert abs(_finite_difference(softmax, [x], dy, direction) - analytic) < 1e-6 * abs(analytic)


def test_softmax_gradient_of_bfloat16_is_computed_in_float32():
    """bfloat16 in and out, but the row sums in float32: within bfloat16's rounding of the inputs
    and of the result (2^-8 relative) of the float64 gradient at the same bfloat16 point, where a
    bfloat16 sum over the row would add its own rounding at every term."""
    rng = np.random.default_rng(7)
    x = tf.cast(rng.standard_normal((4, 128)) * 3, tf.bfloat16)
    dy = tf.cast(rng.standard_normal((4, 128)), tf.bfloat16)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = softmax(x)
    dx = tape.gradient(y, x, output_gradients=dy)
    assert y.dtype == tf.bfloat16 and dx.dtype == tf.bfloat16
    y64 = tf.cast(y, tf.float64)
    dy64 = tf.cast(dy, tf.float64)
    want = (dy64 - tf.reduce_sum(dy64 * y64, -1, keepdims=True)) * y64
    got = tf.cast(dx, tf.float64).numpy()
    np.testing.assert_allclose(got, want.numpy(), rtol=2 ** -8, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("shape", [(64, 48), (3, 20, 48)])
def test_layer_norm_gradients_are_tensorflows(shape):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape) * 3 + 1
    x[0] = 5.0  # a constant row: its variance is 0 and epsilon alone keeps it finite
    gamma = rng.standard_normal(shape[-1:]) * 0.2 + 1
    beta = rng.standard_normal(shape[-1:]) * 0.2
    dy = rng.standard_normal(shape)
    eps = LAYER_NORM_EPSILON

    def ours(x, g, b):
        return layer_norm(x, g, b, eps)

    def reference(x, g, b):
        return _reference_layer_norm(x, g, b, eps)

    y, grads = _gradients(ours, [x, gamma, beta], dy)
    want_y, want = _gradients(reference, [x, gamma, beta], dy)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    for name, g, w in zip(("x", "gamma", "beta"), grads, want):
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9, err_msg=name)
    # The constant row's gradient is finite (1/sqrt(eps) = 1e6 times dy's centred part).
    assert np.all(np.isfinite(grads[0]))
    # Away from the constant row, where finite differences of 1e-6 would cross the eps scale.
    direction = [rng.standard_normal(a.shape) for a in (x, gamma, beta)]
    direction[0][0] = 0
    analytic = sum(float(np.sum(g * d)) for g, d in zip(grads, direction))
    numeric = _finite_difference(ours, [x, gamma, beta], dy, direction)
    assert abs(numeric - analytic) < 1e-6 * abs(analytic), (numeric, analytic)


def test_layer_norm_takes_variables_as_the_model_passes_them():
    rng = np.random.default_rng(3)
    x = tf.constant(rng.standard_normal((16, 8)), tf.float32)
    gamma = tf.Variable(tf.ones([8]))
    beta = tf.Variable(tf.zeros([8]))
    with tf.GradientTape() as tape:
        y = layer_norm(x, gamma, beta, LAYER_NORM_EPSILON)
        loss = tf.reduce_sum(y * tf.range(8, dtype=tf.float32))
    dgamma, dbeta = tape.gradient(loss, [gamma, beta])
    assert dgamma is not None and dbeta is not None
    np.testing.assert_allclose(dbeta.numpy(), 16 * np.arange(8), rtol=1e-6)


@pytest.mark.parametrize("shape", [(2048, 7), (5, 9, 3), (1, 4)])
def test_column_sums_sum_every_axis_but_the_last(shape):
    t = np.random.default_rng(4).standard_normal(shape)
    got = column_sums(tf.constant(t)).numpy()
    assert got.shape == shape[-1:]
    np.testing.assert_allclose(got, t.reshape(-1, shape[-1]).sum(axis=0), rtol=1e-12, atol=1e-12)
