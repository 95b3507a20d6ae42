"""The train step's dropout (model.Dropout): 16 random bits per pair of elements, a drop threshold
of ceil(rate x 2^16) and the kept values scaled so that every output's expectation is its input."""
import json
import math

import numpy as np
import pytest
import tensorflow as tf

from bertgraph.exporter.config import BertConfig
from bertgraph.exporter.model import (DROPOUT_BITS, Dropout, dropout_pair_offset,
                                      dropout_threshold, keep_pairs)

SEED = tf.constant([7, 11], tf.int64)


def _sigmas(observed, n, p):
    """How many binomial standard deviations observed (a count of n trials) is from n x p."""
    return abs(observed - n * p) / math.sqrt(n * p * (1 - p))


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.25, 0.9, 1e-6])
def test_threshold_keeps_the_expectation_exact(rate):
    threshold, scale = dropout_threshold(rate)
    levels = 1 << DROPOUT_BITS
    assert threshold == math.ceil(rate * levels)
    assert 0 <= threshold - rate * levels < 1  # the rate rounded up by less than 2^-16
    keep = (levels - threshold) / levels
    assert keep * scale == pytest.approx(1.0, rel=1e-15)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.25, 0.9, 1e-6, 1 - 2 ** -16])
def test_a_pairs_decisions_keep_at_the_rate_and_are_independent(rate):
    """Over every one of the 2^16 bit patterns, exactly: each element of a pair is kept for
    L - t of them (L = 2^16, t the threshold), as one alone would be, and both for the share
    independent decisions give, within the offset's rounding (half a pattern: 2^-17)."""
    levels = 1 << DROPOUT_BITS
    threshold, _ = dropout_threshold(rate)
    bits = tf.constant(np.arange(levels, dtype=np.uint16))
    first, second = (k.numpy() for k in keep_pairs(bits, threshold))
    assert first.sum() == second.sum() == levels - threshold
    keep = (levels - threshold) / levels
    for a, pa in ((first, keep), (~first, 1 - keep)):
        for b, pb in ((second, keep), (~second, 1 - keep)):
            assert abs((a & b).sum() / levels - pa * pb) <= 2 ** -17, (rate, pa, pb)
    assert (first & second).sum() == levels - threshold - dropout_pair_offset(threshold)


# An odd number of elements: the last pair's second element and the last 32-bit word's second
# half are drawn and not used.
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_masks_drop_at_the_rate_and_scale_what_they_keep(rate):
    shape = (301, 203)
    n = shape[0] * shape[1]
    x = tf.fill(shape, 3.0)
    y = Dropout(SEED)(x, rate).numpy()
    threshold, scale = dropout_threshold(rate)
    keep_p = 1 - threshold / (1 << DROPOUT_BITS)
    kept = y != 0
    np.testing.assert_array_equal(y[kept], np.float32(3.0 * scale))
    # Binomial: 5 standard deviations fail a correct mask about once in 1.7 million runs. This
    # catches a wrong threshold or a half of each word left unused, not a rate off by 2^-8: the
    # exact scale above pins the 16-bit threshold.
    assert _sigmas(kept.sum(), n, keep_p) < 5
    # Element i and element i + pairs share their 16 bits. Both halves of the mask keep at the
    # rate, with both 16-bit halves of every word (the even and the odd elements of each half);
    # and the pairs' decisions are independent: both elements dropped at rate^2, where the same
    # bits read alike would give rate.
    flat = kept.ravel()
    pairs = (n + 1) // 2
    first, second = flat[:pairs], flat[pairs:]
    for half in (first, second):
        assert _sigmas(half[0::2].sum(), len(half[0::2]), keep_p) < 5
        assert _sigmas(half[1::2].sum(), len(half[1::2]), keep_p) < 5
    both_dropped = (~first[:len(second)] & ~second).sum()
    assert _sigmas(both_dropped, len(second), (1 - keep_p) ** 2) < 5
    # Expectation: the mean output is the input within the sampling error of the mean.
    sd = 3.0 * scale * math.sqrt(keep_p * (1 - keep_p) / n)
    assert abs(y.mean() - 3.0) < 5 * sd


def test_masks_follow_the_seed_and_the_site():
    x = tf.ones((64, 128))
    first = Dropout(SEED)
    a1, a2 = first(x, 0.1).numpy(), first(x, 0.1).numpy()  # sites 1 and 2
    b1 = Dropout(SEED)(x, 0.1).numpy()
    c1 = Dropout(tf.constant([7, 12], tf.int64))(x, 0.1).numpy()
    np.testing.assert_array_equal(a1, b1)  # same seed, same site: the same mask in any process
    n = x.shape[0] * x.shape[1]
    for other in (a2, c1):
        both_dropped = ((a1 == 0) & (other == 0)).sum()
        # Independent masks drop the same element with probability rate^2 (1%), not rate (10%).
        assert _sigmas(both_dropped, n, 0.1 ** 2) < 5


def test_gradient_is_the_mask_times_the_scale():
    x = tf.random.stateless_normal((33, 17), seed=[1, 1])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = Dropout(SEED)(x, 0.1)
    g = tape.gradient(y, x).numpy()
    _, scale = dropout_threshold(0.1)
    np.testing.assert_array_equal(g, np.where(y.numpy() != 0, np.float32(scale), 0))


@pytest.mark.parametrize("rate", [1.0, 1 - 2 ** -17, -0.1])
def test_rates_that_keep_nothing_or_are_negative_are_refused(rate):
    with pytest.raises(ValueError, match="dropout rate"):
        dropout_threshold(rate)
    with pytest.raises(ValueError, match="dropout rate"):
        Dropout(SEED)(tf.ones((2, 2)), rate)


@pytest.mark.parametrize("field", ["hidden_dropout_prob", "attention_probs_dropout_prob"])
def test_config_refuses_a_dropout_probability_outside_0_1(tmp_path, field):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps({"vocab_size": 10, "hidden_size": 8, "num_attention_heads": 2, field: 1.0}))
    with pytest.raises(ValueError, match=f"{path}: {field} 1.0 is not in"):
        BertConfig.from_json_file(path)


def test_inference_and_rate_zero_are_the_identity():
    x = tf.ones((4, 4))
    assert Dropout(None)(x, 0.1) is x
    assert Dropout(SEED)(x, 0.0) is x


def test_unscaled_is_the_same_mask_without_the_scale():
    x = tf.random.stateless_normal((40, 50), seed=[2, 3])
    dropped, scale = Dropout(SEED).unscaled(x, 0.1)
    assert scale == dropout_threshold(0.1)[1]
    y = Dropout(SEED)(x, 0.1)  # the same seed and site: the same mask
    np.testing.assert_array_equal(y.numpy(), (dropped * scale).numpy())
    kept = dropped.numpy() != 0
    np.testing.assert_array_equal(dropped.numpy()[kept], x.numpy()[kept])
    unchanged, one = Dropout(None).unscaled(x, 0.1)
    assert unchanged is x and one == 1.0
