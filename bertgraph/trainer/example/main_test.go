package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/bertgraph/trainer/internal/synthetic"
	"github.com/gorovod/gorovod/tf/checkpoint"
	"github.com/gorovod/gorovod/tf/testenv"
)

// asMainEnv makes this test binary run the example's main instead of the tests (under mpirun).
const asMainEnv = "EXAMPLE_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The example trains the tiny model over 40 examples (5 steps of 8) and leaves the checkpoint of
// its last step; a second run finds it and has nothing left to train.
func TestExampleTrainsAndResumes(t *testing.T) {
	model := testenv.TinyModel.Require(t)
	dir := t.TempDir()
	train, out := filepath.Join(dir, "train.tf_record"), filepath.Join(dir, "out")
	if err := synthetic.WriteExamples(train, 40, 32, 128, 2); err != nil {
		t.Fatal(err)
	}
	args := []string{"-saved_model", model, "-train", train, "-output_dir", out}
	for _, want := range []string{"trained from step 0 to step 5 of 5", "trained from step 5 to step 5 of 5"} {
		var log bytes.Buffer
		if err := run(args, &log); err != nil {
			t.Fatalf("%v\n%s", err, log.String())
		}
		if !strings.Contains(log.String(), want) {
			t.Errorf("log does not say %q:\n%s", want, log.String())
		}
	}
	if _, step, ok, err := checkpoint.Latest(out); !ok || step != 5 || err != nil {
		t.Errorf("latest checkpoint: step %d, ok %v, %v", step, ok, err)
	}
}

// Under mpirun, as its documentation says it runs: 2 ranks of batch 8 share the 40 examples (a
// schedule of 40/16 = 2 steps) and rank 0 leaves the checkpoint of the last.
func TestExampleUnderMpirun(t *testing.T) {
	model := testenv.TinyModel.Require(t)
	if _, err := exec.LookPath("mpirun"); err != nil {
		t.Skipf("no mpirun: %v", err)
	}
	dir := t.TempDir()
	train, out := filepath.Join(dir, "train.tf_record"), filepath.Join(dir, "out")
	if err := synthetic.WriteExamples(train, 40, 32, 128, 2); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("timeout", "-k", "5", "120", "mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2",
		"-x", asMainEnv+"=1", os.Args[0], "-saved_model", model, "-train", train, "-output_dir", out)
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "TF_CPP_MIN_LOG_LEVEL=2")
	start := time.Now()
	log, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("mpirun: %v after %v\n%s", err, time.Since(start), log)
	}
	for rank := range 2 {
		if want := fmt.Sprintf("rank %d: trained from step 0 to step 2 of 2", rank); !strings.Contains(string(log), want) {
			t.Errorf("log does not say %q:\n%s", want, log)
		}
	}
	if _, step, ok, err := checkpoint.Latest(out); !ok || step != 2 || err != nil {
		t.Errorf("latest checkpoint: step %d, ok %v, %v", step, ok, err)
	}
}
