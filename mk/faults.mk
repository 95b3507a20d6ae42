# Fault injection into 2-rank finetune jobs of the tiny model (docs/faults.md).
#
#   make test-faults   scripts/faults/fault-times.sh under bin/gorovodrun: a mistyped flag, a
#                      setup error, kill -9 of a rank mid-training, Ctrl-C, a second run into a
#                      busy --output_dir, a resume past a truncated checkpoint, and SIGSTOP of a
#                      rank; prints the seconds each job took to end and fails when one misses
#                      its target (2 s for a failure before training, 5 s after a rank's death).
#                      A few minutes; not part of make test (the Go tests of ./cmd/finetune,
#                      ./cmd/gorovodrun and ./horovod/conformance check the same behaviour with
#                      looser time bounds). FAULT_LAUNCHER="mpirun ... -np 2" measures another
#                      launch line.

.PHONY: test-faults
test-faults: setup finetune-bin
	$(ROOT)/scripts/faults/fault-times.sh $(FAULT_LAUNCHER)
