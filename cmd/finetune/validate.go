package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/gorovod/gorovod/bertgraph/tokenizer"
	"github.com/gorovod/gorovod/cmd/finetune/internal/dirlock"
	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/tf/checkpoint"
)

// Files that the exporter packages inside a training SavedModel (bertgraph/exporter/contract.py).
const (
	modelBertConfig = "assets.extra/bert_config.json"
	modelVocab      = "assets.extra/vocab.txt"
)

// bertConfig holds the fields of a Google bert_config.json that decide whether a model, a
// vocabulary and a sequence length fit together.
type bertConfig struct {
	VocabSize             int     `json:"vocab_size"`
	HiddenSize            int     `json:"hidden_size"`
	NumHiddenLayers       int     `json:"num_hidden_layers"`
	NumAttentionHeads     int     `json:"num_attention_heads"`
	IntermediateSize      int     `json:"intermediate_size"`
	HiddenAct             string  `json:"hidden_act"`
	MaxPositionEmbeddings int     `json:"max_position_embeddings"`
	TypeVocabSize         int     `json:"type_vocab_size"`
	InitializerRange      float64 `json:"initializer_range"`
	// The dropout rates are in the exported graph: a config that differs would not be used.
	HiddenDropoutProb         float64 `json:"hidden_dropout_prob"`
	AttentionProbsDropoutProb float64 `json:"attention_probs_dropout_prob"`
}

func readBertConfig(path string) (bertConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return bertConfig{}, fmt.Errorf("bert config: %w", err)
	}
	var c bertConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return bertConfig{}, fmt.Errorf("bert config %s: %w", path, err)
	}
	if c.VocabSize <= 0 || c.MaxPositionEmbeddings <= 0 || c.HiddenSize <= 0 {
		return bertConfig{}, fmt.Errorf("bert config %s: vocab_size, hidden_size and max_position_embeddings must be positive", path)
	}
	return c, nil
}

// inputs are the checked files of a run.
type inputs struct {
	bert           bertConfig
	bertConfigPath string
	vocab          *tokenizer.Vocab
	vocabPath      string
	train, dev     string // data files, "" when not used
	test           string
	rankDir        string
	lock           *dirlock.Lock // rank 0's hold on --output_dir, for the life of the process
	warnings       []string      // for the log: what validation let pass but the user should know
}

