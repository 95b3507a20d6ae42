# horovod: the MPI conformance suite and the collective/fp16 benchmarks.
#
#   make test-mpi       the horovod/mpi backend tests and the conformance suite under mpirun -np 2
#                       and -np 3 (oversubscribed), the -np 2 run also writing and checking a timeline,
#                       and once more with a 4 KiB fusion threshold and a 3-entry negotiation cache;
#                       rank 1 alone without fusion or cache, and alone with a 2 s stall shutdown
#                       time while rank 0 stops for 4 s, each taking rank 0's settings;
#                       then a -np 2 job whose Init fails on rank 0 only must fail it on both ranks
#   make test-horovod-race  horovod's core (controller, negotiation, fusion, Reducer, objects,
#                       process sets, over the in-process backend), the trainer, and the MPI
#                       backend and conformance suite under mpirun -np 3, under the race detector
#   make test-multinode the same suites over two machines simulated on this one
#                       (scripts/fake-nodes: a network and a UTS namespace per host, veth pairs
#                       through a bridge, 198.18.0.0/15 addresses, TCP between them; needs root)
#                       in 2+2, 2+1, 1+1+1 and interleaved 2+2 layouts, checking local and cross
#                       ranks against each rank's hostname and an allreduce's bytes against the
#                       kernel's count on each host's interface, and a rank dying, stalling or
#                       freezing alone on one machine; then finetune's GPU placement per
#                       machine (with a GPU build of TensorFlow) and a 2+2 training run equal to
#                       one rank with 4x the batch
#   make bench-horovod  one mpirun -np 2 run: allreduce vs raw MPI_Allreduce (64 MiB, 4 KiB; MiniLM's
#                       gradients in float32, fp16 and bf16; grouped reducescatters fused and
#                       one call each), fp16 and bf16 conversion vs memcpy
#                       and vs github.com/x448/float16; then a Reducer step
#                       over MiniLM's gradients and a 128 MiB copy on one goroutine and on this
#                       rank's share of the cores, side by side, and Average's scaling pass over
#                       1 MiB with the AVX kernels and with the scalar loop
#   make bench-network  the allreduce of MiniLM's gradients (float32, fp16, bf16), 64 MiB and 4 KiB
#                       against raw MPI_Allreduce over 2 and 4 simulated machines of one rank each,
#                       their links shaped to 1 and 10 Gbit/s with 0.2 ms of delay
#                       (scripts/fake-nodes/bench-network.sh; needs root; not part of make bench)
#   make network-faults finetune on 2 simulated machines while nodeb's link goes down for good,
#                       goes down for 5 s, or loses 1% or 10% of its packets: how each job ends,
#                       after how long, its checkpoint and resume, its weights against an
#                       undisturbed run (scripts/fake-nodes/faults.sh; needs root; a report, and
#                       a test for the link down for good: rank 0 names nodeb, every rank ends
#                       within 91 s, the resume finishes)
#
# go-test runs the same suites as a job of size 1, the in-process multi-rank controller tests, and
# the failure tests (dead, stalled, frozen rank), which launch their own mpirun.

HVD_BUILD := $(CACHE)/horovod
# ip, for scripts/fake-nodes' network namespaces.
DEBS += iproute2
# A broken rank must fail the run, not hang it: stalls abort after a minute, and each mpirun is
# bounded as a last resort.
HVD_MPIRUN := HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=60 timeout 300 $(MPIRUN)
HVD_FUSED_RUN := -test.count=1 -test.run '^TestFusedAndGroupedAllreduce$$'
HVD_CHILD_RUN := -test.count=1 -test.run '^TestChild$$'

.PHONY: test-mpi test-horovod-race test-multinode bench-horovod bench-network network-faults
TEST_TARGETS  += test-mpi test-horovod-race test-multinode
BENCH_TARGETS += bench-horovod

