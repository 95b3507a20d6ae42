package main

import (
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/term"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/bertgraph/tokenizer"
	"github.com/gorovod/gorovod/bertgraph/trainer"
	"github.com/gorovod/gorovod/cmd/finetune/internal/progress"
	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/ncclbackend"
	"github.com/gorovod/gorovod/nccl"
	"github.com/gorovod/gorovod/tf"
	"github.com/gorovod/gorovod/tf/checkpoint"
)

// job is one rank's part of a run.
type job struct {
	cfg        Config
	hvd        *horovod.Horovod
	rank, size int
	in         *inputs
	model      *bertgraph.Model
	conv       *features.Converter
	ckpts      *checkpoint.Manager // rank 0's checkpoints (nil on other ranks)
	stop       *stopper
	console    *console
	bare       bool // run without arguments: the default task
	// lossScale is the loss scale after the last training step (trainer.Result; 1 unless float16).
	lossScale float32
	// inferenceBatches is how many batches rank 0 evaluates or predicts at once.
	inferenceBatches int
}

// errInterrupted ends a run stopped by a signal: in the training loop after rank 0 wrote the
// checkpoint of the last step (during == ""), elsewhere at once, leaving no partial output.
type errInterrupted struct {
	sig    os.Signal
	during string // the phase cut short, "" for the training loop
}

func (e errInterrupted) Error() string { return fmt.Sprintf("stopped by %v", e.sig) }

// run returns the process exit status: 0 on success, 2 for a command-line mistake, 128+n after
// signal n (with a checkpoint written), 1 otherwise.
func run(args []string) int {
	cfg, err := parseConfig(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var usage *usageError
	if errors.As(err, &usage) {
		fmt.Fprintf(os.Stderr, "finetune: %v\nRun finetune -help for the flags.\n", err)
		return 2
	}
	stop := newStopper()
	defer stop.close()
	hvd, err := horovod.Init(allreduceOptions(cfg.AllreduceBackend)...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "finetune: %v\n", err)
		return 1
	}
	j := &job{cfg: cfg, hvd: hvd, rank: hvd.Rank(), size: hvd.Size(), stop: stop, console: newConsole(hvd.Rank()), bare: len(args) == 0}
	// Before the model loads: each step then reuses the last one's memory instead of faulting
	// it in again (tf.ReuseFreedMemory). Without it training is only slower.
	if err := tf.ReuseFreedMemory(); err != nil {
		j.console.infof("warning: %v: each step faults its memory in again", err)
	}
	err = j.run()
	// Each rank says how it ends before Shutdown, whose MPI_Finalize no rank leaves before every
	// rank has entered it: mpirun ends the ranks left as soon as the first exits non-zero, and a
	// rank still on its way to its line would be ended without it.
	code := 0
	var intr errInterrupted
	var reported errReported
	switch {
	case errors.As(err, &reported):
		code = 1
	case errors.As(err, &intr) && intr.during == "":
		j.console.rankf("%v: exiting after the checkpoint of the last step", intr.sig)
		stop.checkpointWritten()
		code = exitCode(intr.sig)
	case errors.As(err, &intr):
		j.console.rankf("%v: stopped %s, exiting", intr.sig, intr.during)
		code = exitCode(intr.sig)
	case err != nil:
		j.console.errorf("%v", j.explain(err))
		code = 1
	}
	if serr := hvd.Shutdown(); serr != nil && code == 0 && !errors.Is(serr, horovod.ErrShutdown) {
		j.console.errorf("%v", serr)
		code = 1
	}
	return code
}

// explain adds to err, for a run without arguments that failed before its inputs were checked,
// where the default task expects to run.
func (j *job) explain(err error) error {
	if j.bare && j.in == nil {
		return fmt.Errorf("%w\n(the default task runs at the repository root after `make setup data`)", err)
	}
	return err
}

// errReported is an error the rank has already printed.
type errReported struct{ error }

func (e errReported) Unwrap() error { return e.error }

