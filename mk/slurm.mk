# Slurm: gorovod jobs started by srun and sbatch on a cluster simulated on this one.
#
#   make test-slurm  Debian's slurmd, slurmctld, slurm-client and munge installed; a controller and a
#                    slurmd per simulated machine, each in its own network, UTS and mount namespaces
#                    (scripts/fake-nodes/slurm.sh; needs root); then srun --mpi=pmix runs horovod's
#                    conformance suite on 2 nodes x 2 ranks and 2 + 1 ranks, checking Rank, LocalRank
#                    and CrossRank against SLURM_PROCID, SLURM_LOCALID and SLURM_NODEID; sbatch
#                    scripts/slurm/finetune-cpu.sbatch trains the tiny model on 2 nodes x 1 rank; and
#                    the same job cancelled with scancel mid-training leaves a whole checkpoint that a
#                    resubmission resumes to the end (scripts/fake-nodes/test-slurm.sh); last, a
#                    cluster whose command fails while a job runs on both nodes must leave no
#                    daemon, job step or namespace behind (scripts/fake-nodes/test-slurm-cleanup.sh).
#                    Part of make test, after test-multinode (which it must not disturb).

SLURM_BUILD := $(CACHE)/slurm
SLURM_DEBS := slurmd slurmctld slurm-client munge

.PHONY: test-slurm slurm-debs
TEST_TARGETS += test-slurm

# The Makefile's debs, for Slurm's packages only.
slurm-debs:
	@$(MAKE) --no-print-directory debs DEBS='$(SLURM_DEBS)'

# The tiny model and IMDB, made here when test-slurm runs alone.
test-slurm: debs slurm-debs tflib $(TINY_MODEL_DIR)/.stamp $(IMDB_DIR)/.stamp
	$(VENV)/bin/shellcheck -x $(ROOT)/scripts/fake-nodes/*.sh $(ROOT)/scripts/slurm/*.sbatch
	@mkdir -p $(SLURM_BUILD)
	cd $(ROOT) && $(GO) test -c -o $(SLURM_BUILD)/conformance.test ./horovod/conformance
	cd $(ROOT) && $(GO) build -o $(SLURM_BUILD)/finetune ./cmd/finetune
	timeout -k 10 900 $(ROOT)/scripts/fake-nodes/slurm.sh nodea:2,nodeb:2 $(ROOT)/scripts/fake-nodes/test-slurm.sh \
		$(SLURM_BUILD)/conformance.test $(SLURM_BUILD)/finetune $(CACHE)/model/tiny $(CACHE)/data/imdb
	$(ROOT)/scripts/fake-nodes/test-slurm-cleanup.sh
