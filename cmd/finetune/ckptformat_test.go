package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Checkpoints of runs before contract version 3 hold the object-based keys of the SavedModel's
// SaverDef (the keys of its own variables/variables): a run cannot resume from one, and says so,
// naming the file and how to go on; --init_checkpoint with it then starts a new run from its
// weights.
func TestOldFormatCheckpointIsRefusedForResumeAndInitialisesANewRun(t *testing.T) {
	model, data, flags, out, step := trainedTinyRun(t)
	prefix := filepath.Join(out, fmt.Sprintf("model.ckpt-%d", step))
	// The checkpoint an older run would have left: the SaverDef's keys.
	for _, suffix := range []string{".index", ".data-00000-of-00001"} {
		b, err := os.ReadFile(filepath.Join(model, "variables", "variables"+suffix))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(prefix+suffix, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	r := runCmd(t, exec.Command(finetuneBinary(t), flags...))
	for _, want := range []string{prefix, "keyed the old way", "--init_checkpoint=" + prefix} {
		if r.code == 0 || !strings.Contains(r.output, want) {
			t.Errorf("resume from an old-format checkpoint: exit %d, output lacks %q:\n%s", r.code, want, r.output)
		}
	}

	again := mustSucceed(t, exec.Command(finetuneBinary(t), tinyFlags(model, data, filepath.Join(t.TempDir(), "out"),
		"--do_train", "--train_batch_size=4", "--num_train_epochs=1", "--init_checkpoint="+prefix)...))
	if want := "*INIT_FROM_CKPT* (from bert/embeddings/word_embeddings/.ATTRIBUTES/VARIABLE_VALUE)"; !strings.Contains(again, want) {
		t.Errorf("--init_checkpoint with an old-format checkpoint: the output lacks %q:\n%s", want, again)
	}
}
