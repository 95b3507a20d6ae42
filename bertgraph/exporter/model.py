"""BERT encoder + classification head whose variables carry Google's checkpoint names.

The forward pass follows Google BERT's modeling.py and run_classifier.py ``create_model``: word +
token-type + position embeddings, LayerNorm, N transformer layers (self-attention with the -10000
mask adder, GELU feed-forward, post-LayerNorm), tanh pooler on the first token, dropout, and
``logits = pooled @ output_weights^T + output_bias``.

Mixed precision (``compute_dtype`` bfloat16 or float16): the variables stay float32; the matrix
products (the dense layers' and attention's) take their inputs cast to ``compute_dtype``, and
their results are cast back to float32 at once, but where a result only feeds another product:
attention's queries, keys and values (bias included) and its context stay in ``compute_dtype``,
and so do the scores' mask, softmax and dropout in bfloat16 (not float16, whose range is too
small for them). Everything else element-wise (GELU, LayerNorm, residuals, the other biases and
dropouts, the loss) runs in float32: TensorFlow's own whole-graph rewrite also moves those to
bfloat16, where on CPU they ran slower than in float32, and float16 LayerNorm and softmax lose
the range and precision loss scaling cannot restore. Measured in docs/mixed-precision.md.

Every variable sits in a tree of tf.Module nodes whose attribute path *is* its Google name, so the
object-based checkpoint key TensorFlow derives for it (the key in the SavedModel's variables/) is
``<google name>/.ATTRIBUTES/VARIABLE_VALUE`` (see ``object_key``).  The ordered list of variables
is kept outside that tree (a plain Python list the tracker never sees), so no shorter second path
can take over the key.  Training checkpoints do not use these keys: the save_checkpoint signature
writes every variable under its Google name, as run_classifier does (export.py).
"""
import math

import numpy as np
import tensorflow as tf

from .config import BertConfig

LAYER_NORM_EPSILON = 1e-12  # tf.contrib.layers.layer_norm's default, used by Google BERT
MASK_ADDER = -10000.0  # Google BERT's attention mask adder


def object_key(path):
    """The object-based checkpoint key of the variable at attribute path ``path``."""
    return "/".join(p.replace(".", "..").replace("/", ".S") for p in path.split("/")) \
        + "/.ATTRIBUTES/VARIABLE_VALUE"


class VariableTree(tf.Module):
    """A tree of modules whose attribute paths are the variables' Google names."""

    def __init__(self, name=None):
        super().__init__(name=name)
        object.__setattr__(self, "_ordered", [])  # untracked: keeps creation order only

    def create(self, path, initial_value, trainable=True, dtype=tf.float32):
        *parents, leaf = path.split("/")
        node = self
        for p in parents:
            child = getattr(node, p, None)
            if child is None:
                child = tf.Module(name=None)
                setattr(node, p, child)
            node = child
        if hasattr(node, leaf):
            raise ValueError(f"variable {path} created twice")
        var = tf.Variable(initial_value, trainable=trainable, dtype=dtype,
                          name=path)
        setattr(node, leaf, var)
        self._ordered.append((path, var))
        return var

    @property
    def named_variables(self):
        """[(google name, tf.Variable)] in creation order."""
        return list(self._ordered)


_SQRT_HALF = math.sqrt(0.5)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def gelu(x):
    """The exact GELU, x Phi(x) with Phi(x) = (1 + erf(x / sqrt 2)) / 2 (HuggingFace's formula,
    which MiniLM was trained with), with its derivative written out, Phi(x) + x phi(x), from the
    Phi(x) the forward pass computed, where TensorFlow would differentiate op by op. erf rather
    than tf.nn.gelu's 0.5 erfc(-x / sqrt 2): TensorFlow's CPU erfc is 3.6x slower (MiniLM's
    [2048, 1536], one thread: 4.2 against 1.2 ms), and the two differ only in the far negative
    tail, where 1 + erf loses Phi's relative precision but not its absolute one (below 1e-7,
    against activations of order 1). tests/test_layers.py has the bounds."""
    @tf.custom_gradient
    def _gelu(x):
        cdf = 0.5 + 0.5 * tf.math.erf(x * _SQRT_HALF)
        def grad(dy):
            # phi(x) = exp(-x^2/2) / sqrt(2 pi), the constant folded into the exponent.
            return dy * (cdf + x * tf.exp(tf.square(x) * -0.5 - _LOG_SQRT_2PI))
        return x * cdf, grad
    return _gelu(x)


