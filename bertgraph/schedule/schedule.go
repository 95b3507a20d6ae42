// Package schedule computes the training length and the learning rate of BERT fine-tuning with
// Horovod: the step count of run_classifier.py divided by the number of ranks, the learning rate
// scaled by the number of ranks, linear warmup then linear decay to zero (BERT's optimization.py:
// polynomial_decay with power 1 and end 0, replaced by init*step/warmup while step < warmup).
package schedule

import (
	"fmt"
	"math"
)

// Schedule is the learning-rate schedule of one training run. The zero value is not useful; build
// it with New.
type Schedule struct {
	// TrainSteps is the number of optimizer steps of the whole run (every rank takes each step).
	TrainSteps int64
	// WarmupSteps is the number of leading steps whose learning rate rises linearly from zero.
	WarmupSteps int64
	// PeakLR is the learning rate after warmup: the flag's value times the number of ranks. A
	// run that combines its gradients with Adasum sets it back to the flag's value, as Horovod's
	// examples do (finetune --use_adasum).
	PeakLR float64
}

// New returns the schedule of a run over numExamples training examples (all ranks together) with
// batchPerRank examples per rank and step, for epochs passes, on size ranks.
//
// As run_classifier.py: num_train_steps = int(examples / batch * epochs), here with the global
// batch batchPerRank*size, and num_warmup_steps = int(num_train_steps * warmupProportion).
func New(numExamples, batchPerRank int, epochs, warmupProportion, learningRate float64, size int) (Schedule, error) {
	switch {
	case numExamples <= 0:
		return Schedule{}, fmt.Errorf("schedule: %d training examples, need at least one", numExamples)
	case batchPerRank <= 0 || size <= 0:
		return Schedule{}, fmt.Errorf("schedule: batch %d per rank on %d ranks", batchPerRank, size)
	case !(epochs > 0):
		return Schedule{}, fmt.Errorf("schedule: num_train_epochs %v must be positive", epochs)
	case !(warmupProportion >= 0 && warmupProportion <= 1):
		return Schedule{}, fmt.Errorf("schedule: warmup_proportion %v outside [0, 1]", warmupProportion)
	case !(learningRate > 0):
		return Schedule{}, fmt.Errorf("schedule: learning_rate %v must be positive", learningRate)
	}
	exact := float64(numExamples) / float64(batchPerRank) * epochs / float64(size)
	if exact >= math.MaxInt64 { // converted, it would wrap to a negative count
		return Schedule{}, fmt.Errorf("schedule: %d examples / (batch %d x %d ranks) x %v epochs is more steps than an int64 counts",
			numExamples, batchPerRank, size, epochs)
	}
	steps := int64(exact)
	if steps < 1 {
		return Schedule{}, fmt.Errorf("schedule: %d examples / (batch %d x %d ranks) x %v epochs is less than one step",
			numExamples, batchPerRank, size, epochs)
	}
	return Schedule{
		TrainSteps:  steps,
		WarmupSteps: int64(float64(steps) * warmupProportion),
		PeakLR:      learningRate * float64(size),
	}, nil
}

// LearningRate returns the rate applied by the update at global step step (0 for the first update,
// as in BERT, whose first warmup step has rate zero).
func (s Schedule) LearningRate(step int64) float64 {
	if step < s.WarmupSteps {
		return s.PeakLR * float64(step) / float64(s.WarmupSteps)
	}
	if step >= s.TrainSteps {
		return 0
	}
	return s.PeakLR * (1 - float64(step)/float64(s.TrainSteps))
}
