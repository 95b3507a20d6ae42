# Package tf: the TensorFlow C API binding. Its plain tests run in `go-test`; here are the
# race-detector run of its concurrency tests and its benchmark against Python TensorFlow.

.PHONY: test-tf-race
TEST_TARGETS += test-tf-race

# Run/Close from many goroutines under the race detector (the rest of tf's tests run in go-test).
test-tf-race:
	$(GO) test -count=1 -race -run 'Concurrent|Close' ./tf

.PHONY: bench-tf
BENCH_TARGETS += bench-tf

# Session.Run per-call overhead from Go beside Python's session.run and concrete function.
bench-tf:
	GO=$(GO) $(PY) $(ROOT)/tf/testdata/bench.py
