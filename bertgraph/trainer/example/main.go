// Command example fine-tunes a gorovod training SavedModel with the trainer library, without
// finetune's tasks and flags: it trains on a run_classifier train.tf_record (finetune's feature
// cache, or any TFRecord file of the five features) and leaves the checkpoints and the
// TensorBoard events file in -output_dir. Under mpirun every rank trains on its share of the
// records.
//
//	go run ./bertgraph/trainer/example -saved_model .cache/model/tiny -train train.tf_record -output_dir /tmp/example
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/bertgraph/schedule"
	"github.com/gorovod/gorovod/bertgraph/tfrecord"
	"github.com/gorovod/gorovod/bertgraph/trainer"
	"github.com/gorovod/gorovod/horovod"
	// The MPI backend, for runs under mpirun (a program that imports no backend runs alone).
	_ "github.com/gorovod/gorovod/horovod/mpi"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "example: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string, log io.Writer) error {
	fs := flag.NewFlagSet("example", flag.ContinueOnError)
	savedModel := fs.String("saved_model", "", "training SavedModel (bertgraph/exporter)")
	train := fs.String("train", "", "TFRecord file of run_classifier features")
	outputDir := fs.String("output_dir", "", "directory for the checkpoints and the events file")
	batch := fs.Int("batch", 8, "examples per rank and step")
	epochs := fs.Float64("epochs", 1, "passes over the training data")
	lr := fs.Float64("learning_rate", 1e-3, "peak learning rate of one rank (scaled by the number of ranks)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *savedModel == "" || *train == "" || *outputDir == "" {
		return errors.New("-saved_model, -train and -output_dir are required")
	}

	hvd, err := horovod.Init()
	if err != nil {
		return err
	}
	defer hvd.Shutdown()
	// Each rank writes into a directory of its own; rank 0's holds the checkpoints.
	dir := *outputDir
	if hvd.Rank() != 0 {
		dir = filepath.Join(dir, fmt.Sprint(hvd.Rank()))
	}
	model, err := bertgraph.Load(*savedModel, bertgraph.Options{})
	if err != nil {
		return err
	}
	defer model.Close()
	examples, err := countRecords(*train)
	if err != nil {
		return err
	}
	sched, err := schedule.New(examples, *batch, *epochs, 0.1, *lr, hvd.Size())
	if err != nil {
		return err
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(log, "rank %d: "+format+"\n", append([]any{hvd.Rank()}, args...)...)
	}
	t, err := trainer.New(hvd, model, trainer.Options{Dir: dir, Schedule: sched, BatchSize: *batch, ClipNorm: 1, Logf: logf})
	if err != nil {
		return err
	}
	from, err := t.Start()
	if err != nil {
		return err
	}
	data, err := tfrecord.OpenDataset([]string{*train}, tfrecord.DatasetOptions{
		Rank: hvd.Rank(), Size: hvd.Size(), ShuffleBuffer: 1000, Seed: uint64(hvd.Rank()), Repeat: true})
	if err != nil {
		return err
	}
	defer data.Close()
	res, err := t.Train(data, from)
	if err != nil {
		return err
	}
	logf("trained from step %d to step %d of %d", from.Step, res.Step, sched.TrainSteps)
	return nil
}

// countRecords counts the examples of a TFRecord file.
func countRecords(path string) (int, error) {
	ds, err := tfrecord.OpenDataset([]string{path}, tfrecord.DatasetOptions{})
	if err != nil {
		return 0, err
	}
	defer ds.Close()
	n := 0
	for {
		_, err := ds.Next()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return 0, err
		}
		n++
	}
}
