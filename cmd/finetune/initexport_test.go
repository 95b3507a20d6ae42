package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/tf/testenv"
)

// An --init_checkpoint that does not fit the model stops every rank at setup, before any
// feature conversion, with an error naming the checkpoint and a bounded list of what is wrong.
func TestInitCheckpointThatDoesNotFitStopsBeforeFeatures(t *testing.T) {
	model := tinyModel(t, true)
	data := t.TempDir()
	writeData(t, data, 16, 4, 4)
	ckpts := t.TempDir()
	testenv.Python(t, `
import sys
sys.path.insert(0, sys.argv[3])
import numpy as np
from bertgraph.exporter import checkpoint, contract
model, out = sys.argv[1], sys.argv[2]
checkpoint.write(out + "/foreign.ckpt", {"encoder/layer_0/foo": np.zeros([3], np.float32)})
checkpoint.write(out + "/shapes.ckpt", {v["name"]: np.zeros([d + 1 for d in v["shape"]], np.float32)
                                        for v in contract.read(model)["variables"]})
`, model, ckpts, testenv.Root())
	foreign, shapes := filepath.Join(ckpts, "foreign.ckpt"), filepath.Join(ckpts, "shapes.ckpt")
	for _, c := range []struct {
		name, ckpt string
		np         int
		want       []string
	}{
		{"names of another convention, 2 ranks", foreign, 2, []string{"rank(s) 0 could not start",
			"--init_checkpoint: bertgraph: init checkpoint " + foreign + " initialises none of the model's", "encoder/layer_0/foo", "bert/embeddings/word_embeddings"}},
		{"every shape wrong", shapes, 1, []string{"init checkpoint " + shapes + " does not fit the model", "differ in shape or dtype", "... and 31 more"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			args := tinyFlags(model, data, out, "--do_train", "--train_batch_size=4", "--num_train_epochs=1", "--init_checkpoint="+c.ckpt)
			cmd := exec.Command(finetuneBinary(t), args...)
			cmd.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2", "CUDA_VISIBLE_DEVICES=")
			if c.np > 1 {
				cmd = mpirun(t, c.np, args...)
			}
			r := runCmd(t, cmd)
			for _, w := range c.want {
				if r.code == 0 || !strings.Contains(r.output, w) {
					t.Errorf("exit %d, output lacks %q:\n%s", r.code, w, r.output)
				}
			}
			if strings.Contains(r.output, "training examples (") {
				t.Errorf("features were converted before the checkpoint was refused:\n%s", r.output)
			}
			if _, err := os.Stat(filepath.Join(out, "train.tf_record")); !os.IsNotExist(err) {
				t.Errorf("train.tf_record exists: %v", err)
			}
			if n := strings.Count(r.output, "in the checkpoint, the model's"); n > 10 {
				t.Errorf("%d mismatch lines, want at most 10:\n%s", n, r.output)
			}
		})
	}
}

// A run with its own --vocab_file and --labels exports a model that records them: its
// vocab.txt is the run's, its contract names the run's labels, and a Classifier loaded from it
// predicts the test texts as the run's own test_results.tsv did.
func TestExportRecordsTheRunsVocabularyAndLabels(t *testing.T) {
	model := tinyModel(t, true)
	plain, data := t.TempDir(), t.TempDir()
	writeData(t, plain, 16, 4, 6)
	var texts []string
	for _, f := range []string{"train.tsv", "dev.tsv", "test.tsv"} {
		b, err := os.ReadFile(filepath.Join(plain, f))
		if err != nil {
			t.Fatal(err)
		}
		var named strings.Builder
		for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			label, text, _ := strings.Cut(line, "\t")
			fmt.Fprintf(&named, "%s\t%s\n", map[string]string{"0": "neg", "1": "pos"}[label], text)
			if f == "test.tsv" {
				texts = append(texts, text)
			}
		}
		if err := os.WriteFile(filepath.Join(data, f), []byte(named.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The packaged vocabulary with its words in reverse order: every id of the data changes.
	packaged, err := os.ReadFile(filepath.Join(model, "assets.extra", "vocab.txt"))
	if err != nil {
		t.Fatal(err)
	}
	tokens := strings.Fields(string(packaged))
	slices.Reverse(tokens[5:])
	vocab := filepath.Join(t.TempDir(), "vocab.txt")
	if err := os.WriteFile(vocab, []byte(strings.Join(tokens, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	cmd := exec.Command(finetuneBinary(t), tinyFlags(model, data, out, "--do_train", "--do_predict", "--train_batch_size=4",
		"--num_train_epochs=1", "--learning_rate=1e-3", "--vocab_file="+vocab, "--labels=neg,pos")...)
	cmd.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2", "CUDA_VISIBLE_DEVICES=")
	mustSucceed(t, cmd)

	export := filepath.Join(out, "export", "4")
	got, err := os.ReadFile(filepath.Join(export, bertgraph.VocabFile))
	if err != nil || !bytes.Equal(got, []byte(strings.Join(tokens, "\n")+"\n")) {
		t.Errorf("the export's vocab.txt is not the run's --vocab_file (%v)", err)
	}
	c, err := bertgraph.LoadClassifier(export, bertgraph.ClassifierOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !slices.Equal(c.Labels(), []string{"neg", "pos"}) {
		t.Errorf("the export names labels %v, the run trained with neg,pos", c.Labels())
	}
	preds, err := c.Predict(texts)
	if err != nil {
		t.Fatal(err)
	}
	want := readTestResults(t, filepath.Join(out, "test_results.tsv"))
	if len(want) != len(texts) {
		t.Fatalf("test_results.tsv has %d rows for %d texts", len(want), len(texts))
	}
	for i, p := range preds {
		for k, v := range p.Probabilities {
			if math.Abs(float64(v)-want[i][k]) > 1e-5 {
				t.Errorf("text %d: the exported classifier gives %v, the run predicted %v", i, p.Probabilities, want[i])
				break
			}
		}
	}
}
