package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/bertgraph/trainer"
	"github.com/gorovod/gorovod/horovod"
)

// Config is one fine-tuning run: run_classifier.py's flags with their names, defaults and
// meanings (train_batch_size is per rank, as in the Horovod recipe), plus gorovod's own.
type Config struct {
	// run_classifier.py
	TaskName                   string // "" is the seed task (tasks.go)
	DoTrain, DoEval, DoPredict bool
	DataDir                    string
	VocabFile                  string
	BertConfigFile             string
	InitCheckpoint             string
	DoLowerCase                bool
	// lowerCaseFromExport is the --saved_model whose contract gave DoLowerCase ("": the flag
	// or the default), for a message that says what to change.
	lowerCaseFromExport  string
	PreserveUnusedTokens bool // tokenization.py's flag; must be false
	MaxSeqLength         int
	KeepTailTokens       int // gorovod: head+tail truncation (features.Converter.WithTailTokens)
	TrainBatchSize       int
	NumAccumulationSteps int // NVIDIA BERT's: batches whose gradients a rank sums per update
	EvalBatchSize        int
	PredictBatchSize     int
	LearningRate         float64
	NumTrainEpochs       float64
	WarmupProportion     float64
	OutputDir            string
	SaveCheckpointsSteps int
	// TPU flags, accepted so that run_classifier's command lines run; only their defaults (or
	// inert values) are honoured, see check.
	UseTPU            bool
	IterationsPerLoop int
	TPUName, TPUZone  string
	GCPProject        string
	Master            string
	NumTPUCores       int
	TPUJobName        string
	// Estimator RunConfig
	KeepCheckpointMax         int
	KeepCheckpointEveryNHours float64
	LogStepCountSteps         int
	// Horovod BERT recipe
	UseFP16 bool
	UseXLA  bool
	// AMP is --amp: "" (off), "true" (by the hardware), "bfloat16" or "float16" (forced);
	// bertgraph.AMPPrecision resolves it.
	AMP     string
	Horovod bool
	// gorovod
	AllreduceBackend   string // auto, mpi or nccl
	Compression        string // none, fp16 or bf16: the allreduce's wire type (--use_fp16 is fp16)
	SparseAsDense      bool
	UseAdasum          string // "" (average), "gradients" or "updates": what Adasum combines
	SavedModel         string
	ExportDir          string
	Seed               int64
	Threads            int
	InterOpThreads     int
	Labels             []string
	SkipBadLines       bool
	ShuffleBuffer      int
	ClipNorm           float64
	MaxTrainExamples   int
	MaxEvalExamples    int
	MaxPredictExamples int
	// TimelineSteps is --timeline_steps, "first,last": the steps whose Horovod timeline rank 0
	// writes (timelineSteps parses it); "" for none.
	TimelineSteps string
}

// lookupEnv reads the environment: horovod's settings, whose HOROVOD_TIMELINE file
// --timeline_steps excludes.
var lookupEnv = os.LookupEnv

// timelineSteps is --timeline_steps' range of training steps and its file in --output_dir.
func (c *Config) timelineSteps() (trainer.TimelineSteps, error) {
	first, last, ok := strings.Cut(c.TimelineSteps, ",")
	a, errA := strconv.ParseInt(strings.TrimSpace(first), 10, 64)
	b, errB := strconv.ParseInt(strings.TrimSpace(last), 10, 64)
	if !ok || errA != nil || errB != nil || a < 1 || a > b {
		return trainer.TimelineSteps{}, fmt.Errorf("--timeline_steps %q: want first,last with 1 <= first <= last (steps numbered from 1)", c.TimelineSteps)
	}
	return trainer.TimelineSteps{Path: filepath.Join(c.OutputDir, fmt.Sprintf("timeline-steps-%d-%d.json", a, b)), First: a, Last: b}, nil
}

