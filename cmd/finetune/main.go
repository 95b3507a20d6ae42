// Command finetune is BERT's run_classifier.py with Horovod, in Go: launched with
// `mpirun -np N finetune --do_train=true ...` it shards the data by rank, broadcasts rank 0's
// initial weights, averages the gradients of every step with a fused allreduce, and checkpoints,
// evaluates and predicts on rank 0, with run_classifier's flags and output files.
//
// Without flags it runs the embedded default task (MiniLM on an IMDB subset, see defaultTask) on
// the files prepared by `make setup model data`.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// run returns the process exit status: 0 on success, 2 for a command-line mistake, 1 otherwise.
func run(args []string) int {
	cfg, err := parseConfig(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var usage *usageError
	if errors.As(err, &usage) {
		fmt.Fprintf(os.Stderr, "finetune: %v\nRun finetune -help for the flags.\n", err)
		return 2
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "finetune: %v\n", err)
		return 1
	}
	if _, err := validate(&cfg, 0); err != nil {
		fmt.Fprintf(os.Stderr, "finetune: %v\n", err)
		return 1
	}
	return 0
}
