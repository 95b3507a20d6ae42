package bertgraph

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/tf"

	"github.com/gorovod/gorovod/tf/testenv"
)

// fixture is what the Python exporter writes for these tests (drive.py fixture): a tiny
// training SavedModel (2 layers, hidden 32, max_seq_length 16, labels neg/pos) and a
// Google-named checkpoint lacking output_weights, output_bias and bert/pooler/dense/bias, with
// an extra cls/predictions/output_bias.
var fixture struct {
	Model  string `json:"model"`
	Google string `json:"google"`
}

const seqLength = 16

func TestMain(m *testing.M) {
	testenv.VenvPython.RequireMain()
	dir, err := os.MkdirTemp("", "bertgraph-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, err := python("fixture", "--out", dir)
	if err == nil {
		err = json.Unmarshal(out, &fixture)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bertgraph tests: the Python exporter could not write the fixture (run `make setup`): %v\n", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// python runs `python -m bertgraph.exporter.drive args...` in the project venv and returns stdout.
func python(args ...string) ([]byte, error) {
	out, err := venvPython(append([]string{"-m", "bertgraph.exporter.drive"}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("drive.py %v: %w", args, err)
	}
	return out, nil
}

// venvPython runs the project venv's python with args at the repository root and returns stdout.
func venvPython(args ...string) ([]byte, error) {
	cmd := exec.Command(testenv.VenvPython.Path(), args...)
	cmd.Dir = testenv.Root()
	cmd.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2")
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, stderr.String())
	}
	return out, nil
}

// lockedBuffer collects a child's stderr, written by exec's copying goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}

func testOptions() Options {
	return Options{Session: &tf.SessionOptions{IntraOpThreads: 2, InterOpThreads: 1}}
}

func loadFixture(t testing.TB) *Model {
	t.Helper()
	return loadFixtureIn(t, Float32)
}

func loadFixtureIn(t testing.TB, p Precision) *Model {
	t.Helper()
	opts := testOptions()
	opts.Precision = p
	m, err := Load(fixture.Model, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return m
}

// separableBatch draws n examples whose label is decided by the half of the vocabulary their
// tokens come from (ids 5..66 for label 0, 67..127 for label 1), with [CLS]=2 and [SEP]=3 around
// them and padding after.
func separableBatch(rng *rand.Rand, n int) *features.Batch {
	b := features.NewBatch(n, seqLength)
	for i := range n {
		label := int32(rng.IntN(2))
		length := 4 + rng.IntN(seqLength-4)
		row := b.InputIDs[i*seqLength : (i+1)*seqLength]
		row[0] = 2
		for j := 1; j < length-1; j++ {
			row[j] = 5 + label*62 + int32(rng.IntN(61))
		}
		row[length-1] = 3
		for j := range length {
			b.InputMask[i*seqLength+j] = 1
		}
		b.LabelIDs[i] = label
		b.IsRealExample[i] = 1
		b.GUIDs = append(b.GUIDs, fmt.Sprint(i))
	}
	return b
}

func newRand() *rand.Rand { return rand.New(rand.NewPCG(42, 43)) }