// allreduceOptions selects horovod's data backend. Negotiation stays on MPI either way; with
// NCCL, the gradients are staged to each rank's GPU and reduced there. auto, in a job of more
// than one rank, uses NCCL when every rank can (the ranks decide together, so machines that
// differ cannot split the job between two backends) and MPI otherwise.
func allreduceOptions(choice string) []horovod.Option {
	cfg := ncclbackend.Config{
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "finetune: "+format+"\n", args...) },
		// auto's fallback is one line; the explicit choice fails with every rank's full reason.
		FullReasonHint: "--allreduce_backend=nccl reports why in full",
	}
	// A launcher environment that names no rank within a size fails horovod.Init itself.
	l, _ := horovod.DetectLauncher(os.LookupEnv)
	switch {
	case choice == "nccl":
		return []horovod.Option{horovod.WithDataBackend(ncclbackend.Opener(cfg))}
	case choice == "auto" && l.Size > 1:
		return []horovod.Option{horovod.WithDataBackend(ncclbackend.AutoOpener(cfg))}
	}
	return nil
}

func (j *job) run() error {
	if err := j.setup(); err != nil {
		return err
	}
	defer j.model.Close()
	step, err := int64(0), error(nil)
	if j.cfg.DoTrain {
		if step, err = j.train(); err != nil {
			return err
		}
	} else if j.rank == 0 {
		if step, err = j.restoreForInference(); err != nil {
			return err
		}
	}
	// Evaluation, prediction and export are rank 0's alone: the other ranks leave the job here,
	// and rank 0 needs no collective any more.
	if err := j.hvd.Shutdown(); err != nil && !errors.Is(err, horovod.ErrShutdown) {
		return err
	}
	if j.rank != 0 {
		// A signal that came too late to stop the training (after this rank agreed to its last
		// step) or the setup stops the job from here, as a signal to any rank does: exiting
		// 128+n makes mpirun end rank 0's evaluation, prediction or export, which a signal
		// stops without partial output. Rank 0's final checkpoint is complete: this rank's
		// Shutdown (MPI_Finalize) returned only once rank 0 had entered its own, after it.
		if sig := j.stop.requested(); sig != nil && j.cfg.DoTrain {
			return errInterrupted{sig, "after training"}
		} else if sig != nil {
			return errInterrupted{sig, "after setup"}
		}
		return nil
	}
	if j.cfg.DoEval {
		if err := j.evaluate(step); err != nil {
			return err
		}
	}
	if j.cfg.DoPredict {
		if err := j.predict(); err != nil {
			return err
		}
	}
	if j.cfg.DoTrain && j.cfg.ExportDir != "none" {
		if sig := j.stop.requested(); sig != nil {
			return errInterrupted{sig, "before the export"}
		}
		return j.export(step)
	}
	return nil
}

// setup validates the inputs, loads the model and checks it against the flags on every rank,
// then makes the ranks agree that all of them are ready: a rank that cannot start fails the
// whole job with its reason, before any training, and no rank waits for it forever. A signal
// that arrived meanwhile, on any rank, stops every rank here.
func (j *job) setup() error {
	err := j.prepare()
	status := int64(1) // 1 ready, 0 failed, -n signal n
	precision := int64(-1)
	settings := j.sharedSettings()
	columns := make([]int64, 2+len(settings)) // status, precision, then each setting's hash
	if err == nil {
		precision = int64(j.model.Precision())
		for i, s := range settings {
			h := fnv.New64a()
			h.Write([]byte(s.value))
			columns[2+i] = int64(h.Sum64())
		}
	}
	if err != nil {
		// Said now, before the ranks agree: once the others know, they exit, and mpirun ends
		// the job, dropping what this rank writes afterwards.
		j.console.errorf("%v", j.explain(err))
		err = errReported{err}
		status = 0
	} else if sig := j.stop.requested(); sig != nil {
		status = -int64(signalNumber(sig))
	}
	columns[0], columns[1] = status, precision
	perRank, aerr := j.gatherInt64("finetune/setup", columns...)
	if aerr != nil {
		return errors.Join(err, aerr)
	}
	var failed []string
	for r, row := range perRank {
		if row[0] == 0 {
			failed = append(failed, strconv.Itoa(r))
		}
	}
	if err == nil && failed != nil {
		// Said now too: the failed ranks exit as soon as they know, and mpirun then ends this
		// one, whose model and horovod would otherwise close first (a slower machine lost the
		// message that way).
		err = fmt.Errorf("rank(s) %s could not start (see their errors); stopping before training", strings.Join(failed, ", "))
		j.console.errorf("%v", err)
		err = errReported{err}
	}
	for _, row := range perRank {
		if err == nil && row[0] < 0 {
			err = errInterrupted{syscall.Signal(-row[0]), "during setup"}
		}
	}
	if err == nil {
		err = checkSamePrecision(perRank)
	}
	if err == nil {
		err = checkSameSettings(perRank, settings)
	}
	if err != nil && j.model != nil {
		j.model.Close()
	}
	return err
}

