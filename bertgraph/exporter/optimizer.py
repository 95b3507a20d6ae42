"""AdamWeightDecay with global-norm clipping, as Google BERT's optimization.py applies it.

    grads   = clip_by_global_norm(gradient_scale * grads, clip_norm)   # after the allreduce
    m       = beta1 * m + (1 - beta1) * g
    v       = beta2 * v + (1 - beta2) * g^2
    update  = m / (sqrt(v) + epsilon) + weight_decay * param  # decay unless LayerNorm/layer_norm/bias
    param  -= learning_rate * update                           # no bias correction
    global_step += 1

``gradient_scale`` lets the caller hand over gradients that still need a factor, such as the sum of
an allreduce whose 1/size is left to this step: 1 means the gradients are already averaged.  It is
folded into the multiply clipping does anyway (the norm of the scaled gradients is gradient_scale
times the norm of the given ones), so each gradient is still multiplied once, by
gradient_scale * clip_norm / max(gradient_scale * norm, clip_norm): no extra pass over them.

The moments and the parameter are updated by TensorFlow's fused ApplyAdam kernel with its bias
correction off (beta powers 0), after the decay term (which reads the parameter before the step, as
Google's update does); the kernel computes 1 - beta2 in float32 (0.00099998713 for 0.999, 1.3e-5
below Google's 0.001), the only difference from Google's arithmetic beyond rounding.

A non-finite global norm (an overflowed or NaN gradient) skips the whole update: parameters, slots
and global_step keep their values and ``applied`` says False.

Loss scaling (``LossScale``, for float16 compute): train_step differentiates loss x loss_scale, so
its gradients are loss_scale times too large; apply folds 1/loss_scale into gradient_scale, so the
gradients are unscaled before the norm and clipping, in the same one multiply.  With a positive
growth interval the scale is dynamic, as tf.keras.mixed_precision.LossScaleOptimizer's: a
non-finite global norm skips the step and halves the scale (not below 1); ``growth_interval``
finite steps in a row double it.  The sums the decision is made on are the same on every rank, so
every rank decides alike.  With growth interval 0 the scale is static (1 for float32 and bfloat16:
the scaling is then exact, and the step is what it was without loss scaling).
"""
import re

import tensorflow as tf

from .model import VariableTree

BETA_1 = 0.9
BETA_2 = 0.999
EPSILON = 1e-6
WEIGHT_DECAY_RATE = 0.01
EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")
# The slots, named as Google's AdamWeightDecayOptimizer names them: <param name>/<slot>.
SLOTS = ("adam_m", "adam_v")


def uses_weight_decay(name):
    """Google's AdamWeightDecayOptimizer._do_use_weight_decay."""
    return not any(re.search(r, name) for r in EXCLUDE_FROM_WEIGHT_DECAY)


# LossScaleOptimizer's dynamic defaults: initial scale 2^15, doubled after 2000 finite steps.
INITIAL_LOSS_SCALE = 2.0 ** 15
LOSS_SCALE_GROWTH_INTERVAL = 2000


class LossScale(tf.Module):
    """The loss scale's state: ``loss_scale`` (float32), ``growth_interval`` (int64, 0: static)
    and ``good_steps`` (finite steps since the last change).  Exported as 1 and static."""

    def __init__(self):
        super().__init__(name="loss_scale")
        self.loss_scale = tf.Variable(1.0, dtype=tf.float32, trainable=False, name="loss_scale")
        self.growth_interval = tf.Variable(0, dtype=tf.int64, trainable=False,
                                           name="growth_interval")
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="good_steps")

    def set(self, loss_scale, growth_interval):
        self.loss_scale.assign(loss_scale)
        self.growth_interval.assign(growth_interval)
        self.good_steps.assign(0)

    def update(self, finite):
        """After a step whose global norm was ``finite`` (or not): halve, grow or keep."""
        dynamic = self.growth_interval > 0
        scale = self.loss_scale.read_value()
        good = tf.where(finite, self.good_steps + 1, 0)
        doubled = scale * 2.0
        grow = finite & dynamic & (good >= self.growth_interval) & tf.math.is_finite(doubled)
        shrink = tf.logical_not(finite) & dynamic
        self.loss_scale.assign(tf.where(shrink, tf.maximum(scale * 0.5, 1.0),
                                        tf.where(grow, doubled, scale)))
        self.good_steps.assign(tf.where(grow | tf.logical_not(dynamic), tf.zeros_like(good), good))


class AdamWeightDecay(tf.Module):
    """Slots ``adam_m``/``adam_v`` mirror the model's variable tree; see module docstring.  The
    optimizer keeps no other state: the learning rate and clip norm are inputs of every step,
    and global_step belongs to the model."""

    def __init__(self, named_variables):
        super().__init__(name="adam_weight_decay")
        self.adam_m = VariableTree()
        self.adam_v = VariableTree()
        object.__setattr__(self, "_params", list(named_variables))
        for name, var in named_variables:
            self.adam_m.create(name, tf.zeros(var.shape), trainable=False)
            self.adam_v.create(name, tf.zeros(var.shape), trainable=False)

    @property
    def named_slots(self):
        """(``<param name>/<slot>``, variable) of every slot: all ``adam_m``, then all ``adam_v``,
        each in the order of ``named_variables``."""
        return [(f"{name}/{slot}", var) for slot in SLOTS
                for name, var in getattr(self, slot).named_variables]

    def apply(self, grads, learning_rate, clip_norm, global_step, gradient_scale=1.0,
              loss_scale=None):
        """Returns (global_norm, applied): the norm is that of the scaled (and unscaled by
        ``loss_scale``, a LossScale, which this step then updates) gradients, before clipping.
        ``grads`` are in the order of ``named_variables``."""
        if loss_scale is not None:
            gradient_scale = gradient_scale / loss_scale.loss_scale.read_value()
        global_norm = gradient_scale * tf.linalg.global_norm(grads)
        finite = tf.math.is_finite(global_norm)

        def update():
            # With gradient_scale 1 this is exactly clip_by_global_norm's factor.
            scale = gradient_scale * clip_norm / tf.maximum(global_norm, clip_norm)
            ms = [v for _, v in self.adam_m.named_variables]
            vs = [v for _, v in self.adam_v.named_variables]
            no_bias_correction = tf.constant(0.0)  # beta powers 0: ApplyAdam's rate is lr itself
            for (name, param), g, m, v in zip(self._params, grads, ms, vs):
                # The decay reads the parameter before the Adam step, as Google's update does:
                # param - lr * (adam + wd * param) = param * (1 - lr * wd) - lr * adam. Assigning
                # the product hands its buffer to the variable: one pass over the parameter, where
                # assign_sub(lr * wd * param) takes two (MiniLM on one thread: 17.6 -> 10.2 ms).
                if uses_weight_decay(name):
                    param.assign(param * (1.0 - learning_rate * WEIGHT_DECAY_RATE))
                # One fused kernel for m, v and the parameter instead of a dozen element-wise ops,
                # each a pass over all the model's values: MiniLM's apply on one thread 177 -> 93 ms.
                tf.raw_ops.ResourceApplyAdam(
                    var=param.handle, m=m.handle, v=v.handle, beta1_power=no_bias_correction,
                    beta2_power=no_bias_correction, lr=learning_rate, beta1=tf.constant(BETA_1),
                    beta2=tf.constant(BETA_2), epsilon=tf.constant(EPSILON), grad=g * scale)
            global_step.assign_add(1)
            return tf.constant(True)

        applied = tf.cond(finite, update, lambda: tf.constant(False))
        if loss_scale is not None:
            loss_scale.update(finite)
        return global_norm, applied
