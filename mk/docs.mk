# docs: the benchmark charts, and TensorBoard over finetune's event files.
#
#   make plots        docs/img/*.png from the benchmark figures in docs/bench/*.tsv (each file names
#                     the command that produced its figures and the machine); tests/test_plots.py
#                     runs the script in `make test`'s py-test
#   make tensorboard  TensorBoard on `make run`'s output directory, or TENSORBOARD_LOGDIR, at
#                     TENSORBOARD_PORT (default 6006) on every interface; prints the URL

PLOTS_DATA         := $(ROOT)/docs/bench
PLOTS_OUT          := $(ROOT)/docs/img
TENSORBOARD_PORT   ?= 6006
TENSORBOARD_LOGDIR ?= $(FINETUNE_OUT)

.PHONY: plots tensorboard
plots: venv
	$(PY) $(ROOT)/scripts/plots/plot_benchmarks.py --data $(PLOTS_DATA) --out $(PLOTS_OUT)

tensorboard: venv
	@test -d '$(TENSORBOARD_LOGDIR)' || { echo "make tensorboard: no $(TENSORBOARD_LOGDIR)"; \
	  echo "  hint: run make run first, or give TENSORBOARD_LOGDIR=<finetune --output_dir>"; exit 1; }
	@echo "TensorBoard on $(TENSORBOARD_LOGDIR): http://localhost:$(TENSORBOARD_PORT)/ (or http://$$(hostname):$(TENSORBOARD_PORT)/ from elsewhere; Ctrl-C stops it)"
	$(VENV)/bin/tensorboard --logdir '$(TENSORBOARD_LOGDIR)' --port $(TENSORBOARD_PORT) --bind_all
