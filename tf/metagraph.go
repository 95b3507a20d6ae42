package tf

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// The part of a tensorflow.MetaGraphDef that running and checkpointing need, decoded with
// protowire from the field numbers of tensorflow/core/protobuf/meta_graph.proto, saver.proto
// and tensorflow/core/framework/tensor_shape.proto. The GraphDef is left to TensorFlow.

// Signature is one SignatureDef of a SavedModel: named inputs and outputs, each sorted by key.
type Signature struct {
	Key        string // e.g. "serving_default"
	MethodName string // e.g. "tensorflow/serving/predict"
	Inputs     []TensorInfo
	Outputs    []TensorInfo
}

// TensorInfo describes one input or output of a signature.
type TensorInfo struct {
	Key   string   // the signature's name for it
	Name  string   // the graph tensor, "op:index"
	DType DataType // element type
	Shape Shape    // static shape
}

// Shape is a static shape: dimensions of -1 are unknown; UnknownRank means even the rank is.
type Shape struct {
	Dims        []int64
	UnknownRank bool
}

func (s Shape) String() string {
	if s.UnknownRank {
		return "<unknown>"
	}
	return shapeString(s.Dims)
}

// Input returns the input with the given key.
func (s *Signature) Input(key string) (TensorInfo, bool) { return findInfo(s.Inputs, key) }

// Output returns the output with the given key.
func (s *Signature) Output(key string) (TensorInfo, bool) { return findInfo(s.Outputs, key) }

func findInfo(infos []TensorInfo, key string) (TensorInfo, bool) {
	i, ok := slices.BinarySearchFunc(infos, key, func(t TensorInfo, k string) int { return strings.Compare(t.Key, k) })
	if !ok {
		return TensorInfo{}, false
	}
	return infos[i], true
}

func infoKeys(infos []TensorInfo) string {
	keys := make([]string, len(infos))
	for i, t := range infos {
		keys[i] = t.Key
	}
	return strings.Join(keys, ", ")
}

// SaverDef tells how to save and restore a graph's variables: feed the checkpoint prefix to
// FilenameTensor, then fetch SaveTensor to save or run RestoreOp to restore.
type SaverDef struct {
	FilenameTensor string // tensor name, "op:index"
	SaveTensor     string // tensor name
	RestoreOp      string // operation name (a bare name, or "op:0" in some graphs)
	MaxToKeep      int32
	Sharded        bool
	Version        int32 // CheckpointFormatVersion: 1 V1, 2 V2
}

// internalSignatures are the SignatureDefs TensorFlow uses to name the init and train ops of
// a SavedModel; the loader runs them and Python's `signatures` leaves them out, as we do.
var internalSignatures = map[string]bool{"__saved_model_init_op": true, "__saved_model_train_op": true}

// metaGraph is the decoded part of a MetaGraphDef.
type metaGraph struct {
	tags       []string
	signatures []Signature // sorted by key
	saver      *SaverDef   // nil when the MetaGraphDef has none
}

// MetaGraphDef, MetaInfoDef, SignatureDef, TensorInfo, TensorShapeProto and SaverDef fields.
const (
	metaGraphMetaInfo  = 1
	metaGraphSaverDef  = 3
	metaGraphSignature = 5
	metaInfoTags       = 4

	mapKey   = 1
	mapValue = 2

	signatureInputs  = 1
	signatureOutputs = 2
	signatureMethod  = 3

	tensorInfoName  = 1
	tensorInfoDType = 2
	tensorInfoShape = 3

	shapeDim         = 2
	shapeUnknownRank = 3
	dimSize          = 1

	saverFilename  = 1
	saverSave      = 2
	saverRestore   = 3
	saverMaxToKeep = 4
	saverSharded   = 5
	saverVersion   = 7
)

// field is one decoded protobuf field: v for varint and fixed types, b for length-delimited.
type field struct {
	num protowire.Number
	v   uint64
	b   []byte
}

// fields decodes a message's fields, in the order they appear.
func fields(msg []byte, what string) ([]field, error) {
	var out []field
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return nil, fmt.Errorf("%s: %w", what, protowire.ParseError(n))
		}
		msg = msg[n:]
		f := field{num: num}
		switch typ {
		case protowire.VarintType:
			f.v, n = protowire.ConsumeVarint(msg)
		case protowire.Fixed32Type:
			var v uint32
			v, n = protowire.ConsumeFixed32(msg)
			f.v = uint64(v)
		case protowire.Fixed64Type:
			f.v, n = protowire.ConsumeFixed64(msg)
		case protowire.BytesType:
			f.b, n = protowire.ConsumeBytes(msg)
		default:
			n = protowire.ConsumeFieldValue(num, typ, msg)
		}
		if n < 0 {
			return nil, fmt.Errorf("%s: field %d: %w", what, num, protowire.ParseError(n))
		}
		msg = msg[n:]
		out = append(out, f)
	}
	return out, nil
}

