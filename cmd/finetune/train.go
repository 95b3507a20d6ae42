package main

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/bertgraph/schedule"
	"github.com/gorovod/gorovod/bertgraph/tfrecord"
	"github.com/gorovod/gorovod/bertgraph/trainer"
	"github.com/gorovod/gorovod/cmd/finetune/internal/progress"
	"github.com/gorovod/gorovod/horovod"
)

// train runs the training phase and returns the global step reached: the task's features, the
// schedule for the examples of all ranks, then the trainer from the resume point.
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
	perRank, err := j.gatherInt64("finetune/train_examples", int64(cache.Examples), int64(cache.Skipped), sig,
		sumPrefix(cache.Key.TrainSHA256), sumPrefix(cache.Key.VocabSHA256))
	if err != nil {
		return 0, err
	}
	for _, row := range perRank {
		if row[2] != 0 {
			return 0, errInterrupted{syscall.Signal(row[2]), "before training"}
		}
	}
	if err := j.checkSameFiles(perRank); err != nil {
		return 0, err
	}
	examples, skipped, err := j.checkShards(perRank)
	if err != nil {
		return 0, err
	}
	sched, err := schedule.New(int(examples), c.TrainBatchSize*c.NumAccumulationSteps, c.NumTrainEpochs, c.WarmupProportion, c.LearningRate, j.size)
	if err != nil {
		return 0, err
	}
	op := horovod.Average
	if c.UseAdasum != "" {
		// Horovod's examples scale the learning rate by the number of ranks for Average
		// only (lr_scaler = 1 with --use-adasum on CPUs): Adasum of orthogonal gradients is
		// their sum, of equal ones their mean, so it already grows the step with the ranks
		// where they disagree.
		op, sched.PeakLR = horovod.Adasum, c.LearningRate
	}
	accumulated := ""
	if c.NumAccumulationSteps > 1 {
		accumulated = fmt.Sprintf(" x %d accumulated", c.NumAccumulationSteps)
	}
	j.console.infof("***** Running training *****  examples = %d (%d skipped), batch = %d per rank%s x %d ranks, steps = %d, warmup = %d, peak learning rate = %g",
		examples, skipped, c.TrainBatchSize, accumulated, j.size, sched.TrainSteps, sched.WarmupSteps, sched.PeakLR)

	compression, err := c.compression()
	if err != nil {
		return 0, err
	}
	var timeline trainer.TimelineSteps
	if c.TimelineSteps != "" {
		if timeline, err = c.timelineSteps(); err != nil {
			return 0, err
		}
	}
	t, err := trainer.New(j.hvd, j.model, trainer.Options{
		Dir: j.in.rankDir, Checkpoints: j.ckpts, SaveCheckpointsSteps: c.SaveCheckpointsSteps, InitCheckpoint: c.InitCheckpoint,
		Schedule: sched, BatchSize: c.TrainBatchSize, AccumulationSteps: c.NumAccumulationSteps, Seed: c.Seed, ClipNorm: c.ClipNorm, Compression: compression,
		SparseAsDense: c.SparseAsDense, Op: op, AdasumUpdates: c.UseAdasum == "updates", Timeline: timeline,
		Stop: j.stop.requested, Progress: j.console, Logf: j.console.logf,
	})
	if err != nil {
		return 0, err
	}
	from, err := t.Start()
	if err != nil {
		return 0, err
	}
	if from.Step >= sched.TrainSteps {
		j.console.infof("%s already holds step %d of %d: nothing to train", c.OutputDir, from.Step, sched.TrainSteps)
		return from.Step, nil
	}
	ds, err := tfrecord.OpenDataset([]string{path}, tfrecord.DatasetOptions{
		ShuffleBuffer: c.ShuffleBuffer, Seed: uint64(c.Seed)*1_000_003 + uint64(j.rank), Repeat: true})
	if err != nil {
		return 0, err
	}
	defer ds.Close()
	if j.rank == 0 {
		term, width := isTerminal(os.Stderr)
		j.console.bar = progress.New(os.Stderr, term, width, from.Step, sched.TrainSteps, c.LogStepCountSteps)
	}
	res, err := t.Train(ds, from)
	err = forgetDamagedCache(err, path, j.in.train)
	j.lossScale = res.LossScale
	if j.rank == 0 && err == nil {
		j.console.bar.Done(res.Step, (res.Step-from.Step)*int64(c.TrainBatchSize*c.NumAccumulationSteps*j.size))
		j.console.bar = nil
		if p := res.Phases.PerStep(); res.Phases.Steps > 0 {
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			j.console.infof("a step after the first, on rank 0 (mean of %d): train_step %.1f ms, allreduce %.1f ms (waiting for the other ranks included), apply_gradients %.1f ms, the rest %.1f ms",
				res.Phases.Steps, ms(p.TrainStep), ms(p.Allreduce), ms(p.Apply), ms(p.Other))
		}
	}
	if err == nil && res.Stopped != nil {
		err = errInterrupted{res.Stopped, ""}
	}
	return res.Step, err
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

// sumPrefix is the first 8 bytes of a hexadecimal SHA-256, for the ranks to compare.
func sumPrefix(sum string) int64 {
	b, _ := hex.DecodeString(sum[:min(16, len(sum))])
	if len(b) < 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(b))
}

// checkSameFiles fails, on every rank alike, when a rank read another training file or
// vocabulary than rank 0 (columns 3 and 4 of perRank: sumPrefix of each rank's). Machines
// without a shared disk read copies of their own, and line i of the file goes to rank i % size:
// a stale copy would leave lines untrained or train others twice, and another vocabulary would
// give its rank other token ids, with nothing to say so.
func (j *job) checkSameFiles(perRank [][]int64) error {
	for _, f := range []struct {
		column     int
		what, path string
	}{{3, "training file", j.in.train}, {4, "vocabulary", j.in.vocabPath}} {
		var differ []string
		for r, row := range perRank {
			if row[f.column] != perRank[0][f.column] {
				differ = append(differ, strconv.Itoa(r))
			}
		}
		if differ != nil {
			return fmt.Errorf("rank(s) %s read another %s than rank 0 (this rank's %s has SHA-256 %016x...): every rank must read the same one",
				strings.Join(differ, ", "), f.what, f.path, uint64(perRank[j.rank][f.column]))
		}
	}
	return nil
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
		who := "rank " + empty[0] + " has"
		if len(empty) > 1 {
			who = "ranks " + strings.Join(empty, ", ") + " have"
		}
		return 0, 0, fmt.Errorf("%s 0 training examples (%d lines of %s for %d ranks, line i going to rank i %% %d, %d of them skipped as bad): give it more data or run fewer ranks",
			who, examples+skipped, j.in.train, j.size, j.size, skipped)
	}
	for r, row := range perRank {
		if row[0] < int64(j.cfg.TrainBatchSize) {
			j.console.infof("warning: rank %d has %d training examples, fewer than --train_batch_size %d: its batches repeat them", r, row[0], j.cfg.TrainBatchSize)
		}
	}
	return examples, skipped, nil
}