// defaultTask is what runs without flags (`go run ./cmd/finetune`, `make run`): MiniLM converted
// by `make model`, fine-tuned on the IMDB subset of `make data`, evaluated and used to predict.
// Paths are relative to the repository root. The subset sizes keep `make run` (two ranks on a
// two-core machine) within about ten minutes (defaultTrainExamples); head+tail truncation, the
// training set size and the learning rate were chosen on dev lines that make run does not report
// (docs/usage.md, "What `make run` gives you", has the measured time and accuracy).
func defaultTask() Config {
	c := runClassifierDefaults()
	c.DoTrain, c.DoEval, c.DoPredict = true, true, true
	c.DataDir = ".cache/data/imdb"
	c.SavedModel = defaultSavedModel
	c.OutputDir = ".cache/finetune/imdb-minilm"
	c.MaxSeqLength = defaultMaxSeqLength
	c.TrainBatchSize = 16
	c.EvalBatchSize = 64
	c.PredictBatchSize = 64
	c.LearningRate = 3e-5 // per rank: 6e-5 on 2 ranks; 1e-4 failed to learn on 12,000 examples
	c.NumTrainEpochs = 1
	c.SaveCheckpointsSteps = 100
	c.LogStepCountSteps = 10
	c.AMP = "true" // bfloat16 where it runs faster (AMX; AVX512-BF16 on AMD), float32 (and why) elsewhere
	c.MaxTrainExamples = defaultTrainExamples(bertgraph.DetectCPUBF16())
	c.KeepTailTokens = 96 // head 30 + tail 96: about Sun et al.'s 128 + 382 of 510, scaled to 126
	c.MaxEvalExamples = 1000
	c.MaxPredictExamples = 200
	return c
}

// defaultTrainExamples is how much of IMDB's training split the default task trains on: as much as
// make run trains in about ten minutes on a two-core machine in the precision --amp picks there,
// since more examples are what lifts its dev accuracy (docs/usage.md). Where --amp computes in
// bfloat16 (bertgraph.CPUBF16.Supported: AMX, or AVX512-BF16 on AMD), 14,000: the slowest such CPU
// measured (an AMD EPYC of family 25) trained them in 7 min 41 s at 30.3 examples/s, and at the
// 27.4 it reached on a slower afternoon, in 8 min 31 s, which with set-up, evaluation and
// prediction still leaves half a minute; 16,000 missed the ten minutes there that afternoon. In
// float32, 8,000: 9 minutes at 14.9 examples/s on an AMD EPYC with AVX2 alone, 4 min 58 s at 27.6
// on an Intel Xeon with AVX512-BF16 but no AMX, where bfloat16 is the slower precision. (On a GPU
// --amp computes in float16 whatever the CPU, and either size trains in minutes.) Every rank
// decides alike on one machine. Ranks computing on CPUs that differ resolve --amp to different
// precisions, and the job stops before training (checkSamePrecision); ranks on GPU hosts whose CPUs
// differ each read their own first lines, and the schedule follows their sum.
func defaultTrainExamples(cpu bertgraph.CPUBF16) int {
	if cpu.Supported() {
		return 14000
	}
	return 8000
}

const (
	defaultSavedModel   = ".cache/model/imdb_minilm"
	defaultMaxSeqLength = 128
)

func runClassifierDefaults() Config {
	return Config{
		DoLowerCase:               true,
		MaxSeqLength:              128,
		TrainBatchSize:            32,
		NumAccumulationSteps:      1,
		EvalBatchSize:             8,
		PredictBatchSize:          8,
		LearningRate:              5e-5,
		NumTrainEpochs:            3,
		WarmupProportion:          0.1,
		SaveCheckpointsSteps:      1000,
		IterationsPerLoop:         1000,
		NumTPUCores:               8,
		KeepCheckpointMax:         5,
		KeepCheckpointEveryNHours: 10000,
		LogStepCountSteps:         100,
		ShuffleBuffer:             100,
		ClipNorm:                  1,
		Seed:                      12345,
		AllreduceBackend:          "auto",
		Compression:               "none",
	}
}

// usageError is a command-line mistake: reported with the usage hint, exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// labelsFlag is a comma-separated list of label names.
type labelsFlag struct{ dst *[]string }

func (l labelsFlag) String() string {
	if l.dst == nil {
		return ""
	}
	return strings.Join(*l.dst, ",")
}

func (l labelsFlag) Set(s string) error {
	*l.dst = nil
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			return errors.New("empty label name")
		}
		*l.dst = append(*l.dst, p)
	}
	return nil
}

// adasumFlag is --use_adasum: a boolean flag (--use_adasum alone is gradients, false is "") that
// also takes gradients or updates.
type adasumFlag struct{ dst *string }

