// Command finetune is BERT's run_classifier.py with Horovod, in Go: launched with
// `mpirun -np N finetune --do_train=true ...` it shards the data by rank, broadcasts rank 0's
// initial weights, averages the gradients of every step with a fused allreduce, and checkpoints,
// evaluates and predicts on rank 0, with run_classifier's flags and output files.
//
// Without flags it runs the embedded default task (MiniLM on an IMDB subset, see defaultTask) on
// the files prepared by `make setup`.
package main

import (
	"os"

	// Under mpirun, horovod.Init joins the job through the MPI driver this import registers.
	_ "github.com/gorovod/gorovod/horovod/mpi"
)

func main() {
	os.Exit(run(os.Args[1:]))
}
