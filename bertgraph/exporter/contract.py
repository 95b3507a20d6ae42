"""The SavedModel contract between the exporter and Go's ``bertgraph`` package.

Everything Go needs to drive the model without guessing is in ``assets.extra/gorovod_contract.json``:
the signatures with their input/output keys, dtypes and shapes, the variables in gradient order with
their Google names, shapes, signature keys, training-checkpoint keys (their Google names) and
object-based keys (in the SavedModel's variables/), the optimizer slots and global_step with their
checkpoint keys, and the serving SavedModel packaged beside it.  Bump
``CONTRACT_VERSION`` whenever a key, dtype or meaning changes; Go refuses other versions.
"""
import json
import pathlib

# 2: apply_gradients takes gradient_scale (the factor the given gradients are multiplied by).
# 3: save_checkpoint/restore_checkpoint write and read training checkpoints keyed by Google BERT
#    names (checkpoint_key: N, N/adam_m, N/adam_v, global_step); object_key is the SavedModel's key.
# 4: mixed precision: train_step_bfloat16 and train_step_float16 (matrix products in that dtype),
#    the loss scale (train_step differentiates loss x loss_scale, apply_gradients unscales,
#    updates it and outputs it), set_loss_scale.
CONTRACT_VERSION = 4
CONTRACT_FILE = "assets.extra/gorovod_contract.json"
SERVING_DIR = "assets.extra/serving"
VOCAB_FILE = "assets.extra/vocab.txt"

TRAIN_STEP = "train_step"
# train_step with its matrix products in another dtype: {compute dtype: signature key}.
MIXED_TRAIN_STEPS = {"bfloat16": "train_step_bfloat16", "float16": "train_step_float16"}
SET_LOSS_SCALE = "set_loss_scale"
APPLY_GRADIENTS = "apply_gradients"
EVAL_STEP = "eval_step"
PREDICT = "predict"
SERVING_DEFAULT = "serving_default"
READ_VARIABLES = "read_variables"
ASSIGN_VARIABLES = "assign_variables"
SAVE_CHECKPOINT = "save_checkpoint"
RESTORE_CHECKPOINT = "restore_checkpoint"


def gradient_key(i):
    return f"grad_{i:04d}"


def variable_key(i):
    return f"var_{i:04d}"


def tensor_spec(spec):
    """{dtype, shape} of a tf.TensorSpec, -1 for unknown dimensions."""
    return {"dtype": spec.dtype.name,
            "shape": [-1 if d is None else int(d) for d in spec.shape.as_list()]}


def signature_entry(concrete_function, input_specs):
    """{inputs, outputs} of a signature: key -> {dtype, shape}."""
    outputs = concrete_function.structured_outputs
    return {
        "inputs": {k: tensor_spec(v) for k, v in sorted(input_specs.items())},
        "outputs": {k: tensor_spec(v) for k, v in sorted(outputs.items())},
    }


def write(export_dir, contract):
    path = pathlib.Path(export_dir) / CONTRACT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(contract, indent=1, sort_keys=True) + "\n")


def read(export_dir):
    return json.loads((pathlib.Path(export_dir) / CONTRACT_FILE).read_text())