test-mpi: debs
	@mkdir -p $(HVD_BUILD)
	cd $(ROOT) && $(GO) test -c -o $(HVD_BUILD)/mpi.test ./horovod/mpi
	cd $(ROOT) && $(GO) test -c -o $(HVD_BUILD)/conformance.test ./horovod/conformance
	$(HVD_MPIRUN) -np 3 $(HVD_BUILD)/mpi.test -test.count=1
	GOROVOD_MPI_TEST_PROCESS_SETS=1 $(HVD_MPIRUN) -np 3 $(HVD_BUILD)/mpi.test -test.count=1
	rm -f $(HVD_BUILD)/timeline.json
	# A timeline, with process sets allowed: adding one is in it.
	HOROVOD_TIMELINE=$(HVD_BUILD)/timeline.json HOROVOD_DYNAMIC_PROCESS_SETS=1 $(HVD_MPIRUN) -np 2 $(HVD_BUILD)/conformance.test -test.count=1
	$(HVD_MPIRUN) -np 3 $(HVD_BUILD)/conformance.test -test.count=1
	# Small fusion buffers and a nearly full negotiation cache: batches split, signatures renegotiated;
	# with process sets allowed (MPI_THREAD_MULTIPLE), which TestProcessSets needs.
	HOROVOD_FUSION_THRESHOLD=4096 HOROVOD_CACHE_CAPACITY=3 HOROVOD_DYNAMIC_PROCESS_SETS=1 $(HVD_MPIRUN) -np 3 $(HVD_BUILD)/conformance.test -test.count=1
	# Rank 1 alone without fusion or cache (an environment set per machine): it takes rank 0's
	# settings, or its collectives would not match the others' (MPI_ERR_TRUNCATE, wrong sums).
	$(HVD_MPIRUN) -np 1 $(HVD_BUILD)/conformance.test $(HVD_FUSED_RUN) : \
	  -np 1 -x HOROVOD_FUSION_THRESHOLD=0 -x HOROVOD_CACHE_CAPACITY=0 $(HVD_BUILD)/conformance.test $(HVD_FUSED_RUN) : \
	  -np 1 $(HVD_BUILD)/conformance.test $(HVD_FUSED_RUN)
	# Rank 1 alone with a 2 s stall shutdown time while rank 0 stops for 4 s (TestChild's mode stop):
	# it takes rank 0's stall times, or its watchdog would abort the job.
	GOROVOD_CONFORMANCE_CHILD=stop GOROVOD_CONFORMANCE_STOP_RANK=0 $(HVD_MPIRUN) -np 1 $(HVD_BUILD)/conformance.test $(HVD_CHILD_RUN) : \
	  -np 1 -x HOROVOD_STALL_CHECK_TIME_SECONDS=1 -x HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=2 $(HVD_BUILD)/conformance.test $(HVD_CHILD_RUN)
	# Init failing on rank 0 only (it alone creates the timeline, here in a missing directory) must
	# fail Init on both ranks, naming rank 0. No stall shutdown: a hang is caught by the timeout.
	rm -rf $(HVD_BUILD)/missing
	HOROVOD_TIMELINE=$(HVD_BUILD)/missing/timeline.json GOROVOD_CONFORMANCE_INIT_FAILURE=1 HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=0 \
		timeout 60 $(MPIRUN) -np 2 $(HVD_BUILD)/conformance.test -test.count=1 -test.v -test.run '^TestInitFailureReachesEveryRank$$'
	# Process sets given to Init, without HOROVOD_DYNAMIC_PROCESS_SETS: Init opens MPI for them.
	GOROVOD_CONFORMANCE_INIT_SETS=1 $(HVD_MPIRUN) -np 3 $(HVD_BUILD)/conformance.test -test.count=1 -test.run '^TestProcessSetsGivenToInit$$'

# The race detector over horovod's goroutines: the caller's and the background loop's negotiation
# rounds, the Reducer's parallel passes, the shared-memory segments mapped and freed beside the
# collectives, process sets' threads under MPI_THREAD_MULTIPLE (with a 4 KiB fusion threshold and
# a 3-entry cache, batches split and signatures renegotiated), and the trainer's ranks, signals and
# summaries (on the tiny model). About 3 min on 2 cores, builds cached.
HVD_RACE := $(HVD_BUILD)/race
test-horovod-race: debs tflib $(CACHE)/model/tiny/.stamp
	@mkdir -p $(HVD_RACE)
	cd $(ROOT) && GOROVOD_TEST_REQUIRE=1 $(GO) test -race -count=1 -timeout 15m ./horovod ./horovod/local ./horovod/internal/parallel ./bertgraph/trainer
	cd $(ROOT) && $(GO) test -race -c -o $(HVD_RACE)/mpi.test ./horovod/mpi
	cd $(ROOT) && $(GO) test -race -c -o $(HVD_RACE)/conformance.test ./horovod/conformance
	GOROVOD_MPI_TEST_PROCESS_SETS=1 $(HVD_MPIRUN) -np 3 $(HVD_RACE)/mpi.test -test.count=1
	HOROVOD_FUSION_THRESHOLD=4096 HOROVOD_CACHE_CAPACITY=3 HOROVOD_DYNAMIC_PROCESS_SETS=1 $(HVD_MPIRUN) -np 3 $(HVD_RACE)/conformance.test -test.count=1

