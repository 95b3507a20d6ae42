"""Exporter for gorovod's BERT classifier SavedModel.

The model is written here with tf.Module and tf.Variable so that every variable carries the name it
has in Google's BERT checkpoints (``bert/encoder/layer_0/attention/self/query/kernel``, ...).  The
SavedModel's signatures compute the loss and one dense gradient per variable (``train_step``), apply
averaged gradients with Google's AdamWeightDecay (``apply_gradients``), evaluate, predict, and read or
assign the variables; the contract the Go package ``bertgraph`` checks is written beside them in
``assets.extra/gorovod_contract.json``.

Modules:
    config      the Google ``bert_config.json``
    model       encoder + classification head with Google variable names
    optimizer   AdamWeightDecay with global-norm clipping (Google BERT's optimization.py)
    contract    signature keys, contract version and the metadata JSON
    export      training and serving SavedModels (``python -m bertgraph.exporter.export``)
    convert_hf  HuggingFace safetensors -> Google checkpoint (``python -m bertgraph.exporter.convert_hf``)
    checkpoint  writing TF1 name-based checkpoints
"""