func (a adasumFlag) String() string {
	if a.dst == nil || *a.dst == "" {
		return "false"
	}
	return *a.dst
}

func (a adasumFlag) Set(s string) error {
	switch lower := strings.ToLower(s); lower {
	case "true", "t", "1", "gradients": // absl's spellings of true
		*a.dst = "gradients"
	case "false", "f", "0":
		*a.dst = ""
	case "updates":
		*a.dst = lower
	default:
		return errors.New("want true (gradients), false or updates")
	}
	return nil
}

func (a adasumFlag) IsBoolFlag() bool { return true }

// ampFlag is --amp: a boolean flag (--amp alone is --amp=true) that also takes bf16 or fp16.
type ampFlag struct{ dst *string }

func (a ampFlag) String() string {
	if a.dst == nil {
		return ""
	}
	return *a.dst
}

func (a ampFlag) Set(s string) error {
	p, _, err := bertgraph.AMPPrecision(s, false, bertgraph.CPUBF16{})
	if err != nil {
		return errors.New("want true, false, bf16 or fp16")
	}
	switch lower := strings.ToLower(s); {
	case lower == "true" || lower == "t" || s == "1": // absl's spellings of true
		*a.dst = "true"
	case p == bertgraph.Float32: // off
		*a.dst = ""
	default:
		*a.dst = p.String()
	}
	return nil
}

func (a ampFlag) IsBoolFlag() bool { return true }

// exportDefault is a flag whose default is --saved_model's (fromTaskAndModel applies it): it
// starts at run_classifier's default, which Get returns, but String is empty until the flag is
// set, so that the usage shows no "(default 128)" that most models would contradict.
type exportDefault[T int | bool] struct {
	dst *T
	set bool
}

func (f *exportDefault[T]) String() string {
	if f == nil || f.dst == nil || !f.set {
		return ""
	}
	return fmt.Sprint(*f.dst)
}

func (f *exportDefault[T]) Set(s string) error {
	switch dst := any(f.dst).(type) {
	case *int:
		v, err := strconv.Atoi(s)
		if err != nil {
			return errors.New("not an integer")
		}
		*dst = v
	case *bool:
		v, err := strconv.ParseBool(s)
		if err != nil {
			return errors.New("not a boolean")
		}
		*dst = v
	}
	f.set = true
	return nil
}

func (f *exportDefault[T]) Get() any { return *f.dst }

// IsBoolFlag lets a bool flag be given without a value (-do_lower_case), as flag.BoolVar's.
func (f *exportDefault[T]) IsBoolFlag() bool {
	_, ok := any(f.dst).(*bool)
	return ok
}

