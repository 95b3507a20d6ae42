package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gorovod/gorovod/bertgraph/features"
)

// task is --task_name: one of run_classifier.py's DataProcessors, saying which files of
// --data_dir hold each split, how their lines are read, and the label list.
type task struct {
	name             string
	train, dev, test split
	// labels is the task's label list in id order; nil takes the model's (or --labels).
	labels []string
}

// split is one data file of a task and how to read it (format and columns; the reader's
// sharding, label check and skipping come from the run).
type split struct {
	file string // "" for a split the task lacks
	read features.ReadOptions
}

// glueSplit reads a GLUE TSV file by column index, as run_classifier's processors do: text_a in
// field a, text_b in field b (b < 0: single sequences), the label in field *label (nil: the
// split is read without labels).
func glueSplit(file string, header bool, a, b int, label *int) split {
	o := features.ReadOptions{Format: features.FormatGLUE, NoHeader: !header, TextA: features.ColumnAt(a)}
	if b >= 0 {
		o.TextB = features.ColumnAt(b)
	}
	if label != nil {
		o.Label = features.ColumnAt(*label)
	} else {
		o.Unlabelled = true
	}
	return split{file: file, read: o}
}

func at(i int) *int { return &i }

// seedTaskName is the task without --task_name: the seed format of `make data`'s IMDB files and
// of the Horovod BERT recipe, with the labels the model was exported with.
const seedTaskName = "seed"

// tasks are run_classifier.py's processors of bert-tensorflow 1.0.4 (ColaProcessor,
// MrpcProcessor, MnliProcessor, XnliProcessor) with the same files, columns and labels, GLUE's SST-2 as the
// processors of GLUE's own baseline and HF transformers read it, and the seed format. Every test
// split is read without labels: run_classifier gives its test examples a dummy label (the first
// of the list, id 0), as the converter does for unlabelled ones.
var tasks = []*task{
	{
		name:  seedTaskName,
		train: split{file: "train.tsv"},
		dev:   split{file: "dev.tsv"},
		// Labels optional: see seedTestLabelled.
		test: split{file: "test.tsv", read: features.ReadOptions{Unlabelled: true}},
	},
	{
		// CoLA: train and dev have no header: source, label, original mark, sentence.
		name:   "cola",
		train:  glueSplit("train.tsv", false, 3, -1, at(1)),
		dev:    glueSplit("dev.tsv", false, 3, -1, at(1)),
		test:   glueSplit("test.tsv", true, 1, -1, nil), // index, sentence
		labels: []string{"0", "1"},
	},
	{
		// MRPC: Quality, #1 ID, #2 ID, #1 String, #2 String (test: index instead of Quality).
		name:   "mrpc",
		train:  glueSplit("train.tsv", true, 3, 4, at(0)),
		dev:    glueSplit("dev.tsv", true, 3, 4, at(0)),
		test:   glueSplit("test.tsv", true, 3, 4, nil),
		labels: []string{"0", "1"},
	},
	{
		// MNLI: sentence1 and sentence2 are fields 8 and 9, gold_label the last; matched dev/test.
		name:   "mnli",
		train:  glueSplit("train.tsv", true, 8, 9, at(-1)),
		dev:    glueSplit("dev_matched.tsv", true, 8, 9, at(-1)),
		test:   glueSplit("test_matched.tsv", true, 8, 9, nil),
		labels: []string{"contradiction", "entailment", "neutral"},
	},
	{
		// XNLI in Chinese, as XnliProcessor (language "zh"): MultiNLI's machine-translated
		// training set (premise, hypo, label, "contradictory" meaning "contradiction") and the zh
		// lines of XNLI's dev set (language, gold_label, ..., sentence1 and sentence2 in fields 6
		// and 7); no test split.
		name: "xnli",
		train: split{file: filepath.Join("multinli", "multinli.train.zh.tsv"), read: features.ReadOptions{
			Format: features.FormatGLUE, TextA: features.ColumnAt(0), TextB: features.ColumnAt(1), Label: features.ColumnAt(2),
			LabelAliases: map[string]string{"contradictory": "contradiction"}}},
		dev: split{file: "xnli.dev.tsv", read: features.ReadOptions{
			Format: features.FormatGLUE, TextA: features.ColumnAt(6), TextB: features.ColumnAt(7), Label: features.ColumnAt(1),
			Where: features.Filter{Column: features.ColumnAt(0), Value: "zh"}}},
		labels: []string{"contradiction", "entailment", "neutral"},
	},
	{
		// SST-2: sentence, label (test: index, sentence).
		name:   "sst-2",
		train:  glueSplit("train.tsv", true, 0, -1, at(1)),
		dev:    glueSplit("dev.tsv", true, 0, -1, at(1)),
		test:   glueSplit("test.tsv", true, 1, -1, nil),
		labels: []string{"0", "1"},
	},
}

// taskNames lists the known --task_name values.
func taskNames() []string {
	var names []string
	for _, t := range tasks {
		names = append(names, t.name)
	}
	return names
}

// lookupTask finds a task by name, case-insensitively as run_classifier (FLAGS.task_name.lower());
// "" is the seed task.
func lookupTask(name string) (*task, error) {
	if name == "" {
		name = seedTaskName
	}
	for _, t := range tasks {
		if t.name == strings.ToLower(name) {
			return t, nil
		}
	}
	return nil, fmt.Errorf("--task_name %q: unknown task; known: %s", name, strings.Join(taskNames(), ", "))
}

// task is the run's task; check has rejected unknown names, and "" (a Config built in code) is
// the seed task.
func (c *Config) task() *task {
	t, err := lookupTask(c.TaskName)
	if err != nil {
		panic(err) // unreachable after check
	}
	return t
}

// checkLabels settles the label list of a task with fixed labels: --labels may only repeat it.
func (t *task) checkLabels(flagLabels []string) ([]string, error) {
	if t.labels == nil || flagLabels == nil {
		if t.labels != nil {
			return slices.Clone(t.labels), nil
		}
		return flagLabels, nil
	}
	if !slices.Equal(flagLabels, t.labels) {
		return nil, fmt.Errorf("--labels %s contradicts --task_name=%s, whose labels are %s: omit --labels",
			strings.Join(flagLabels, ","), t.name, strings.Join(t.labels, ","))
	}
	return flagLabels, nil
}

// seedTestLabelled tells whether a seed-format test file has labels: it has unless its first
// line has no tab, in which case every line is a text (the labels of test.tsv are never used).
func seedTestLabelled(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadSlice('\n')
	if err != nil && err != bufio.ErrBufferFull && len(line) == 0 {
		return true, nil // empty file: the reader reports it
	}
	return bytes.IndexByte(line, '\t') >= 0, nil
}
