package bertgraph

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gorovod/gorovod/tf"
	"github.com/gorovod/gorovod/tf/testenv"
)

var miniLM = testenv.Fixture{Rel: ".cache/model/imdb_minilm", What: "the MiniLM training SavedModel", Target: "make setup"}

// reuseChild names, in a child process of this test binary, whether it calls
// tf.ReuseFreedMemory before loading: malloc's settings are process-wide and last, so each
// side runs in a process of its own.
const reuseChild = "GOROVOD_BERTGRAPH_REUSE_CHILD"

// MiniLM's training step (batch 16 x 128, one thread, as a rank of make run) frees tensors of
// several MiB that glibc by default gives back to the kernel, so the next step faults their
// pages in again; with tf.ReuseFreedMemory (which finetune calls) the steps after the first
// reuse them. Counted in page faults (the kernel's count, not a timing).
func TestReuseFreedMemoryCutsTrainStepPageFaults(t *testing.T) {
	dir := miniLM.Require(t)
	if mode := os.Getenv(reuseChild); mode != "" {
		stepFaults(t, dir, mode == "reuse")
		return
	}
	faults := map[string]int64{}
	for _, mode := range []string{"default", "reuse"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestReuseFreedMemoryCutsTrainStepPageFaults$", "-test.v")
		cmd.Env = append(os.Environ(), reuseChild+"="+mode, "TF_CPP_MIN_LOG_LEVEL=2")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s child: %v\n%s", mode, err, out)
		}
		_, after, ok := strings.Cut(string(out), "page faults per step: ")
		if !ok {
			t.Fatalf("%s child printed no count:\n%s", mode, out)
		}
		if faults[mode], err = strconv.ParseInt(strings.Fields(after)[0], 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("page faults per MiniLM step: %d by default, %d after tf.ReuseFreedMemory", faults["default"], faults["reuse"])
	if faults["default"] < 10000 {
		t.Skipf("this C library kept the pages by default (%d faults per step): nothing to compare", faults["default"])
	}
	if faults["reuse"]*4 > faults["default"] {
		t.Fatalf("with tf.ReuseFreedMemory a step faulted %d pages, by default %d: want a quarter or less", faults["reuse"], faults["default"])
	}
}

func stepFaults(t *testing.T, dir string, reuse bool) {
	if reuse {
		if err := tf.ReuseFreedMemory(); err != nil {
			t.Fatal(err)
		}
	}
	m, err := Load(dir, Options{Session: &tf.SessionOptions{IntraOpThreads: 1, InterOpThreads: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	batch := SyntheticBatch(m, 16)
	grads := m.NewFlatTensors()
	const warm, steps = 2, 2 // the first steps allocate for good (Grappler, buffers)
	var before int64
	for i := range warm + steps {
		if i == warm {
			before = minorFaults()
		}
		if _, err := m.TrainStep(batch, DropoutSeed{0, int64(i)}, grads); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Apply(grads, 1, 1e-5, 1); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("page faults per step: %d", (minorFaults()-before)/steps)
}

func minorFaults() int64 {
	var r syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r)
	return r.Minflt
}