func newFlagSet(c *Config, output io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("finetune", flag.ContinueOnError)
	fs.SetOutput(output)
	// run_classifier.py
	fs.StringVar(&c.TaskName, "task_name", c.TaskName, "The name of the task to train: "+strings.Join(taskNames(), ", ")+
		" (the files of --data_dir, their columns and labels, as run_classifier's processors). Default "+seedTaskName+
		": train.tsv, dev.tsv, test.tsv with one label<TAB>text example a line (test.tsv may hold the text alone), labels of --saved_model.")
	fs.BoolVar(&c.DoTrain, "do_train", c.DoTrain, "Whether to run training.")
	fs.BoolVar(&c.DoEval, "do_eval", c.DoEval, "Whether to run eval on the dev set (rank 0).")
	fs.BoolVar(&c.DoPredict, "do_predict", c.DoPredict, "Whether to run the model in inference mode on the test set (rank 0).")
	fs.StringVar(&c.DataDir, "data_dir", c.DataDir, "The input data dir: the .tsv files of --task_name.")
	fs.StringVar(&c.VocabFile, "vocab_file", c.VocabFile, "The vocabulary file that the BERT model was trained on (default: the one packaged in --saved_model).")
	fs.StringVar(&c.BertConfigFile, "bert_config_file", c.BertConfigFile, "The config json file of the pre-trained BERT model; must match --saved_model's (default: the one packaged in it).")
	fs.StringVar(&c.InitCheckpoint, "init_checkpoint", c.InitCheckpoint, "Initial checkpoint of a pre-trained BERT model: a prefix, one of its files, or a directory with a `checkpoint` file. Ignored when --output_dir holds one to resume from.")
	fs.Var(&exportDefault[bool]{dst: &c.DoLowerCase}, "do_lower_case", "Whether to lower case the input text (true for uncased models); must match --saved_model (default: the export's, else true).")
	fs.BoolVar(&c.PreserveUnusedTokens, "preserve_unused_tokens", c.PreserveUnusedTokens, "Accepted for run_classifier compatibility (bert-tensorflow's tokenization.py); must be false: [unused*] tokens are word-pieced like any text.")
	fs.Var(&exportDefault[int]{dst: &c.MaxSeqLength}, "max_seq_length", "The maximum total input sequence `length` after WordPiece tokenization; must match --saved_model (default: the export's, else 128).")
	fs.IntVar(&c.KeepTailTokens, "keep_tail_tokens", c.KeepTailTokens, "Of a text longer than max_seq_length-2 tokens, keep the last N tokens with the first max_seq_length-2-N (head+tail truncation, Sun et al. 2019: a long review ends with its verdict); 0 keeps the head alone, as BERT. Pairs are truncated longest-first, as run_classifier.")
	fs.IntVar(&c.TrainBatchSize, "train_batch_size", c.TrainBatchSize, "Batch size for training, per rank.")
	fs.IntVar(&c.NumAccumulationSteps, "num_accumulation_steps", c.NumAccumulationSteps, "Number of batches whose gradients each rank sums before an update (NVIDIA BERT's flag, Horovod's backward_passes_per_step): global batch size = train_batch_size x num_accumulation_steps x ranks.")
	fs.IntVar(&c.EvalBatchSize, "eval_batch_size", c.EvalBatchSize, "Batch size for eval.")
	fs.IntVar(&c.PredictBatchSize, "predict_batch_size", c.PredictBatchSize, "Batch size for predict.")
	fs.Float64Var(&c.LearningRate, "learning_rate", c.LearningRate, "The initial learning rate for Adam, per rank: the run uses it times the number of ranks (with --use_adasum, as given).")
	fs.Float64Var(&c.NumTrainEpochs, "num_train_epochs", c.NumTrainEpochs, "Total number of training epochs to perform.")
	fs.Float64Var(&c.WarmupProportion, "warmup_proportion", c.WarmupProportion, "Proportion of training to perform linear learning rate warmup for.")
	fs.StringVar(&c.OutputDir, "output_dir", c.OutputDir, "The output directory where the model checkpoints will be written (rank r > 0 writes to output_dir/r).")
	fs.IntVar(&c.SaveCheckpointsSteps, "save_checkpoints_steps", c.SaveCheckpointsSteps, "How often to save the model checkpoint (0: only at the end).")
	fs.IntVar(&c.IterationsPerLoop, "iterations_per_loop", c.IterationsPerLoop, "Accepted for run_classifier compatibility; no effect (TPU only: every step is one session run).")
	fs.BoolVar(&c.UseTPU, "use_tpu", c.UseTPU, "Accepted for run_classifier compatibility; must be false (no TPU path: CPUs and GPUs through Horovod).")
	fs.StringVar(&c.TPUName, "tpu_name", c.TPUName, "Accepted for run_classifier compatibility; no effect (TPU only).")
	fs.StringVar(&c.TPUZone, "tpu_zone", c.TPUZone, "Accepted for run_classifier compatibility; no effect (TPU only).")
	fs.StringVar(&c.GCPProject, "gcp_project", c.GCPProject, "Accepted for run_classifier compatibility; no effect (TPU only).")
	fs.StringVar(&c.Master, "master", c.Master, "Accepted for run_classifier compatibility; must be empty (TensorFlow runs in each rank's process, never on a remote master).")
	fs.IntVar(&c.NumTPUCores, "num_tpu_cores", c.NumTPUCores, "Accepted for run_classifier compatibility; no effect (TPU only).")
	fs.StringVar(&c.TPUJobName, "tpu_job_name", c.TPUJobName, "Accepted for run_classifier compatibility; no effect (TPU only).")
	fs.IntVar(&c.KeepCheckpointMax, "keep_checkpoint_max", c.KeepCheckpointMax, "The most recent checkpoints to keep (0 keeps all).")
	fs.Float64Var(&c.KeepCheckpointEveryNHours, "keep_checkpoint_every_n_hours", c.KeepCheckpointEveryNHours, "Also keep one checkpoint every this many hours.")
	fs.IntVar(&c.LogStepCountSteps, "log_step_count_steps", c.LogStepCountSteps, "How often (in steps) rank 0 logs the loss and speed when its output is not a terminal.")
	fs.BoolVar(&c.UseFP16, "use_fp16", c.UseFP16, "Compress the gradients to float16 for the allreduce (Horovod's Compression.fp16).")
	fs.BoolVar(&c.UseXLA, "use_xla", c.UseXLA, "Compile the graphs with XLA (global_jit_level ON_1).")
	fs.Var(ampFlag{&c.AMP}, "amp", "Mixed-precision training (NVIDIA BERT's flag): the matrix products of the train step in float16 with dynamic loss scaling on a GPU, in bfloat16 on a CPU with AMX or an AMD CPU with AVX512-BF16, float32 elsewhere (said at start-up); =bf16 or =fp16 forces one. Weights, optimizer state and checkpoints stay float32 (docs/mixed-precision.md).")
	fs.BoolVar(&c.Horovod, "horovod", c.Horovod, "Accepted for the Horovod recipe's command lines; no effect: every run is Horovod's (one rank without mpirun).")
	// gorovod
	fs.StringVar(&c.AllreduceBackend, "allreduce_backend", c.AllreduceBackend, "Where gradients are averaged: mpi (host memory), nccl (each rank's GPU), or auto (nccl when every rank of a multi-rank job has a GPU and NCCL, else mpi).")
	fs.StringVar(&c.Compression, "compression", c.Compression, "How the gradients cross the wire in the allreduce: none (float32), fp16 (Horovod's Compression.fp16, as --use_fp16) or bf16 (bfloat16: fp16's bytes, float32's range, 8 significant bits instead of 11).")
	fs.BoolVar(&c.SparseAsDense, "sparse_as_dense", c.SparseAsDense, "Allreduce the word embeddings' gradient dense with the others (Horovod's sparse_as_dense=True) instead of allgathering the rows each step's batches look up (Horovod's default for such a gradient).")
	fs.Var(adasumFlag{&c.UseAdasum}, "use_adasum", "Combine the ranks' gradients with Adasum (Horovod's op=hvd.Adasum, its examples' --use-adasum) instead of averaging them: the word embeddings' gradient dense with the others, the learning rate not scaled by the number of ranks. =updates combines each rank's weight update after an AdamWeightDecay step of its own instead (Horovod's DistributedOptimizer(op=hvd.Adasum) with a TensorFlow 1 optimizer).")
	fs.StringVar(&c.SavedModel, "saved_model", c.SavedModel, "The training SavedModel exported by bertgraph/exporter.")
	fs.StringVar(&c.ExportDir, "export_dir", c.ExportDir, "Where rank 0 exports the serving SavedModel of the final weights (default output_dir/export; \"none\" skips).")
	fs.Int64Var(&c.Seed, "seed", c.Seed, "Seed of the shuffling and the dropout (each rank derives its own from it).")
	fs.IntVar(&c.Threads, "threads", c.Threads, "TensorFlow intra-op threads per rank (0: cores / ranks on this machine).")
	fs.IntVar(&c.InterOpThreads, "inter_op_threads", c.InterOpThreads, "TensorFlow inter-op threads per rank (0: TensorFlow's choice).")
	fs.Var(labelsFlag{&c.Labels}, "labels", "Comma-separated label `names` in class order (default: --task_name's labels, else the names --saved_model was exported with).")
	fs.BoolVar(&c.SkipBadLines, "skip_bad_lines", c.SkipBadLines, "Skip and count malformed train and dev lines instead of failing (a malformed test line is always an error: test_results.tsv follows test.tsv line by line).")
	fs.IntVar(&c.ShuffleBuffer, "shuffle_buffer", c.ShuffleBuffer, "Shuffle buffer of the training examples, per rank, as run_classifier's 100 (0 or 1: file order).")
	fs.Float64Var(&c.ClipNorm, "clip_norm", c.ClipNorm, "Clip the averaged gradients to this global norm.")
	fs.IntVar(&c.MaxTrainExamples, "max_train_examples", c.MaxTrainExamples, "Use only the first N lines of train.tsv (0: all).")
	fs.IntVar(&c.MaxEvalExamples, "max_eval_examples", c.MaxEvalExamples, "Use only the first N lines of dev.tsv (0: all).")
	fs.IntVar(&c.MaxPredictExamples, "max_predict_examples", c.MaxPredictExamples, "Use only the first N lines of test.tsv (0: all).")
	fs.StringVar(&c.TimelineSteps, "timeline_steps", c.TimelineSteps, "`first,last`: write Horovod's timeline of these training steps only, to output_dir/timeline-steps-FIRST-LAST.json (as Keras's profile_batch; HOROVOD_TIMELINE records the whole run).")
	return fs
}