// checkSamePrecision fails, on every rank alike, when the ranks resolved --amp to different
// precisions (column 1 of perRank), as --amp=true does on machines that differ (a GPU or not,
// AVX512-BF16 or not). A float16 rank scales its gradients by its loss scale before the
// allreduce and divides the sum by it after, a float32 or bfloat16 rank does not: each would
// apply another update, and the ranks' copies of the model would drift apart. bfloat16 beside
// float32 keeps them alike but is still two different jobs in one; a precision named by the
// flag resolves alike everywhere.
func checkSamePrecision(perRank [][]int64) error {
	var ranks []string
	differ := false
	for r, row := range perRank {
		ranks = append(ranks, fmt.Sprintf("rank %d %s", r, bertgraph.Precision(row[1])))
		differ = differ || row[1] != perRank[0][1]
	}
	if !differ {
		return nil
	}
	return fmt.Errorf("the ranks compute in different precisions (%s): --amp=true chooses by each machine's hardware; name one for every rank with --amp=fp16, --amp=bf16 or --amp=false",
		strings.Join(ranks, ", "))
}

// setting is a flag every rank must be given alike, with this rank's value as resolved.
type setting struct{ flag, value string }

// sharedSettings are the flags that decide, on each rank, whether it trains, its schedule (the
// steps, the learning rate), the update it applies to its copy of the model, what crosses the
// wire beside the others' tensors, and how its share of train.tsv becomes features. A launch
// that gives the ranks their own flags (mpirun's "-np 1 finetune ... : -np 1 finetune ...", or
// a wrapper per machine) could give them different ones: measured before this check with
// --num_train_epochs=1 on rank 0 and 2 on rank 1, rank 1 trained another learning-rate
// schedule for 4 steps, failed with "horovod: shut down (Shutdown called on rank 0)" when rank 0
// finished, and mpirun then ended rank 0 after its evaluation, its export lost, with no reason
// given. Flags rank 0 alone uses (checkpoints, evaluation, export) and per-rank ones (threads,
// paths, --seed, from which each rank derives its own) may differ, and so may every other one
// in a job that does not train. Labels count once the
// converter has resolved them (nil before: the setup failed, and nothing is compared).
func (j *job) sharedSettings() []setting {
	c := &j.cfg
	comp, _ := c.compression() // its contradictions were refused with the flags
	var labels []string
	if j.conv != nil {
		labels = j.conv.Labels().Names()
	}
	maxTrain := strconv.Itoa(c.MaxTrainExamples)
	if j.bare {
		// The default task's count follows each host's CPU (defaultTrainExamples): ranks on GPU
		// hosts whose CPUs differ read their own first lines, and the schedule follows the sum.
		maxTrain = ""
	}
	settings := []setting{
		{"do_train", strconv.FormatBool(c.DoTrain)},
		{"train_batch_size", strconv.Itoa(c.TrainBatchSize)},
		{"num_accumulation_steps", strconv.Itoa(c.NumAccumulationSteps)},
		{"num_train_epochs", fmt.Sprint(c.NumTrainEpochs)},
		{"warmup_proportion", fmt.Sprint(c.WarmupProportion)},
		{"learning_rate", fmt.Sprint(c.LearningRate)},
		{"clip_norm", fmt.Sprint(c.ClipNorm)},
		{"compression", comp.String()},
		{"sparse_as_dense", strconv.FormatBool(c.SparseAsDense)},
		{"use_adasum", adasumFlag{&c.UseAdasum}.String()},
		{"task_name", c.TaskName},
		{"labels", strings.Join(labels, ",")},
		{"do_lower_case", strconv.FormatBool(c.DoLowerCase)},
		{"keep_tail_tokens", strconv.Itoa(c.KeepTailTokens)},
		{"max_train_examples", maxTrain},
	}
	if !c.DoTrain {
		// Without training, rank 0 alone evaluates and predicts: nothing else is shared.
		for i := 1; i < len(settings); i++ {
			settings[i].value = ""
		}
	}
	return settings
}

