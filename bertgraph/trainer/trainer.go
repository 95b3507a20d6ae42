package trainer

import (
	"errors"
	"fmt"
	"log"
	"math"
	"os"
	"time"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/bertgraph/schedule"
	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/tf/checkpoint"
)

// Options configure a Trainer. Dir, Schedule, BatchSize and ClipNorm are required; the rest has
// defaults.
type Options struct {
	// Dir is the rank's output directory, made if missing: on rank 0 the checkpoints and the
	// TensorBoard events file, on the others the copy of the checkpoint rank 0 resumes from (under
	// Dir/resume).
	Dir string
	// Checkpoints manages rank 0's checkpoints; nil opens one on Dir keeping the 5 newest
	// (tf.estimator's default). Other ranks ignore it.
	Checkpoints *checkpoint.Manager
	// SaveCheckpointsSteps saves a checkpoint every that many steps; 0 saves only the last.
	SaveCheckpointsSteps int
	// InitCheckpoint is a Google BERT checkpoint that rank 0 applies to the SavedModel's weights
	// when Dir holds no checkpoint to resume from ("": the SavedModel's own weights).
	InitCheckpoint string

	// Schedule is the run's length and learning rate (schedule.New).
	Schedule schedule.Schedule
	// BatchSize is the number of examples each rank computes the gradients of at once: a step
	// trains on AccumulationSteps such batches per rank.
	BatchSize int
	// AccumulationSteps is the number of batches whose gradients each rank sums before the ranks
	// combine them and apply one update (NVIDIA BERT's num_accumulation_steps, Horovod's
	// backward_passes_per_step): a step's global batch is BatchSize x AccumulationSteps x ranks,
	// and the update applies the mean gradient over all of them, as one batch that large would.
	// 0 is 1. The Schedule counts steps of that global batch (schedule.New with batchPerRank
	// BatchSize x AccumulationSteps).
	AccumulationSteps int
	// Seed seeds the dropout of every batch: rank r's batch k of step s uses
	// (Seed + r, s x AccumulationSteps + k), (Seed + r, s) without accumulation.
	Seed int64
	// ClipNorm is the global norm the averaged gradients are clipped to (BERT's is 1).
	ClipNorm float64
	// Compression is how the gradients cross the wire in the allreduce (float32, or compressed
	// to float16 or bfloat16).
	Compression horovod.Compression
	// SparseAsDense allreduces the word embeddings' gradient dense with the others (Horovod's
	// sparse_as_dense=True) instead of allgathering the rows the step's batches looked up.
	SparseAsDense bool
	// Op is how the ranks combine their gradients: horovod.Average (the zero value), or
	// horovod.Adasum (Horovod's DistributedGradientTape(op=hvd.Adasum)), which applies the
	// adaptive sum of the ranks' gradients, tensor by tensor, where Average applies their mean.
	// Adasum implies SparseAsDense (the rows of the ranks' batches have no Adasum: Horovod
	// refuses sparse gradients with it) and leaves the learning rate to the Schedule: Horovod's
	// examples do not scale it by the number of ranks for Adasum on CPUs.
	Op horovod.ReduceOp
	// AdasumUpdates, with Op Adasum, combines the ranks' weight updates instead of their
	// gradients: every rank takes an AdamWeightDecay step of its own (its own gradients clipped,
	// its own slots), and the weights become those before it plus the Adasum of the ranks'
	// changes, as Horovod's DistributedOptimizer(op=hvd.Adasum) does with a TensorFlow 1
	// optimizer. The ranks agree on skipping a step before any takes it; rank 0's slots are the
	// ones checkpointed (and broadcast on resume), and Step.GlobalNorm is the norm of rank 0's
	// own gradients. Each step reads the weights twice and assigns them once. Not with float16
	// compute (its loss scale is Apply's to keep).
	AdasumUpdates bool

	// Timeline, when its Path is set, writes Horovod's timeline of a range of steps only.
	Timeline TimelineSteps

	// Stop, when set, is asked at every step whether this rank was asked to stop (a signal; nil
	// for no). The ranks agree on the request beside the step's gradients, so all of them stop
	// after the same step, rank 0 with a checkpoint of it.
	Stop func() os.Signal
	// Progress, on rank 0, is told of every step; nil tells nothing.
	Progress Progress
	// Logf receives the run's log lines: the resume point, the checkpoints saved, skipped
	// updates on rank 0, and a rank's own warnings on that rank. nil: log.Printf.
	Logf func(format string, args ...any)
}

// TimelineSteps is a range of training steps whose Horovod timeline rank 0 writes to Path, as
// Keras's TensorBoard(profile_batch=(first, last)) profiles a range of batches: the timeline
// starts as step First begins and stops as step Last ends, or as training does (steps numbered
// as Step.Step, the global step after the update; a run resumed past First starts it at its
// first step). A timeline that cannot be started or completed is a warning: training goes on.
type TimelineSteps struct {
	Path        string
	First, Last int64
}

// Progress follows rank 0's training (a progress bar, a log line every n steps).
type Progress interface {
	// Report receives each step rank 0 trains, as it ends; a skipped update too, its Step
	// the global step it left unchanged.
	Report(Step)
	// Rate is the smoothed number of examples per second, all ranks together, which the
	// summaries record as examples_per_sec.
	Rate() float64
}

// Step is what one training step reports on rank 0.
type Step struct {
	Step       int64   // global step after the update
	Loss       float64 // mean training loss of the step over all ranks
	LR         float64 // learning rate applied by the step
	GlobalNorm float64 // global norm of the averaged gradients, before clipping
	Accuracy   float64 // training accuracy of the step over all ranks
	Examples   int     // examples trained on by the step, all ranks and accumulated batches together
	Skipped    int64   // updates skipped so far for non-finite gradients
}

