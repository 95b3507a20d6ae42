// Command stepbench times the training step of a SavedModel from Go, on the TensorFlow C
// library it runs against: load, one warm-up step, then -steps steps of TrainStep + Apply on a
// synthetic batch, one line per step on stdout:
//
//	tf_version <TAB> precision <TAB> step <TAB> seconds
//
// scripts/tf_versions.sh runs it against several TensorFlow versions' C libraries (through
// LD_LIBRARY_PATH, which the binary's RUNPATH yields to) and compares them. A SavedModel that
// the library cannot load ends the run with exit status 1 and TensorFlow's message.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/tf"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("stepbench: ")
	dir := flag.String("model", ".cache/model/imdb_minilm", "training SavedModel directory")
	precision := flag.String("precision", "float32", "train step precision: float32, bfloat16 or float16")
	batch := flag.Int("batch", 16, "examples per step")
	steps := flag.Int("steps", 3, "timed steps, after one warm-up step")
	threads := flag.Int("threads", 1, "TensorFlow intra-op and inter-op threads")
	flag.Parse()
	p, err := bertgraph.ParsePrecision(*precision)
	if err != nil {
		log.Fatal(err)
	}
	if err := tf.ReuseFreedMemory(); err != nil { // as finetune does
		log.Fatal(err)
	}
	n := int32(*threads)
	m, err := bertgraph.Load(*dir, bertgraph.Options{Session: &tf.SessionOptions{IntraOpThreads: n, InterOpThreads: n}, Precision: p})
	if err != nil {
		log.Fatalf("TensorFlow %s: %v", tf.Version(), err)
	}
	defer m.Close()
	b := bertgraph.SyntheticBatch(m, *batch)
	grads := m.NewFlatTensors()
	for i := -1; i < *steps; i++ {
		start := time.Now()
		if _, err := m.TrainStep(b, bertgraph.DropoutSeed{0, int64(i)}, grads); err != nil {
			log.Fatalf("TensorFlow %s: train step: %v", tf.Version(), err)
		}
		if _, err := m.Apply(grads, 1, 1e-5, 1); err != nil {
			log.Fatalf("TensorFlow %s: apply: %v", tf.Version(), err)
		}
		if i >= 0 { // step -1 warms up: Grappler and the first allocations
			fmt.Fprintf(os.Stdout, "%s\t%s\t%d\t%.4f\n", tf.Version(), p, i, time.Since(start).Seconds())
		}
	}
}
