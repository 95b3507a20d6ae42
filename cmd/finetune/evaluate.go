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
	var total bertgraph.EvalStats
	var batchLoss float64
	batches := 0
	err = j.eachBatch(stream, "during evaluation", func(b *features.Batch) error {
		st, err := j.model.Eval(b)
		if err != nil {
			return err
		}
		total.Add(st)
		if st.Examples > 0 {
			batchLoss += st.LossSum / float64(st.Examples)
			batches++
		}
		return nil
	})
	if err != nil {
		return err
	}
	if total.Examples == 0 {
		return fmt.Errorf("%s: no examples to evaluate", j.in.dev)
	}
	res := evalResult{
		Accuracy:   float64(total.Correct) / float64(total.Examples),
		Loss:       total.LossSum / float64(total.Examples),
		BatchLoss:  batchLoss / float64(batches),
		GlobalStep: step,
		Examples:   total.Examples,
	}
	if c.AMP != "" {
		res.Precision = j.model.Precision().String()
		if j.model.Precision() == bertgraph.Float16 && j.lossScale != 0 {
			res.LossScale = float64(j.lossScale)
		}
	}
	path := filepath.Join(c.OutputDir, "eval_results.txt")
	if err := writeEvalResults(path, res); err != nil {
		return err
	}
	j.console.infof("***** Eval results ***** (%d examples of %s, %d bad lines skipped, in %v) -> %s",
		total.Examples, j.in.dev, r.Counts().Skipped, time.Since(start).Round(time.Millisecond), path)
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
	path := filepath.Join(c.OutputDir, "test_results.tsv")
	out, err := createTestResults(path)
	if err != nil {
		return err
	}
	defer out.Abort()
	err = j.eachBatch(stream, "during prediction", func(b *features.Batch) error {
		p, err := j.model.Predict(b)
		if err != nil {
			return err
		}
		return out.Write(p.Probabilities, b.NumReal(), p.NumLabels)
	})
	if err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	// Unlike dev lines, test lines are never skipped (evalStream): every row is its line's.
	j.console.infof("***** Predict results ***** (%d examples of %s, one row per line, in %v) -> %s",
		out.rows, j.in.test, time.Since(start).Round(time.Millisecond), path)
	return nil
}

// eachBatch feeds every batch of stream to f, stopping early when a signal arrives (rank 0
// alone runs it, so it stops without asking the others).
func (j *job) eachBatch(stream *features.Stream, phase string, f func(*features.Batch) error) error {
	for {
		if sig := j.stop.requested(); sig != nil {
			return errInterrupted{sig, phase}
		}
		b, err := stream.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := f(b); err != nil {
			return err
		}
	}
}

// export writes the serving SavedModel of the final weights to <export_dir>/<global step>, the
// versioned layout TensorFlow Serving loads, with the vocabulary, casing, truncation and label
// names this run trained with: a classifier on the export tokenises and names labels as training did.
func (j *job) export(step int64) error {
	c := &j.cfg
	base := c.ExportDir
	if base == "" {
		base = filepath.Join(c.OutputDir, "export")
	}
	dir := filepath.Join(base, strconv.FormatInt(step, 10))
	opts := bertgraph.ExportOptions{VocabFile: j.in.vocabPath, DoLowerCase: &c.DoLowerCase, LabelNames: c.Labels, KeepTailTokens: c.KeepTailTokens}
	if err := j.model.ExportServing(dir, opts); err != nil {
		return err
	}
	j.console.infof("exported the serving SavedModel of step %d to %s", step, dir)
	return nil
}
