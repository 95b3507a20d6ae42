# Peer benchmark: gorovod side by side with the real Horovod, built from source on this machine.
#
#   make bench-peer  builds Horovod $(PEER_HOROVOD_VERSION) (MPI only, TensorFlow, CPU operations over
#                    MPI) against tensorflow-cpu $(PEER_TF_VERSION) in its own virtualenv under
#                    .cache/peer (once: about 3 minutes on 2 cores; rebuilt when the pins change),
#                    then prints in one run, for raw MPI, Horovod and gorovod: allreduce (Sum,
#                    Average, Average with fp16 compression, Adasum) from 4 KiB to 256 MiB,
#                    allgather, broadcast, reducescatter (Sum, Average), alltoall (even splits) and a grouped
#                    reducescatter of 64 tensors, an allreduce in a process set of the first and
#                    last rank (a run of its own on each side), on 2 and 3 ranks (scripts/bench_peer: Horovod's
#                    side under mpirun, and the table; gorovod's and raw MPI's side is horovod/internal/bench -peer);
#                    then Horovod's Adasum of known inputs against gorovod's on 2 and 4 ranks, float32
#                    and float16 (scripts/bench_peer/adasum_check.py, bench -peer-adasum: fails over
#                    1e-5 in float32, 4e-3 in float16);
#                    then fine-tuning MiniLM at 1 and 2 ranks, gorovod's finetune against the
#                    exporter's model under Horovod (DistributedGradientTape), at Horovod's
#                    defaults and with mpi_yield_when_idle, and the initial broadcast of the
#                    model's variables (scripts/bench_peer/finetune.py). The whole run: 15 minutes
#                    alone on 2 cores with PEER_FINETUNE_REPEATS=3.
#
# Not part of `make test` or `make bench`: it needs cmake, g++ and libopenmpi-dev, and the build
# takes minutes. PEER_SIZES and PEER_RANKS narrow the run, e.g.
# `make bench-peer PEER_SIZES=4K,1M PEER_RANKS=2`; PEER_FINETUNE_STEPS and PEER_FINETUNE_REPEATS
# size the fine-tuning rows (timed steps per run, interleaved runs of which the best counts).

PEER_HOROVOD_VERSION := 0.28.1
# The newest TensorFlow Horovod 0.28.1 compiles against (its C++ ABI and op registration).
PEER_TF_VERSION      := 2.13.1
PEER_DIR             := $(CACHE)/peer
PEER_VENV            := $(PEER_DIR)/venv-hvd$(PEER_HOROVOD_VERSION)-tf$(PEER_TF_VERSION)
PEER_PY              := $(PEER_VENV)/bin/python
PEER_RANKS           ?= 2 3
PEER_SIZES           ?= 4K,64K,1M,16M,64M,256M
PEER_MPIRUN          := timeout 1800 $(MPIRUN)
PEER_FINETUNE_STEPS   ?= 4
PEER_FINETUNE_REPEATS ?= 1

.PHONY: bench-peer peer-horovod
peer-horovod: $(PEER_VENV)/.stamp

# Horovod's setup.py imports TensorFlow at build time, so it builds without isolation in a
# virtualenv that already holds TensorFlow; cmake and a C++ compiler come from Debian. A
# virtualenv whose creation was cut short (Debian links its python before ensurepip runs) has
# no pip: it is made again.
$(PEER_VENV)/.stamp: | debs
	@command -v cmake >/dev/null && command -v g++ >/dev/null || { \
	  echo "make peer-horovod: cmake and g++ are needed to build Horovod"; \
	  echo "  hint: apt-get install cmake g++"; exit 1; }
	@mkdir -p $(PEER_DIR)
	$(PEER_PY) -m pip --version >/dev/null 2>&1 || python3 -m venv --clear $(PEER_VENV)
	$(PEER_PY) -m pip install -q --disable-pip-version-check 'tensorflow-cpu==$(PEER_TF_VERSION)' 'wheel' 'setuptools<70' 'cloudpickle' 'psutil' 'pyyaml' 'packaging'
	HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
	  HOROVOD_WITHOUT_GLOO=1 HOROVOD_CPU_OPERATIONS=MPI MAKEFLAGS=-j2 \
	  $(PEER_PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-cache-dir \
	  'horovod==$(PEER_HOROVOD_VERSION)'
	$(PEER_PY) -c 'import horovod.tensorflow as hvd; assert hvd.mpi_built() and not hvd.gloo_built(), "Horovod built without MPI"'
	@touch $@

# Each side runs alone on the machine (gorovod's with raw MPI side by side, then Horovod's), per
# job size; the table joins them.
bench-peer: peer-horovod setup data finetune-bin
	@mkdir -p $(PEER_DIR)
	cd $(ROOT) && $(GO) build -o $(PEER_DIR)/bench ./horovod/internal/bench
	for np in $(PEER_RANKS); do \
	  $(PEER_MPIRUN) -np $$np $(PEER_DIR)/bench -peer $(PEER_SIZES) > $(PEER_DIR)/gorovod-$$np.tsv; \
	  $(PEER_MPIRUN) -np $$np $(PEER_PY) $(ROOT)/scripts/bench_peer/horovod_collectives.py $(PEER_SIZES) > $(PEER_DIR)/horovod-$$np.tsv; \
	  HOROVOD_DYNAMIC_PROCESS_SETS=1 $(PEER_MPIRUN) -np $$np $(PEER_DIR)/bench -peer $(PEER_SIZES) -only process_set >> $(PEER_DIR)/gorovod-$$np.tsv; \
	  $(PEER_MPIRUN) -np $$np $(PEER_PY) $(ROOT)/scripts/bench_peer/horovod_collectives.py $(PEER_SIZES) --process-sets >> $(PEER_DIR)/horovod-$$np.tsv; \
	  $(PEER_PY) $(ROOT)/scripts/bench_peer/table.py $$np $(PEER_DIR)/gorovod-$$np.tsv $(PEER_DIR)/horovod-$$np.tsv; \
	done
	for np in 2 4; do \
	  $(PEER_MPIRUN) -np $$np $(PEER_PY) $(ROOT)/scripts/bench_peer/adasum_check.py $(PEER_DIR)/adasum-$$np.f32 && \
	  $(PEER_MPIRUN) -np $$np $(PEER_DIR)/bench -peer-adasum $(PEER_DIR)/adasum-$$np.f32 || exit 1; \
	done
	cd $(ROOT) && $(PY) scripts/bench_peer/finetune.py --finetune $(FINETUNE_BIN) --bench $(PEER_DIR)/bench \
	  --mpirun "$(PEER_MPIRUN)" --peer_python $(PEER_PY) --saved_model $(DEFAULT_MODEL_DIR) \
	  --init_checkpoint $(MINILM_CKPT_DIR)/bert_model.ckpt --data_dir $(CACHE)/data/imdb --work $(PEER_DIR)/finetune \
	  --steps $(PEER_FINETUNE_STEPS) --repeats $(PEER_FINETUNE_REPEATS)
