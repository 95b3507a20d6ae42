package tf

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gorovod/gorovod/tf/testenv"
)

// The SavedModels and checkpoints are built once per test binary by testdata/build_models.py
// with the project's Python TensorFlow, which also records what TensorFlow computes on them.

var fixtures struct {
	once     sync.Once
	dir      string
	err      error
	expected expectedFile
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fixtures.dir != "" {
		os.RemoveAll(fixtures.dir)
	}
	os.Exit(code)
}

type expectedFile struct {
	TFVersion  string                             `json:"tf_version"`
	CUDABuild  bool                               `json:"cuda_build"` // tf.test.is_built_with_cuda()
	TF2Calls   []expectedCall                     `json:"tf2_calls"`
	TF1Calls   []expectedCall                     `json:"tf1_calls"`
	MetaGraphs map[string]expectedMetaGraph       `json:"meta_graphs"`
	Checkpts   map[string][]expectedCheckpointVar `json:"checkpoints"`
}

type expectedCall struct {
	Signature string                   `json:"signature"`
	Inputs    map[string]encodedTensor `json:"inputs"`
	Outputs   map[string]encodedTensor `json:"outputs"`
}

type expectedMetaGraph struct {
	Tags       []string `json:"tags"`
	Signatures map[string]struct {
		Method  string                        `json:"method"`
		Inputs  map[string]expectedTensorInfo `json:"inputs"`
		Outputs map[string]expectedTensorInfo `json:"outputs"`
	} `json:"signatures"`
	SaverDef struct {
		FilenameTensor string `json:"filename_tensor"`
		SaveTensor     string `json:"save_tensor"`
		RestoreOp      string `json:"restore_op"`
		MaxToKeep      int32  `json:"max_to_keep"`
		Sharded        bool   `json:"sharded"`
		Version        int32  `json:"version"`
	} `json:"saver_def"`
}

type expectedTensorInfo struct {
	Name      string  `json:"name"`
	DType     string  `json:"dtype"`
	DTypeEnum int32   `json:"dtype_enum"`
	Shape     []int64 `json:"shape"` // null: unknown rank
}

type expectedCheckpointVar struct {
	Name  string        `json:"name"`
	DType string        `json:"dtype"`
	Shape []int64       `json:"shape"`
	Value encodedTensor `json:"value"`
}

// encodedTensor is a tensor as build_models.py writes it: little-endian bytes, or one byte
// string per element for string tensors (encoding/json decodes the base64).
type encodedTensor struct {
	DType   string   `json:"dtype"`
	Shape   []int64  `json:"shape"`
	Data    []byte   `json:"data"`
	Strings [][]byte `json:"strings"`
}

// models returns the fixture directory and what Python computed, building them on first use.
func models(t testing.TB) (string, *expectedFile) {
	t.Helper()
	testenv.VenvPython.Require(t)
	fixtures.once.Do(func() {
		fixtures.err = buildFixtures()
	})
	if fixtures.err != nil {
		t.Fatal(fixtures.err)
	}
	return fixtures.dir, &fixtures.expected
}

func buildFixtures() error {
	dir, err := os.MkdirTemp("", "gorovod-tf-test-")
	if err != nil {
		return err
	}
	fixtures.dir = dir
	cmd := exec.Command(testenv.VenvPython.Path(), "testdata/build_models.py", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("testdata/build_models.py (needs `make setup`): %v\n%s", err, stderr.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "expected.json"))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, &fixtures.expected)
}

