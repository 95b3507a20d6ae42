package main

// The harness of the end-to-end tests: the finetune binary built once, tiny SavedModels exported
// once by the Python exporter, synthetic data in the tiny vocabulary, and runs under mpirun.

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/tf/testenv"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	models    sync.Map // "dropout"/"nodropout" -> *exported
	shared    string   // directory shared by the tests of this process
)

type exported struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "finetune-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shared = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// finetuneBinary builds this command once.
func finetuneBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binPath = filepath.Join(shared, "finetune")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// tinyModel exports the exporter's tiny configuration (2 layers, hidden 32, vocab 128, 64
// positions) for 2 labels and sequences of 32, with or without dropout, once per process.
func tinyModel(t *testing.T, dropout bool) string {
	t.Helper()
	key := "dropout"
	if !dropout {
		key = "nodropout"
	}
	v, _ := models.LoadOrStore(key, &exported{})
	e := v.(*exported)
	e.once.Do(func() {
		e.dir = filepath.Join(shared, "tiny-"+key)
		args := []string{"-m", "bertgraph.exporter.export", "--tiny", "--num_labels", "2", "--max_seq_length", "32", "--seed", "7", "--out", e.dir}
		if !dropout {
			args = append(args, "--no_dropout")
		}
		root := testenv.Root()
		cmd := exec.Command(testenv.VenvPython.Require(t), args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2", "CUDA_VISIBLE_DEVICES=")
		if out, err := cmd.CombinedOutput(); err != nil {
			e.err = fmt.Errorf("exporting the tiny model: %v\n%s", err, out)
		}
	})
	if e.err != nil {
		t.Fatal(e.err)
	}
	return e.dir
}

// writeData writes train/dev/test.tsv of a separable task in the tiny vocabulary: label 0
// draws its words from w0..w29, label 1 from w40..w69.
func writeData(t *testing.T, dir string, train, dev, test int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, f := range []struct {
		name string
		n    int
	}{{"train.tsv", train}, {"dev.tsv", dev}, {"test.tsv", test}} {
		var b strings.Builder
		for range f.n {
			y := rng.IntN(2)
			words := make([]string, 5+rng.IntN(35))
			for k := range words {
				words[k] = fmt.Sprintf("w%d", 40*y+rng.IntN(30))
			}
			fmt.Fprintf(&b, "%d\t%s\n", y, strings.Join(words, " "))
		}
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// tinyFlags are the flags of a run of the tiny model on data in dataDir.
func tinyFlags(model, dataDir, outputDir string, extra ...string) []string {
	return append([]string{"--saved_model=" + model, "--data_dir=" + dataDir, "--output_dir=" + outputDir,
		"--max_seq_length=32", "--threads=1", "--inter_op_threads=1", "--log_step_count_steps=1"}, extra...)
}

// trainedTinyRun trains the tiny model for one epoch of 16 examples, batch 4, on one rank into a
// new output directory, and returns the model, the data directory, the run's flags, its output
// directory and the global step of its latest checkpoint: a finished run to resume from.
func trainedTinyRun(t *testing.T) (model, data string, flags []string, out string, step int64) {
	t.Helper()
	model = tinyModel(t, false)
	data, out = t.TempDir(), filepath.Join(t.TempDir(), "out")
	writeData(t, data, 16, 4, 4)
	flags = tinyFlags(model, data, out, "--do_train", "--train_batch_size=4", "--num_train_epochs=1")
	mustSucceed(t, exec.Command(finetuneBinary(t), flags...))
	return model, data, flags, out, latestStep(t, out)
}

// mpirun returns the command that runs finetune on np ranks.
func mpirun(t *testing.T, np int, args ...string) *exec.Cmd {
	t.Helper()
	full := append([]string{"--oversubscribe", "--bind-to", "none", "-np", fmt.Sprint(np), finetuneBinary(t)}, args...)
	cmd := exec.Command("mpirun", full...)
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
		"TF_CPP_MIN_LOG_LEVEL=2", "CUDA_VISIBLE_DEVICES=")
	return cmd
}

// result is a finished run.
type result struct {
	code   int
	output string
	took   time.Duration
}

func runCmd(t *testing.T, cmd *exec.Cmd) result {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	r := result{output: out.String(), took: time.Since(start)}
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("%v: %v", cmd.Args, err)
		}
		r.code = ee.ExitCode()
	}
	return r
}

// mustSucceed runs cmd and fails the test on a non-zero exit, with the output.
func mustSucceed(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	r := runCmd(t, cmd)
	if r.code != 0 {
		t.Fatalf("%s: exit %d\n%s", strings.Join(cmd.Args, " "), r.code, r.output)
	}
	return r.output
}
