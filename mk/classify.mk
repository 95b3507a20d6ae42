# cmd/classify: serve finetune's export from the command line.
#
#   make classify-bin  build bin/classify (needs setup's TensorFlow C library, as finetune-bin)
#
#   bin/classify --model .cache/finetune/imdb-minilm/export < reviews.txt
#
# `make run` does not build it. Its tests (the CLI against Classifier.Predict on an exported tiny
# model) are Go tests of ./cmd/classify and run in `make test`'s go-test.

CLASSIFY_BIN := $(ROOT)/bin/classify

.PHONY: classify-bin
classify-bin: setup
	$(GO) build -o $(CLASSIFY_BIN) ./cmd/classify
