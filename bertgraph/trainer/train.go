package trainer

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/bertgraph/tfrecord"
	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/tf/summary"
)

// maxConsecutiveSkips ends a run whose gradients stay non-finite: it has diverged, and skipping
// forever would only burn the allocation.
const maxConsecutiveSkips = 100

// Start makes every rank start from the same state (Horovod's broadcast_variables): the latest
// checkpoint of rank 0's directory (model, optimizer slots and global step, on every rank), or
// else the SavedModel's weights with InitCheckpoint applied on rank 0, broadcast from it. It
// returns the global step and the batches of training data drawn before it.
func (t *Trainer) Start() (Position, error) {
	prefix := ""
	if t.rank == 0 {
		p, _, ok, err := t.ckpts.Latest()
		if err != nil {
			return Position{}, err
		}
		if ok {
			prefix = p
		}
	}
	resume, err := shareCheckpoint(t.hvd, prefix, t.opts.Dir, t.opts.BatchSize)
	if err != nil {
		return Position{}, err
	}
	if local := resume.Prefix; local != "" {
		if local != prefix {
			// A received copy, as large as the model and its optimizer slots: restored, it is
			// no longer needed, and after a failed restore the next run receives a new one.
			defer os.RemoveAll(filepath.Dir(local))
		}
		if err := t.model.Restore(local); err != nil {
			return Position{}, err
		}
		got, err := t.model.GlobalStep()
		if err != nil {
			return Position{}, err
		}
		if got != resume.Step {
			return Position{}, fmt.Errorf("checkpoint %s holds global_step %d, its name says %d", local, got, resume.Step)
		}
		t.infof("resuming from %s at step %d", prefix, resume.Step)
		examples := resume.examples(t.opts.BatchSize)
		for _, w := range []string{sizeChangeWarning(prefix, resume.inputPosition, t.size, examples),
			batchChangeWarning(prefix, resume.inputPosition, t.opts.BatchSize, t.opts.AccumulationSteps)} {
			if w != "" {
				t.infof("%s", w)
			}
		}
		return Position{resume.Step, resume.Batches, examples}, nil
	}
	if t.rank == 0 && t.opts.InitCheckpoint != "" {
		report, err := t.model.InitFromCheckpoint(t.opts.InitCheckpoint)
		if err != nil {
			return Position{}, err
		}
		t.infof("%s", report.String())
	}
	values := t.model.NewFlatTensors()
	if err := t.model.ReadVariables(values); err != nil {
		return Position{}, err
	}
	if err := t.hvd.BroadcastVariables(t.named(values), 0); err != nil {
		return Position{}, err
	}
	if t.rank != 0 {
		if err := t.model.AssignVariables(values); err != nil {
			return Position{}, err
		}
	}
	// A fresh start: a step's batches for whatever steps the SavedModel already holds.
	step, err := t.model.GlobalStep()
	batches := step * int64(t.opts.AccumulationSteps)
	return Position{step, batches, batches * int64(t.opts.BatchSize)}, err
}

// named views each variable's part of f as a horovod tensor named after the variable.
func (t *Trainer) named(f *bertgraph.FlatTensors) []horovod.NamedTensor {
	vars := t.model.Variables()
	out := make([]horovod.NamedTensor, len(vars))
	for i, v := range vars {
		shape := make([]int, len(v.Shape))
		for k, d := range v.Shape {
			shape[k] = int(d)
		}
		tensor, _ := horovod.NewTensor(shape, f.Parts[i])
		out[i] = horovod.NamedTensor{Name: v.Name, Tensor: tensor}
	}
	return out
}