// checkSameSettings fails, on every rank alike, when a rank was given another value of a shared
// setting than rank 0 (columns 2 on of perRank: a hash of each setting's value), naming the
// flags and this rank's values: each rank says its own.
func checkSameSettings(perRank [][]int64, settings []setting) error {
	var differ []string
	ranks := map[int]bool{}
	for i, s := range settings {
		named := false
		for r, row := range perRank {
			if row[2+i] != perRank[0][2+i] {
				ranks[r] = true
				if !named {
					differ = append(differ, fmt.Sprintf("--%s (this rank's %q)", s.flag, s.value))
					named = true
				}
			}
		}
		if i == 0 && differ != nil {
			break // ranks that train beside ranks that do not: their other settings are not shared
		}
	}
	if differ == nil {
		return nil
	}
	var who []string
	for r := range perRank {
		if ranks[r] {
			who = append(who, strconv.Itoa(r))
		}
	}
	return fmt.Errorf("rank(s) %s were given other settings than rank 0: %s: give every rank the same", strings.Join(who, ", "), strings.Join(differ, ", "))
}

func (j *job) prepare() error {
	c := &j.cfg
	in, err := validate(c, j.rank)
	if err != nil {
		return err
	}
	for _, w := range in.warnings {
		j.console.infof("%s", w)
	}
	j.in = in
	tfGPU, err := tensorFlowHasGPU()
	if err != nil {
		return err
	}
	gpus := ""
	if tfGPU {
		if gpus, err = placeGPU(nccl.Options{}, j.hvd.LocalRank(), j.hvd.LocalSize(), j.console.rankf); err != nil {
			return err
		}
	}
	precision, why, err := bertgraph.AMPPrecision(c.AMP, gpus != "", bertgraph.DetectCPUBF16())
	if err != nil {
		return err
	}
	j.console.infof("precision: %s", why)
	session := j.sessionOptions(gpus)
	j.model, err = bertgraph.Load(c.SavedModel, bertgraph.Options{Session: session, Precision: precision})
	if err != nil {
		return err
	}
	j.inferenceBatches = inferenceBatches(runtime.NumCPU(), int(session.IntraOpThreads), int(session.InterOpThreads), gpus != "")
	ct := j.model.Contract()
	if ct.MaxSeqLength != c.MaxSeqLength {
		return fmt.Errorf("--max_seq_length %d, but --saved_model %s was exported for %d: pass --max_seq_length=%d or export again with --max_seq_length %d",
			c.MaxSeqLength, c.SavedModel, ct.MaxSeqLength, ct.MaxSeqLength, c.MaxSeqLength)
	}
	names := c.Labels
	if names == nil {
		names = ct.LabelNames
	}
	if len(names) != ct.NumLabels {
		return fmt.Errorf("--labels %s names %d labels, but --saved_model %s classifies %d", strings.Join(names, ","), len(names), c.SavedModel, ct.NumLabels)
	}
	labels, err := features.NewLabels(names)
	if err != nil {
		return err
	}
	tok, err := tokenizer.New(in.vocab, tokenizer.Options{DoLowerCase: c.DoLowerCase})
	if err != nil {
		return fmt.Errorf("%s: %w", in.vocabPath, err)
	}
	if j.conv, err = features.NewConverter(tok, c.MaxSeqLength, labels); err != nil {
		return err
	}
	if j.conv, err = j.conv.WithTailTokens(c.KeepTailTokens); err != nil {
		return err
	}
	if j.rank == 0 {
		if j.ckpts, err = checkpoint.Open(in.rankDir, c.KeepCheckpointMax, c.KeepCheckpointEveryNHours); err != nil {
			return err
		}
		j.ckpts.Warnf = j.console.infof
		j.ckpts.Verify = tf.VerifyCheckpoint
		// The state file says whether there are checkpoints to resume or evaluate (which are
		// verified when read).
		_, serr := os.Stat(filepath.Join(in.rankDir, checkpoint.StateFile))
		if err := checkTrainedLabels(in.rankDir, labels.Names(), serr == nil, c.DoTrain); err != nil {
			return err
		}
		// Rank 0 alone reads --init_checkpoint (and broadcasts it): its index is checked against
		// the model now, before any rank spends minutes converting features for a run that
		// would fail, or train from scratch, once it is read.
		if c.InitCheckpoint != "" {
			if _, err := ct.CheckInitCheckpoint(c.InitCheckpoint); err != nil {
				return fmt.Errorf("--init_checkpoint: %w", err)
			}
		}
		j.console.infof("%d rank(s), %s backend; model %s (%d variables, max_seq_length %d, labels %s); TensorFlow %s",
			j.size, j.hvd.Backend(), c.SavedModel, len(ct.Variables), ct.MaxSeqLength, strings.Join(names, ","), tf.Version())
	}
	return nil
}