def layer_norm(x, gamma, beta, epsilon):
    """LayerNorm over the last axis, (x - mean) / sqrt(variance + epsilon) x gamma + beta, with
    its gradient written out (the standard closed form: dx = (g - mean(g) - xhat mean(g xhat)) /
    sqrt(variance + epsilon) with g = dy gamma) rather than TensorFlow's op by op through the
    moments, and gamma's and beta's sums as column_sums. MiniLM's [2048, 384], one thread,
    forward and backward: 6.1 -> 4.5 ms for each of its 13."""
    @tf.custom_gradient
    def _layer_norm(x, gamma, beta):
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        rstd = tf.math.rsqrt(variance + epsilon)
        xhat = (x - mean) * rstd
        def grad(dy):
            g = dy * gamma
            dx = rstd * (g - tf.reduce_mean(g, -1, keepdims=True)
                         - xhat * tf.reduce_mean(g * xhat, -1, keepdims=True))
            return dx, column_sums(dy * xhat), column_sums(dy)
        return xhat * gamma + beta, grad
    return _layer_norm(x, gamma, beta)


def softmax(x):
    """Softmax over the last axis in x's dtype, its gradient, (dy - sum(dy y)) y, in float32 at
    least: a bfloat16 sum over a row would round every partial sum."""
    wide = tf.float32 if x.dtype in (tf.bfloat16, tf.float16) else x.dtype
    @tf.custom_gradient
    def _softmax(x):
        y = tf.nn.softmax(x)
        def grad(dy):
            yw, dyw = tf.cast(y, wide), tf.cast(dy, wide)
            return tf.cast((dyw - tf.reduce_sum(dyw * yw, -1, keepdims=True)) * yw, x.dtype)
        return y, grad
    return _softmax(x)


def column_sums(t):
    """t summed over every axis but the last: BiasAdd's gradient kernel, 2-4x faster on CPU
    than tf.reduce_sum over those axes (see BertClassifier._dense)."""
    return tf.raw_ops.BiasAddGrad(out_backprop=t)


def _activation(name):
    if name == "gelu":
        return gelu
    if name in ("gelu_tanh", "gelu_new"):
        return lambda x: tf.nn.gelu(x, approximate=True)
    return {"relu": tf.nn.relu, "tanh": tf.tanh, "linear": tf.identity}[name]


# Dropout decides each element's fate at a resolution of 2^-16, not with a float32 uniform as
# tf.nn.dropout does, and from 16 random bits per pair of elements: TensorFlow's CPU Philox costs
# about as much per 32-bit word as per float, and the step's masks take tens of millions of
# decisions (MiniLM's, batch 16 x 128: 29 M), so a quarter of the words make them about a
# quarter as dear. An element is dropped when its bits are below ceil(rate x 2^16), so the rate is
# rounded up to a multiple of 2^-16 (0.1 -> 0.100006), and the kept elements are scaled by the
# inverse of the keep probability those bits give, so that the expectation of every output is its
# input, exactly as with tf.nn.dropout. The second element of a pair reads its pair's bits v
# shifted by an offset (``dropout_pair_offset``), which makes its keep probability the first's
# exactly and the two decisions independent to within 2^-17 in each of their four joint
# probabilities; distinct pairs read distinct bits.
DROPOUT_BITS = 16


def dropout_threshold(rate):
    """The 16-bit values below which an element is dropped, and the scale of a kept one."""
    levels = 1 << DROPOUT_BITS
    threshold = math.ceil(rate * levels)
    if not 0 <= threshold < levels:
        raise ValueError(f"dropout rate {rate!r} is not in [0, 1 - 2^-{DROPOUT_BITS}]: at the "
                         f"masks' resolution of 2^-{DROPOUT_BITS} it keeps no element")
    return threshold, levels / (levels - threshold)


def dropout_pair_offset(threshold):
    """The offset d with which a pair's second element is kept when (v + d) mod 2^16 >= threshold,
    v the pair's 16 random bits (the first's: v >= threshold). With t the threshold and L = 2^16,
    the second is then kept for v in [t - d, L - d), L - t values as the first, both for v in
    [t, L - d): L - t - d values, which d = round(t (L - t) / L) makes (L - t)^2 / L, the
    independent product, but for d's rounding."""
    levels = 1 << DROPOUT_BITS
    return round(threshold * (levels - threshold) / levels)


