package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/bertgraph/features"
)

// The files of rank 0's results in --output_dir, as run_classifier names them.
const (
	evalResultsFile = "eval_results.txt"
	testResultsFile = "test_results.tsv"
)

// evaluate runs dev.tsv through eval_step on rank 0 and writes eval_results.txt.
func (j *job) evaluate(step int64) error {
	c := &j.cfg
	start := time.Now()
	stream, r, err := evalStream(c, j.in.dev, j.conv, c.EvalBatchSize, c.MaxEvalExamples, true)
	if err != nil {
		return err
	}
	defer r.Close()
	defer stream.Close()
	var sums evalSums
	err = inBatchOrder(stream.Next, j.inferenceBatches, j.stopCheck("during evaluation"), j.model.Eval, func(_ *features.Batch, st bertgraph.EvalStats) error {
		sums.add(st)
		return nil
	})
	if err != nil {
		return err
	}
	if sums.total.Examples == 0 {
		return fmt.Errorf("%s: no examples to evaluate", j.in.dev)
	}
	res := sums.result(step)
	if c.AMP != "" {
		res.Precision = j.model.Precision().String()
		if j.model.Precision() == bertgraph.Float16 && j.lossScale != 0 {
			res.LossScale = float64(j.lossScale)
		}
	}
	path := filepath.Join(c.OutputDir, evalResultsFile)
	if err := writeEvalResults(path, res); err != nil {
		return err
	}
	// The curves serve TensorBoard; eval_results.txt holds the results whatever happens to them.
	if err := writeEvalSummary(filepath.Join(c.OutputDir, evalSummaryDir), res); err != nil {
		j.console.infof("warning: the evaluation's TensorBoard events could not be written: %v (eval_results.txt has them)", err)
	}
	j.console.infof("***** Eval results ***** (%d examples of %s, %d bad lines skipped, %s, in %v) -> %s",
		res.Examples, j.in.dev, r.Counts().Skipped, j.batchesAtOnce(), time.Since(start).Round(time.Millisecond), path)
	j.console.infof("  eval_accuracy = %s", pyFloat32(res.Accuracy))
	j.console.infof("  eval_loss = %s", pyFloat32(res.Loss))
	j.console.infof("  global_step = %d", res.GlobalStep)
	j.console.infof("  loss = %s", pyFloat32(res.BatchLoss))
	if res.LossScale != 0 {
		j.console.infof("  loss_scale = %s", pyFloat32(res.LossScale))
	}
	if res.Precision != "" {
		j.console.infof("  precision = %s", res.Precision)
	}
	return nil
}

// evalSums accumulates eval_step's batches into run_classifier's metrics: accuracy and
// eval_loss over the real examples, and Estimator's loss, the mean over batches of each
// batch's mean loss (a batch of padding alone has none, and does not count).
type evalSums struct {
	total     bertgraph.EvalStats
	batchLoss float64 // the sum of the batches' mean losses
	batches   int
}

func (s *evalSums) add(st bertgraph.EvalStats) {
	s.total.Add(st)
	if st.Examples > 0 {
		s.batchLoss += st.LossSum / float64(st.Examples)
		s.batches++
	}
}

// result is the metrics at global step step; at least one real example was added.
func (s *evalSums) result(step int64) evalResult {
	return evalResult{
		Accuracy:   float64(s.total.Correct) / float64(s.total.Examples),
		Loss:       s.total.LossSum / float64(s.total.Examples),
		BatchLoss:  s.batchLoss / float64(s.batches),
		GlobalStep: step,
		Examples:   s.total.Examples,
	}
}

// predict runs test.tsv through predict on rank 0 and writes test_results.tsv, one row of class
// probabilities per real example.
func (j *job) predict() error {
	c := &j.cfg
	start := time.Now()
	stream, r, err := evalStream(c, j.in.test, j.conv, c.PredictBatchSize, c.MaxPredictExamples, false)
	if err != nil {
		return err
	}
	defer r.Close()
	defer stream.Close()
	path := filepath.Join(c.OutputDir, testResultsFile)
	out, err := createTestResults(path)
	if err != nil {
		return err
	}
	defer out.Abort()
	err = inBatchOrder(stream.Next, j.inferenceBatches, j.stopCheck("during prediction"), j.model.Predict, func(b *features.Batch, p *bertgraph.Predictions) error {
		return out.Write(p.Probabilities, b.NumReal(), p.NumLabels)
	})
	if err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	// Unlike dev lines, test lines are never skipped (evalStream): every row is its line's.
	j.console.infof("***** Predict results ***** (%d examples of %s, one row per line, %s, in %v) -> %s",
		out.rows, j.in.test, j.batchesAtOnce(), time.Since(start).Round(time.Millisecond), path)
	return nil
}