// toTensor builds a Go tensor from an encoded one with the public constructors.
func (e encodedTensor) toTensor(t testing.TB) *Tensor {
	t.Helper()
	var (
		tensor *Tensor
		err    error
	)
	switch e.DType {
	case "float32":
		tensor, err = NewTensor(decodeLE[float32](e.Data), e.Shape...)
	case "float64":
		tensor, err = NewTensor(decodeLE[float64](e.Data), e.Shape...)
	case "int32":
		tensor, err = NewTensor(decodeLE[int32](e.Data), e.Shape...)
	case "int64":
		tensor, err = NewTensor(decodeLE[int64](e.Data), e.Shape...)
	case "bool":
		tensor, err = NewTensor(decodeLE[bool](e.Data), e.Shape...)
	case "float16":
		tensor, err = NewFloat16Tensor(decodeLE[uint16](e.Data), e.Shape...)
	case "string":
		s := make([]string, len(e.Strings))
		for i, b := range e.Strings {
			s[i] = string(b)
		}
		tensor, err = NewStringTensor(s, e.Shape...)
	default:
		t.Fatalf("unsupported dtype %q", e.DType)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tensor
}

// decodeLE decodes the little-endian bytes the fixtures hold (panics on a bad length: the
// fixtures are ours).
func decodeLE[T any](b []byte) []T {
	var zero T
	out := make([]T, len(b)/binary.Size(zero))
	if err := binary.Read(bytes.NewReader(b), binary.LittleEndian, out); err != nil {
		panic(err)
	}
	return out
}

// le returns a function that encodes what a typed reader returns as little-endian bytes.
func le[T any](t testing.TB) func([]T, error) []byte {
	return func(values []T, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := binary.Write(&buf, binary.LittleEndian, values); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
}

// encode reads a Go tensor back with the typed readers into the encoded form.
func encode(t testing.TB, tensor *Tensor) encodedTensor {
	t.Helper()
	e := encodedTensor{DType: tensor.DataType().String(), Shape: tensor.Shape()}
	switch tensor.DataType() {
	case Float:
		e.Data = le[float32](t)(tensor.Float32s())
	case Double:
		e.Data = le[float64](t)(tensor.Float64s())
	case Int32:
		e.Data = le[int32](t)(tensor.Int32s())
	case Int64:
		e.Data = le[int64](t)(tensor.Int64s())
	case Bool:
		e.Data = le[bool](t)(tensor.Bools())
	case Half:
		e.Data = le[uint16](t)(tensor.Float16Bits(nil))
	case String:
		s, err := tensor.Strings()
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range s {
			e.Strings = append(e.Strings, []byte(v))
		}
	default:
		t.Fatalf("unsupported dtype %s", tensor.DataType())
	}
	return e
}

// equal compares exactly: same dtype, shape and bytes.
func (e encodedTensor) equal(o encodedTensor) bool {
	if e.DType != o.DType || !slices.Equal(e.Shape, o.Shape) || !bytes.Equal(e.Data, o.Data) || len(e.Strings) != len(o.Strings) {
		return false
	}
	for i := range e.Strings {
		if !bytes.Equal(e.Strings[i], o.Strings[i]) {
			return false
		}
	}
	return true
}

func (e encodedTensor) String() string {
	var values any
	switch e.DType {
	case "float32":
		values = decodeLE[float32](e.Data)
	case "float64":
		values = decodeLE[float64](e.Data)
	case "int32":
		values = decodeLE[int32](e.Data)
	case "int64":
		values = decodeLE[int64](e.Data)
	case "string":
		values = e.Strings
	default:
		values = e.Data
	}
	return fmt.Sprintf("%s%v %v", e.DType, e.Shape, values)
}

// identityGraphDef is a GraphDef, encoded by hand, with a Placeholder "in" of the given type
// and static shape (nil: unknown rank) and an Identity "out" of it, for tests that need a
// graph of their own.
func identityGraphDef(dtype DataType, shape []int64) []byte {
	const (
		graphNode = 1
		nodeName  = 1
		nodeOp    = 2
		nodeInput = 3
		nodeAttr  = 5
		attrType  = 6
		attrShape = 7
	)
	attr := func(name string, value []byte) []byte {
		entry := appendString(nil, mapKey, name)
		return appendMessage(nil, nodeAttr, appendMessage(entry, mapValue, value))
	}
	typ := appendVarint(nil, attrType, uint64(dtype))
	var shapeProto []byte
	if shape == nil {
		shapeProto = appendBool(nil, shapeUnknownRank, true)
	}
	for _, d := range shape {
		shapeProto = appendMessage(shapeProto, shapeDim, appendVarint(nil, dimSize, uint64(d)))
	}
	// An empty TensorShapeProto (a scalar) must still be present, so write it by hand.
	shapeAttr := protowire.AppendBytes(protowire.AppendTag(nil, attrShape, protowire.BytesType), shapeProto)

	placeholder := appendString(nil, nodeName, "in")
	placeholder = appendString(placeholder, nodeOp, "Placeholder")
	placeholder = append(placeholder, attr("dtype", typ)...)
	placeholder = append(placeholder, attr("shape", shapeAttr)...)
	identity := appendString(nil, nodeName, "out")
	identity = appendString(identity, nodeOp, "Identity")
	identity = appendString(identity, nodeInput, "in")
	identity = append(identity, attr("T", typ)...)
	return appendMessage(appendMessage(nil, graphNode, placeholder), graphNode, identity)
}

// identitySession runs identityGraphDef.
func identitySession(t testing.TB, dtype DataType, shape []int64) (*Session, Output, Output) {
	t.Helper()
	g := NewGraph()
	if err := g.Import(identityGraphDef(dtype, shape), ""); err != nil {
		t.Fatal(err)
	}
	s, err := NewSession(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		g.Close()
	})
	in, err := g.Output("in:0")
	if err != nil {
		t.Fatal(err)
	}
	out, err := g.Output("out")
	if err != nil {
		t.Fatal(err)
	}
	return s, in, out
}