// Train trains from the position Start returned until the schedule's last step or an agreed stop
// request: every step draws AccumulationSteps batches of data (this rank's examples), computes
// and sums their gradients, combines them over the ranks (Op) and applies the result; rank 0 reports the step, writes its summaries and
// saves the checkpoints, the last one after the last step. A resumed run first skips the batches
// drawn before the checkpoint, so it trains on the examples an uninterrupted run would. The
// schedule counts epochs over data, so data must repeat (tfrecord.DatasetOptions.Repeat): data
// that ends first is an error naming the step.
func (t *Trainer) Train(data *tfrecord.Dataset, from Position) (Result, error) {
	if from.Step >= t.opts.Schedule.TrainSteps {
		return Result{Step: from.Step}, nil
	}
	drawn := inputPosition{Batches: from.Batches, Examples: from.Examples}
	if drawn.Examples == 0 {
		drawn.Examples = from.Batches * int64(t.opts.BatchSize)
	}
	if err := data.Skip(drawn.Examples); err != nil {
		return Result{Step: from.Step}, t.dataEnded(err, from.Step)
	}
	res, err := t.loop(data, from.Step, drawn)
	return res, t.dataEnded(err, res.Step)
}

// dataEnded explains an io.EOF from the training data at step; other errors pass unchanged.
func (t *Trainer) dataEnded(err error, step int64) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	return fmt.Errorf("trainer: the training data ended at step %d of %d on rank %d: the schedule counts epochs "+
		"over it, so open it with tfrecord.DatasetOptions.Repeat: %w", step, t.opts.Schedule.TrainSteps, t.rank, err)
}

