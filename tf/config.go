package tf

/*
#include <stdlib.h>
#include <tensorflow/c/c_api.h>
*/
import "C"

import (
	"math"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
)

// SessionOptions configures a session. It is encoded as a tensorflow.ConfigProto: the field
// numbers below are TensorFlow's (tensorflow/core/protobuf/config.proto and
// rewriter_config.proto), and a test decodes our bytes with Python TensorFlow's own
// ConfigProto. Zero values leave TensorFlow's defaults.
type SessionOptions struct {
	IntraOpThreads int32 // ConfigProto.intra_op_parallelism_threads; 0: one per core
	InterOpThreads int32 // ConfigProto.inter_op_parallelism_threads; 0: one per core

	AllowSoftPlacement bool // ConfigProto.allow_soft_placement
	LogDevicePlacement bool // ConfigProto.log_device_placement

	GPU GPUOptions

	// GlobalJitLevel turns XLA auto-clustering on (OptimizerOptions.global_jit_level).
	GlobalJitLevel JitLevel
	// AutoMixedPrecision is Grappler's float16 rewrite on GPU (RewriterConfig.auto_mixed_precision).
	AutoMixedPrecision Toggle
}

// GPUOptions is the GPU part of SessionOptions (tensorflow.GPUOptions).
type GPUOptions struct {
	AllowGrowth bool // allocate GPU memory as needed instead of all up front
	// VisibleDeviceList maps visible GPUs to TensorFlow's, e.g. "1" for a process that owns
	// GPU 1 (one GPU per rank).
	VisibleDeviceList string
	// PerProcessMemoryFraction caps the fraction of each GPU's memory TensorFlow takes; 0: all.
	PerProcessMemoryFraction float64
}

// JitLevel is OptimizerOptions.GlobalJitLevel.
type JitLevel int32

// The XLA auto-clustering levels.
const (
	JitDefault JitLevel = 0
	JitOff     JitLevel = -1
	JitOn1     JitLevel = 1
	JitOn2     JitLevel = 2
)

// Toggle is RewriterConfig.Toggle.
type Toggle int32

// The Grappler rewrite toggles.
const (
	ToggleDefault    Toggle = 0
	ToggleOn         Toggle = 1
	ToggleOff        Toggle = 2
	ToggleAggressive Toggle = 3
)

// Field numbers of the ConfigProto messages we write.
const (
	configIntraOpThreads     = 2
	configInterOpThreads     = 5
	configGPUOptions         = 6
	configAllowSoftPlacement = 7
	configLogDevicePlacement = 8
	configGraphOptions       = 10

	gpuMemoryFraction   = 1
	gpuAllowGrowth      = 4
	gpuVisibleDeviceLst = 5

	graphOptimizerOptions = 3
	graphRewriteOptions   = 10

	optimizerGlobalJitLevel = 5

	rewriterAutoMixedPrecision = 23
)

// ConfigProto encodes the options as serialized tensorflow.ConfigProto bytes (what Python's
// ConfigProto.SerializeToString would give for the same settings, fields in number order).
func (o *SessionOptions) ConfigProto() []byte {
	if o == nil {
		return nil
	}
	var b []byte
	b = appendVarint(b, configIntraOpThreads, uint64(int64(o.IntraOpThreads)))
	b = appendVarint(b, configInterOpThreads, uint64(int64(o.InterOpThreads)))

	var gpu []byte
	if o.GPU.PerProcessMemoryFraction != 0 {
		gpu = protowire.AppendTag(gpu, gpuMemoryFraction, protowire.Fixed64Type)
		gpu = protowire.AppendFixed64(gpu, math.Float64bits(o.GPU.PerProcessMemoryFraction))
	}
	gpu = appendBool(gpu, gpuAllowGrowth, o.GPU.AllowGrowth)
	gpu = appendString(gpu, gpuVisibleDeviceLst, o.GPU.VisibleDeviceList)
	b = appendMessage(b, configGPUOptions, gpu)

	b = appendBool(b, configAllowSoftPlacement, o.AllowSoftPlacement)
	b = appendBool(b, configLogDevicePlacement, o.LogDevicePlacement)

	optimizer := appendVarint(nil, optimizerGlobalJitLevel, uint64(int64(o.GlobalJitLevel)))
	rewriter := appendVarint(nil, rewriterAutoMixedPrecision, uint64(int64(o.AutoMixedPrecision)))
	graph := appendMessage(nil, graphOptimizerOptions, optimizer)
	graph = appendMessage(graph, graphRewriteOptions, rewriter)
	b = appendMessage(b, configGraphOptions, graph)
	return b
}

// c builds the TF_SessionOptions; the caller deletes them.
func (o *SessionOptions) c() (*C.TF_SessionOptions, error) {
	opts := C.TF_NewSessionOptions()
	if o == nil {
		return opts, nil
	}
	if config := o.ConfigProto(); len(config) > 0 {
		st := newStatus()
		defer st.delete()
		C.TF_SetConfig(opts, unsafe.Pointer(&config[0]), C.size_t(len(config)), st.c)
		if err := st.err("session config"); err != nil {
			C.TF_DeleteSessionOptions(opts)
			return nil, err
		}
	}
	return opts, nil
}

// Proto3 writers that leave zero values out, as protobuf does.

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	return appendVarint(b, num, protowire.EncodeBool(v))
}

func appendString(b []byte, num protowire.Number, v string) []byte {
	if v == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, v)
}

func appendMessage(b []byte, num protowire.Number, msg []byte) []byte {
	if len(msg) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, msg)
}