def keep_pairs(bits, threshold):
    """The keep decisions of the pairs' first and second elements, from their 16-bit ``bits``."""
    offset = tf.constant(dropout_pair_offset(threshold), tf.uint16)
    return bits >= threshold, bits + offset >= threshold  # uint16: the sum wraps mod 2^16


class Dropout:
    """Stateless dropout: the mask is a function of (seed, site), so a train step is reproducible
    given its seed, whichever process (Go or Python) runs it, and ranks differ by their seeds."""

    def __init__(self, seed):
        self._seed = seed
        self._site = 0

    def __call__(self, x, rate):
        dropped, scale = self.unscaled(x, rate)
        return dropped if scale == 1.0 else dropped * scale

    def unscaled(self, x, rate):
        """(x with the dropped elements zeroed, the scale its kept elements still need): for a
        caller that applies the scale to a smaller tensor computed linearly from x (attention
        scales its context, not the probabilities). The scale is 1.0 when nothing is dropped."""
        if self._seed is None or rate == 0.0:
            return x, 1.0
        self._site += 1
        site_seed = tf.random.experimental.stateless_fold_in(self._seed, self._site)
        threshold, scale = dropout_threshold(rate)
        # Element i and element i + pairs (of x flattened) are a pair: the decisions come out as
        # the two halves of the mask, and no op interleaves them.
        n = tf.size(x)
        pairs = (n + 1) // 2
        words = tf.random.stateless_uniform(tf.reshape((pairs + 1) // 2, [1]), seed=site_seed,
                                            minval=None, maxval=None, dtype=tf.uint32)
        bits = tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:pairs]
        keep = tf.concat(keep_pairs(bits, threshold), 0)[:n]
        return tf.where(tf.reshape(keep, tf.shape(x)), x, tf.zeros((), x.dtype)), scale


def matmul(a, b, compute_dtype, out_dtype=tf.float32, **kwargs):
    """a @ b with the product computed in ``compute_dtype``, the result in ``out_dtype``. (tf.cast
    to a tensor's own dtype adds no op.)"""
    return tf.cast(tf.matmul(tf.cast(a, compute_dtype), tf.cast(b, compute_dtype), **kwargs),
                   out_dtype)