// loop is the training loop of one rank: train step, fused allreduce of the gradients, apply,
// and on rank 0 the progress, the summaries and the checkpoints.
func (t *Trainer) loop(data *tfrecord.Dataset, step int64, drawn inputPosition) (Result, error) {
	var lossScale float32 // after the last step trained
	o := &t.opts
	// In place: the sums overwrite the gradients in their one contiguous buffer, which the
	// backend reduces with a single call and Apply then reads; no copy of 90 MB per step. The
	// 1/size of the average is left to Apply (DeferAverage), which folds it into the multiply
	// clipping does anyway: no pass over the 90 MB for it either. Adasum has no division to
	// defer (its GradientScale is 1).
	adasum := o.Op == horovod.Adasum
	reducer, err := t.hvd.NewReducer(horovod.ReducerOptions{Op: o.Op, Compression: o.Compression, InPlace: true, DeferAverage: !adasum})
	if err != nil {
		return Result{Step: step, LossScale: lossScale}, err
	}
	grads, freeGrads, err := t.gradientBuffer()
	if err != nil {
		return Result{Step: step, LossScale: lossScale}, err
	}
	// Given back as the loop ends, before Shutdown frees the backend's memory; nothing reads
	// the gradients after the loop. A failure to give it back is only logged: training and its
	// checkpoint are done, and Shutdown frees the memory anyway.
	defer func() {
		if ferr := freeGrads(); ferr != nil {
			o.Logf("warning: giving back the gradients' memory: %v", ferr)
		}
	}()
	named := t.named(grads)
	// With more than one rank, the word embeddings' gradient travels as the looked-up rows
	// (lookedUpRows), the rest in the fused allreduce: with the embeddings first, as BERT's
	// variables are, the rest still lies back to back and is reduced in place in one call.
	var rows *lookedUpRows
	emb, lookedUp := t.model.LookedUpRows()
	var updates *adasumUpdates
	switch {
	case o.AdasumUpdates:
		updates = &adasumUpdates{model: t.model, before: t.model.NewFlatTensors()}
		t.infof("Adasum combines the ranks' weight updates: each rank steps AdamWeightDecay on its own gradients, with its own slots")
		if o.Compression == horovod.FP16Compression {
			// A step's change is about the learning rate, 1e-5 to 1e-4: below 6.1e-5 float16
			// is subnormal, its spacing 2^-24, so 1e-5 keeps about 7 significant bits of 11.
			t.infof("warning: fp16 compression rounds weight updates of 1e-5 to about 7 significant bits (float16 subnormals); bf16 keeps 8 at any size")
		}
	case adasum && t.size > 1:
		t.infof("Adasum combines the gradients, the word embeddings' dense with the others")
	}
	if lookedUp && !o.SparseAsDense && !adasum && t.size > 1 {
		shape := t.model.Variables()[emb].Shape
		rows = newLookedUpRows(int(shape[0]), int(shape[1]))
		named = append(named[:emb:emb], named[emb+1:]...)
		t.infof("the word embeddings' gradient (%.1f MB) travels as the rows each step's batches look up (allgather), the other %d gradients in the allreduce",
			float64(4*len(grads.Parts[emb]))/1e6, len(named))
	}

	// With accumulation, a step's first batch computes its gradients into grads, each later one
	// into micro, added into grads; the looked-up rows are those of all the step's batches.
	accumulation := o.AccumulationSteps
	var micro *bertgraph.FlatTensors
	var stepIDs []int32
	if accumulation > 1 {
		micro = t.model.NewFlatTensors()
	}

	var curves *summaries
	if t.rank == 0 {
		ev, err := summary.Create(o.Dir)
		if err != nil {
			return Result{Step: step, LossScale: lossScale}, err
		}
		curves = newSummaries(ev, o.Logf)
		defer curves.close()
		curves.start(step + 1)
	}
	// Beside the gradients, every step agrees on two small tensors: the step's statistics, summed
	// over the ranks, and the stop request, the largest signal number any rank received.
	// The statistics: this rank's loss, correct predictions and examples, and 1 when its own
	// step would be skipped (AdasumUpdates: gradients not finite).
	localStats := make([]float64, 4)
	localStop := make([]int32, 1) // the signal this rank received, 0 for none
	localStatsTensor, _ := horovod.NewTensor(nil, localStats)
	localStopTensor, _ := horovod.NewTensor(nil, localStop)
	var skipped, consecutive int64
	var stopped os.Signal
	// float16 compute scales its loss dynamically: the scale is logged with a skipped step and
	// written to TensorBoard beside the loss.
	float16 := t.model.Precision() == bertgraph.Float16
	globalBatch := o.BatchSize * accumulation * t.size
	batch := features.NewBatch(o.BatchSize, t.model.Contract().MaxSeqLength) // refilled every step
	var phases Phases
	pastFirst := false // the first step's phases are dropped as the second begins
	clock := newPhaseClock()
	// Whether this rank has tried o.Timeline's start (once: a failure warns once), whether it
	// records, and from which step.
	timelineTried, timeline, timelineFrom := false, false, int64(0)
	for step < o.Schedule.TrainSteps && stopped == nil {
		if !pastFirst && phases.Steps == 1 {
			phases, pastFirst = Phases{}, true
		}
		if tw := o.Timeline; tw.Path != "" && !timelineTried && step+1 >= tw.First && step+1 <= tw.Last {
			timelineTried = true
			timeline, timelineFrom = t.startTimeline(), step+1
		}
		clear(localStats)
		stepIDs = stepIDs[:0]
		for k := range accumulation {
			if err := data.ReadBatch(batch, true); err != nil {
				return Result{Step: step, LossScale: lossScale}, err
			}
			drawn.Batches++
			drawn.Examples += int64(o.BatchSize)
			clock.lap(&phases.Other)
			// Each batch its own dropout: (seed + rank, step) without accumulation, as before it.
			seed := bertgraph.DropoutSeed{o.Seed + int64(t.rank), step*int64(accumulation) + int64(k)}
			into := grads
			if k > 0 {
				into = micro
			}
			st, err := t.model.TrainStep(batch, seed, into)
			if err != nil {
				return Result{Step: step, LossScale: lossScale}, err
			}
			if k > 0 {
				addInto(grads.Data, micro.Data)
			}
			if rows != nil && accumulation > 1 {
				stepIDs = append(stepIDs, batch.InputIDs...)
			}
			clock.lap(&phases.TrainStep)
			localStats[0] += float64(st.Loss) / float64(accumulation) // the mean over the step's batches
			localStats[1] += float64(st.Correct)
			localStats[2] += float64(st.Examples)
		}
		localStop[0] = 0
		if o.Stop != nil {
			if sig, ok := o.Stop().(syscall.Signal); ok { // SIGINT, SIGTERM: numbers every rank reads alike
				localStop[0] = int32(sig)
			}
		}
		// The mean over the step's batches: the accumulated sum over accumulation.
		scale := float32(reducer.GradientScale() / float64(accumulation))
		if updates != nil && updates.skips(grads.Data, scale) {
			localStats[3] = 1
		}
		// The statistics travel beside the gradients: submitted first, they negotiate in the
		// same cycle as the reducer's tensors.
		statsPending, err := t.hvd.AllreduceAsync("trainer/step_stats", localStatsTensor, horovod.AllreduceOptions{Op: horovod.Sum})
		if err != nil {
			return Result{Step: step, LossScale: lossScale}, err
		}
		stopPending, err := t.hvd.AllreduceAsync("trainer/stop", localStopTensor, horovod.AllreduceOptions{Op: horovod.Max})
		if err != nil {
			return Result{Step: step, LossScale: lossScale}, err
		}
		lr := o.Schedule.LearningRate(step)
		var totalStats, agreedStop horovod.Tensor
		var res bertgraph.ApplyResult
		if updates != nil {
			// The ranks agree on skipping before any of them steps.
			if totalStats, err = statsPending.Wait(); err != nil {
				return Result{Step: step, LossScale: lossScale}, err
			}
			if agreedStop, err = stopPending.Wait(); err != nil {
				return Result{Step: step, LossScale: lossScale}, err
			}
			clock.lap(&phases.Allreduce)
			res = bertgraph.ApplyResult{GlobalStep: step, GlobalNorm: float32(math.NaN()), LossScale: 1}
			if totals, _ := horovod.Values[float64](totalStats); totals[3] == 0 {
				if res, err = updates.step(grads, named, reducer, scale, float32(lr), float32(o.ClipNorm), t.rank, &phases, clock); err != nil {
					return Result{Step: step, LossScale: lossScale}, err
				}
			}
		} else {
			var rowIndices, rowValues *horovod.Handle
			if rows != nil {
				ids := batch.InputIDs
				if accumulation > 1 {
					ids = stepIDs
				}
				if err := rows.collect(ids, grads.Parts[emb]); err != nil {
					return Result{Step: step, LossScale: lossScale}, err
				}
				indices, values := rows.tensors()
				if rowIndices, err = t.hvd.AllgatherAsync("trainer/word_embeddings/indices", indices); err != nil {
					return Result{Step: step, LossScale: lossScale}, err
				}
				if rowValues, err = t.hvd.AllgatherAsync("trainer/word_embeddings/rows", values); err != nil {
					return Result{Step: step, LossScale: lossScale}, err
				}
			}
			if _, _, err := reducer.Reduce(named); err != nil {
				return Result{Step: step, LossScale: lossScale}, err
			}
			if rows != nil {
				// The Reducer's results times its GradientScale are the average: the rows' sum
				// times 1/(size x GradientScale) is what the Reducer would have returned for them.
				rowScale := float32(1 / (float64(t.size) * reducer.GradientScale()))
				if err := t.sumRows(rows, grads.Parts[emb], rowIndices, rowValues, rowScale); err != nil {
					return Result{Step: step, LossScale: lossScale}, err
				}
			}
			totalStats, err = statsPending.Wait()
			if err != nil {
				return Result{Step: step, LossScale: lossScale}, err
			}
			agreedStop, err = stopPending.Wait()
			if err != nil {
				return Result{Step: step, LossScale: lossScale}, err
			}
			clock.lap(&phases.Allreduce)
			if res, err = t.model.Apply(grads, scale, float32(lr), float32(o.ClipNorm)); err != nil {
				return Result{Step: step, LossScale: lossScale}, err
			}
		}
		clock.lap(&phases.Apply)
		if phases.Steps == 0 && !pastFirst { // said once, for the first step
			if res.CopiedBytes == 0 {
				t.infof("apply_gradients reads the gradients where they lie (%.1f MB, no copy)", float64(4*len(grads.Data))/1e6)
			} else {
				t.infof("apply_gradients copies %.1f of the gradients' %.1f MB: parts not aligned for TensorFlow",
					float64(res.CopiedBytes)/1e6, float64(4*len(grads.Data))/1e6)
			}
		}
		phases.Steps++
		lossScale = res.LossScale
		if !res.Applied {
			skipped++
			consecutive++
			note := ""
			if float16 {
				note = fmt.Sprintf(", loss scale now %v", lossScale)
			}
			// Named by the step it would have made: the global step stays where it was.
			t.infof("update to step %d skipped on every rank: gradients not finite (global norm %v), the global step stays at %d (%d skipped so far)%s",
				step+1, res.GlobalNorm, step, skipped, note)
			if consecutive >= maxConsecutiveSkips {
				return Result{Step: step, LossScale: lossScale}, fmt.Errorf("the gradients were not finite for %d steps in a row at step %d: training diverged", consecutive, step)
			}
		} else {
			consecutive = 0
		}
		step = res.GlobalStep
		stopped = signalOf(agreedStop)
		if timeline && step >= o.Timeline.Last {
			t.stopTimeline(timelineFrom, step)
			timeline = false
		}
		if t.rank != 0 {
			clock.lap(&phases.Other)
			continue
		}
		totals, _ := horovod.Values[float64](totalStats)
		report := Step{Step: step, Loss: totals[0] / float64(t.size), LR: lr, GlobalNorm: float64(res.GlobalNorm),
			Accuracy: totals[1] / max(1, totals[2]), Examples: globalBatch, Skipped: skipped}
		rate := math.NaN()
		if o.Progress != nil {
			o.Progress.Report(report)
			rate = o.Progress.Rate()
		}
		if float16 {
			curves.also("loss_scale", float64(lossScale))
		}
		// One point a step, as Estimator writes them: a skipped update leaves the step where it
		// was, and the next step that applies writes it (with the loss scale it halved to).
		if res.Applied {
			curves.write(step, report.Loss, lr, report.GlobalNorm, rate, report.Accuracy)
		}
		if res.Applied && o.SaveCheckpointsSteps > 0 && step%int64(o.SaveCheckpointsSteps) == 0 {
			if err := t.saveCheckpoint(step, drawn); err != nil {
				return Result{Step: step, LossScale: lossScale}, err
			}
		}
		clock.lap(&phases.Other)
	}
	if timeline {
		t.stopTimeline(timelineFrom, step)
	}
	if !pastFirst { // no step after the first
		phases = Phases{}
	}
	if t.rank == 0 {
		if err := t.saveCheckpoint(step, drawn); err != nil {
			return Result{Step: step, LossScale: lossScale}, err
		}
		curves.close()
	}
	if stopped != nil {
		// No rank leaves before rank 0's checkpoint is complete.
		if err := t.hvd.Barrier(); err != nil {
			return Result{Step: step, LossScale: lossScale}, err
		}
	}
	return Result{Step: step, Stopped: stopped, LossScale: lossScale, Phases: phases}, nil
}

