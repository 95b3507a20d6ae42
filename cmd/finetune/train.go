package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/bertgraph/tfrecord"
	"github.com/gorovod/gorovod/cmd/finetune/internal/events"
	"github.com/gorovod/gorovod/cmd/finetune/internal/progress"
	"github.com/gorovod/gorovod/cmd/finetune/internal/schedule"
	"github.com/gorovod/gorovod/horovod"
)

// maxConsecutiveSkips ends a run whose gradients stay non-finite: it has diverged, and skipping
// forever would only burn the allocation.
const maxConsecutiveSkips = 100

// train runs the training phase and returns the global step reached.
func (j *job) train() (int64, error) {
	c := &j.cfg
	path, cache, reused, err := trainFeatures(c, j.in, j.conv, j.rank, j.size, j.stop)
	var intr errInterrupted
	if err != nil && !errors.As(err, &intr) {
		return 0, err
	}
	if err == nil {
		how := "converted"
		if reused {
			how = "reused"
		}
		j.console.rankf("%d training examples (%s %s), %d bad lines skipped", cache.Examples, how, path, cache.Skipped)
	}
	// A signal that arrived before training, on any rank, stops every rank here.
	var sig int64
	if s := j.stop.requested(); s != nil {
		sig = int64(signalNumber(s))
	}
	perRank, err := j.gatherInt64("finetune/train_examples", int64(cache.Examples), int64(cache.Skipped), sig)
	if err != nil {
		return 0, err
	}
	for _, row := range perRank {
		if row[2] != 0 {
			return 0, errInterrupted{syscall.Signal(row[2]), "before training"}
		}
	}
	examples, skipped, err := j.checkShards(perRank)
	if err != nil {
		return 0, err
	}
	sched, err := schedule.New(int(examples), c.TrainBatchSize, c.NumTrainEpochs, c.WarmupProportion, c.LearningRate, j.size)
	if err != nil {
		return 0, err
	}
	j.console.infof("***** Running training *****  examples = %d (%d skipped), batch = %d per rank x %d ranks, steps = %d, warmup = %d, peak learning rate = %g",
		examples, skipped, c.TrainBatchSize, j.size, sched.TrainSteps, sched.WarmupSteps, sched.PeakLR)

	start, drawn, err := j.initialWeights()
	if err != nil {
		return 0, err
	}
	if start >= sched.TrainSteps {
		j.console.infof("%s already holds step %d of %d: nothing to train", c.OutputDir, start, sched.TrainSteps)
		return start, nil
	}
	ds, err := tfrecord.OpenDataset([]string{path}, tfrecord.DatasetOptions{
		ShuffleBuffer: c.ShuffleBuffer, Seed: uint64(c.Seed)*1_000_003 + uint64(j.rank), Repeat: true})
	if err != nil {
		return 0, err
	}
	defer ds.Close()
	// A resumed run continues the same example sequence where the interrupted one stopped.
	if err := skipBatches(ds, drawn, c.TrainBatchSize); err != nil {
		return 0, err
	}
	return j.loop(ds, sched, start, drawn)
}

// initialWeights makes every rank start from the same state: the latest checkpoint of rank 0's
// output directory (model, optimizer slots and global step, on every rank), or else the
// SavedModel's weights with --init_checkpoint applied on rank 0, broadcast from it. It returns
// the global step and the batches of training data drawn before it.
func (j *job) initialWeights() (step, drawn int64, err error) {
	prefix := ""
	if j.rank == 0 {
		p, _, ok, err := j.ckpts.Latest()
		if err != nil {
			return 0, 0, err
		}
		if ok {
			prefix = p
		}
	}
	resume, err := shareCheckpoint(j.hvd, prefix, j.in.rankDir)
	if err != nil {
		return 0, 0, err
	}
	if local := resume.Prefix; local != "" {
		if err := j.model.Restore(local); err != nil {
			return 0, 0, err
		}
		got, err := j.model.GlobalStep()
		if err != nil {
			return 0, 0, err
		}
		if got != resume.Step {
			return 0, 0, fmt.Errorf("checkpoint %s holds global_step %d, its name says %d", local, got, resume.Step)
		}
		j.console.infof("resuming from %s at step %d", prefix, resume.Step)
		if w := sizeChangeWarning(prefix, resume.inputPosition, j.size); w != "" {
			j.console.infof("%s", w)
		}
		if local != prefix { // a received copy: restored, no longer needed
			os.RemoveAll(filepath.Dir(local))
		}
		return resume.Step, resume.Batches, nil
	}
	if j.rank == 0 && j.cfg.InitCheckpoint != "" {
		report, err := j.model.InitFromCheckpoint(j.cfg.InitCheckpoint)
		if err != nil {
			return 0, 0, err
		}
		j.console.infof("%s", report.String())
	}
	values := j.model.NewFlatTensors()
	if err := j.model.ReadVariables(values); err != nil {
		return 0, 0, err
	}
	if err := j.hvd.BroadcastVariables(j.named(values), 0); err != nil {
		return 0, 0, err
	}
	if j.rank != 0 {
		if err := j.model.AssignVariables(values); err != nil {
			return 0, 0, err
		}
	}
	// A fresh start: one batch per step for whatever steps the SavedModel already holds.
	step, err = j.model.GlobalStep()
	return step, step, err
}

