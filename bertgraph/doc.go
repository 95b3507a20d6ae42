// Package bertgraph drives gorovod's BERT classifier SavedModel from Go.
//
// The SavedModel is written by the Python exporter (bertgraph/exporter): its signatures compute
// the loss and one dense gradient per variable (train_step), apply averaged gradients with
// Google BERT's AdamWeightDecay after global-norm clipping (apply_gradients), evaluate
// (eval_step), predict (predict, serving_default), read or assign every model variable
// (read_variables, assign_variables), and save or restore every training variable in a
// checkpoint keyed by Google BERT names, as run_classifier's are (save_checkpoint,
// restore_checkpoint). assets.extra/gorovod_contract.json lists the variables in gradient order
// with their Google checkpoint names; Load checks the SavedModel against it and
// against what this package expects, so a stale or foreign model fails at load time with an
// error that names what is wrong, not in the middle of training.
//
// A Model's training methods serialise on a mutex and reuse their input tensors and output
// buffers, so a training loop does not allocate per step. Eval and Predict feed tensors of their
// own and may run from several goroutines at once: with TensorFlow's intra-op threads fewer
// than the cores, concurrent batches are how an evaluation uses the rest.
// Gradients and variable values travel in FlatTensors: one contiguous float32 buffer with a view
// per variable, the shape a fused allreduce or a broadcast wants.
//
// A Classifier serves an exported model (Model.ExportServing) to concurrent callers:
// Predict(texts) tokenizes with the model's vocabulary and returns labels and probabilities.
package bertgraph