// stopCheck is inBatchOrder's stop for phase: rank 0 alone evaluates and predicts, so a signal
// stops it without asking the other ranks.
func (j *job) stopCheck(phase string) func() error {
	return func() error {
		if sig := j.stop.requested(); sig != nil {
			return errInterrupted{sig, phase}
		}
		return nil
	}
}

func (j *job) batchesAtOnce() string {
	if j.inferenceBatches == 1 {
		return "one batch at a time"
	}
	return fmt.Sprintf("%d batches at a time", j.inferenceBatches)
}

// maxInferenceBatches bounds the batches evaluated or predicted at once (and so their
// activations in memory) on a machine of many cores and ranks.
const maxInferenceBatches = 8

// inferenceBatches is how many batches rank 0 evaluates or predicts at once after the other
// ranks have left: each TensorFlow run uses the intra-op threads its session was given (the
// machine's cores over its ranks), so concurrent runs are how it uses the cores the ranks
// left. TensorFlow runs them in parallel on its inter-op threads (one per core when not set);
// a GPU runs one batch at a time. A second session with every core would not do: TensorFlow
// sizes its CPU thread pools once per process, by the first session, and a second one shares
// them.
func inferenceBatches(cores, intraOpThreads, interOpThreads int, gpu bool) int {
	if gpu {
		return 1
	}
	if intraOpThreads <= 0 { // TensorFlow's choice: one per core
		intraOpThreads = cores
	}
	n := max(1, cores/intraOpThreads)
	if interOpThreads > 0 {
		n = min(n, interOpThreads)
	}
	return min(n, maxInferenceBatches)
}

// inBatchOrder runs work on every batch next gives, up to n batches at once, and hands each
// result to done in the batches' order, so that sums and output rows are those of one batch
// at a time. stop is asked before each batch starts. After an error (of next, work, done or
// stop) no batch starts, the ones running finish, done sees no more, and the first error is
// returned; io.EOF from next ends the batches.
func inBatchOrder[R any](next func() (*features.Batch, error), n int, stop func() error,
	work func(*features.Batch) (R, error), done func(*features.Batch, R) error) error {
	type result struct {
		r   R
		err error
	}
	type running struct {
		b   *features.Batch
		out chan result
	}
	var queue []running
	var err error
	settle := func() { // the oldest running batch
		f := queue[0]
		queue = queue[1:]
		res := <-f.out
		if err == nil {
			err = res.err
		}
		if err == nil {
			err = done(f.b, res.r)
		}
	}
	for err == nil {
		if err = stop(); err != nil {
			break
		}
		var b *features.Batch
		if b, err = next(); err != nil {
			if err == io.EOF {
				err = nil
			}
			break
		}
		f := running{b, make(chan result, 1)}
		go func() {
			r, err := work(f.b)
			f.out <- result{r, err}
		}()
		queue = append(queue, f)
		if len(queue) >= n {
			settle()
		}
	}
	for len(queue) > 0 {
		settle()
	}
	return err
}

// export writes the serving SavedModel of the final weights to <export_dir>/<global step>, the
// versioned layout TensorFlow Serving loads, with the vocabulary, casing, truncation and label
// names this run trained with: a classifier on the export tokenises and names labels as training did.
func (j *job) export(step int64) error {
	c := &j.cfg
	dir := filepath.Join(c.exportBase(), strconv.FormatInt(step, 10))
	opts := bertgraph.ExportOptions{VocabFile: j.in.vocabPath, DoLowerCase: &c.DoLowerCase, LabelNames: c.Labels, KeepTailTokens: c.KeepTailTokens}
	if err := j.model.ExportServing(dir, opts); err != nil {
		return err
	}
	j.console.infof("exported the serving SavedModel of step %d to %s", step, dir)
	return nil
}