// startTimeline starts Options.Timeline's timeline (a file on rank 0 alone) and reports whether
// it did; a failure warns, and training goes on without it.
func (t *Trainer) startTimeline() bool {
	tw := t.opts.Timeline
	if err := t.hvd.StartTimeline(tw.Path); err != nil {
		t.opts.Logf("warning: the timeline of steps %d to %d was not started: %v (training goes on)", tw.First, tw.Last, err)
		return false
	}
	return true
}

// stopTimeline completes Options.Timeline's timeline, begun at step from, after step to; a
// failure warns.
func (t *Trainer) stopTimeline(from, to int64) {
	tw := t.opts.Timeline
	if err := t.hvd.StopTimeline(); err != nil {
		t.opts.Logf("warning: the timeline of steps %d to %d is incomplete: %v (training goes on)", tw.First, tw.Last, err)
	} else {
		t.infof("wrote the timeline of steps %d to %d to %s", from, to, tw.Path)
	}
}

// sumRows waits for the allgathers of the looked-up rows, adds them into grad times scale and
// gives their memory back to horovod, which hands it out again as the next step's: a new
// result every step would be fresh memory every step, whose page faults cost more than the
// allgather itself (2 MB a step: 7-10 ms on the 2-core VM once nothing else kept the Go heap
// large).
func (t *Trainer) sumRows(rows *lookedUpRows, grad []float32, indices, values *horovod.Handle, scale float32) error {
	gatheredIndices, err := indices.Wait()
	if err != nil {
		return err
	}
	gatheredValues, err := values.Wait()
	if err != nil {
		return err
	}
	if err := rows.sum(grad, gatheredIndices, gatheredValues, scale); err != nil {
		return err
	}
	return t.hvd.Release(gatheredIndices, gatheredValues)
}

