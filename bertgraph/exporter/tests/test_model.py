"""The classifier's last layer computed for the first token only (BertClassifier.logits) against
the whole layer (the pooled output of BertClassifier.encode): the same logits and the same
gradient of every variable but for rounding, with padding in the batch so that the attention
mask is in play, and with random weights, so that no variable's gradient is zero by accident.

The bounds are float32 rounding of two different op orders, not bit equality: the two graphs
run different matrix shapes, and oneDNN picks other kernels (and summation orders) for them on
other CPUs."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from bertgraph.exporter.config import TINY
from bertgraph.exporter.model import BertClassifier, Dropout

SEQ = 16


def _batch(config):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, config.vocab_size, size=(3, SEQ), dtype=np.int32)
    lengths = np.array([SEQ, 9, 4])
    mask = (np.arange(SEQ)[None] < lengths[:, None]).astype(np.int32)
    segments = ((np.arange(SEQ)[None] >= lengths[:, None] // 2) * mask).astype(np.int32)
    labels = np.array([0, 1, 1], np.int32)
    return [tf.constant(a) for a in (ids, mask, segments)], tf.constant(labels)


def _whole_layer_logits(model, inputs):
    """The logits from every token's last-layer output, as Google's create_model computes them."""
    _, pooled = model.encode(*inputs)
    return tf.matmul(pooled, model.var("output_weights"), transpose_b=True) + model.var("output_bias")


def _loss_and_gradients(model, logits_fn, labels):
    variables = [v for _, v in model.named_variables]
    with tf.GradientTape() as tape:
        logits = logits_fn()
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    return logits.numpy(), tape.gradient(loss, variables)


@pytest.fixture(scope="module")
def model():
    m = BertClassifier(TINY, num_labels=2, seed=3)
    # Random biases, LayerNorm parameters and head too (they start at 0 and 1), so that every
    # term of every gradient is exercised.
    rng = np.random.default_rng(1)
    for name, var in m.named_variables:
        if "embeddings" not in name and "kernel" not in name:
            var.assign(var + 0.1 * rng.standard_normal(var.shape).astype(np.float32))
    m.var("output_weights").assign(rng.standard_normal((2, TINY.hidden_size)).astype(np.float32))
    return m


def test_first_token_logits_and_gradients_are_the_whole_layers(model):
    inputs, labels = _batch(TINY)
    got_logits, got = _loss_and_gradients(model, lambda: model.logits(*inputs), labels)
    want_logits, want = _loss_and_gradients(model, lambda: _whole_layer_logits(model, inputs), labels)
    np.testing.assert_allclose(got_logits, want_logits, rtol=1e-5, atol=1e-6)
    # Not vacuous: the examples' logits differ, and so would a layer computed for another token.
    assert np.abs(want_logits[0] - want_logits[1]).max() > 1e-3
    names = [n for n, _ in model.named_variables]
    got = [tf.convert_to_tensor(g).numpy() for g in got]
    want = [tf.convert_to_tensor(w).numpy() for w in want]
    largest = max(np.abs(w).max() for w in want)
    for name, g, w in zip(names, got, want):
        scale = np.abs(w).max()
        if name.endswith("/key/bias"):
            # A key bias adds the same q.b to every score of a query, which softmax ignores:
            # its gradient is 0 but for rounding, on both sides.
            assert scale < 1e-6 * largest, name
            scale = largest
        else:
            assert scale > 1e-7 * largest, f"{name}: the whole layer's gradient is zero"
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5 * scale, err_msg=name)


def test_first_token_output_still_reads_every_token(model):
    """The last layer's first-token output, what the pooler reads, changes when a later token of
    its sequence changes (through the keys and values): the shortcut keeps that dependence, and
    keeps the examples apart."""
    inputs, _ = _batch(TINY)
    ids = inputs[0].numpy()
    ids[0, SEQ - 1] = (ids[0, SEQ - 1] + 1) % TINY.vocab_size
    changed = [tf.constant(ids)] + inputs[1:]
    before, after = model.logits(*inputs).numpy(), model.logits(*changed).numpy()
    assert np.abs(before[0] - after[0]).max() > 1e-6  # example 0's last token is real
    np.testing.assert_allclose(before[1:], after[1:], rtol=1e-6, atol=1e-7)  # the others' are not


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_mixed_precision_first_token_logits_are_close(model, dtype):
    inputs, _ = _batch(TINY)
    whole = _whole_layer_logits(model, inputs).numpy()
    np.testing.assert_allclose(model.logits(*inputs, compute_dtype=dtype).numpy(), whole,
                               rtol=0, atol=0.05 * np.abs(whole).max())


def test_dropout_keeps_its_sites_and_rates():
    """With dropout on, the shortcut draws at the same sites (the seed's fold-in counter) as the
    whole layer, and drops at the configured rate in the last layer too."""
    config = dataclasses.replace(TINY, hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5)
    m = BertClassifier(config, num_labels=2)
    inputs, _ = _batch(config)
    seed = tf.constant([7, 11], tf.int64)
    whole, first = Dropout(seed), Dropout(seed)
    m._encode(*inputs, whole)
    m._encode(*inputs, first, first_token_only=True)
    assert first._site == whole._site > 0
    a = m.logits(*inputs, dropout_seed=seed).numpy()
    b = m.logits(*inputs, dropout_seed=tf.constant([7, 12], tf.int64)).numpy()
    assert np.isfinite(a).all() and np.abs(a - b).max() > 1e-6
    # Bit for bit: the same graph on the same shapes in one process, and the masks a function
    # of the seed alone.
    np.testing.assert_array_equal(a, m.logits(*inputs, dropout_seed=seed).numpy())