func parseMetaGraph(b []byte) (*metaGraph, error) {
	fs, err := fields(b, "MetaGraphDef")
	if err != nil {
		return nil, err
	}
	mg := &metaGraph{}
	for _, f := range fs {
		switch f.num {
		case metaGraphMetaInfo:
			info, err := fields(f.b, "MetaInfoDef")
			if err != nil {
				return nil, err
			}
			for _, g := range info {
				if g.num == metaInfoTags {
					mg.tags = append(mg.tags, string(g.b))
				}
			}
		case metaGraphSaverDef:
			if mg.saver, err = parseSaverDef(f.b); err != nil {
				return nil, err
			}
		case metaGraphSignature:
			key, value, err := mapEntry(f.b, "signature_def")
			if err != nil {
				return nil, err
			}
			if internalSignatures[key] {
				continue
			}
			sig, err := parseSignature(key, value)
			if err != nil {
				return nil, err
			}
			mg.signatures = append(mg.signatures, sig)
		}
	}
	slices.SortFunc(mg.signatures, func(a, b Signature) int { return strings.Compare(a.Key, b.Key) })
	return mg, nil
}

func mapEntry(b []byte, what string) (key string, value []byte, err error) {
	fs, err := fields(b, what)
	if err != nil {
		return "", nil, err
	}
	for _, f := range fs {
		switch f.num {
		case mapKey:
			key = string(f.b)
		case mapValue:
			value = f.b
		}
	}
	return key, value, nil
}

func parseSignature(key string, b []byte) (Signature, error) {
	sig := Signature{Key: key}
	what := fmt.Sprintf("SignatureDef %q", key)
	fs, err := fields(b, what)
	if err != nil {
		return sig, err
	}
	for _, f := range fs {
		switch f.num {
		case signatureInputs, signatureOutputs:
			k, v, err := mapEntry(f.b, what)
			if err != nil {
				return sig, err
			}
			info, err := parseTensorInfo(k, v, what)
			if err != nil {
				return sig, err
			}
			if f.num == signatureInputs {
				sig.Inputs = append(sig.Inputs, info)
			} else {
				sig.Outputs = append(sig.Outputs, info)
			}
		case signatureMethod:
			sig.MethodName = string(f.b)
		}
	}
	byKey := func(a, b TensorInfo) int { return strings.Compare(a.Key, b.Key) }
	slices.SortFunc(sig.Inputs, byKey)
	slices.SortFunc(sig.Outputs, byKey)
	return sig, nil
}

func parseTensorInfo(key string, b []byte, what string) (TensorInfo, error) {
	// An absent shape decodes as TensorShapeProto's default, which is a scalar.
	info := TensorInfo{Key: key, Shape: Shape{Dims: []int64{}}}
	what = fmt.Sprintf("%s key %q", what, key)
	fs, err := fields(b, what)
	if err != nil {
		return info, err
	}
	for _, f := range fs {
		switch f.num {
		case tensorInfoName:
			info.Name = string(f.b)
		case tensorInfoDType:
			info.DType = DataType(f.v)
		case tensorInfoShape:
			if info.Shape, err = parseShape(f.b, what); err != nil {
				return info, err
			}
		}
	}
	if info.Name == "" {
		return info, fmt.Errorf("%s: not a dense tensor (sparse and composite tensors are not supported)", what)
	}
	return info, nil
}

func parseShape(b []byte, what string) (Shape, error) {
	s := Shape{Dims: []int64{}}
	fs, err := fields(b, what+" shape")
	if err != nil {
		return s, err
	}
	for _, f := range fs {
		switch f.num {
		case shapeDim:
			dim, err := fields(f.b, what+" shape dim")
			if err != nil {
				return s, err
			}
			size := int64(0) // proto3: an absent size is 0
			for _, d := range dim {
				if d.num == dimSize {
					size = int64(d.v)
				}
			}
			s.Dims = append(s.Dims, size)
		case shapeUnknownRank:
			s.UnknownRank = f.v != 0
		}
	}
	if s.UnknownRank {
		s.Dims = nil
	}
	return s, nil
}

func parseSaverDef(b []byte) (*SaverDef, error) {
	fs, err := fields(b, "SaverDef")
	if err != nil {
		return nil, err
	}
	sd := &SaverDef{}
	for _, f := range fs {
		switch f.num {
		case saverFilename:
			sd.FilenameTensor = string(f.b)
		case saverSave:
			sd.SaveTensor = string(f.b)
		case saverRestore:
			sd.RestoreOp = string(f.b)
		case saverMaxToKeep:
			sd.MaxToKeep = int32(f.v)
		case saverSharded:
			sd.Sharded = f.v != 0
		case saverVersion:
			sd.Version = int32(f.v)
		}
	}
	return sd, nil
}
