// Package trainer is data-parallel fine-tuning of a bertgraph.Model with Horovod's recipe, as a
// library: what cmd/finetune trains through, without its flags and tasks.
//
// Every rank makes the same calls in the same order:
//
//	t, err := trainer.New(hvd, model, trainer.Options{Dir: dir, Schedule: sched, BatchSize: 32, ClipNorm: 1})
//	from, err := t.Start()          // rank 0's latest checkpoint in Dir on every rank, or rank 0's weights broadcast
//	res, err := t.Train(data, from) // train step, fused allreduce, apply; rank 0 checkpoints and writes summaries
//
// A step runs the model's train step on this rank's batch, averages the gradients over the ranks
// with one fused allreduce (the word embeddings' looked-up rows by allgather, unless
// Options.SparseAsDense), and applies them with the global-norm clipping after the average. The
// schedule (bertgraph/schedule) fixes the step count before training starts; data is a
// bertgraph/tfrecord dataset of run_classifier features opened with Repeat. Options.Stop stops
// every rank after the same step with a checkpoint; Result.Phases says where this rank's steps
// spent their time.
//
// A complete program is in bertgraph/trainer/example.
package trainer
