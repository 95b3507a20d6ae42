# cmd/finetune: the main job on its embedded default, and its benchmark.
#
#   make run             set up a fresh machine (setup: Debian packages, venv, TensorFlow C library,
#                        MiniLM SavedModel; data: IMDB), build bin/finetune, fine-tune MiniLM on the
#                        IMDB subset of the default task with 2 ranks (bin/gorovodrun -np 2), evaluate on
#                        dev, predict test, export the serving model, print the dev accuracy
#   make bench-finetune  examples/s of 1 rank x 1 thread vs 2 ranks x 1 thread (scaling efficiency)
#                        and vs TensorFlow's MultiWorkerMirroredStrategy with 2 workers, same model,
#                        batch and records
#   make bench-amp       --amp's speed: MiniLM's three train steps (float32, bfloat16, float16) and
#                        float32 under Grappler's bfloat16 rewrite, in Python on one thread with a
#                        per-op profile, then finetune float32 vs --amp=bf16 on 1 and 2 ranks
#                        (speed-up, scaling efficiency against two independent jobs, compression,
#                        the word embeddings' rows against --sparse_as_dense)
#   make bench-amp-accuracy  the default task on 2 ranks with and without --amp (bfloat16 forced on
#                        a CPU where --amp alone runs float32): both dev accuracies and their
#                        difference, which must stay within 0.01; two full trainings, so not part
#                        of `make bench`
#   make bench-adasum-accuracy  the default task on 2 ranks averaging its gradients, with
#                        --use_adasum and with --use_adasum=updates: the dev accuracies and their
#                        differences, which must stay within 0.02 (two standard errors over 1,000
#                        dev reviews); three full trainings, so not part of `make bench`
#
# The end-to-end tests (equivalence, kill/resume, SIGINT, bad setups) are Go tests of
# ./cmd/finetune and run in `make test`'s go-test.

FINETUNE_BIN := $(ROOT)/bin/finetune
# The default task's output directory (cmd/finetune/config.go: defaultTask).
FINETUNE_OUT := $(CACHE)/finetune/imdb-minilm
# No mpi_yield_when_idle: a rank waiting for its peers' train step sleeps in horovod/mpi's
# negotiation wait on its own (docs/benchmarks.md: it changes neither CPU time nor examples/s),
# as under a user's plain mpirun.
FINETUNE_MPIRUN := $(MPIRUN)
# make run launches through bin/gorovodrun: its Ctrl-C reaches every rank at once and rank 0
# checkpoints, while a failed job ends within about 2 s (docs/faults.md).
FINETUNE_LAUNCH := $(GOROVODRUN_BIN) --oversubscribe

.PHONY: run finetune-bin bench-finetune bench-amp bench-amp-accuracy bench-adasum-accuracy
finetune-bin: setup
	$(GO) build -o $(FINETUNE_BIN) ./cmd/finetune

# A fresh fine-tuning every time (the output directory would otherwise resume, as run_classifier).
run: setup data finetune-bin
	rm -rf $(FINETUNE_OUT)
	cd $(ROOT) && TF_CPP_MIN_LOG_LEVEL=2 $(FINETUNE_LAUNCH) -np 2 $(FINETUNE_BIN)
	@echo "dev accuracy (eval_accuracy of $(FINETUNE_OUT)/eval_results.txt): $$(sed -n 's/^eval_accuracy = //p' $(FINETUNE_OUT)/eval_results.txt)"

BENCH_TARGETS += bench-finetune
bench-finetune: setup data finetune-bin
	cd $(ROOT) && $(PY) scripts/bench_finetune.py --finetune $(FINETUNE_BIN) --mpirun "$(FINETUNE_MPIRUN)" \
	  --saved_model $(CACHE)/model/imdb_minilm --data_dir $(CACHE)/data/imdb --work $(CACHE)/bench-finetune

BENCH_TARGETS += bench-amp
bench-amp: setup data finetune-bin
	cd $(ROOT) && TF_CPP_MIN_LOG_LEVEL=2 $(PY) scripts/amp_step_profile.py $(CACHE)/model/imdb_minilm 16 3
	cd $(ROOT) && $(PY) scripts/bench_finetune.py --amp --finetune $(FINETUNE_BIN) --mpirun "$(FINETUNE_MPIRUN)" \
	  --saved_model $(CACHE)/model/imdb_minilm --data_dir $(CACHE)/data/imdb --work $(CACHE)/bench-amp

bench-amp-accuracy: setup data
	cd $(ROOT) && GOROVOD_AMP_ACCURACY=1 TF_CPP_MIN_LOG_LEVEL=2 $(GO) test -count=1 -timeout 120m \
	  -run '^TestDefaultTaskAccuracyWithAndWithoutAMP$$' -v ./cmd/finetune

bench-adasum-accuracy: setup data
	cd $(ROOT) && GOROVOD_ADASUM_ACCURACY=1 TF_CPP_MIN_LOG_LEVEL=2 $(GO) test -count=1 -timeout 120m \
	  -run '^TestDefaultTaskAccuracyWithAndWithoutAdasum$$' -v ./cmd/finetune
