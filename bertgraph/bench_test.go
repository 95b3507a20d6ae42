package bertgraph

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/tf"
)

// BenchmarkTrainApply times one train_step + apply_gradients driven from Go (gradients copied
// to host buffers, as the allreduce needs them) and, in the same run, the same signatures
// driven from Python TensorFlow by drive.py bench with the same thread settings, and reports
// the ratio. It also reports the peak RSS of this process (one rank) and of Python's.
// The models are `make model`'s: tiny (2 layers, hidden 32, seq 32) and MiniLM (seq 128).
func BenchmarkTrainApply(b *testing.B) {
	threads := runtime.NumCPU()
	batchSize := 32
	if s := os.Getenv("BERTGRAPH_BENCH_BATCH"); s != "" {
		batchSize, _ = strconv.Atoi(s)
	}
	pyResults := map[string]*pyBench{}
	for _, bm := range []struct {
		name    string
		pySteps int
	}{{"tiny", 20}, {"imdb_minilm", 3}} {
		name := bm.name
		b.Run(name, func(b *testing.B) {
			dir, err := filepath.Abs(filepath.Join("..", ".cache", "model", name))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dir, ContractFile)); err != nil {
				b.Skipf("%s: %v (run `make model`)", dir, err)
			}
			m, err := Load(dir, Options{Session: &tf.SessionOptions{IntraOpThreads: int32(threads), InterOpThreads: int32(threads)}})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			batch := syntheticBatch(m, batchSize)
			grads := m.NewFlatTensors()
			step := func(i int) {
				if _, err := m.TrainStep(batch, DropoutSeed{0, int64(i)}, grads); err != nil {
					b.Fatal(err)
				}
				if _, err := m.Apply(grads, 1e-5, 1); err != nil {
					b.Fatal(err)
				}
			}
			step(-1) // warm-up: Grappler and the first allocations
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				step(i)
			}
			goSec := time.Since(start).Seconds() / float64(b.N)
			b.StopTimer()
			var ru syscall.Rusage
			if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
				b.Fatal(err)
			}
			// Python runs once per model (the benchmark function is called for several b.N).
			py := pyResults[name]
			if py == nil {
				if py, err = runPyBench(b, dir, batchSize, bm.pySteps, threads); err != nil {
					b.Fatal(err)
				}
				pyResults[name] = py
			}
			b.ReportMetric(goSec*1e3, "go_ms/step")
			b.ReportMetric(py.SecondsPerStep*1e3, "python_ms/step")
			b.ReportMetric(goSec/py.SecondsPerStep, "go/python")
			b.ReportMetric(float64(ru.Maxrss)/1024, "go_peak_RSS_MiB")
			b.ReportMetric(py.PeakRSSMiB, "python_peak_RSS_MiB")
		})
	}
}

// syntheticBatch is drive.py bench's batch: random ids, full masks, one segment.
func syntheticBatch(m *Model, n int) *features.Batch {
	var cfg struct {
		VocabSize int `json:"vocab_size"`
	}
	if err := json.Unmarshal(m.Contract().BertConfig, &cfg); err != nil || cfg.VocabSize < 6 {
		cfg.VocabSize = 6
	}
	rng := rand.New(rand.NewPCG(0, 0))
	s := m.MaxSeqLength()
	b := features.NewBatch(n, s)
	for i := range b.InputIDs {
		b.InputIDs[i] = 5 + int32(rng.IntN(cfg.VocabSize-5))
		b.InputMask[i] = 1
	}
	for i := range n {
		b.LabelIDs[i] = int32(rng.IntN(m.NumLabels()))
		b.IsRealExample[i] = 1
	}
	return b
}

type pyBench struct {
	SecondsPerStep float64 `json:"seconds_per_step"`
	PeakRSSMiB     float64 `json:"peak_rss_mib"`
}

func runPyBench(b *testing.B, dir string, batchSize, steps, threads int) (*pyBench, error) {
	out := filepath.Join(b.TempDir(), "py.json")
	if _, err := python("bench", "--model", dir, "--batch_size", fmt.Sprint(batchSize), "--steps", fmt.Sprint(steps),
		"--warmup", "1", "--threads", fmt.Sprint(threads), "--out", out); err != nil {
		return nil, err
	}
	var py pyBench
	raw, err := os.ReadFile(out)
	if err == nil {
		err = json.Unmarshal(raw, &py)
	}
	return &py, err
}
