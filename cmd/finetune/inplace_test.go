package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The gradients lie back to back in one buffer (bertgraph.FlatTensors), so horovod must reduce
// them where they are: a 2-rank training run's timeline shows every gradient reaching
// MPI_ALLREDUCE each step and none copied into or out of the fusion buffer. The statistics and
// the stop request (trainer/*) are tensors of their own, fused through the buffer as usual.
func TestGradientsAreReducedInPlace(t *testing.T) {
	model := tinyModel(t, false)
	data := t.TempDir()
	writeData(t, data, 32, 4, 4)
	out := t.TempDir()
	timeline := filepath.Join(out, "timeline.json")
	const steps = 4 // 32 lines, 2 ranks, batch 4
	cmd := mpirun(t, 2, tinyFlags(model, data, out, "--do_train", "--num_train_epochs=1", "--train_batch_size=4",
		"--learning_rate=1e-3", "--save_checkpoints_steps=0", "--export_dir=none", "--seed=3")...)
	cmd.Env = append(cmd.Env, "HOROVOD_TIMELINE="+timeline)
	mustSucceed(t, cmd)

	b, err := os.ReadFile(timeline)
	if err != nil {
		t.Fatal(err)
	}
	var events []struct {
		Name  string            `json:"name"`
		Phase string            `json:"ph"`
		PID   int               `json:"pid"`
		Args  map[string]string `json:"args"`
	}
	if err := json.Unmarshal(b, &events); err != nil {
		t.Fatalf("%s: %v", timeline, err)
	}
	tensor := map[int]string{} // pid -> tensor name, from the process_name metadata
	for _, e := range events {
		if e.Phase == "M" && e.Name == "process_name" {
			tensor[e.PID] = e.Args["name"]
		}
	}
	reduced := map[string]int{}
	copies := map[string]int{}
	for _, e := range events {
		name := tensor[e.PID]
		if e.Phase != "B" || strings.HasPrefix(name, "trainer/") {
			continue
		}
		switch e.Name {
		case "MPI_ALLREDUCE":
			reduced[name]++
		case "MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER":
			copies[name+" "+e.Name]++
		}
	}
	// The tiny model has 2 layers of 16 variables plus embeddings, pooler and classifier.
	if len(reduced) < 30 {
		t.Fatalf("%d gradients reached MPI_ALLREDUCE in the timeline, want every variable's: %v", len(reduced), reduced)
	}
	for name, n := range reduced {
		if n != steps {
			t.Errorf("%s: reduced %d times, want once per step (%d)", name, n, steps)
		}
	}
	if len(copies) > 0 {
		t.Errorf("gradients copied through the fusion buffer (%d tensor phases), want none: %v", len(copies), copies)
	}
}
