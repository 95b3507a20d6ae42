package bertgraph

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/tf"
)

// BenchmarkTrainApply times one train_step + apply_gradients driven from Go (gradients copied
// to host buffers, as the allreduce needs them) against the same signatures driven from Python
// TensorFlow (drive.py bench, a resident process) with the same thread settings, alternating one
// Go step and one Python step so that both see the same load on a shared machine. It reports
// each side's fastest and median step, their ratios, and the peak RSS of this process (one
// rank) and of Python's. Run it with -benchtime Nx. The models are `make model`'s: tiny
// (2 layers, hidden 32, seq 32) and MiniLM (seq 128).
func BenchmarkTrainApply(b *testing.B) {
	threads := runtime.NumCPU()
	batchSize := 32
	if s := os.Getenv("BERTGRAPH_BENCH_BATCH"); s != "" {
		batchSize, _ = strconv.Atoi(s)
	}
	for _, name := range []string{"tiny", "imdb_minilm"} {
		b.Run(name, func(b *testing.B) {
			dir, err := filepath.Abs(filepath.Join("..", ".cache", "model", name))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dir, ContractFile)); err != nil {
				b.Skipf("%s: %v (run `make model`)", dir, err)
			}
			if b.N < 2 {
				return // testing's probe run; the comparison runs with -benchtime Nx, N >= 2
			}
			m, err := Load(dir, Options{Session: &tf.SessionOptions{IntraOpThreads: int32(threads), InterOpThreads: int32(threads)}})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			batch := SyntheticBatch(m, batchSize)
			grads := m.NewFlatTensors()
			step := func(i int) time.Duration {
				start := time.Now()
				if _, err := m.TrainStep(batch, DropoutSeed{0, int64(i)}, grads); err != nil {
					b.Fatal(err)
				}
				if _, err := m.Apply(grads, 1, 1e-5, 1); err != nil {
					b.Fatal(err)
				}
				return time.Since(start)
			}
			step(-1) // warm-up: Grappler and the first allocations
			py, err := startPyBench(dir, batchSize, threads)
			if err != nil {
				b.Fatal(err)
			}
			defer py.close()
			var goSteps, pySteps []float64
			b.ResetTimer()
			for i := range b.N {
				goSteps = append(goSteps, step(i).Seconds())
				b.StopTimer()
				s, err := py.step()
				if err != nil {
					b.Fatal(err)
				}
				pySteps = append(pySteps, s)
				b.StartTimer()
			}
			b.StopTimer()
			pyRSS, err := py.finish()
			if err != nil {
				b.Fatal(err)
			}
			var ru syscall.Rusage
			if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
				b.Fatal(err)
			}
			slices.Sort(goSteps)
			slices.Sort(pySteps)
			goMin, pyMin := goSteps[0], pySteps[0]
			goMed, pyMed := sortedMedian(goSteps), sortedMedian(pySteps)
			b.ReportMetric(goMin*1e3, "go_min_ms")
			b.ReportMetric(pyMin*1e3, "py_min_ms")
			b.ReportMetric(goMin/pyMin, "go/py_min")
			b.ReportMetric(goMed*1e3, "go_median_ms")
			b.ReportMetric(pyMed*1e3, "py_median_ms")
			b.ReportMetric(goMed/pyMed, "go/py_median")
			b.ReportMetric(float64(ru.Maxrss)/1024, "go_peak_RSS_MiB")
			b.ReportMetric(pyRSS, "py_peak_RSS_MiB")
		})
	}
}

// sortedMedian is the median of sorted xs: the mean of the middle two when there is an even
// number of them (make bench-model runs 4 and 20 steps).
func sortedMedian(xs []float64) float64 {
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// pyBench is a resident `drive.py bench` process answering one timed step per request.
type pyBench struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Scanner
	stderr lockedBuffer
}

func startPyBench(dir string, batchSize, threads int) (*pyBench, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return nil, err
	}
	p := &pyBench{cmd: exec.Command(filepath.Join(root, ".venv/bin/python"), "-m", "bertgraph.exporter.drive", "bench",
		"--model", dir, "--batch_size", fmt.Sprint(batchSize), "--warmup", "1", "--threads", fmt.Sprint(threads))}
	p.cmd.Dir = root
	p.cmd.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2")
	p.cmd.Stderr = &p.stderr
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.out = bufio.NewScanner(stdout)
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	if line, err := p.line(); err != nil || line != "ready" {
		p.close()
		return nil, fmt.Errorf("drive.py bench did not start (%q, %v): %s", line, err, p.stderr.String())
	}
	return p, nil
}

func (p *pyBench) line() (string, error) {
	if !p.out.Scan() {
		return "", fmt.Errorf("drive.py bench exited: %v\n%s", p.out.Err(), p.stderr.String())
	}
	return p.out.Text(), nil
}

func (p *pyBench) step() (float64, error) {
	if _, err := io.WriteString(p.stdin, "step\n"); err != nil {
		return 0, err
	}
	line, err := p.line()
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(line, 64)
}

// finish ends the process and returns its peak RSS in MiB.
func (p *pyBench) finish() (float64, error) {
	p.stdin.Close()
	line, err := p.line()
	if err != nil {
		return 0, err
	}
	var r struct {
		PeakRSSMiB float64 `json:"peak_rss_mib"`
	}
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return 0, fmt.Errorf("drive.py bench: %q: %w", line, err)
	}
	return r.PeakRSSMiB, p.cmd.Wait()
}

func (p *pyBench) close() {
	if p.cmd.ProcessState != nil { // finished
		return
	}
	p.stdin.Close()
	p.cmd.Process.Kill()
	p.cmd.Wait()
}
