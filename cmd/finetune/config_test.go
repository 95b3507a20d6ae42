package main

import (
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/bertgraph/datatests"
	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/bertgraph/tokenizer"
	"github.com/gorovod/gorovod/horovod"
)

func TestNoArgumentsIsTheEmbeddedDefaultTask(t *testing.T) {
	c, err := parseConfig(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.DoTrain || !c.DoEval || !c.DoPredict || c.SavedModel != defaultSavedModel || c.DataDir == "" || c.OutputDir == "" {
		t.Fatalf("default task %+v", c)
	}
	if err := c.check(); err != nil {
		t.Fatalf("the default task fails its own checks: %v", err)
	}
	// --amp by the hardware (bfloat16 on a CPU with AMX or on AMD's with AVX512-BF16, float32
	// elsewhere), never forced, and the examples trained follow the precision.
	if c.AMP != "true" {
		t.Errorf("default task --amp %q, want true", c.AMP)
	}
	for _, tc := range []struct {
		cpu  bertgraph.CPUBF16
		want bertgraph.Precision
	}{
		{bertgraph.CPUBF16{Read: true}, bertgraph.Float32},
		{bertgraph.CPUBF16{Read: true, Vendor: "GenuineIntel", AMXBF16: true}, bertgraph.BFloat16},
		{bertgraph.CPUBF16{Read: true, Vendor: "AuthenticAMD", AVX512BF16: true}, bertgraph.BFloat16},
		{bertgraph.CPUBF16{Read: true, Vendor: "GenuineIntel", AVX512BF16: true}, bertgraph.Float32},
	} {
		if p, _, err := bertgraph.AMPPrecision(c.AMP, false, tc.cpu); p != tc.want || err != nil {
			t.Errorf("default task on a CPU with %+v: precision %v, %v; want %v", tc.cpu, p, err, tc.want)
		}
		if n, want := defaultTrainExamples(tc.cpu), map[bertgraph.Precision]int{bertgraph.Float32: 8000, bertgraph.BFloat16: 14000}[tc.want]; n != want {
			t.Errorf("default task on a CPU with %+v trains %d examples, want %d (%v)", tc.cpu, n, want, tc.want)
		}
	}
}

func TestFlagsKeepRunClassifierNamesAndDefaults(t *testing.T) {
	c, err := parseConfig([]string{"--do_train=True", "--data_dir=d", "--output_dir=o", "--saved_model=m",
		"--train_batch_size", "4", "--labels=neg, pos"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// run_classifier.py's defaults for what was not given.
	if !c.DoTrain || c.DoEval || !c.DoLowerCase || c.MaxSeqLength != 128 || c.EvalBatchSize != 8 ||
		c.LearningRate != 5e-5 || c.NumTrainEpochs != 3 || c.WarmupProportion != 0.1 ||
		c.SaveCheckpointsSteps != 1000 || c.TrainBatchSize != 4 || strings.Join(c.Labels, "|") != "neg|pos" {
		t.Fatalf("parsed %+v", c)
	}
}

func TestBadCommandLinesAreUsageErrorsNamingTheFlag(t *testing.T) {
	base := []string{"--data_dir=d", "--output_dir=o", "--saved_model=m"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--do_train", "--bogus_flag=1"}, "flag provided but not defined: -bogus_flag"},
		{[]string{"--do_train", "extra"}, `unexpected argument "extra"`},
		{[]string{"--do_train=maybe"}, "invalid boolean value"},
		{nil, "at least one of --do_train, --do_eval or --do_predict"},
		{[]string{"--do_train", "--use_tpu"}, "--use_tpu"},
		{[]string{"--do_train", "--warmup_proportion=1.5"}, "--warmup_proportion 1.5"},
		{[]string{"--do_train", "--train_batch_size=0"}, "--train_batch_size 0 must be positive"},
		{[]string{"--do_train", "--num_accumulation_steps=0"}, "--num_accumulation_steps 0 must be positive"},
		{[]string{"--do_train", "--learning_rate=-1"}, "--learning_rate -1"},
		{[]string{"--do_train", "--num_train_epochs=inf"}, "--num_train_epochs +Inf must be a finite positive number"},
		// Finite in float64, infinite in the model's float32.
		{[]string{"--do_train", "--clip_norm=1e39"}, "--clip_norm 1e+39 must be a finite positive number (at most 3.4028234663852886e+38"},
		{[]string{"--do_train", "--learning_rate=1e39"}, "--learning_rate 1e+39 must be a finite positive number"},
		{[]string{"--do_eval", "--eval_batch_size=0"}, "--eval_batch_size 0"},
		// Beyond 2^31-1 tokens a batch: the features' allocation would end the process.
		{[]string{"--do_eval", "--eval_batch_size=100000000000"}, "--eval_batch_size 100000000000 x --max_seq_length 128 is 12800000000000 tokens in one batch, more than 2^31-1"},
		{[]string{"--do_train", "--train_batch_size=16777216"}, "--train_batch_size 16777216 x --max_seq_length 128 is 2147483648 tokens"},
		{[]string{"--do_predict", "--max_seq_length=64", "--predict_batch_size=40000000"}, "--predict_batch_size 40000000 x --max_seq_length 64"},
		{[]string{"--do_predict", "--max_seq_length=2"}, "--max_seq_length 2"},
		{[]string{"--do_train", "--keep_checkpoint_max=-1"}, "--keep_checkpoint_max -1"},
		{[]string{"--do_train", "--keep_tail_tokens=-1"}, "--keep_tail_tokens -1: want 0 to max_seq_length-2 = 126"},
		{[]string{"--do_train", "--max_seq_length=64", "--keep_tail_tokens=63"}, "--keep_tail_tokens 63: want 0 to max_seq_length-2 = 62"},
		{[]string{"--do_train", "--labels=a,,b"}, "empty label name"},
		{[]string{"--do_train", "--allreduce_backend=gloo"}, `--allreduce_backend "gloo"`},
		{[]string{"--do_train", "--timeline_steps=5"}, `--timeline_steps "5": want first,last with 1 <= first <= last`},
		{[]string{"--do_train", "--timeline_steps=0,3"}, `--timeline_steps "0,3"`},
		{[]string{"--do_train", "--timeline_steps=4,3"}, `--timeline_steps "4,3"`},
		{[]string{"--do_eval", "--timeline_steps=1,2"}, "--timeline_steps 1,2 needs --do_train"},
		{[]string{"--do_train", "--do_lower_case=false", "--init_checkpoint=/m/uncased_L-12_H-768_A-12/bert_model.ckpt"},
			"uncased model uncased_L-12_H-768_A-12"},
	} {
		_, err := parseConfig(append(append([]string{}, base...), c.args...), io.Discard)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
	// Several problems are reported at once.
	_, err := parseConfig([]string{"--do_train", "--train_batch_size=0", "--num_train_epochs=0"}, io.Discard)
	if err == nil || strings.Count(err.Error(), "\n") < 4 { // + data_dir, output_dir, saved_model
		t.Errorf("want every problem listed, got %v", err)
	}
	if _, err := parseConfig([]string{"-help"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-help: %v", err)
	}
}

// fakeModel lays out what validate reads of a SavedModel: saved_model.pb and the packaged
// bert_config.json and vocab.txt.
func fakeModel(t *testing.T, vocabSize, vocabLines, positions int) string {
	t.Helper()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "assets.extra"), 0o755)
	os.WriteFile(filepath.Join(dir, "saved_model.pb"), []byte("pb"), 0o644)
	cfg := `{"vocab_size": ` + strconv.Itoa(vocabSize) + `, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
 "intermediate_size": 64, "hidden_act": "gelu", "max_position_embeddings": ` + strconv.Itoa(positions) + `, "type_vocab_size": 2,
 "initializer_range": 0.02, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}`
	os.WriteFile(filepath.Join(dir, modelBertConfig), []byte(cfg), 0o644)
	writeVocab(t, filepath.Join(dir, modelVocab), vocabLines)
	return dir
}

func writeVocab(t *testing.T, path string, n int) {
	t.Helper()
	tokens := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
	for i := len(tokens); i < n; i++ {
		tokens = append(tokens, "w"+strconv.Itoa(i))
	}
	if err := os.WriteFile(path, []byte(strings.Join(tokens, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// binaryConverter is a converter of seq tokens for labels 0 and 1 over a vocabulary of n tokens
// (writeVocab's) written in dir; it returns the vocabulary's path too.
func binaryConverter(t *testing.T, dir string, n, seq int) (*features.Converter, string) {
	t.Helper()
	vocab := filepath.Join(dir, "vocab.txt")
	writeVocab(t, vocab, n)
	tok, err := tokenizer.Load(vocab, true)
	if err != nil {
		t.Fatal(err)
	}
	labels, _ := features.NewLabels([]string{"0", "1"})
	conv, err := features.NewConverter(tok, seq, labels)
	if err != nil {
		t.Fatal(err)
	}
	return conv, vocab
}

func dataDir(t *testing.T, files ...string) string {
	dir := t.TempDir()
	for _, f := range files {
		os.WriteFile(filepath.Join(dir, f), []byte("0\tgood\n1\tbad\n"), 0o644)
	}
	return dir
}

func TestValidateAcceptsAFittingSetupAndWritesRankDirs(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	c := Config{DoTrain: true, DoEval: true, SavedModel: fakeModel(t, 100, 100, 64), MaxSeqLength: 64,
		DataDir: dataDir(t, "train.tsv", "dev.tsv"), OutputDir: out}
	in, err := validate(&c, 1)
	if err != nil {
		t.Fatal(err)
	}
	if in.rankDir != filepath.Join(out, "1") || in.vocab.Size() != 100 || in.test != "" {
		t.Fatalf("inputs %+v", in)
	}
	if st, err := os.Stat(in.rankDir); err != nil || !st.IsDir() {
		t.Fatalf("rank dir not made: %v", err)
	}
}

// TestValidateChecksRankZerosFilesOnRankZeroOnly: on several machines the dev and test data
// and --init_checkpoint may exist only on rank 0's, which alone reads them; every rank reads its
// shard of the training data.
func TestValidateChecksRankZerosFilesOnRankZeroOnly(t *testing.T) {
	config := func(data string) Config {
		return Config{DoTrain: true, DoEval: true, DoPredict: true, SavedModel: fakeModel(t, 100, 100, 64), MaxSeqLength: 64,
			DataDir: data, OutputDir: t.TempDir(), InitCheckpoint: "/nonexistent/bert_model.ckpt"}
	}
	c := config(dataDir(t, "train.tsv"))
	in, err := validate(&c, 1)
	if err != nil {
		t.Fatalf("rank 1 checked what rank 0 alone reads: %v", err)
	}
	if in.dev != filepath.Join(c.DataDir, "dev.tsv") || in.test != filepath.Join(c.DataDir, "test.tsv") {
		t.Errorf("rank 1: dev %q, test %q", in.dev, in.test)
	}
	_, err = validate(&c, 0)
	for _, want := range []string{"dev.tsv: no such file", "test.tsv: no such file", "--init_checkpoint: /nonexistent/bert_model.ckpt"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("rank 0: got %v, want %q", err, want)
		}
	}
	c = config(dataDir(t, "dev.tsv", "test.tsv"))
	if _, err := validate(&c, 1); err == nil || !strings.Contains(err.Error(), "train.tsv: no such file") {
		t.Errorf("rank 1 without its training data: got %v", err)
	}
}

func TestValidateResolvesInitCheckpoint(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "model.ckpt-7")
	for _, suffix := range []string{".index", ".data-00000-of-00001"} {
		os.WriteFile(prefix+suffix, nil, 0o644)
	}
	os.WriteFile(filepath.Join(dir, "checkpoint"), []byte(`model_checkpoint_path: "model.ckpt-7"`+"\n"), 0o644)
	for _, flag := range []string{dir, prefix, prefix + ".index", prefix + ".data-00000-of-00001"} {
		c := Config{DoTrain: true, SavedModel: fakeModel(t, 100, 100, 64), MaxSeqLength: 64,
			DataDir: dataDir(t, "train.tsv"), OutputDir: t.TempDir(), InitCheckpoint: flag}
		if _, err := validate(&c, 0); err != nil || c.InitCheckpoint != prefix {
			t.Errorf("--init_checkpoint=%s: resolved to %q (%v), want %s", flag, c.InitCheckpoint, err, prefix)
		}
	}
}

func TestValidateNamesEveryMisfit(t *testing.T) {
	notADir := filepath.Join(t.TempDir(), "file")
	os.WriteFile(notADir, nil, 0o644)
	otherCfg := filepath.Join(t.TempDir(), "bert_config.json")
	os.WriteFile(otherCfg, []byte(`{"vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
 "intermediate_size": 64, "hidden_act": "gelu", "max_position_embeddings": 64, "type_vocab_size": 2, "initializer_range": 0.02}`), 0o644)
	noDropout := filepath.Join(t.TempDir(), "bert_config.json")
	os.WriteFile(noDropout, []byte(`{"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
 "intermediate_size": 64, "hidden_act": "gelu", "max_position_embeddings": 64, "type_vocab_size": 2, "initializer_range": 0.02,
 "hidden_dropout_prob": 0, "attention_probs_dropout_prob": 0}`), 0o644)
	bigVocab := filepath.Join(t.TempDir(), "vocab.txt")
	writeVocab(t, bigVocab, 101)
	for _, c := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"missing model", func(c *Config) { c.SavedModel = "/nonexistent/model" }, "--saved_model /nonexistent/model: no saved_model.pb"},
		{"missing data", func(c *Config) { c.DoPredict = true }, "test.tsv: no such file"},
		{"vocab larger than the model", func(c *Config) { c.VocabFile = bigVocab }, "has 101 tokens but the model embeds only vocab_size 100"},
		{"missing vocab", func(c *Config) { c.VocabFile = "/nonexistent/vocab.txt" }, "/nonexistent/vocab.txt"},
		{"sequence beyond positions", func(c *Config) { c.MaxSeqLength = 65 }, "cannot use --max_seq_length 65 because the BERT model was only trained up to sequence length 64"},
		{"config of another model", func(c *Config) { c.BertConfigFile = otherCfg }, "hidden_size 64 != 32"},
		{"config with other dropout", func(c *Config) { c.BertConfigFile = noDropout },
			"hidden_dropout_prob 0 != 0.1, attention_probs_dropout_prob 0 != 0.1"},
		{"missing init checkpoint", func(c *Config) { c.InitCheckpoint = "/nonexistent/bert_model.ckpt" }, "--init_checkpoint: /nonexistent/bert_model.ckpt is neither a checkpoint prefix"},
		{"unwritable output", func(c *Config) { c.OutputDir = filepath.Join(notADir, "out") }, "--output_dir: mkdir"},
		{"glob character in output_dir", func(c *Config) { c.OutputDir = filepath.Join(t.TempDir(), "o[1]") }, `TensorFlow reads checkpoint paths as glob patterns and '[' is a pattern character`},
		{"glob character in init_checkpoint", func(c *Config) { c.InitCheckpoint = "/ckpts/run*/model.ckpt-1" }, "--init_checkpoint /ckpts/run*/model.ckpt-1: TensorFlow reads"},
	} {
		cfg := Config{DoTrain: true, SavedModel: fakeModel(t, 100, 100, 64), MaxSeqLength: 64,
			DataDir: dataDir(t, "train.tsv"), OutputDir: t.TempDir()}
		c.edit(&cfg)
		_, err := validate(&cfg, 0)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
}

// withContract adds to a fakeModel the contract file that parseConfig reads for its defaults.
func withContract(t *testing.T, dir string, numLabels, maxSeqLength int, doLowerCase bool) string {
	t.Helper()
	names := make([]string, numLabels)
	for i := range names {
		names[i] = "l" + strconv.Itoa(i)
	}
	b, _ := json.Marshal(map[string]any{"contract_version": bertgraph.ContractVersion, "kind": "training",
		"bert_config": map[string]int{"vocab_size": 100, "type_vocab_size": 2}, "num_labels": numLabels, "label_names": names,
		"max_seq_length": maxSeqLength, "do_lower_case": doLowerCase})
	if err := os.WriteFile(filepath.Join(dir, bertgraph.ContractFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// max_seq_length and do_lower_case not given are the export's; given, they must agree with it.
func TestSequenceLengthAndCaseDefaultToTheExport(t *testing.T) {
	model := withContract(t, fakeModel(t, 100, 100, 64), 2, 32, false)
	base := []string{"--do_train", "--data_dir=d", "--output_dir=o", "--saved_model=" + model}
	c, err := parseConfig(base, io.Discard)
	if err != nil || c.MaxSeqLength != 32 || c.DoLowerCase {
		t.Fatalf("defaults from the contract: max_seq_length %d, do_lower_case %v, %v", c.MaxSeqLength, c.DoLowerCase, err)
	}
	if c, err = parseConfig(append(base, "--max_seq_length=32", "--do_lower_case=false"), io.Discard); err != nil || c.MaxSeqLength != 32 {
		t.Fatalf("flags equal to the export: %+v, %v", c, err)
	}
	for _, tc := range []struct {
		flag, want string
	}{
		{"--max_seq_length=128", "--max_seq_length 128, but --saved_model " + model + " was exported for 32"},
		{"--do_lower_case=true", "--do_lower_case=true, but --saved_model " + model + " was exported with do_lower_case=false"},
		{"--task_name=MNLI", "--task_name=mnli has 3 labels (contradiction,entailment,neutral), but --saved_model " + model + " classifies 2"},
	} {
		_, err := parseConfig(append(base, tc.flag), io.Discard)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want a usage error containing %q", tc.flag, err, tc.want)
		}
	}
	// A cased export with an uncased Google checkpoint: the export's casing, then run_classifier's check.
	_, err = parseConfig(append(base, "--init_checkpoint=/m/uncased_L-12_H-768_A-12/bert_model.ckpt"), io.Discard)
	if want := "--saved_model " + model + " was exported with do_lower_case=false but --init_checkpoint /m/uncased_L-12_H-768_A-12/bert_model.ckpt " +
		"is the uncased model uncased_L-12_H-768_A-12: export it again with --do_lower_case=true"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("cased export, uncased checkpoint: %v, want %q (the flag is not what to change)", err, want)
	}
}

// run_classifier's command lines parse: --task_name (any case) with its labels, the TPU flags at
// any inert value; what cannot be honoured is an error.
func TestRunClassifierCommandLinesParse(t *testing.T) {
	base := []string{"--do_train=true", "--data_dir=d", "--output_dir=o", "--saved_model=m"}
	c, err := parseConfig(append(base, "--task_name=MRPC", "--iterations_per_loop=500", "--use_tpu=False",
		"--tpu_name=", "--num_tpu_cores=8", "--horovod=true", "--use_fp16=true", "--use_xla=false"), io.Discard)
	if err != nil || c.task().name != "mrpc" || strings.Join(c.Labels, ",") != "0,1" || c.IterationsPerLoop != 500 {
		t.Fatalf("parsed %+v, %v", c, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--task_name=qnli"}, `--task_name "qnli": unknown task; known: seed, cola, mrpc, mnli, xnli, sst-2`},
		{[]string{"--task_name=XNLI", "--do_predict"}, "--do_predict: --task_name=xnli has no test split"},
		{[]string{"--use_tpu=true", "--tpu_name=grpc://10.0.0.1:8470"}, "--use_tpu: gorovod runs on CPUs and GPUs"},
		{[]string{"--master=grpc://10.0.0.1:8470"}, `--master "grpc://10.0.0.1:8470"`},
		{[]string{"--preserve_unused_tokens=true"}, "--preserve_unused_tokens"},
		{[]string{"--task_name=cola", "--labels=1,0"}, "--labels 1,0 contradicts --task_name=cola, whose labels are 0,1"},
	} {
		_, err := parseConfig(append(append([]string{}, base...), tc.args...), io.Discard)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want a usage error containing %q", tc.args, err, tc.want)
		}
	}
	// The seed task keeps --labels as given.
	if c, err := parseConfig(append(base, "--labels=neg,pos"), io.Discard); err != nil || c.task().name != seedTaskName || strings.Join(c.Labels, ",") != "neg,pos" {
		t.Errorf("seed task: %+v, %v", c, err)
	}
}

// A mistake prints nothing itself (run prints the error once with a -help hint); -help prints
// the usage, each flag with the kind of its value.
func TestUsageOnHelpOnly(t *testing.T) {
	var out strings.Builder
	if _, err := parseConfig([]string{"--bogus=1"}, &out); err == nil || out.Len() != 0 {
		t.Errorf("unknown flag: err %v, printed %q", err, out.String())
	}
	if _, err := parseConfig([]string{"-help"}, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-help: %v", err)
	}
	help := out.String()
	for _, want := range []string{"\n  -data_dir string\n", "\n  -labels names\n", "\n  -task_name string\n", "\n  -iterations_per_loop int\n", "cola, mrpc, mnli, xnli, sst-2",
		"\n  -max_seq_length length\n", "must match --saved_model (default: the export's, else 128)", "\n  -do_lower_case\n", "must match --saved_model (default: the export's, else true)"} {
		if !strings.Contains(help, want) {
			t.Errorf("-help lacks %q:\n%s", want, help)
		}
	}
	// Go's own suffix would state run_classifier's value as the default, which the export overrides.
	for _, wrong := range []string{"(default 128)", "(default true)"} {
		if strings.Contains(help, wrong) {
			t.Errorf("-help says %q:\n%s", wrong, help)
		}
	}
}

// The flags whose default is the export's parse as flag.IntVar and flag.BoolVar do.
func TestExportDefaultFlagsParse(t *testing.T) {
	for _, c := range []struct {
		args  []string
		seq   int
		lower bool
		err   string
	}{
		{nil, 128, true, ""},
		{[]string{"-max_seq_length=64", "-do_lower_case=false"}, 64, false, ""},
		{[]string{"-max_seq_length", "96", "-do_lower_case"}, 96, true, ""},
		{[]string{"-max_seq_length=x"}, 0, false, `invalid value "x" for flag -max_seq_length: not an integer`},
		{[]string{"-do_lower_case=maybe"}, 0, false, `invalid boolean value "maybe" for -do_lower_case: not a boolean`},
	} {
		cfg := runClassifierDefaults()
		fs := newFlagSet(&cfg, io.Discard)
		err := fs.Parse(c.args)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %v, want %q", c.args, err, c.err)
			}
			continue
		}
		if err != nil || cfg.MaxSeqLength != c.seq || cfg.DoLowerCase != c.lower {
			t.Errorf("%q: max_seq_length %d, do_lower_case %v, %v; want %d, %v", c.args, cfg.MaxSeqLength, cfg.DoLowerCase, err, c.seq, c.lower)
		}
	}
}

// Each task's files are the ones validate requires.
func TestValidateNamesTheTaskFiles(t *testing.T) {
	cfg := Config{TaskName: "mnli", DoTrain: true, DoEval: true, DoPredict: true, SavedModel: fakeModel(t, 100, 100, 64), MaxSeqLength: 64,
		DataDir: dataDir(t, "train.tsv", "dev.tsv", "test.tsv"), OutputDir: t.TempDir()}
	_, err := validate(&cfg, 0)
	if err == nil || !strings.Contains(err.Error(), "dev_matched.tsv: no such file") || !strings.Contains(err.Error(), "test_matched.tsv: no such file") {
		t.Errorf("mnli without its matched files: %v", err)
	}
}

// Every flag that run_classifier.py (with the tokenization.py it imports) defines is one of
// finetune's, of the same kind and with the same default, read from the Python module itself:
// a run_classifier command line parses unchanged.
func TestFlagsMatchRunClassifierDefinitions(t *testing.T) {
	var ref map[string]struct {
		Type    string
		Default any
	}
	if err := json.Unmarshal(datatests.RunPython(t, nil, "glue_ref.py", "flags"), &ref); err != nil {
		t.Fatal(err)
	}
	if len(ref) < 25 {
		t.Fatalf("run_classifier defines only %d flags?", len(ref))
	}
	c := runClassifierDefaults()
	fs := newFlagSet(&c, io.Discard)
	for name, r := range ref {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("--%s (%s, default %v) is not a flag", name, r.Type, r.Default)
			continue
		}
		got := f.Value.(flag.Getter).Get()
		var want any
		switch r.Type {
		case "bool":
			want, _ = r.Default.(bool)
		case "int":
			n, _ := r.Default.(float64)
			want = int(n)
		case "float":
			want, _ = r.Default.(float64)
		case "string":
			want, _ = r.Default.(string) // None: ""
		default:
			t.Errorf("--%s: flag type %s", name, r.Type)
			continue
		}
		if got != want {
			t.Errorf("--%s: default %#v, run_classifier's %#v", name, got, want)
		}
	}
}

// --amp is NVIDIA BERT's boolean flag (--amp alone turns it on) that also takes a precision.
// --use_adasum is a boolean (alone: the gradients) that also takes updates; absl's spellings of
// a boolean, --nouse_adasum too.
func TestAdasumFlag(t *testing.T) {
	checkValuedBoolFlag(t, "use_adasum", func(c Config) string { return c.UseAdasum }, []flagCase{
		{"", ""}, {"--use_adasum", "gradients"}, {"--use_adasum=True", "gradients"}, {"--use_adasum=gradients", "gradients"},
		{"--use_adasum=updates", "updates"}, {"--use_adasum=false", ""}, {"--nouse_adasum", ""},
	}, "--use_adasum=weights", "false or updates")
}

func TestAMPFlag(t *testing.T) {
	checkValuedBoolFlag(t, "amp", func(c Config) string { return c.AMP }, []flagCase{
		{"", ""}, {"--amp", "true"}, {"--amp=True", "true"}, {"--amp=t", "true"}, {"--amp=false", ""}, {"--amp=0", ""}, {"--amp=F", ""},
		{"--amp=bf16", "bfloat16"}, {"--amp=float16", "float16"}, {"--amp=fp32", ""},
	}, "--amp=fp8", "bf16 or fp16")
}

// flagCase is a flag on a training command line ("": none) and the value it leaves.
type flagCase struct{ args, want string }

// checkValuedBoolFlag checks a boolean flag that also takes values: each case's flag, after a
// training command line, leaves get's value its want, and bad, a value it refuses, is a usage
// error naming the flag and saying what it wants (wantSays).
func checkValuedBoolFlag(t *testing.T, name string, get func(Config) string, cases []flagCase, bad, wantSays string) {
	t.Helper()
	base := []string{"--do_train=true", "--data_dir=d", "--output_dir=o", "--saved_model=m"}
	for _, tc := range cases {
		args := base
		if tc.args != "" {
			args = append(append([]string{}, base...), tc.args)
		}
		c, err := parseConfig(args, io.Discard)
		if err != nil || get(c) != tc.want {
			t.Errorf("%s: --%s is %q, %v; want %q", tc.args, name, get(c), err, tc.want)
		}
	}
	_, err := parseConfig(append(base, bad), io.Discard)
	var u *usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "-"+name) || !strings.Contains(err.Error(), wantSays) {
		t.Errorf("%s: %v", bad, err)
	}
}

// --compression picks the allreduce's wire type; --use_fp16 keeps its meaning (fp16) and
// contradicts bf16.
func TestCompressionFlag(t *testing.T) {
	base := []string{"--do_train=true", "--data_dir=d", "--output_dir=o", "--saved_model=m"}
	for _, tc := range []struct {
		args []string
		want horovod.Compression
	}{
		{nil, horovod.NoCompression},
		{[]string{"--use_fp16"}, horovod.FP16Compression},
		{[]string{"--compression=fp16"}, horovod.FP16Compression},
		{[]string{"--compression=bf16"}, horovod.BF16Compression},
		{[]string{"--compression=fp16", "--use_fp16"}, horovod.FP16Compression},
		{[]string{"--compression=none", "--use_fp16"}, horovod.FP16Compression},
	} {
		c, err := parseConfig(append(append([]string{}, base...), tc.args...), io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got, err := c.compression(); err != nil || got != tc.want {
			t.Errorf("%v: compression %v, %v; want %v", tc.args, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--compression=bf16", "--use_fp16"}, "--use_fp16 and --compression=bf16 contradict"},
		{[]string{"--compression=int8"}, `--compression "int8": want none, fp16 or bf16`},
	} {
		_, err := parseConfig(append(append([]string{}, base...), tc.args...), io.Discard)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want a usage error containing %q", tc.args, err, tc.want)
		}
	}
}

// absl's forms of run_classifier's command lines, --flagfile (nested, comments, either way of
// giving the file) and --noNAME, give every run_classifier flag the value absl itself parses
// from the same arguments.
func TestAbslFormsParseAsAbslDoes(t *testing.T) {
	dir := t.TempDir()
	inner := filepath.Join(dir, "inner.flags")
	outer := filepath.Join(dir, "outer.flags")
	os.WriteFile(inner, []byte("--nodo_eval\n--train_batch_size=16\n--task_name=MRPC\n"), 0o644)
	os.WriteFile(outer, []byte("--do_train=true\n# a comment\n// another\n\n--flagfile="+inner+"  \n  --learning_rate=2e-5\n--do_eval\n"), 0o644)
	for _, argv := range [][]string{
		{"--flagfile=" + outer, "--nodo_lower_case", "--max_seq_length=64"},
		{"--do_eval", "--nodo_eval", "--flagfile", inner, "--nouse_tpu", "--num_train_epochs=2"},
		{"--flagfile=" + inner, "--flagfile=" + outer, "--do_lower_case", "--nodo_predict"},
		// absl reads a boolean's value in any case (true, t, 1, false, f, 0).
		{"--do_train=tRUE", "--do_eval=F", "--use_tpu=fAlse", "--do_lower_case=False", "--do_predict=1"},
	} {
		var ref map[string]any
		if err := json.Unmarshal(datatests.RunPython(t, nil, "glue_ref.py", append([]string{"parse"}, argv...)...), &ref); err != nil {
			t.Fatal(err)
		}
		c := runClassifierDefaults()
		fs := newFlagSet(&c, io.Discard)
		args, err := abslArgs(fs, argv)
		if err == nil {
			err = fs.Parse(args)
		}
		if err != nil {
			t.Fatalf("%q: %v", argv, err)
		}
		for name, want := range ref {
			got := fs.Lookup(name).Value.(flag.Getter).Get()
			switch w := want.(type) {
			case nil:
				want = ""
			case float64:
				if _, isInt := got.(int); isInt {
					want = int(w)
				}
			}
			if got != want {
				t.Errorf("%q: --%s = %#v, absl's %#v", argv, name, got, want)
			}
		}
	}
	loop := filepath.Join(dir, "loop.flags")
	os.WriteFile(loop, []byte("--do_train\n--flagfile="+loop+"\n"), 0o644)
	notFlag := filepath.Join(dir, "positional.flags")
	os.WriteFile(notFlag, []byte("--do_train\n\ndata/\n"), 0o644)
	indented := filepath.Join(dir, "indented.flags")
	os.WriteFile(indented, []byte("--do_train\n  --flagfile="+inner+"\n"), 0o644)
	for _, tc := range []struct{ arg, want string }{
		{"--flagfile=" + filepath.Join(dir, "missing.flags"), "missing.flags: no such file"},
		{"--flagfile=" + loop, "--flagfile " + loop + " includes itself"},
		{"--flagfile=" + notFlag, notFlag + `:3: "data/" is not a flag`},
		{"--flagfile", "--flagfile needs a file"},
		{"--flagfile=" + indented, indented + `:2: "--flagfile=` + inner + `" is indented`},
		{"--nodata_dir", "flag provided but not defined: -nodata_dir"}, // no: for boolean flags only
	} {
		_, err := parseConfig([]string{"--data_dir=d", "--output_dir=o", "--saved_model=m", tc.arg}, io.Discard)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want a usage error containing %q", tc.arg, err, tc.want)
		}
	}
}

// --timeline_steps names the range and its file in --output_dir, and refuses HOROVOD_TIMELINE
// set to a file (the whole run's timeline, which StartTimeline would end at the first step).
func TestTimelineStepsFlag(t *testing.T) {
	args := []string{"--do_train", "--data_dir=d", "--output_dir=o", "--saved_model=m", "--timeline_steps=10, 12"}
	c, err := parseConfig(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	tw, err := c.timelineSteps()
	if err != nil || tw.First != 10 || tw.Last != 12 || tw.Path != filepath.Join("o", "timeline-steps-10-12.json") {
		t.Errorf("--timeline_steps=10, 12: %+v, %v", tw, err)
	}
	defer func(old func(string) (string, bool)) { lookupEnv = old }(lookupEnv)
	for _, v := range []string{"DYNAMIC", "/tmp/whole.json"} {
		lookupEnv = func(name string) (string, bool) {
			if name == "HOROVOD_TIMELINE" {
				return v, true
			}
			return "", false
		}
		_, err := parseConfig(args, io.Discard)
		if refused := err != nil && strings.Contains(err.Error(), "HOROVOD_TIMELINE=/tmp/whole.json both ask for a timeline"); refused != (v != "DYNAMIC") {
			t.Errorf("HOROVOD_TIMELINE=%s: %v", v, err)
		}
	}
}
