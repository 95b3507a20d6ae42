# Package tf: the TensorFlow C API binding. Its plain tests run in `go-test`; here are the
# race-detector run of its concurrency tests, its benchmark against Python TensorFlow, and the
# train step on the C library of other TensorFlow versions (make bench-tf-versions
# [TF_VERSIONS="2.13.1 2.21.0"]).

.PHONY: test-tf-race
TEST_TARGETS += test-tf-race

# Run/Close from many goroutines, and tensors over Go memory that TensorFlow releases from its
# own threads, under the race detector (the rest of tf's tests run in go-test).
test-tf-race: tflib
	$(GO) test -count=1 -race -run 'Concurrent|Close|TensorOver' ./tf

.PHONY: bench-tf
BENCH_TARGETS += bench-tf

# Session.Run per-call overhead from Go beside Python's session.run and concrete function.
bench-tf: setup
	GO=$(GO) $(PY) $(ROOT)/tf/testdata/bench.py

.PHONY: bench-tf-versions
# Not in `make bench`: it downloads three tensorflow-cpu wheels (about 600 MB) into
# .cache/tfversions and times MiniLM's train step on each one's C library, float32 and bfloat16,
# 1 thread, alternating versions (scripts/tf_versions.sh; ROUNDS, STEPS, BATCH, PRECISIONS).
bench-tf-versions: tflib $(MINILM_CKPT_DIR)/.stamp
	PY=$(PY) GO=$(GO) $(ROOT)/scripts/tf_versions.sh $(TF_VERSIONS)