// phaseClock charges the time since its last lap to one phase.
type phaseClock struct{ last time.Time }

func newPhaseClock() *phaseClock { return &phaseClock{last: time.Now()} }

func (c *phaseClock) lap(phase *time.Duration) {
	now := time.Now()
	*phase += now.Sub(c.last)
	c.last = now
}

// saveCheckpoint saves the model and optimizer state of global step step, with the batches and
// examples drawn so far (see positionSuffix).
func (t *Trainer) saveCheckpoint(step int64, drawn inputPosition) error {
	drawn.BatchSize, drawn.AccumulationSteps, drawn.Ranks = t.opts.BatchSize, t.opts.AccumulationSteps, t.size
	if t.ckpts.IsLatest(step) { // the final save coincides with a periodic one or the resumed one
		return t.updatePosition(drawn)
	}
	p, err := t.ckpts.Save(step, withInputPosition(func(prefix string) error {
		_, err := t.model.Save(prefix)
		return err
	}, drawn))
	if err == nil {
		t.infof("saved checkpoint %s", p)
	}
	return err
}

// signalOf reads the agreed stop request: a signal number, 0 for none.
func signalOf(agreed horovod.Tensor) os.Signal {
	v, err := horovod.Values[int32](agreed)
	if err != nil || len(v) != 1 || v[0] == 0 {
		return nil
	}
	return syscall.Signal(v[0])
}