// validate checks, before any work, that every file the run needs exists and fits the others:
// the SavedModel, the BERT config (the flag's must equal the model's), the vocabulary (no id
// beyond the model's vocab_size), max_seq_length within the model's positions, the data files of
// each requested phase, the initial checkpoint, and a writable output directory for this rank.
// All problems are reported together. Files that rank 0 alone reads (the dev and test data, the
// initial checkpoint) are checked on rank 0 only: with several machines they may exist only on
// its disk. validate resolves --init_checkpoint to a checkpoint prefix in c (see
// checkpoint.ResolvePrefix), on rank 0, which reads it.
func validate(c *Config, rank int) (*inputs, error) {
	var errs []string
	bad := func(err error) { errs = append(errs, err.Error()) }
	in := &inputs{}
	// TensorFlow reads a checkpoint prefix as a glob pattern (a SavedModel's variables, ours, an
	// init checkpoint; Python's tf.saved_model.load fails the same way), so a path with a
	// pattern character would train and then fail to restore or export: refuse it up front.
	for _, p := range []struct{ flag, path string }{
		{"saved_model", c.SavedModel}, {"output_dir", c.OutputDir}, {"export_dir", c.ExportDir}, {"init_checkpoint", c.InitCheckpoint},
	} {
		if i := strings.IndexAny(p.path, globChars); i >= 0 {
			bad(fmt.Errorf("--%s %s: TensorFlow reads checkpoint paths as glob patterns and %q is a pattern character there: choose a path without any of %s",
				p.flag, p.path, p.path[i], globChars))
		}
	}

	if st, err := os.Stat(filepath.Join(c.SavedModel, "saved_model.pb")); err != nil || st.IsDir() {
		bad(fmt.Errorf("--saved_model %s: no saved_model.pb (export one with python -m bertgraph.exporter.export, or run `make model`)", c.SavedModel))
	} else {
		modelCfgPath := filepath.Join(c.SavedModel, modelBertConfig)
		modelCfg, err := readBertConfig(modelCfgPath)
		switch {
		case err == nil && c.BertConfigFile != "":
			flagCfg, err := readBertConfig(c.BertConfigFile)
			if err != nil {
				bad(fmt.Errorf("--bert_config_file: %w", err))
			} else if diff := configDiff(flagCfg, modelCfg); diff != "" {
				bad(fmt.Errorf("--bert_config_file %s does not describe --saved_model %s: %s", c.BertConfigFile, c.SavedModel, diff))
			} else {
				in.bert, in.bertConfigPath = flagCfg, c.BertConfigFile
			}
		case err == nil:
			in.bert, in.bertConfigPath = modelCfg, modelCfgPath
		case c.BertConfigFile != "":
			if in.bert, err = readBertConfig(c.BertConfigFile); err != nil {
				bad(fmt.Errorf("--bert_config_file: %w", err))
			}
			in.bertConfigPath = c.BertConfigFile
		default:
			bad(fmt.Errorf("--saved_model %s packages no bert config (%v): pass --bert_config_file", c.SavedModel, err))
		}
		in.vocabPath = c.VocabFile
		if in.vocabPath == "" {
			in.vocabPath = filepath.Join(c.SavedModel, modelVocab)
		}
	}
	if in.bertConfigPath != "" && c.MaxSeqLength > in.bert.MaxPositionEmbeddings {
		bad(fmt.Errorf("cannot use --max_seq_length %d because the BERT model was only trained up to sequence length %d (max_position_embeddings of %s)",
			c.MaxSeqLength, in.bert.MaxPositionEmbeddings, in.bertConfigPath))
	}
	if in.vocabPath != "" {
		v, err := tokenizer.LoadVocab(in.vocabPath)
		switch {
		case err != nil:
			bad(fmt.Errorf("--vocab_file: %w", err))
		case in.bertConfigPath != "" && v.Size() > in.bert.VocabSize:
			bad(fmt.Errorf("--vocab_file %s has %d tokens but the model embeds only vocab_size %d (%s): ids from %d on would index past the embedding table",
				in.vocabPath, v.Size(), in.bert.VocabSize, in.bertConfigPath, in.bert.VocabSize))
		default:
			for _, special := range []string{"[CLS]", "[SEP]", "[UNK]"} {
				if _, ok := v.ID(special); !ok {
					bad(fmt.Errorf("--vocab_file %s has no %s token", in.vocabPath, special))
				}
			}
			in.vocab = v
		}
	}
	t := c.task()
	// dataFile checks a data file on the ranks that read it: each rank its shard of the
	// training data, rank 0 alone the dev and test data.
	dataFile := func(use, readHere bool, name string) string {
		if !use {
			return ""
		}
		p := filepath.Join(c.DataDir, name)
		if !readHere {
			return p
		}
		if f, err := os.Open(p); err != nil {
			bad(fmt.Errorf("--data_dir: %w", err))
		} else {
			f.Close()
		}
		return p
	}
	in.train = dataFile(c.DoTrain, true, t.train.file)
	in.dev = dataFile(c.DoEval, rank == 0, t.dev.file)
	in.test = dataFile(c.DoPredict, rank == 0, t.test.file)
	if c.InitCheckpoint != "" && rank == 0 {
		if prefix, err := checkpoint.ResolvePrefix(c.InitCheckpoint); err != nil {
			bad(fmt.Errorf("--init_checkpoint: %w", err))
		} else {
			c.InitCheckpoint = prefix
		}
	}
	in.rankDir = rankOutputDir(c.OutputDir, rank)
	if err := checkWritable(in.rankDir); err != nil {
		bad(fmt.Errorf("--output_dir: %w", err))
	} else if rank == 0 {
		// Before anything is written there (opening the checkpoints removes what looks like
		// an interrupted save, which another run's save in flight also looks like).
		var warning string
		if in.lock, warning, err = lockOutputDir(in.rankDir); err != nil {
			bad(fmt.Errorf("--output_dir: %w", err))
		} else if warning != "" {
			in.warnings = append(in.warnings, warning)
		}
	}
	// Rank 0 exports after training and evaluating, hours later: a path it cannot create
	// failed only then (a file in its place: "bertgraph: export serving: mkdir ...: not a
	// directory", not naming the flag). Checked without creating it, as an interrupted run
	// would leave the empty directory behind.
	if c.DoTrain && c.ExportDir != "none" && rank == 0 {
		if err := checkCreatable(c.exportBase()); err != nil {
			bad(fmt.Errorf("--export_dir: %w", err))
		}
	}
	// The same for its results: a directory in their place failed only the rename that
	// replaces them, after training and evaluating ("rename ...: file exists").
	for _, f := range []struct {
		use  bool
		name string
	}{{c.DoEval, evalResultsFile}, {c.DoPredict, testResultsFile}} {
		p := filepath.Join(c.OutputDir, f.name)
		if st, err := os.Stat(p); f.use && rank == 0 && err == nil && st.IsDir() {
			bad(fmt.Errorf("--output_dir: %s is a directory, where rank 0 writes its results", p))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return in, nil
}

// globChars are the characters TensorFlow's file matching (GetMatchingPaths) treats as a pattern.
const globChars = `*?[\`

// configDiff names the fields in which two BERT configs differ ("" when none).
func configDiff(a, b bertConfig) string {
	var diffs []string
	va, vb, t := reflect.ValueOf(a), reflect.ValueOf(b), reflect.TypeOf(a)
	for i := range t.NumField() {
		if x, y := va.Field(i).Interface(), vb.Field(i).Interface(); x != y {
			diffs = append(diffs, fmt.Sprintf("%s %v != %v", t.Field(i).Tag.Get("json"), x, y))
		}
	}
	return strings.Join(diffs, ", ")
}

// lockOutputDir holds dir for this run, so that a second run into it refuses to start, naming
// this one (dirlock). On a filesystem that takes no locks the run goes on without, and warning
// says so: refusing would leave no way to run there at all.
func lockOutputDir(dir string) (lock *dirlock.Lock, warning string, err error) {
	host, _ := os.Hostname()
	launcher, _ := horovod.DetectLauncher(os.LookupEnv) // a malformed launcher environment fails Init itself
	holder := fmt.Sprintf("finetune, pid %d on %s, rank 0 of %d, started %s",
		os.Getpid(), host, launcher.Size, time.Now().UTC().Format(time.DateTime+" UTC"))
	l, err := dirlock.Acquire(dir, holder)
	switch {
	case errors.Is(err, dirlock.ErrHeld):
		return nil, "", fmt.Errorf("%w\n  wait for that run to end, or choose another --output_dir", err)
	case errors.Is(err, dirlock.ErrUnsupported):
		return nil, fmt.Sprintf("warning: --output_dir: %v: going on without it, so nothing stops a second run into %s", err, dir), nil
	}
	return l, "", err
}

// checkWritable creates dir if needed and proves that a file can be created in it.
func checkWritable(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return probeFile(dir)
}

// probeFile proves that a file can be created in the directory dir, leaving none.
func probeFile(dir string) error {
	f, err := os.CreateTemp(dir, ".write-probe-*")
	if err != nil {
		return fmt.Errorf("%s is not writable: %w", dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// checkCreatable proves, without creating dir, that it is a directory or can be made one that
// takes files: its nearest existing ancestor (dir itself when it exists) is a directory in
// which a file can be created.
func checkCreatable(dir string) error {
	p := dir
	for {
		st, err := os.Stat(p)
		if err == nil && !st.IsDir() {
			return fmt.Errorf("%s is not a directory", p)
		}
		if err == nil {
			break
		}
		if parent := filepath.Dir(p); errors.Is(err, os.ErrNotExist) && parent != p {
			p = parent
			continue
		}
		return err
	}
	err := probeFile(p)
	if err != nil && p != dir {
		return fmt.Errorf("%s cannot be created: %w", dir, err)
	}
	return err
}
