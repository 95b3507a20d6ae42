package trainer_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/bertgraph/schedule"
	"github.com/gorovod/gorovod/bertgraph/tfrecord"
	"github.com/gorovod/gorovod/bertgraph/trainer"
	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/tf/checkpoint"
	"github.com/gorovod/gorovod/tf/testenv"
)

// steps records what the trainer reports.
type steps []trainer.Step

func (s *steps) Report(st trainer.Step) { *s = append(*s, st) }
func (s *steps) Rate() float64          { return 1 }

// A stop request ends Train after the step it arrived in, with that step's checkpoint; a new
// trainer (a fresh model) starts from it, and the two runs together train every step once: the
// weights of one uninterrupted run (trainByHand's, or with 2 batches of 4 accumulated per step,
// those of a Train that was not stopped). Each step draws AccumulationSteps batches.
func TestStopThenResume(t *testing.T) {
	hvd, err := horovod.Init()
	if err != nil {
		t.Fatal(err)
	}
	defer hvd.Shutdown()
	sched, err := schedule.New(32, 8, 1, 0, 1e-3, 1) // 4 steps of 8 examples
	if err != nil {
		t.Fatal(err)
	}
	dataOpts := tfrecord.DatasetOptions{ShuffleBuffer: 8, Seed: 1, Repeat: true}
	run := func(dir string, accumulation, stopAt int) (trainer.Position, trainer.Result, steps) {
		t.Helper()
		model, err := bertgraph.Load(tinyModel, bertgraph.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer model.Close()
		var reported steps
		calls := 0
		stop := func() os.Signal {
			if calls++; calls == stopAt {
				return syscall.SIGINT
			}
			return nil
		}
		tr, from, data := started(t, hvd, model, trainer.Options{Dir: dir, Schedule: sched, BatchSize: 8 / accumulation,
			AccumulationSteps: accumulation, ClipNorm: 1, Stop: stop, Progress: &reported, Logf: t.Logf}, dataOpts)
		start := time.Now()
		res, err := tr.Train(data, from)
		if err != nil {
			t.Fatal(err)
		}
		// The phases cover every step but the first, within Train's own time.
		p := res.Phases
		if p.Steps != int64(len(reported)-1) || p.TrainStep <= 0 || p.Allreduce <= 0 || p.Apply <= 0 ||
			p.TrainStep+p.Allreduce+p.Apply+p.Other > time.Since(start) {
			t.Errorf("phases %+v for %d steps in %v: want every step but the first, each phase timed", p, len(reported), time.Since(start))
		}
		if mean := p.PerStep(); mean.TrainStep != p.TrainStep/time.Duration(p.Steps) {
			t.Errorf("mean step %+v of %+v", mean, p)
		}
		return from, res, reported
	}
	latestWeights := func(dir string) *bertgraph.Model {
		final, _, _, err := checkpoint.Latest(dir)
		if err != nil {
			t.Fatal(err)
		}
		model, err := bertgraph.Load(tinyModel, bertgraph.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { model.Close() })
		if err := model.Restore(final); err != nil {
			t.Fatal(err)
		}
		return model
	}

	for _, accumulation := range []int{1, 2} {
		t.Run(fmt.Sprint("accumulation=", accumulation), func(t *testing.T) {
			dir := t.TempDir()
			from, res, reported := run(dir, accumulation, 2)
			if from != (trainer.Position{}) || res.Step != 2 || res.Stopped != syscall.SIGINT || len(reported) != 2 {
				t.Fatalf("first run: from %+v, result %+v, %d steps reported; want from 0, stopped by SIGINT after step 2", from, res, len(reported))
			}
			prefix, step, ok, err := checkpoint.Latest(dir)
			if !ok || step != 2 || err != nil {
				t.Fatalf("latest checkpoint after the stop: step %d, ok %v, %v", step, ok, err)
			}
			// Its input position names the step's batches, for a resume with other ones to warn.
			pos, err := os.ReadFile(prefix + ".input_position.json")
			if want := fmt.Sprintf(`"batch_size":%d,"accumulation_steps":%d,`, 8/accumulation, accumulation); err != nil || !strings.Contains(string(pos), want) {
				t.Errorf("input position %s (%v), want it to say %s", pos, err, want)
			}
			from, res, reported = run(dir, accumulation, 0)
			if want := (trainer.Position{Step: 2, Batches: 2 * int64(accumulation), Examples: 16}); from != want || res.Step != 4 || res.Stopped != nil {
				t.Fatalf("resumed run: from %+v, result %+v; want from %+v to the schedule's step 4", from, res, want)
			}
			for i, st := range reported {
				if st.Step != int64(3+i) || st.Examples != 8 || !(st.Loss > 0) || st.LR != sched.LearningRate(int64(2+i)) {
					t.Errorf("resumed run's report %d: %+v", i, st)
				}
			}
			// The resumed run continued the data after the batches the first drew.
			if accumulation == 1 {
				checkWeights(t, latestWeights(dir), trainByHand(t, dataOpts, sched, 0, 1))
				return
			}
			uninterrupted := t.TempDir()
			run(uninterrupted, accumulation, 0)
			whole := latestWeights(uninterrupted)
			want := whole.NewFlatTensors()
			if err := whole.ReadVariables(want); err != nil {
				t.Fatal(err)
			}
			checkWeights(t, latestWeights(dir), want)
		})
	}
}

// Start resumes at the batches the checkpoint's input position says were drawn, not at its
// global step: they differ once an update was skipped, and the next position written counts on
// from them.
func TestStartResumesAtTheBatchesDrawn(t *testing.T) {
	hvd, model, sched := tinyRun(t, 1, 1e-3)
	dir := t.TempDir()
	opts := trainer.Options{Dir: dir, Schedule: sched, BatchSize: 8, ClipNorm: 1, Logf: t.Logf,
		Stop: func() os.Signal { return syscall.SIGINT }} // after the first step
	tr, from, data := started(t, hvd, model, opts, tfrecord.DatasetOptions{Repeat: true})
	if res, err := tr.Train(data, from); err != nil || res.Step != 1 {
		t.Fatalf("first run: step %d, %v; want stopped after step 1", res.Step, err)
	}
	prefix, _, _, err := checkpoint.Latest(dir)
	if err != nil {
		t.Fatal(err)
	}
	// As a run whose update was skipped once before step 1 saves it: 2 batches drawn.
	if err := os.WriteFile(prefix+".input_position.json", []byte(`{"batches":2,"examples":16,"batch_size":8,"ranks":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	opts.Stop = nil
	if tr, err = trainer.New(hvd, model, opts); err != nil {
		t.Fatal(err)
	}
	if from, err = tr.Start(); err != nil || from != (trainer.Position{Step: 1, Batches: 2, Examples: 16}) {
		t.Errorf("resumed at %+v, %v; want step 1 after 2 batches (16 examples)", from, err)
	}
}

// started is a trainer of opts on hvd and model after its Start, and the training records
// opened with dataOpts, closed when the test ends.
func started(t *testing.T, hvd *horovod.Horovod, model *bertgraph.Model, opts trainer.Options, dataOpts tfrecord.DatasetOptions) (*trainer.Trainer, trainer.Position, *tfrecord.Dataset) {
	t.Helper()
	tr, err := trainer.New(hvd, model, opts)
	if err != nil {
		t.Fatal(err)
	}
	from, err := tr.Start()
	if err != nil {
		t.Fatal(err)
	}
	data, err := tfrecord.OpenDataset([]string{trainRecords}, dataOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { data.Close() })
	return tr, from, data
}

// tinyRun is a job of this process alone, the tiny model and the schedule of epochs over the
// 32 training records in batches of 8 at learning rate lr, closed when the test ends.
func tinyRun(t *testing.T, epochs, lr float64) (*horovod.Horovod, *bertgraph.Model, schedule.Schedule) {
	t.Helper()
	hvd, err := horovod.Init()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hvd.Shutdown() })
	model, err := bertgraph.Load(tinyModel, bertgraph.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { model.Close() })
	sched, err := schedule.New(32, 8, epochs, 0, lr, 1)
	if err != nil {
		t.Fatal(err)
	}
	return hvd, model, sched
}

// New refuses a clip norm Apply would refuse at the first step (after Start's broadcast); Train
// on data that ends before the schedule says why, naming the step (the schedule's 8 steps over
// 32 examples read once end at step 4).
func TestBadClipNormAndEndingData(t *testing.T) {
	hvd, model, sched := tinyRun(t, 2, 1e-3)
	for _, clip := range []float64{0, -1, math.Inf(1), math.NaN(), 1e39} {
		_, err := trainer.New(hvd, model, trainer.Options{Dir: t.TempDir(), Schedule: sched, BatchSize: 8, ClipNorm: clip})
		if err == nil || !strings.Contains(err.Error(), "clip norm") {
			t.Errorf("ClipNorm %v: %v, want an error naming the clip norm", clip, err)
		}
	}
	tr, from, data := started(t, hvd, model, trainer.Options{Dir: t.TempDir(), Schedule: sched, BatchSize: 8, ClipNorm: 1, Logf: t.Logf}, tfrecord.DatasetOptions{})
	res, err := tr.Train(data, from)
	if !errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "ended at step 4 of 8") || !strings.Contains(err.Error(), "Repeat") || res.Step != 4 {
		t.Errorf("Train over data read once: step %d, %v; want io.EOF at step 4 of 8, naming Repeat", res.Step, err)
	}
}

// New takes Average and Adasum and refuses the other ops, naming the option: a Sum would apply
// size times the step, a Max no gradient at all.
func TestNewRefusesOpsOtherThanAverageAndAdasum(t *testing.T) {
	hvd, model, sched := tinyRun(t, 1, 1e-3)
	for _, op := range []horovod.ReduceOp{horovod.Average, horovod.Adasum, horovod.Sum, horovod.Max, horovod.Product} {
		_, err := trainer.New(hvd, model, trainer.Options{Dir: t.TempDir(), Schedule: sched, BatchSize: 8, ClipNorm: 1, Op: op})
		if ok := op == horovod.Average || op == horovod.Adasum; ok != (err == nil) || err != nil && !strings.Contains(err.Error(), "Options.Op") {
			t.Errorf("Op %v: %v; want an error naming Options.Op for all but Average and Adasum", op, err)
		}
	}
}

// With AdasumUpdates the ranks agree on skipping a step before any takes it: a run whose
// weights blow up (learning rate 1e30) skips every step once its gradients are not finite,
// with the skip logged, and ends as diverged after 100, as a run combining gradients does; no
// rank's own Apply meets the non-finite gradients. AdasumUpdates needs Op Adasum.
func TestAdasumUpdatesSkipNonFiniteSteps(t *testing.T) {
	hvd, model, sched := tinyRun(t, 1, 1e30)
	opts := trainer.Options{Dir: t.TempDir(), Schedule: sched, BatchSize: 8, ClipNorm: 1e30, AdasumUpdates: true}
	if _, err := trainer.New(hvd, model, opts); err == nil || !strings.Contains(err.Error(), "AdasumUpdates needs Op Adasum") {
		t.Errorf("AdasumUpdates with Average: %v", err)
	}
	opts.Op = horovod.Adasum
	skips := 0
	opts.Logf = func(format string, args ...any) {
		if strings.Contains(fmt.Sprintf(format, args...), "skipped on every rank: gradients not finite") {
			skips++
		}
	}
	tr, from, data := started(t, hvd, model, opts, tfrecord.DatasetOptions{Repeat: true})
	_, err := tr.Train(data, from)
	if err == nil || !strings.Contains(err.Error(), "not finite for 100 steps in a row") || skips < 100 {
		t.Fatalf("Train: %v after %d skips logged; want the divergence after 100 skipped steps", err, skips)
	}
}

// A run whose updates are skipped (gradients not finite: here a learning rate that blows the
// weights up) writes one TensorBoard point a step, not one per skipped update at the step
// that did not advance, and its file starts with the SessionLog START of its first step. Its
// log names a skipped update by the step it would have made, beside the step that stays.
func TestSkippedUpdatesWriteOnePointAStep(t *testing.T) {
	hvd, model, sched := tinyRun(t, 1, 1e30)
	dir := t.TempDir()
	var skipLines []string
	logf := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		t.Log(line)
		if strings.Contains(line, "skipped on every rank") {
			skipLines = append(skipLines, line)
		}
	}
	tr, from, data := started(t, hvd, model, trainer.Options{Dir: dir, Schedule: sched, BatchSize: 8, ClipNorm: 1e30, Logf: logf}, tfrecord.DatasetOptions{Repeat: true})
	res, err := tr.Train(data, from)
	if err == nil || !strings.Contains(err.Error(), "not finite for 100 steps in a row") || !strings.Contains(err.Error(), "training diverged") {
		t.Fatalf("Train: %v, want the divergence after 100 skipped updates", err)
	}
	want := fmt.Sprintf("update to step %d skipped on every rank: gradients not finite", res.Step+1)
	last := ""
	if len(skipLines) > 0 {
		last = skipLines[len(skipLines)-1]
	}
	if len(skipLines) < 100 || !strings.HasPrefix(last, want) || !strings.Contains(last, fmt.Sprintf("the global step stays at %d (", res.Step)) {
		t.Errorf("%d skip lines, the last %q: want at least 100, the last starting %q and naming step %d as the one that stays",
			len(skipLines), last, want, res.Step)
	}
	events, _ := filepath.Glob(filepath.Join(dir, "events.out.tfevents.*"))
	if len(events) != 1 {
		t.Fatalf("events files %v", events)
	}
	out := testenv.Python(t, `
import json, sys
import tensorflow as tf
print(json.dumps([[e.step, e.session_log.status] for e in tf.compat.v1.train.summary_iterator(sys.argv[1]) if not e.file_version]))
`, events[0])
	var got [][2]int64
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(got) < 2 || got[0] != [2]int64{1, 1} {
		t.Fatalf("events (step, session_log status) %v: want a START at step 1 first", got)
	}
	seen := map[int64]bool{}
	for _, e := range got[1:] {
		if seen[e[0]] {
			t.Fatalf("step %d has several points: %v", e[0], got)
		}
		seen[e[0]] = true
	}
}

// On one rank, Train is the schedule's steps of TrainStep then Apply, by hand (trainByHand).
// Rank 0 saves every SaveCheckpointsSteps steps and after the last one.
func TestTrainIsTrainStepThenApplyEveryStep(t *testing.T) {
	const seed, clip = 7, 0.5
	hvd, model, sched := tinyRun(t, 1, 1e-3) // 4 steps of a learning rate decaying to 0
	dir := t.TempDir()
	opts := tfrecord.DatasetOptions{Repeat: true}
	tr, from, data := started(t, hvd, model, trainer.Options{Dir: dir, Schedule: sched, BatchSize: 8, Seed: seed, ClipNorm: clip,
		SaveCheckpointsSteps: 3, Logf: t.Logf}, opts)
	res, err := tr.Train(data, from)
	if err != nil || res.Step != sched.TrainSteps {
		t.Fatalf("Train: step %d, %v; want the schedule's %d steps", res.Step, err, sched.TrainSteps)
	}
	checkWeights(t, model, trainByHand(t, opts, sched, seed, clip))
	indexes, _ := filepath.Glob(filepath.Join(dir, "model.ckpt-*.index"))
	if want := []string{filepath.Join(dir, "model.ckpt-3.index"), filepath.Join(dir, "model.ckpt-4.index")}; !slices.Equal(indexes, want) {
		t.Errorf("checkpoints %v, want %v: every 3 steps and the last", indexes, want)
	}
}

// trainByHand loads the tiny model and trains it as one rank's Train should, returning its
// weights: the schedule's steps, each on the next batch of 8 of the training records (opened
// with opts), with dropout seed (seed, step), the schedule's learning rate at the step before
// the update, clip norm clip, and gradient scale 1 (the average over one rank).
func trainByHand(t *testing.T, opts tfrecord.DatasetOptions, sched schedule.Schedule, seed int64, clip float32) *bertgraph.FlatTensors {
	t.Helper()
	model, err := bertgraph.Load(tinyModel, bertgraph.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer model.Close()
	data, err := tfrecord.OpenDataset([]string{trainRecords}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	grads := model.NewFlatTensors()
	batch := features.NewBatch(8, model.MaxSeqLength())
	for step := range sched.TrainSteps {
		if err := data.ReadBatch(batch, true); err != nil {
			t.Fatal(err)
		}
		if _, err := model.TrainStep(batch, bertgraph.DropoutSeed{seed, step}, grads); err != nil {
			t.Fatal(err)
		}
		if _, err := model.Apply(grads, 1, float32(sched.LearningRate(step)), clip); err != nil {
			t.Fatal(err)
		}
	}
	weights := model.NewFlatTensors()
	if err := model.ReadVariables(weights); err != nil {
		t.Fatal(err)
	}
	return weights
}

// checkWeights fails unless model's variables are want, bit for bit.
func checkWeights(t *testing.T, model *bertgraph.Model, want *bertgraph.FlatTensors) {
	t.Helper()
	got := model.NewFlatTensors()
	if err := model.ReadVariables(got); err != nil {
		t.Fatal(err)
	}
	for i, v := range model.Variables() {
		if !slices.Equal(got.Parts[i], want.Parts[i]) {
			t.Fatalf("%s differs from the steps done by hand", v.Name)
		}
	}
}

// Options.Timeline writes Horovod's timeline of its steps only: each step allreduces its
// statistics once ("trainer/step_stats"), so a timeline of steps 2 to 3 of 4 holds two, one of
// steps 3 to 10 the two that training has (it ends with training), and a path that cannot be
// created warns once while training goes on.
func TestTimelineOfSteps(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name        string
		first, last int64
		path        string
		want        int    // step statistics allreduces in the file; -1: no file
		log         string // a line of the run's log
	}{
		{"steps 2 to 3", 2, 3, filepath.Join(dir, "a.json"), 2, "wrote the timeline of steps 2 to 3 to " + filepath.Join(dir, "a.json")},
		{"steps 3 to 10 of 4", 3, 10, filepath.Join(dir, "b.json"), 2, "wrote the timeline of steps 3 to 4 to "},
		{"a missing directory", 1, 4, filepath.Join(dir, "missing", "c.json"), -1, "warning: the timeline of steps 1 to 4 was not started"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hvd, model, sched := tinyRun(t, 1, 1e-3) // 4 steps
			var log strings.Builder
			logf := func(format string, args ...any) { fmt.Fprintf(&log, format+"\n", args...) }
			tr, from, data := started(t, hvd, model, trainer.Options{Dir: t.TempDir(), Schedule: sched, BatchSize: 8, ClipNorm: 1,
				Timeline: trainer.TimelineSteps{Path: tc.path, First: tc.first, Last: tc.last}, Logf: logf}, tfrecord.DatasetOptions{Repeat: true})
			if res, err := tr.Train(data, from); err != nil || res.Step != sched.TrainSteps {
				t.Fatalf("Train: step %d, %v; want the schedule's %d steps", res.Step, err, sched.TrainSteps)
			}
			if n := strings.Count(log.String(), tc.log); n != 1 {
				t.Errorf("the log has %q %d times, want once:\n%s", tc.log, n, log.String())
			}
			raw, err := os.ReadFile(tc.path)
			if tc.want < 0 {
				if !errors.Is(err, os.ErrNotExist) {
					t.Errorf("a timeline at %s: %v", tc.path, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var events []struct {
				Name, Ph string
				PID      int
				Args     map[string]string
			}
			if err := json.Unmarshal(raw, &events); err != nil {
				t.Fatalf("%s is not a complete timeline: %v", tc.path, err)
			}
			rows := map[int]string{}
			stats := 0
			for _, e := range events {
				switch {
				case e.Ph == "M":
					rows[e.PID] = e.Args["name"]
				case e.Ph == "B" && e.Name == "ALLREDUCE" && rows[e.PID] == "trainer/step_stats":
					stats++
				}
			}
			if stats != tc.want {
				t.Errorf("%d steps' statistics in the timeline, want %d", stats, tc.want)
			}
		})
	}
	hvd, model, sched := tinyRun(t, 1, 1e-3)
	if _, err := trainer.New(hvd, model, trainer.Options{Dir: t.TempDir(), Schedule: sched, BatchSize: 8, ClipNorm: 1,
		Timeline: trainer.TimelineSteps{Path: filepath.Join(dir, "d.json"), First: 3, Last: 2}}); err == nil || !strings.Contains(err.Error(), "Options.Timeline") {
		t.Errorf("New with a timeline of steps 3 to 2: %v, want an error naming Options.Timeline", err)
	}
}
