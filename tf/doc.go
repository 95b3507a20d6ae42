// Package tf is gorovod's binding of the TensorFlow C API: tensors, graphs, sessions,
// SavedModels and checkpoints, everything training and serving from Go need. The C library is
// the one of the pinned TensorFlow CPU wheel (third_party/tensorflow, laid out by `make setup`).
//
// # Loading and running a SavedModel
//
//	m, err := tf.LoadSavedModel(dir, []string{"serve"}, &tf.SessionOptions{IntraOpThreads: 2})
//	defer m.Close()
//	x, err := tf.NewTensor(features, batch, 4)     // []float32 with shape [batch, 4]
//	defer x.Close()
//	outs, err := m.RunSignature("predict", map[string]*tf.Tensor{"x": x}, "probs", "label")
//	probs, err := outs[0].Float32s()                // outputs come in the order asked
//
// m.Signatures lists every SignatureDef sorted by key, each with its Inputs and Outputs sorted
// by key (TensorInfo: key, graph tensor name "op:index", dtype, static shape). The internal
// __saved_model_init_op signature is left out, as Python does. Lower down, Session.Run takes
// feeds by Output, fetches and targets: m.Graph.Output("op:1") resolves a tensor name.
//
// # Tensors
//
// NewTensor copies a []float32, []float64, []int32, []int64, []bool or []uint8 with a shape
// into C memory; NewFloat16Tensor takes float16 as raw IEEE bits ([]uint16) and
// NewStringTensor takes []string. Reading back copies with one memmove, no reflection:
// Float32s, Int32s, ... or the generic Values(t, dst) that reuses dst's storage. Overwrite
// refills a feed tensor in place when TensorFlow no longer shares its buffer. NewTensorOver
// feeds a slice without copying it: the tensor's data is the slice's memory (64-byte aligned,
// pinned while TensorFlow refers to it, never written by TensorFlow). Every Tensor must be
// closed (a cleanup frees forgotten ones, but the Go GC does not see C memory).
//
// # Checkpoints
//
// SavedModel.Save(prefix) and Restore(prefix) go through the MetaGraphDef's SaverDef (TF2
// SavedModels' own save/restore functions, or the TF1 Saver's ops). OpenCheckpoint reads any
// TensorFlow checkpoint without a graph: Variables lists names, dtypes and shapes, Read
// returns one variable (e.g. to initialise a model from Google BERT's bert_model.ckpt).
//
// # Errors and concurrency
//
// A failed TF_Status is an *Error with TensorFlow's Code and message and our context (the
// file, signature, tensor or op); feeds are checked against the graph's dtype and static
// shape before running, as are the outputs themselves (index in range, the session's graph),
// and bad keys name the keys that exist. Session.Run (and so RunSignature) is safe for
// concurrent use; Session.Close and SavedModel.Close wait for the calls in flight, after which
// the calls fail with an error wrapping ErrClosed (test with errors.Is). A closed Graph's
// lookups fail the same way or return nil, never touch the freed graph. Tensors are not safe
// for concurrent mutation.
//
// SessionOptions is encoded as tensorflow.ConfigProto bytes with protowire and our own field
// numbers (checked against Python TensorFlow's ConfigProto by the tests); Version,
// KernelDeviceTypes and Session.ListDevices describe the runtime.
package tf