# Each job is bounded; the wrapper fails, saying why, where it cannot make network namespaces.
HVD_FAKE_NODES := timeout -k 10 120 $(ROOT)/scripts/fake-nodes/mpirun.sh
HVD_FAKE_NODES_ENV := -x HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=60

test-multinode: debs tflib
	$(VENV)/bin/shellcheck -x $(ROOT)/scripts/fake-nodes/*.sh
	@mkdir -p $(HVD_BUILD)/multinode
	cd $(ROOT) && $(GO) test -c -o $(HVD_BUILD)/multinode/mpi.test ./horovod/mpi
	cd $(ROOT) && $(GO) test -c -o $(HVD_BUILD)/multinode/conformance.test ./horovod/conformance
	$(HVD_FAKE_NODES) nodea:2,nodeb:1 $(HVD_FAKE_NODES_ENV) $(HVD_BUILD)/multinode/mpi.test -test.count=1
	$(HVD_FAKE_NODES) nodea:2,nodeb:2 $(HVD_FAKE_NODES_ENV) $(HVD_BUILD)/multinode/conformance.test -test.count=1
	# With process sets allowed: TestProcessSets' set of ranks 0 and 2 spans both machines (TCP under
	# MPI_THREAD_MULTIPLE beside the job's collectives).
	$(HVD_FAKE_NODES) nodea:2,nodeb:1 $(HVD_FAKE_NODES_ENV) -x HOROVOD_DYNAMIC_PROCESS_SETS=1 $(HVD_BUILD)/multinode/conformance.test -test.count=1
	$(HVD_FAKE_NODES) nodea:1,nodeb:1,nodec:1 $(HVD_FAKE_NODES_ENV) $(HVD_BUILD)/multinode/conformance.test -test.count=1
	# Ranks dealt round-robin: local rank is not rank modulo local size.
	$(HVD_FAKE_NODES) nodea:2,nodeb:2 --map-by node $(HVD_FAKE_NODES_ENV) $(HVD_BUILD)/multinode/conformance.test -test.count=1
	# The last rank, alone on nodeb, dies, stalls or freezes: the job must still end, with a message.
	GOROVOD_CONFORMANCE_LAUNCHER='$(ROOT)/scripts/fake-nodes/mpirun.sh nodea:2,nodeb:1' \
		timeout 150 $(HVD_BUILD)/multinode/conformance.test -test.count=1 -test.run '^Test(DeadRank|StalledRank|FrozenRank)'
	cd $(ROOT)/cmd/finetune && GOROVOD_TEST_FAKE_NODES=1 $(GO) test -count=1 -timeout 300s -run '^TestTwoMachines$$' .

bench-horovod: debs
	@mkdir -p $(HVD_BUILD)
	cd $(ROOT) && $(GO) build -o $(HVD_BUILD)/bench ./horovod/internal/bench
	$(HVD_MPIRUN) -np 2 $(HVD_BUILD)/bench
	# A process set of ranks 0 and 2 of 3 against MPI_Allreduce on a communicator split alike.
	HOROVOD_DYNAMIC_PROCESS_SETS=1 $(HVD_MPIRUN) -np 3 $(HVD_BUILD)/bench -only 'process set'
	cd $(ROOT) && $(GO) test -run '^$$' -bench 'ReducerStep|Scale|AdasumPass' -benchtime 10x ./horovod
	cd $(ROOT) && $(GO) test -run '^$$' -bench 'Copy' -benchtime 10x ./horovod/internal/parallel

bench-network: debs
	@mkdir -p $(HVD_BUILD)
	cd $(ROOT) && $(GO) build -o $(HVD_BUILD)/bench ./horovod/internal/bench
	$(ROOT)/scripts/fake-nodes/bench-network.sh $(HVD_BUILD)/bench

# The tiny model's stamp by its path: mk/model.mk, which names it, is read after this file.
network-faults: debs tflib $(CACHE)/model/tiny/.stamp $(IMDB_DIR)/.stamp
	command -v nft >/dev/null || $(MAKE) --no-print-directory debs DEBS=nftables
	cd $(ROOT) && $(GO) build -o $(HVD_BUILD)/finetune ./cmd/finetune
	PYTHON=$(PY) $(ROOT)/scripts/fake-nodes/faults.sh $(HVD_BUILD)/finetune $(CACHE)/model/tiny $(CACHE)/data/imdb $(HVD_BUILD)/faults