class BertClassifier(VariableTree):
    """The encoder and the run_classifier head, for ``num_labels`` labels."""

    def __init__(self, config: BertConfig, num_labels: int, seed: int = 0):
        super().__init__(name="bert_classifier")
        if num_labels < 2:
            raise ValueError(f"num_labels must be at least 2, got {num_labels}")
        self.config = config
        self.num_labels = num_labels
        c = config
        counter = [0]

        def normal(shape):
            counter[0] += 1
            return tf.random.stateless_truncated_normal(
                shape, seed=[seed, counter[0]], stddev=c.initializer_range)

        def zeros(n):
            return tf.zeros([n])

        def ones(n):
            return tf.ones([n])

        h, i = c.hidden_size, c.intermediate_size
        self.create("bert/embeddings/word_embeddings", normal([c.vocab_size, h]))
        self.create("bert/embeddings/token_type_embeddings", normal([c.type_vocab_size, h]))
        self.create("bert/embeddings/position_embeddings", normal([c.max_position_embeddings, h]))
        self.create("bert/embeddings/LayerNorm/beta", zeros(h))
        self.create("bert/embeddings/LayerNorm/gamma", ones(h))
        for n in range(c.num_hidden_layers):
            p = f"bert/encoder/layer_{n}"
            for part in ("query", "key", "value"):
                self.create(f"{p}/attention/self/{part}/kernel", normal([h, h]))
                self.create(f"{p}/attention/self/{part}/bias", zeros(h))
            self.create(f"{p}/attention/output/dense/kernel", normal([h, h]))
            self.create(f"{p}/attention/output/dense/bias", zeros(h))
            self.create(f"{p}/attention/output/LayerNorm/beta", zeros(h))
            self.create(f"{p}/attention/output/LayerNorm/gamma", ones(h))
            self.create(f"{p}/intermediate/dense/kernel", normal([h, i]))
            self.create(f"{p}/intermediate/dense/bias", zeros(i))
            self.create(f"{p}/output/dense/kernel", normal([i, h]))
            self.create(f"{p}/output/dense/bias", zeros(h))
            self.create(f"{p}/output/LayerNorm/beta", zeros(h))
            self.create(f"{p}/output/LayerNorm/gamma", ones(h))
        self.create("bert/pooler/dense/kernel", normal([h, h]))
        self.create("bert/pooler/dense/bias", zeros(h))
        self.create("output_weights", normal([num_labels, h]))
        self.create("output_bias", zeros(num_labels))
        object.__setattr__(self, "_by_name", dict(self._ordered))

    def var(self, name):
        return self._by_name[name]

    def load_values(self, values):
        """Assigns {google name: ndarray} (a subset is fine); returns the names assigned."""
        assigned = []
        for name, value in values.items():
            var = self._by_name.get(name)
            if var is None:
                continue
            if tuple(var.shape) != tuple(np.shape(value)):
                raise ValueError(f"{name}: checkpoint shape {np.shape(value)} != model shape "
                                 f"{tuple(var.shape)}")
            var.assign(value)
            assigned.append(name)
        return assigned

    # -- forward pass -----------------------------------------------------------------------------

    def _dense(self, x, prefix, compute_dtype=tf.float32, scale=1.0):
        """x @ kernel + bias, the product in ``compute_dtype``, the result float32. ``scale``
        multiplies the kernel (a constant factor of x moved onto the smaller tensor)."""
        # BiasAdd rather than a broadcasting +: its gradient is BiasAddGrad, which sums the
        # [tokens, units] gradient over the tokens 2-4x faster than Sum over axis 0 does on CPU
        # (MiniLM's intermediate bias, [2048, 1536], one thread: 2.9 -> 0.75 ms).
        kernel = self.var(prefix + "/kernel")
        if scale != 1.0:
            kernel = kernel * scale
        return tf.nn.bias_add(matmul(x, kernel, compute_dtype), self.var(prefix + "/bias"))

    def _projection(self, x, prefix, compute_dtype, scale=1.0):
        """scale (x @ kernel + bias) wholly in ``compute_dtype``, bias included: attention's
        queries, keys and values feed products only, so in bfloat16 they stay bfloat16 (through
        the heads' transposes too) rather than go to float32 and back for the bias alone; their
        product already rounds to bfloat16, and the bias's gradient to it then as the kernel's
        does. ``scale`` multiplies the kernel and the bias, as ``_dense``'s does."""
        kernel, bias = self.var(prefix + "/kernel"), self.var(prefix + "/bias")
        if scale != 1.0:
            kernel, bias = kernel * scale, bias * scale
        return tf.nn.bias_add(matmul(x, kernel, compute_dtype, out_dtype=compute_dtype),
                              tf.cast(bias, compute_dtype))

    def _layer_norm(self, x, prefix):
        return layer_norm(x, self.var(prefix + "/gamma"), self.var(prefix + "/beta"),
                          LAYER_NORM_EPSILON)

    def encode(self, input_ids, input_mask, segment_ids, dropout_seed=None):
        """Returns (sequence_output [B, S, H], pooled_output [B, H]).

        ``dropout_seed`` (int64 [2]) turns dropout on; None is inference."""
        return self._encode(input_ids, input_mask, segment_ids, Dropout(dropout_seed))

    def logits(self, input_ids, input_mask, segment_ids, dropout_seed=None,
               compute_dtype=tf.float32):
        """run_classifier's create_model: dropout (0.1 in Google's code; hidden_dropout_prob here,
        the same value in every released config) on the pooled output, then the output layer.
        ``compute_dtype``: see the module docstring; the output layer stays float32 (its logits
        feed the loss directly, and it is tiny). The last layer runs for the first token only
        (``_encode``'s first_token_only): nothing here reads the other tokens' outputs."""
        drop = Dropout(dropout_seed)
        _, pooled = self._encode(input_ids, input_mask, segment_ids, drop, compute_dtype,
                                 first_token_only=True)
        pooled = drop(pooled, self.config.hidden_dropout_prob)
        return tf.matmul(pooled, self.var("output_weights"), transpose_b=True) \
            + self.var("output_bias")

    def _encode(self, input_ids, input_mask, segment_ids, drop, compute_dtype=tf.float32,
                first_token_only=False):
        """(sequence_output, pooled_output) as ``encode`` documents them.

        ``first_token_only``: the pooler reads the last layer's output at the first token only,
        and a layer's output at one position depends on the layer's input at every position only
        through the keys and values. So the last layer computes its keys and values for every
        token and all the rest (queries, attention, the output projection, the feed-forward
        block, both LayerNorms, dropout) for the first token alone; sequence_output is then None.
        The pooled output and every gradient are the full layer's but for rounding (tests/
        test_model.py), in about a sixth less work for MiniLM's 6 layers."""
        c, cd = self.config, compute_dtype
        act = _activation(c.hidden_act)
        h, heads = c.hidden_size, c.num_attention_heads
        head = h // heads
        batch = tf.shape(input_ids)[0]
        seq = input_ids.shape[1]
        if seq is None:
            seq = tf.shape(input_ids)[1]

        x = tf.gather(self.var("bert/embeddings/word_embeddings"), input_ids)
        token_type = tf.one_hot(segment_ids, c.type_vocab_size, dtype=tf.float32)
        x += tf.einsum("bst,th->bsh", token_type, self.var("bert/embeddings/token_type_embeddings"))
        x += self.var("bert/embeddings/position_embeddings")[:seq][tf.newaxis]
        x = self._layer_norm(x, "bert/embeddings/LayerNorm")
        x = drop(x, c.hidden_dropout_prob)

        mask = tf.cast(input_mask, tf.float32)[:, tf.newaxis, tf.newaxis, :]  # [B, 1, 1, S]
        adder = (1.0 - mask) * MASK_ADDER
        x = tf.reshape(x, [-1, h])  # [B*S, H], as Google's transformer_model keeps it

        def split_heads(t, positions=seq):
            return tf.transpose(tf.reshape(t, [batch, positions, heads, head]), [0, 2, 1, 3])

        for n in range(c.num_hidden_layers):
            p = f"bert/encoder/layer_{n}"
            last = n == c.num_hidden_layers - 1
            # The rows of x the layer computes its output for: every token's, or in the last
            # layer with first_token_only the first token's of each sequence ([B, H]).
            if last and first_token_only:
                rows, positions = tf.reshape(x, [batch, seq, h])[:, 0], 1
            else:
                rows, positions = x, seq
            # Both scalar factors of attention go onto weights rather than the scores
            # ([B, heads, S, S]): 1/sqrt(head) onto the query's kernel and bias, and dropout's
            # scale onto the output projection's kernel. Every product is linear in them, so
            # the results are Google's but for rounding, in two fewer passes over the scores
            # each way (forward, backward) and none over the activations.
            q = split_heads(self._projection(rows, p + "/attention/self/query", cd,
                                             1.0 / math.sqrt(head)), positions)
            k = split_heads(self._projection(x, p + "/attention/self/key", cd))
            v = split_heads(self._projection(x, p + "/attention/self/value", cd))
            # The scores' mask, softmax and dropout in bfloat16 when the products are (it has
            # float32's range, and the probabilities are rounded to it for the product anyway):
            # two fewer casts of the scores; float16's range is too small for them.
            sd = tf.float32 if cd == tf.float16 else cd
            scores = matmul(q, k, cd, out_dtype=sd, transpose_b=True) + tf.cast(adder, sd)
            probs, probs_scale = drop.unscaled(softmax(scores), c.attention_probs_dropout_prob)
            ctx = matmul(probs, v, cd, out_dtype=cd)
            ctx = tf.reshape(tf.transpose(ctx, [0, 2, 1, 3]), [-1, h])
            attn = drop(self._dense(ctx, p + "/attention/output/dense", cd, probs_scale),
                        c.hidden_dropout_prob)
            attn = self._layer_norm(attn + rows, p + "/attention/output/LayerNorm")
            inter = act(self._dense(attn, p + "/intermediate/dense", cd))
            out = drop(self._dense(inter, p + "/output/dense", cd), c.hidden_dropout_prob)
            x = self._layer_norm(out + attn, p + "/output/LayerNorm")

        if first_token_only:
            sequence_output, first = None, x
        else:
            sequence_output = tf.reshape(x, [batch, seq, h])
            first = sequence_output[:, 0]
        pooled = tf.tanh(self._dense(first, "bert/pooler/dense", cd))
        return sequence_output, pooled
