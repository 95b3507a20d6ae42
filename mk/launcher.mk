# cmd/gorovodrun: horovodrun's MPI launcher for gorovod jobs, built next to bin/finetune.
#
#   make gorovodrun-bin  build bin/gorovodrun (make finetune-bin, and so make run, build it too)
#   make test-launcher   bin/gorovodrun for real: local ranks, exit status, Ctrl-C with its
#                        sigkill timeout, no or foreign mpirun, and ranks on two machines simulated
#                        on this one (scripts/fake-nodes; needs root) seeing their hostnames and
#                        the forwarded HOROVOD_* settings
#
# go-test runs the same tests but the simulated machines, with the test binary as gorovodrun.

GOROVODRUN_BIN := $(ROOT)/bin/gorovodrun

.PHONY: gorovodrun-bin test-launcher
TEST_TARGETS += test-launcher

gorovodrun-bin:
	$(GO) build -o $(GOROVODRUN_BIN) ./cmd/gorovodrun

# The launcher is installed with the program it launches.
finetune-bin: gorovodrun-bin

# Each mpirun is bounded in the tests themselves; the whole run here as a last resort.
test-launcher: debs gorovodrun-bin
	cd $(ROOT)/cmd/gorovodrun && GOROVODRUN_BIN=$(GOROVODRUN_BIN) GOROVODRUN_TEST_REQUIRE_MPIRUN=1 GOROVOD_TEST_FAKE_NODES=1 \
		timeout -k 10 120 $(GO) test -count=1 -timeout 90s -run '^TestLaunch' .
