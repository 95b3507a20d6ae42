package trainer_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"testing"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/bertgraph/schedule"
	"github.com/gorovod/gorovod/bertgraph/tfrecord"
	"github.com/gorovod/gorovod/bertgraph/trainer"
	"github.com/gorovod/gorovod/bertgraph/trainer/internal/synthetic"
	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/tf/checkpoint"
	"github.com/gorovod/gorovod/tf/testenv"
)

// Fine-tunes the tiny SavedModel of `make setup` for one epoch of 32 examples, 8 per step, on
// one rank (under mpirun, on every rank), and shows the checkpoint of its last step.
func Example() {
	hvd, err := horovod.Init()
	if err != nil {
		log.Fatal(err)
	}
	defer hvd.Shutdown()
	model, err := bertgraph.Load(tinyModel, bertgraph.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer model.Close()
	sched, err := schedule.New(32, 8, 1, 0.1, 1e-3, hvd.Size())
	if err != nil {
		log.Fatal(err)
	}
	t, err := trainer.New(hvd, model, trainer.Options{Dir: outputDir, Schedule: sched, BatchSize: 8, ClipNorm: 1,
		Logf: func(string, ...any) {}})
	if err != nil {
		log.Fatal(err)
	}
	from, err := t.Start()
	if err != nil {
		log.Fatal(err)
	}
	data, err := tfrecord.OpenDataset([]string{trainRecords}, tfrecord.DatasetOptions{Rank: hvd.Rank(), Size: hvd.Size(), Repeat: true})
	if err != nil {
		log.Fatal(err)
	}
	defer data.Close()
	res, err := t.Train(data, from)
	if err != nil {
		log.Fatal(err)
	}
	latest, _, _, err := checkpoint.Latest(outputDir)
	fmt.Println(res.Step, filepath.Base(latest), err)
	// Output: 4 model.ckpt-4 <nil>
}

// The fixtures of Example: the tiny model, a fresh output directory, and 32 random examples in
// the model's vocabulary as run_classifier's train.tf_record.
var tinyModel, outputDir, trainRecords string

func TestMain(m *testing.M) {
	tinyModel = testenv.TinyModel.RequireMain()
	dir, err := os.MkdirTemp("", "trainer-test-")
	if err == nil {
		outputDir, trainRecords = filepath.Join(dir, "out"), filepath.Join(dir, "train.tf_record")
		err = synthetic.WriteExamples(trainRecords, 32, 32, 128, 1)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