// parseConfig reads the command line. With no arguments at all it returns the embedded default
// task; otherwise run_classifier's defaults apply, the task and the SavedModel's contract fill
// in what the flags leave open, and every flag is checked for meaning and consistency before
// any work starts. A mistake is reported once, without the usage (run adds a -help hint);
// -help prints the usage to output.
func parseConfig(args []string, output io.Writer) (Config, error) {
	if len(args) == 0 {
		c := defaultTask()
		err := c.fromTaskAndModel(nil)
		return c, err
	}
	c := runClassifierDefaults()
	fs := newFlagSet(&c, io.Discard)
	fs.Usage = func() {} // called by the flag package on every error, -help included
	args, err := abslArgs(fs, args)
	if err != nil {
		return Config{}, &usageError{err.Error()}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(fs, output)
			return Config{}, err
		}
		return Config{}, &usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return Config{}, usagef("unexpected argument %q: every setting is a --flag", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []string
	for _, err := range []error{c.fromTaskAndModel(set), c.check()} {
		if err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return c, usagef("%s", strings.Join(errs, "\n"))
	}
	return c, nil
}

func printUsage(fs *flag.FlagSet, output io.Writer) {
	fs.SetOutput(output)
	fmt.Fprintf(output, "Usage: finetune [flags], or mpirun -np N finetune [flags] for N ranks.\n"+
		"BERT's run_classifier.py with Horovod; without flags, the default task of `make run`.\n\nFlags:\n")
	fs.PrintDefaults()
}

// fromTaskAndModel fills in what the flags set leaves open (nil: none given): the label list of
// a task with fixed labels, and max_seq_length and do_lower_case as --saved_model was exported
// (its contract), since a model accepts only its own sequence length and was trained on its
// vocabulary's casing. A flag that contradicts them is an error, as run_classifier's
// validate_case_matches_checkpoint. A model without a readable contract is left to validate.
func (c *Config) fromTaskAndModel(set map[string]bool) error {
	var errs []string
	t, err := lookupTask(c.TaskName)
	if err == nil {
		if c.Labels, err = t.checkLabels(c.Labels); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if ct, err := bertgraph.ReadContract(c.SavedModel); err == nil {
		switch {
		case !set["max_seq_length"]:
			c.MaxSeqLength = ct.MaxSeqLength
		case c.MaxSeqLength != ct.MaxSeqLength:
			errs = append(errs, fmt.Sprintf("--max_seq_length %d, but --saved_model %s was exported for %d: omit the flag, or export again with --max_seq_length %d",
				c.MaxSeqLength, c.SavedModel, ct.MaxSeqLength, c.MaxSeqLength))
		}
		switch {
		case !set["do_lower_case"]:
			c.DoLowerCase, c.lowerCaseFromExport = ct.DoLowerCase, c.SavedModel
		case c.DoLowerCase != ct.DoLowerCase:
			errs = append(errs, fmt.Sprintf("--do_lower_case=%v, but --saved_model %s was exported with do_lower_case=%v for its vocabulary and checkpoint: omit the flag, or export again",
				c.DoLowerCase, c.SavedModel, ct.DoLowerCase))
		}
		if t != nil && t.labels != nil && len(t.labels) != ct.NumLabels {
			errs = append(errs, fmt.Sprintf("--task_name=%s has %d labels (%s), but --saved_model %s classifies %d: export it with --num_labels %d",
				t.name, len(t.labels), strings.Join(t.labels, ","), c.SavedModel, ct.NumLabels, len(t.labels)))
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "\n"))
	}
	return nil
}

// exportBase is the directory under which rank 0 exports the serving SavedModel, one
// subdirectory per step: --export_dir, or output_dir/export by default.
func (c *Config) exportBase() string {
	if c.ExportDir == "" {
		return filepath.Join(c.OutputDir, "export")
	}
	return c.ExportDir
}

// compression is the allreduce's Compression: --compression, with --use_fp16 standing for fp16.
func (c *Config) compression() (horovod.Compression, error) {
	comp, err := horovod.ParseCompression(c.Compression)
	if err != nil {
		return 0, fmt.Errorf("--compression %q: want none, fp16 or bf16", c.Compression)
	}
	if c.UseFP16 {
		if comp == horovod.BF16Compression {
			return 0, errors.New("--use_fp16 and --compression=bf16 contradict each other: keep one")
		}
		comp = horovod.FP16Compression
	}
	return comp, nil
}

// check rejects flags that are out of range or contradict each other. Files are checked later,
// by validate, once the rank is known.
func (c *Config) check() error {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if !c.DoTrain && !c.DoEval && !c.DoPredict {
		bad("at least one of --do_train, --do_eval or --do_predict must be true")
	}
	if t, err := lookupTask(c.TaskName); err != nil {
		bad("%v", err)
	} else if c.DoPredict && t.test.file == "" {
		bad("--do_predict: --task_name=%s has no test split (nor has run_classifier's processor)", t.name)
	}
	if c.UseTPU {
		bad("--use_tpu: gorovod runs on CPUs and GPUs through Horovod; there is no TPU path")
	}
	if c.PreserveUnusedTokens {
		bad("--preserve_unused_tokens: the tokenizer does not keep [unused*] vocabulary entries whole")
	}
	if c.Master != "" {
		bad("--master %q: each rank runs TensorFlow in its own process; there is no remote master", c.Master)
	}
	switch c.AllreduceBackend {
	case "auto", "mpi", "nccl":
	default:
		bad("--allreduce_backend %q: want auto, mpi or nccl", c.AllreduceBackend)
	}
	if _, err := c.compression(); err != nil {
		bad("%v", err)
	}
	if c.OutputDir == "" {
		bad("--output_dir is required")
	}
	if c.DataDir == "" {
		bad("--data_dir is required")
	}
	if c.SavedModel == "" {
		bad("--saved_model is required (export one with python -m bertgraph.exporter.export)")
	}
	if c.MaxSeqLength < 3 {
		bad("--max_seq_length %d: needs room for [CLS], [SEP] and one token", c.MaxSeqLength)
	} else if c.KeepTailTokens < 0 || c.KeepTailTokens > c.MaxSeqLength-2 {
		bad("--keep_tail_tokens %d: want 0 to max_seq_length-2 = %d", c.KeepTailTokens, c.MaxSeqLength-2)
	}
	positive := func(name string, v int) {
		if v <= 0 {
			bad("--%s %d must be positive", name, v)
		}
	}
	nonNegative := func(name string, v int) {
		if v < 0 {
			bad("--%s %d must not be negative", name, v)
		}
	}
	// The model computes in float32: a value past its range would reach it as infinity.
	finitePositive := func(name string, v float64) {
		if !(v > 0) || v > math.MaxFloat32 {
			bad("--%s %v must be a finite positive number (at most %g, float32's largest)", name, v, math.MaxFloat32)
		}
	}
	// A batch's features are allocated in full before the model sees them (three int32s a
	// token): a batch size past this bound would end the process out of memory, not in an error.
	batchTokens := func(name string, v int) {
		positive(name, v)
		if tokens := int64(v) * int64(max(1, c.MaxSeqLength)); tokens > math.MaxInt32 {
			bad("--%s %d x --max_seq_length %d is %d tokens in one batch, more than 2^31-1 (%.0f GB of features alone)",
				name, v, c.MaxSeqLength, tokens, float64(tokens)*12/1e9)
		}
	}
	if c.DoTrain {
		batchTokens("train_batch_size", c.TrainBatchSize)
		positive("num_accumulation_steps", c.NumAccumulationSteps)
		finitePositive("learning_rate", c.LearningRate)
		finitePositive("num_train_epochs", c.NumTrainEpochs)
		finitePositive("clip_norm", c.ClipNorm)
		if !(c.WarmupProportion >= 0 && c.WarmupProportion <= 1) {
			bad("--warmup_proportion %v must be within [0, 1]", c.WarmupProportion)
		}
	}
	if c.DoEval {
		batchTokens("eval_batch_size", c.EvalBatchSize)
	}
	if c.DoPredict {
		batchTokens("predict_batch_size", c.PredictBatchSize)
	}
	nonNegative("save_checkpoints_steps", c.SaveCheckpointsSteps)
	nonNegative("keep_checkpoint_max", c.KeepCheckpointMax)
	if !(c.KeepCheckpointEveryNHours > 0) {
		bad("--keep_checkpoint_every_n_hours %v must be positive", c.KeepCheckpointEveryNHours)
	}
	positive("log_step_count_steps", c.LogStepCountSteps)
	nonNegative("threads", c.Threads)
	nonNegative("inter_op_threads", c.InterOpThreads)
	nonNegative("shuffle_buffer", c.ShuffleBuffer)
	nonNegative("max_train_examples", c.MaxTrainExamples)
	nonNegative("max_eval_examples", c.MaxEvalExamples)
	nonNegative("max_predict_examples", c.MaxPredictExamples)
	if c.TimelineSteps != "" {
		if _, err := c.timelineSteps(); err != nil {
			bad("%v", err)
		} else if !c.DoTrain {
			bad("--timeline_steps %s needs --do_train: it records training steps", c.TimelineSteps)
		} else if s, err := horovod.ReadSettings(lookupEnv); err == nil && s.Timeline != "" {
			// A malformed HOROVOD_* variable is horovod.Init's to report, by name.
			bad("--timeline_steps %s and HOROVOD_TIMELINE=%s both ask for a timeline: give one (the variable records the whole run)", c.TimelineSteps, s.Timeline)
		}
	}
	if err := checkCaseMatchesCheckpoint(c.DoLowerCase, c.lowerCaseFromExport, c.InitCheckpoint); err != nil {
		bad("%v", err)
	}
	if len(errs) > 0 {
		return usagef("%s", strings.Join(errs, "\n"))
	}
	return nil
}

var googleModelName = regexp.MustCompile(`^.*?([A-Za-z0-9_-]+)/bert_model\.ckpt`)

// checkCaseMatchesCheckpoint is run_classifier's validate_case_matches_checkpoint: Google's
// published models are either cased or uncased, and a mismatched --do_lower_case silently ruins
// fine-tuning. fromExport is the SavedModel whose contract gave doLowerCase ("": the flag), which
// is then what has to change.
func checkCaseMatchesCheckpoint(doLowerCase bool, fromExport, initCheckpoint string) error {
	m := googleModelName.FindStringSubmatch(initCheckpoint)
	if m == nil {
		return nil
	}
	lower := map[string]bool{"uncased_L-24_H-1024_A-16": true, "uncased_L-12_H-768_A-12": true,
		"multilingual_L-12_H-768_A-12": true, "chinese_L-12_H-768_A-12": true}
	cased := map[string]bool{"cased_L-12_H-768_A-12": true, "cased_L-24_H-1024_A-16": true,
		"multi_cased_L-12_H-768_A-12": true}
	name := m[1]
	var kind string
	switch {
	case lower[name] && !doLowerCase:
		kind = "uncased"
	case cased[name] && doLowerCase:
		kind = "cased"
	default:
		return nil
	}
	if fromExport != "" {
		return fmt.Errorf("--saved_model %s was exported with do_lower_case=%v but --init_checkpoint %s is the %s model %s: "+
			"export it again with --do_lower_case=%v and that model's vocabulary", fromExport, doLowerCase, initCheckpoint, kind, name, !doLowerCase)
	}
	return fmt.Errorf("--do_lower_case=%v but --init_checkpoint %s is the %s model %s: pass --do_lower_case=%v",
		doLowerCase, initCheckpoint, kind, name, !doLowerCase)
}

// rankOutputDir is where rank writes: output_dir for rank 0, output_dir/<rank> for the others
// (the Horovod BERT recipe), so that only rank 0's checkpoints and summaries sit at the top.
func rankOutputDir(outputDir string, rank int) string {
	if rank == 0 {
		return outputDir
	}
	return filepath.Join(outputDir, fmt.Sprint(rank))
}
