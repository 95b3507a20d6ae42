"""TF1 name-based checkpoints (the format of Google's ``bert_model.ckpt``)."""
import tensorflow as tf


def write(prefix, values):
    """Writes {name: ndarray} as ``prefix.index`` + ``prefix.data-*``, keyed by the names."""
    names = sorted(values)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(values[n]) for n in names])
    return prefix


def read(prefix):
    """{name: ndarray} of every tensor in the checkpoint at ``prefix``."""
    reader = tf.train.load_checkpoint(prefix)
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}