// named views each variable's part of f as a horovod tensor named after the variable.
func (j *job) named(f *bertgraph.FlatTensors) []horovod.NamedTensor {
	vars := j.model.Variables()
	out := make([]horovod.NamedTensor, len(vars))
	for i, v := range vars {
		shape := make([]int, len(v.Shape))
		for k, d := range v.Shape {
			shape[k] = int(d)
		}
		t, _ := horovod.NewTensor(shape, f.Parts[i])
		out[i] = horovod.NamedTensor{Name: v.Name, Tensor: t}
	}
	return out
}

// gatherInt64 collects values from every rank: row r holds rank r's.
func (j *job) gatherInt64(name string, values ...int64) ([][]int64, error) {
	t, _ := horovod.NewTensor([]int{1, len(values)}, values)
	out, err := j.hvd.Allgather(name, t)
	if err != nil {
		return nil, err
	}
	flat, err := horovod.Values[int64](out)
	if err != nil {
		return nil, err
	}
	rows := make([][]int64, j.size)
	for r := range rows {
		rows[r] = flat[r*len(values) : (r+1)*len(values)]
	}
	return rows, nil
}

// checkShards sums the ranks' training examples and bad lines (one row per rank) and fails, on
// every rank alike, when a rank has no example to train on: its dataset could not produce a
// batch, and the others would wait for it. A rank with fewer examples than a batch repeats them.
func (j *job) checkShards(perRank [][]int64) (examples, skipped int64, err error) {
	var empty []string
	for r, row := range perRank {
		examples += row[0]
		skipped += row[1]
		if row[0] == 0 {
			empty = append(empty, strconv.Itoa(r))
		}
	}
	if empty != nil {
		return 0, 0, fmt.Errorf("rank %s has 0 training examples (%d lines of %s for %d ranks, line i going to rank i %% %d, %d of them skipped as bad): give it more data or run fewer ranks",
			strings.Join(empty, ", "), examples+skipped, j.in.train, j.size, j.size, skipped)
	}
	for r, row := range perRank {
		if row[0] < int64(j.cfg.TrainBatchSize) {
			j.console.infof("warning: rank %d has %d training examples, fewer than --train_batch_size %d: its batches repeat them", r, row[0], j.cfg.TrainBatchSize)
		}
	}
	return examples, skipped, nil
}

