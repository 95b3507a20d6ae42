package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// timelineEvent is one event of horovod's timeline (Chrome trace format).
type timelineEvent struct {
	Name  string            `json:"name"`
	Phase string            `json:"ph"`
	PID   int               `json:"pid"`
	Args  map[string]string `json:"args"`
}

// gradientPhases trains the tiny model for 4 steps on 2 ranks with HOROVOD_TIMELINE and the
// given flags, and returns the timeline's operation phases (name -> count) of each gradient (the
// Reducer's gradients/*), the dtype each gradient's ALLREDUCE carried on the wire, and the
// phases of the word embeddings' looked-up rows (trainer/word_embeddings/*), and the run's log.
func gradientPhases(t *testing.T, flags ...string) (phases map[string]map[string]int, wire map[string]string, rows map[string]map[string]int, log string) {
	model := tinyModel(t, false)
	data := t.TempDir()
	writeData(t, data, 32, 4, 4)
	out := t.TempDir()
	timeline := filepath.Join(out, "timeline.json")
	cmd := mpirun(t, 2, tinyFlags(model, data, out, append([]string{"--do_train", "--num_train_epochs=1", "--train_batch_size=4",
		"--learning_rate=1e-3", "--save_checkpoints_steps=0", "--export_dir=none", "--seed=3"}, flags...)...)...)
	cmd.Env = append(cmd.Env, "HOROVOD_TIMELINE="+timeline)
	log = mustSucceed(t, cmd)

	b, err := os.ReadFile(timeline)
	if err != nil {
		t.Fatal(err)
	}
	var events []timelineEvent
	if err := json.Unmarshal(b, &events); err != nil {
		t.Fatalf("%s: %v", timeline, err)
	}
	tensor := map[int]string{} // pid -> tensor name, from the process_name metadata
	for _, e := range events {
		if e.Phase == "M" && e.Name == "process_name" {
			tensor[e.PID] = e.Args["name"]
		}
	}
	phases, wire, rows = map[string]map[string]int{}, map[string]string{}, map[string]map[string]int{}
	for _, e := range events {
		name := tensor[e.PID]
		into := phases
		switch {
		case e.Phase != "B":
			continue
		case strings.HasPrefix(name, "trainer/word_embeddings/"):
			into = rows
		case !strings.HasPrefix(name, "gradients/"):
			continue
		}
		if into[name] == nil {
			into[name] = map[string]int{}
		}
		into[name][e.Name]++
		if e.Name == "ALLREDUCE" {
			wire[name] = e.Args["dtype"]
		}
	}
	return phases, wire, rows, log
}

// The gradients lie back to back in one buffer (bertgraph.FlatTensors), so horovod must reduce
// them where they are: a 2-rank training run's timeline shows every gradient reduced once each
// step, as float32, and none copied into or out of the fusion buffer. Both ranks run on this
// machine, so the buffer is the MPI backend's shared memory (as the log says) and the reduction
// goes over it: SHM_ALLREDUCE, not MPI_ALLREDUCE. The statistics and the stop request are
// tensors of their own, fused through the buffer as usual. apply_gradients then reads the sums
// where they lie too (bertgraph.Model.Apply), as the log says of the first step.
func TestGradientsAreReducedInPlace(t *testing.T) {
	const steps = 4 // 32 lines, 2 ranks, batch 4
	phases, wire, _, log := gradientPhases(t)
	for _, said := range []string{"apply_gradients reads the gradients where they lie", "gradients in the mpi backend's shared memory"} {
		if !strings.Contains(log, said) {
			t.Errorf("the log does not say %q:\n%s", said, log)
		}
	}
	// The tiny model has 2 layers of 16 variables plus embeddings, pooler and classifier.
	if len(phases) < 30 {
		t.Fatalf("%d gradients in the timeline, want every variable's: %v", len(phases), phases)
	}
	for name, p := range phases {
		if n := p["SHM_ALLREDUCE"]; n != steps {
			t.Errorf("%s: reduced over shared memory %d times, want once per step (%d): %v", name, n, steps, p)
		}
		if n := p["MEMCPY_IN_FUSION_BUFFER"] + p["MEMCPY_OUT_FUSION_BUFFER"]; n > 0 {
			t.Errorf("%s: copied through the fusion buffer %d times, want never", name, n)
		}
		if wire[name] != "float32" {
			t.Errorf("%s: crossed the wire as %q, want float32", name, wire[name])
		}
	}
}

// --compression=bf16 really reaches the wire: every gradient's allreduce is a bfloat16 one.
func TestBF16CompressionReachesTheWire(t *testing.T) {
	phases, wire, _, _ := gradientPhases(t, "--compression=bf16")
	if len(phases) < 30 {
		t.Fatalf("%d gradients in the timeline, want every variable's: %v", len(phases), phases)
	}
	for name := range phases {
		if wire[name] != "bfloat16" {
			t.Errorf("%s: crossed the wire as %q, want bfloat16", name, wire[name])
		}
	}
}

// On 2 ranks the word embeddings' gradient leaves the allreduce: each step allgathers the rows
// the batches looked up and their indices instead; --sparse_as_dense (Horovod's flag) puts it
// back among the reduced gradients, as float32 in place like the others.
func TestWordEmbeddingsTravelAsLookedUpRows(t *testing.T) {
	const steps = 4
	const dense = "gradients/bert/embeddings/word_embeddings"
	phases, _, rows, _ := gradientPhases(t)
	if _, ok := phases[dense]; ok {
		t.Errorf("%s is in the allreduce: %v", dense, phases[dense])
	}
	for _, name := range []string{"trainer/word_embeddings/indices", "trainer/word_embeddings/rows"} {
		if n := rows[name]["MPI_ALLGATHER"]; n != steps {
			t.Errorf("%s: allgathered %d times, want once per step (%d): %v", name, n, steps, rows)
		}
	}
	phases, wire, rows, _ := gradientPhases(t, "--sparse_as_dense")
	if n := phases[dense]["SHM_ALLREDUCE"]; n != steps || wire[dense] != "float32" {
		t.Errorf("--sparse_as_dense: %s reduced %d times as %q, want %d as float32", dense, n, wire[dense], steps)
	}
	if len(rows) != 0 {
		t.Errorf("--sparse_as_dense: rows allgathered anyway: %v", rows)
	}
}