// sessionOptions is the Horovod recipe's per-rank session: the cores of the machine shared
// among its ranks, the GPU placeGPU chose for the rank (visibleGPUs, "" on CPU; grown as
// needed), soft placement, XLA on request.
func (j *job) sessionOptions(visibleGPUs string) *tf.SessionOptions {
	threads := j.cfg.Threads
	if threads == 0 {
		threads = max(1, runtime.NumCPU()/max(1, j.hvd.LocalSize()))
	}
	o := &tf.SessionOptions{
		IntraOpThreads:     int32(threads),
		InterOpThreads:     int32(j.cfg.InterOpThreads),
		AllowSoftPlacement: true,
		GPU:                tf.GPUOptions{AllowGrowth: true, VisibleDeviceList: visibleGPUs},
	}
	if j.cfg.UseXLA {
		o.GlobalJitLevel = tf.JitOn1
	}
	return o
}

// restoreForInference gives rank 0 the weights to evaluate or predict with when not training:
// the latest checkpoint of --output_dir, else --init_checkpoint, else the SavedModel's own.
func (j *job) restoreForInference() (int64, error) {
	prefix, _, ok, err := j.ckpts.Latest()
	if err != nil {
		return 0, err
	}
	switch {
	case ok:
		if err := j.model.Restore(prefix); err != nil {
			return 0, err
		}
		j.console.infof("evaluating %s", prefix)
	case j.cfg.InitCheckpoint != "":
		report, err := j.model.InitFromCheckpoint(j.cfg.InitCheckpoint)
		if err != nil {
			return 0, err
		}
		j.console.infof("%s", strings.TrimSuffix(report.String(), "\n"))
	default:
		j.console.infof("warning: no checkpoint in %s and no --init_checkpoint: using the weights of %s", j.cfg.OutputDir, j.cfg.SavedModel)
	}
	return j.model.GlobalStep()
}

// console writes rank 0's log and the other ranks' few lines, through the progress bar when
// one is drawn.
type console struct {
	rank int
	bar  *progress.Reporter
}

func newConsole(rank int) *console { return &console{rank: rank} }

func (c *console) write(line string) {
	if c.bar != nil {
		c.bar.Logf("%s", line)
		return
	}
	fmt.Fprintln(os.Stderr, line)
}

// infof logs on rank 0 only.
func (c *console) infof(format string, args ...any) {
	if c.rank == 0 {
		c.write("finetune: " + fmt.Sprintf(format, args...))
	}
}

// rankf logs on every rank, naming it.
func (c *console) rankf(format string, args ...any) {
	c.write(fmt.Sprintf("finetune[rank %d]: ", c.rank) + fmt.Sprintf(format, args...))
}

// logf logs a line of the trainer's: on rank 0 as the run's, elsewhere naming the rank.
func (c *console) logf(format string, args ...any) {
	if c.rank == 0 {
		c.infof(format, args...)
	} else {
		c.rankf(format, args...)
	}
}

// Report and Rate make the console the trainer's Progress, through rank 0's bar.
func (c *console) Report(s trainer.Step) { c.bar.Report(s) }
func (c *console) Rate() float64         { return c.bar.Rate() }

func (c *console) errorf(format string, args ...any) {
	c.write(fmt.Sprintf("finetune[rank %d]: error: ", c.rank) + fmt.Sprintf(format, args...))
}

func isTerminal(f *os.File) (bool, int) {
	fd := int(f.Fd())
	if !term.IsTerminal(fd) {
		return false, 0
	}
	w, _, err := term.GetSize(fd)
	if err != nil {
		w = 80
	}
	return true, w
}