// loop is the training loop of one rank: train step, fused allreduce of the gradients, apply,
// and on rank 0 the progress, the summaries and the checkpoints.
func (j *job) loop(ds *tfrecord.Dataset, sched schedule.Schedule, step, drawn int64) (int64, error) {
	c := &j.cfg
	first := step
	compression := horovod.NoCompression
	if c.UseFP16 {
		compression = horovod.FP16Compression
	}
	// In place: the sums overwrite the gradients in their one contiguous buffer, which the
	// backend reduces with a single call and Apply then reads; no copy of 90 MB per step. The
	// 1/size of the average is left to Apply (DeferAverage), which folds it into the multiply
	// clipping does anyway: no pass over the 90 MB for it either.
	reducer, err := j.hvd.NewReducer(horovod.ReducerOptions{Compression: compression, InPlace: true, DeferAverage: true})
	if err != nil {
		return step, err
	}
	grads, freeGrads, err := j.gradientBuffer()
	if err != nil {
		return step, err
	}
	// Given back as the loop ends, before Shutdown frees the backend's memory; nothing reads
	// the gradients after the loop. A failure to give it back is only logged: training and its
	// checkpoint are done, and Shutdown frees the memory anyway.
	defer func() {
		if ferr := freeGrads(); ferr != nil {
			j.console.rankf("warning: giving back the gradients' memory: %v", ferr)
		}
	}()
	named := j.named(grads)

	var sums *summaries
	if j.rank == 0 {
		ev, err := events.Create(j.in.rankDir)
		if err != nil {
			return step, err
		}
		sums = newSummaries(ev, j.console.infof)
		defer sums.close()
		term, width := isTerminal(os.Stderr)
		j.console.bar = progress.New(os.Stderr, term, width, step, sched.TrainSteps, c.LogStepCountSteps)
	}
	stats := make([]float64, 3) // loss, correct, examples: summed over ranks
	stop := make([]int32, 1)    // the signal a rank received: the maximum over ranks
	statsT, _ := horovod.NewTensor(nil, stats)
	stopT, _ := horovod.NewTensor(nil, stop)
	var skipped, consecutive int64
	var interrupted os.Signal
	globalBatch := c.TrainBatchSize * j.size
	batch := features.NewBatch(c.TrainBatchSize, c.MaxSeqLength) // refilled every step
	for step < sched.TrainSteps && interrupted == nil {
		if err := ds.ReadBatch(batch, true); err != nil {
			return step, err
		}
		drawn++
		st, err := j.model.TrainStep(batch, bertgraph.DropoutSeed{c.Seed + int64(j.rank), step}, grads)
		if err != nil {
			return step, err
		}
		stats[0], stats[1], stats[2] = float64(st.Loss), float64(st.Correct), float64(st.Examples)
		stop[0] = 0
		if sig := j.stop.requested(); sig != nil {
			stop[0] = int32(signalNumber(sig))
		}
		// The statistics travel beside the gradients: submitted first, they negotiate in the
		// same cycle as the reducer's tensors.
		statsH, err := j.hvd.AllreduceAsync("finetune/step_stats", statsT, horovod.AllreduceOptions{Op: horovod.Sum})
		if err != nil {
			return step, err
		}
		stopH, err := j.hvd.AllreduceAsync("finetune/stop", stopT, horovod.AllreduceOptions{Op: horovod.Max})
		if err != nil {
			return step, err
		}
		if _, _, err := reducer.Reduce(named); err != nil {
			return step, err
		}
		sum, err := statsH.Wait()
		if err != nil {
			return step, err
		}
		stopAll, err := stopH.Wait()
		if err != nil {
			return step, err
		}
		lr := sched.LearningRate(step)
		res, err := j.model.Apply(grads, float32(reducer.GradientScale()), float32(lr), float32(c.ClipNorm))
		if err != nil {
			return step, err
		}
		j.lossScale = res.LossScale
		if !res.Applied {
			skipped++
			consecutive++
			j.console.infof("step %d: gradients not finite (global norm %v): update skipped on every rank (%d so far)%s", step, res.GlobalNorm, skipped, j.lossScaleNote())
			if consecutive >= maxConsecutiveSkips {
				return step, fmt.Errorf("the gradients were not finite for %d steps in a row at step %d: training diverged", consecutive, step)
			}
		} else {
			consecutive = 0
		}
		step = res.GlobalStep
		if sig := signalOf(stopAll); sig != nil {
			interrupted = sig
		}
		if j.rank != 0 {
			continue
		}
		totals, _ := horovod.Values[float64](sum)
		loss := totals[0] / float64(j.size)
		j.console.bar.Report(progress.Step{Step: step, Loss: loss, LR: lr, Examples: globalBatch, Skipped: skipped})
		if j.model.Precision() == bertgraph.Float16 {
			sums.also("loss_scale", float64(res.LossScale))
		}
		sums.write(step, loss, lr, float64(res.GlobalNorm), j.console.bar.Rate(), totals[1]/max(1, totals[2]))
		if res.Applied && c.SaveCheckpointsSteps > 0 && step%int64(c.SaveCheckpointsSteps) == 0 {
			if err := j.saveCheckpoint(step, drawn); err != nil {
				return step, err
			}
		}
	}
	if j.rank == 0 {
		if err := j.saveCheckpoint(step, drawn); err != nil {
			return step, err
		}
		j.console.bar.Done(step, (step-first)*int64(globalBatch))
		j.console.bar = nil
		sums.close()
	}
	if interrupted != nil {
		// No rank leaves before rank 0's checkpoint is complete.
		if err := j.hvd.Barrier(); err != nil {
			return step, err
		}
		return step, errInterrupted{interrupted, ""}
	}
	return step, nil
}

// saveCheckpoint saves the model and optimizer state of global step step, with the number of
// batches drawn so far (see positionSuffix).
func (j *job) saveCheckpoint(step, drawn int64) error {
	if j.ckpts.IsLatest(step) { // the final save coincides with a periodic one
		return nil
	}
	p, err := j.ckpts.Save(step, withInputPosition(func(prefix string) error {
		_, err := j.model.Save(prefix)
		return err
	}, drawn, j.size))
	if err == nil {
		j.console.infof("saved checkpoint %s", p)
	}
	return err
}

// signalOf reads the agreed stop request: a signal number, 0 for none.
func signalOf(t horovod.Tensor) os.Signal {
	v, err := horovod.Values[int32](t)
	if err != nil || len(v) != 1 || v[0] == 0 {
		return nil
	}
	return syscall.Signal(v[0])
}

// scalarWriter is what the training loop needs of an events file (*events.Writer).
type scalarWriter interface {
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

// write records one step's scalars, through one map reused every step.
func (s *summaries) write(step int64, loss, lr, globalNorm, examplesPerSec, accuracy float64) {
	if s.w == nil {
		return
	}
	s.values["loss"], s.values["learning_rate"], s.values["global_norm"] = loss, lr, globalNorm
	s.values["examples_per_sec"], s.values["train_accuracy"] = examplesPerSec, accuracy
	if err := s.w.Scalars(step, s.values); err != nil {
		s.fail(fmt.Sprintf("from step %d on", step), err)
	}
}

// also adds a scalar to the next write's (and every later one's).
func (s *summaries) also(tag string, v float64) { s.values[tag] = v }

// lossScaleNote is what the log says of the loss scale after a skipped step: it was halved.
func (j *job) lossScaleNote() string {
	if j.model.Precision() != bertgraph.Float16 {
		return ""
	}
	return fmt.Sprintf(", loss scale now %v", j.lossScale)
}

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
