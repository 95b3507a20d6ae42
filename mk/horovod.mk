# horovod: the MPI conformance suite and the collective/fp16 benchmarks.
#
#   make test-mpi       the horovod/mpi backend tests and the conformance suite under mpirun -np 2
#                       and -np 3 (oversubscribed), the -np 2 run also writing and checking a timeline,
#                       and once more with a 4 KiB fusion threshold and a 3-entry negotiation cache;
#                       then a -np 2 job whose Init fails on rank 0 only must fail it on both ranks
#   make bench-horovod  one mpirun -np 2 run: allreduce vs raw MPI_Allreduce (64 MiB, 4 KiB), fp16
#                       conversion vs memcpy and vs github.com/x448/float16
#
# go-test runs the same suites as a job of size 1, the in-process multi-rank controller tests, and
# the failure tests (dead, stalled, frozen rank), which launch their own mpirun.

HVD_BUILD := $(CACHE)/horovod
# A broken rank must fail the run, not hang it: stalls abort after a minute, and each mpirun is
# bounded as a last resort.
HVD_MPIRUN := HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=60 timeout 300 $(MPIRUN)

.PHONY: test-mpi bench-horovod
TEST_TARGETS  += test-mpi
BENCH_TARGETS += bench-horovod

test-mpi: debs
	@mkdir -p $(HVD_BUILD)
	cd $(ROOT) && $(GO) test -c -o $(HVD_BUILD)/mpi.test ./horovod/mpi
	cd $(ROOT) && $(GO) test -c -o $(HVD_BUILD)/conformance.test ./horovod/conformance
	$(HVD_MPIRUN) -np 3 $(HVD_BUILD)/mpi.test -test.count=1
	rm -f $(HVD_BUILD)/timeline.json
	HOROVOD_TIMELINE=$(HVD_BUILD)/timeline.json $(HVD_MPIRUN) -np 2 $(HVD_BUILD)/conformance.test -test.count=1
	$(HVD_MPIRUN) -np 3 $(HVD_BUILD)/conformance.test -test.count=1
	# Small fusion buffers and a nearly full negotiation cache: batches split, signatures renegotiated.
	HOROVOD_FUSION_THRESHOLD=4096 HOROVOD_CACHE_CAPACITY=3 $(HVD_MPIRUN) -np 3 $(HVD_BUILD)/conformance.test -test.count=1
	# Init failing on rank 0 only (it alone creates the timeline, here in a missing directory) must
	# fail Init on both ranks, naming rank 0. No stall shutdown: a hang is caught by the timeout.
	rm -rf $(HVD_BUILD)/missing
	HOROVOD_TIMELINE=$(HVD_BUILD)/missing/timeline.json GOROVOD_CONFORMANCE_INIT_FAILURE=1 HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=0 \
		timeout 60 $(MPIRUN) -np 2 $(HVD_BUILD)/conformance.test -test.count=1 -test.v -test.run '^TestInitFailureReachesEveryRank$$'

bench-horovod: debs
	@mkdir -p $(HVD_BUILD)
	cd $(ROOT) && $(GO) build -o $(HVD_BUILD)/bench ./horovod/internal/bench
	$(HVD_MPIRUN) -np 2 $(HVD_BUILD)/bench