// scalarWriter is what the training loop needs of an events file (*summary.Writer).
type scalarWriter interface {
	SessionStart(step int64) error
	Scalars(step int64, values map[string]float64) error
	Close() error
	Path() string
}

// summaries writes rank 0's training curves to the events file. The curves serve TensorBoard;
// the checkpoints are what a run produces. So a failure to write or complete the file does not
// stop training: it is logged as a warning naming the file, once, and the summaries end there.
type summaries struct {
	w      scalarWriter // nil once closed or failed
	values map[string]float64
	warnf  func(format string, args ...any)
}

func newSummaries(w scalarWriter, warnf func(format string, args ...any)) *summaries {
	return &summaries{w: w, values: make(map[string]float64, 5), warnf: warnf}
}

// start marks the run's first step (SessionStart): TensorBoard then drops the points a killed
// earlier run wrote from that step on, which this run trains again.
func (s *summaries) start(step int64) {
	if s.w == nil {
		return
	}
	if err := s.w.SessionStart(step); err != nil {
		s.fail(fmt.Sprintf("from step %d on", step), err)
	}
}

// write records one step's scalars, through one map reused every step.
func (s *summaries) write(step int64, loss, lr, globalNorm, examplesPerSec, accuracy float64) {
	if s.w == nil {
		return
	}
	s.values["loss"], s.values["learning_rate"], s.values["global_norm"] = loss, lr, globalNorm
	s.values["examples_per_sec"], s.values["train_accuracy"] = examplesPerSec, accuracy
	if math.IsNaN(examplesPerSec) { // no Progress measured it
		delete(s.values, "examples_per_sec")
	}
	if err := s.w.Scalars(step, s.values); err != nil {
		s.fail(fmt.Sprintf("from step %d on", step), err)
	}
}

// also adds a scalar to the next write's (and every later one's).
func (s *summaries) also(tag string, v float64) { s.values[tag] = v }

// close completes the file: flushed, synced and closed. Later calls do nothing.
func (s *summaries) close() {
	if s.w == nil {
		return
	}
	if err := s.w.Close(); err != nil {
		s.warnf("warning: the TensorBoard events file %s could not be completed, its last steps may be missing: %v", s.w.Path(), err)
	}
	s.w = nil
}

func (s *summaries) fail(what string, err error) {
	s.warnf("warning: the TensorBoard events file %s lacks the summaries %s: %v (training goes on; its checkpoints are unaffected)", s.w.Path(), what, err)
	s.w.Close()
	s.w = nil
}

// addInto adds src into dst, element by element: one pass over the gradients per accumulated
// batch.
func addInto(dst, src []float32) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] += v
	}
}
