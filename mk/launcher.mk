# cmd/gorovodrun: horovodrun's MPI launcher for gorovod jobs, built next to bin/finetune.
#
#   make gorovodrun-bin  build bin/gorovodrun (make finetune-bin, and so make run, build it too)
#   make test-launcher   bin/gorovodrun for real: local ranks, exit status, Ctrl-C forwarded to
#                        every rank at once, kill -9 of gorovodrun ending its job, no or foreign
#                        mpirun, and ranks on two machines simulated
#                        on this one (scripts/fake-nodes; needs root) seeing their hostnames and
#                        the forwarded HOROVOD_* settings, and machines with a docker bridge each
#                        probed for the interface they share; then horovod's conformance suite under
#                        bin/gorovodrun, -np 3 here and 2+2 on the simulated machines (also over
#                        the docker-bridged ones, no interface named), where its
#                        topology test reads the layout from GOROVOD_FAKE_NODES, which reaches the
#                        ranks only because gorovodrun forwards GOROVOD_* variables
#
# go-test runs the same tests but the simulated machines, with the test binary as gorovodrun.

GOROVODRUN_BIN := $(ROOT)/bin/gorovodrun
LAUNCHER_BUILD := $(CACHE)/launcher
LAUNCHER_FAKE_NODES := --network-interface lo \
	--mpi-args "--mca plm_rsh_agent $(ROOT)/scripts/fake-nodes/rsh-agent.sh --mca oob_tcp_if_include lo --mca btl tcp,self,vader"
# Hosts with network stacks of their own and a docker bridge each (scripts/fake-nodes/login.sh),
# no interface named: gorovodrun probes them and MPI keeps off docker0, where the job would hang.
LAUNCHER_LOGIN_NODE := \
	--mpi-args "--mca plm_rsh_agent $(ROOT)/scripts/fake-nodes/rsh-agent.sh --mca oob_tcp_if_include 198.18.0.0/15 --mca btl tcp,self,vader"

.PHONY: gorovodrun-bin test-launcher
TEST_TARGETS += test-launcher

# Static (no cgo: Go's own resolver): the launcher starts itself on every host to probe the
# network interfaces, so it is installed beside the program and runs on any Linux machine.
gorovodrun-bin:
	CGO_ENABLED=0 $(GO) build -o $(GOROVODRUN_BIN) ./cmd/gorovodrun

# The launcher is installed with the program it launches.
finetune-bin: gorovodrun-bin

# Each mpirun is bounded in the tests themselves; the whole run here as a last resort.
test-launcher: debs gorovodrun-bin
	cd $(ROOT)/cmd/gorovodrun && GOROVODRUN_BIN=$(GOROVODRUN_BIN) GOROVODRUN_TEST_REQUIRE_MPIRUN=1 GOROVOD_TEST_FAKE_NODES=1 \
		timeout -k 10 120 $(GO) test -count=1 -timeout 90s -run '^TestLaunch' .
	@mkdir -p $(LAUNCHER_BUILD)
	cd $(ROOT) && $(GO) test -c -o $(LAUNCHER_BUILD)/conformance.test ./horovod/conformance
	timeout -k 10 120 $(GOROVODRUN_BIN) -np 3 --stall-check-shutdown-time-seconds 60 --fusion-threshold-mb 1 \
		$(LAUNCHER_BUILD)/conformance.test -test.count=1
	GOROVOD_FAKE_NODES=nodea:2,nodeb:2 timeout -k 10 120 $(GOROVODRUN_BIN) -np 4 -H nodea:2,nodeb:2 $(LAUNCHER_FAKE_NODES) \
		--stall-check-shutdown-time-seconds 60 $(LAUNCHER_BUILD)/conformance.test -test.count=1
	GOROVOD_FAKE_NODES=nodea:2,nodeb:2 timeout -k 10 120 $(ROOT)/scripts/fake-nodes/login.sh nodea,nodeb \
		$(GOROVODRUN_BIN) -np 4 -H nodea:2,nodeb:2 $(LAUNCHER_LOGIN_NODE) \
		--stall-check-shutdown-time-seconds 60 $(LAUNCHER_BUILD)/conformance.test -test.count=1