// Position is where a run starts: the global step the weights hold, the batches of training
// data each rank drew before it (AccumulationSteps per step, more when updates were skipped) and
// the examples in them (Batches times the batch size of the runs that drew them; 0 for Batches
// times this run's).
type Position struct {
	Step, Batches, Examples int64
}

// Result is how a Train call ended.
type Result struct {
	// Step is the global step reached, whose checkpoint rank 0 saved.
	Step int64
	// Stopped is the signal whose stop request the ranks agreed on, nil when none came. It
	// ended the run before the schedule's last step, or came during that step: the run then
	// completed, and the caller is still asked to stop (finetune ends there, with the last
	// checkpoint written and without evaluating, as a run stopped earlier does).
	Stopped os.Signal
	// LossScale is the loss scale after the last step trained: 1 unless the model computes in
	// float16 (bertgraph.Float16), whose dynamic scale halves on every skipped step; 0 when no
	// step was trained.
	LossScale float32
	// Phases is where this rank's steps after the first spent their time.
	Phases Phases
}

// Phases is where a rank's training steps spent their time, the first step of a run left out (it
// pays for graph optimisation and first allocations): what a slow step waits for, and what a
// faster train step leaves to the rest.
type Phases struct {
	Steps int64 // steps measured
	// TrainStep is train_step: the forward and backward pass, the gradients copied out.
	TrainStep time.Duration
	// Allreduce is the gradients' allreduce and the step's agreement on its statistics and on
	// stopping, waiting for the slowest rank included.
	Allreduce time.Duration
	// Apply is apply_gradients: the gradients copied in, clipping, AdamWeightDecay.
	Apply time.Duration
	// Other is the rest of the loop: reading the batch, reports, summaries and the periodic
	// checkpoints (not the final one).
	Other time.Duration
}

// PerStep is the mean of each phase over the steps measured (zero when none were).
func (p Phases) PerStep() Phases {
	if p.Steps == 0 {
		return Phases{}
	}
	n := time.Duration(p.Steps)
	return Phases{Steps: 1, TrainStep: p.TrainStep / n, Allreduce: p.Allreduce / n, Apply: p.Apply / n, Other: p.Other / n}
}

// Trainer trains one rank's copy of a SavedModel data-parallel with its peers, as Horovod's
// DistributedOptimizer does: every rank computes the gradients of its own batch, the ranks sum
// them with a fused allreduce, and every rank applies the same averaged update. Every rank calls
// Start, then Train, in the same order.
type Trainer struct {
	hvd        *horovod.Horovod
	model      *bertgraph.Model
	opts       Options
	rank, size int
	ckpts      *checkpoint.Manager // rank 0's; nil on the others
}

// New returns the trainer of model on this rank of hvd.
func New(hvd *horovod.Horovod, model *bertgraph.Model, opts Options) (*Trainer, error) {
	switch {
	case hvd == nil || model == nil:
		return nil, errors.New("trainer: no horovod or no model")
	case opts.Dir == "":
		return nil, errors.New("trainer: no output directory (Options.Dir)")
	case opts.BatchSize <= 0:
		return nil, fmt.Errorf("trainer: batch size %d per rank, want at least 1", opts.BatchSize)
	case opts.AccumulationSteps < 0:
		return nil, fmt.Errorf("trainer: %d accumulation steps, want at least 1 (Options.AccumulationSteps)", opts.AccumulationSteps)
	case opts.Schedule.TrainSteps <= 0:
		return nil, errors.New("trainer: no schedule (Options.Schedule, from schedule.New)")
	case opts.Op != horovod.Average && opts.Op != horovod.Adasum:
		return nil, fmt.Errorf("trainer: gradients combined by %v, want Average or Adasum (Options.Op)", opts.Op)
	case opts.AdasumUpdates && opts.Op != horovod.Adasum:
		return nil, errors.New("trainer: AdasumUpdates needs Op Adasum")
	case opts.AdasumUpdates && model.Precision() == bertgraph.Float16:
		return nil, errors.New("trainer: AdasumUpdates with float16 compute is not built (its dynamic loss scale needs every rank's Apply to see the skipped steps)")
	case opts.Timeline.Path != "" && !(1 <= opts.Timeline.First && opts.Timeline.First <= opts.Timeline.Last):
		return nil, fmt.Errorf("trainer: timeline of steps %d to %d, want 1 <= first <= last (Options.Timeline)", opts.Timeline.First, opts.Timeline.Last)
	case !(opts.ClipNorm > 0) || opts.ClipNorm > math.MaxFloat32:
		// Checked here, not at the first step's Apply: after Start's broadcast, on every rank alike.
		return nil, fmt.Errorf("trainer: clip norm %v, want a positive float32 (Options.ClipNorm; BERT's is 1)", opts.ClipNorm)
	}
	if opts.Logf == nil {
		opts.Logf = log.Printf
	}
	opts.AccumulationSteps = max(1, opts.AccumulationSteps)
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	t := &Trainer{hvd: hvd, model: model, opts: opts, rank: hvd.Rank(), size: hvd.Size()}
	if t.rank == 0 {
		t.ckpts = opts.Checkpoints
		if t.ckpts == nil {
			var err error
			if t.ckpts, err = checkpoint.Open(opts.Dir, 5, 0); err != nil {
				return nil, err
			}
			t.ckpts.Warnf = opts.Logf
		}
	}
	return t, nil
}

// infof logs a line of the run, on rank 0 only.
func (t *Trainer) infof(format string, args ...any) {
	if t.rank == 0 {
		t.opts.Logf(format, args...)
	}
}
