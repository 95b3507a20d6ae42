#!/bin/sh
# Jobs on the Slurm cluster slurm.sh simulates, run by it as a user on the controller's side:
#   slurm.sh nodea:2,nodeb:2 test-slurm.sh CONFORMANCE-TEST FINETUNE MODEL DATA
# 1. srun --mpi=pmix starts horovod's conformance suite (go test -c) on 2 nodes x 2 ranks and on
#    2 + 1 ranks: every collective against raw MPI, and each rank's Rank, LocalRank and CrossRank
#    against SLURM_PROCID, SLURM_LOCALID and SLURM_NODEID (topology_test.go); the bytes of an
#    allreduce cross each node's interface (wire_test.go).
# 2. sbatch ../slurm/finetune-cpu.sbatch trains MODEL on DATA, 2 nodes x 1 rank, to the end.
# 3. The same script, longer, is cancelled with scancel once a checkpoint is written: the latest
#    checkpoint must be whole, and submitting the job again resumes from it and finishes.
set -eu
if [ $# -ne 4 ] || [ -z "${GOROVOD_SLURM_DIR:-}" ]; then
	echo "usage: slurm.sh LAYOUT $0 CONFORMANCE-TEST FINETUNE MODEL DATA" >&2
	exit 2
fi
conformance=$1 finetune=$2 model=$3 data=$4
here=$(cd "$(dirname "$0")" && pwd)
shared=$GOROVOD_SLURM_DIR
# MPI's TCP traffic on the simulated network only.
export OMPI_MCA_btl_tcp_if_include=198.18.0.0/15 OMPI_MCA_btl=tcp,self,vader
export HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=60

echo "== srun --mpi=pmix: conformance suite, 2 nodes x 2 ranks, then 2 + 1 ranks"
timeout -k 10 120 srun --mpi=pmix -N2 -n4 --kill-on-bad-exit=1 "$conformance" -test.count=1
timeout -k 10 120 srun --mpi=pmix -N2 -n3 --kill-on-bad-exit=1 "$conformance" -test.count=1

# finetune_flags OUT EXAMPLES: a short training of the tiny model, a checkpoint every 2 steps.
finetune_flags() {
	echo "--saved_model=$model --data_dir=$data --output_dir=$1 --max_seq_length=32 --threads=1" \
		"--inter_op_threads=1 --log_step_count_steps=2 --do_train --train_batch_size=4" \
		"--max_train_examples=$2 --num_train_epochs=1 --save_checkpoints_steps=2 --export_dir=none --seed=5"
}
# checkpoint_step DIR: the step of DIR's latest checkpoint, per its checkpoint state file; -1 if none.
checkpoint_step() {
	# No state file yet: sed fails, which set -e must not turn into no output.
	found=$(sed -n 's/^model_checkpoint_path: "model\.ckpt-\([0-9]*\)"$/\1/p' "$1/checkpoint" 2>/dev/null) || found=
	echo "${found:--1}"
}
# submit SECONDS OUT EXAMPLES [SBATCH-OPTIONS]: the user's CPU script, sbatch bounded to SECONDS;
# prints the job id.
submit() {
	limit=$1 out=$2 examples=$3
	shift 3
	# The flags are words without spaces: split, meant.
	# shellcheck disable=SC2046
	FINETUNE=$finetune timeout -k 10 "$limit" sbatch --parsable "$@" --output="$shared/job-%j.out" \
		"$here/../slurm/finetune-cpu.sbatch" $(finetune_flags "$out" "$examples")
}

echo "== sbatch finetune-cpu.sbatch: 2 nodes x 1 rank, 16 steps"
job=$(submit 300 "$shared/short" 128 --wait) || {
	cat "$shared"/job-*.out >&2
	exit 1
}
grep -q 'trained steps 0\.\.16 ' "$shared/job-$job.out" || {
	echo "test-slurm: job $job did not train steps 0..16:" >&2
	cat "$shared/job-$job.out" >&2
	exit 1
}
grep -q '2 rank(s)' "$shared/job-$job.out"

echo "== scancel mid-training, then resume"
# 512 steps: long enough (several seconds even for the tiny model) that scancel reaches the job
# while it trains. The wait is on the checkpoint state file, not on one checkpoint's files, which
# keep_checkpoint_max may prune before a poll sees them.
job=$(submit 30 "$shared/cancelled" 4096)
tries=0
until [ "$(checkpoint_step "$shared/cancelled")" -ge 4 ]; do
	tries=$((tries + 1))
	if [ "$tries" -gt 600 ]; then
		echo "test-slurm: job $job wrote no checkpoint of step 4 or later within 300 s" >&2
		cat "$shared/job-$job.out" >&2
		exit 1
	fi
	sleep 0.5
done
scancel "$job"
tries=0
while [ -n "$(squeue -h -j "$job" 2>/dev/null)" ]; do
	tries=$((tries + 1))
	[ "$tries" -lt 120 ] || {
		echo "test-slurm: job $job still runs 60 s after scancel" >&2
		exit 1
	}
	sleep 0.5
done
cat "$shared/job-$job.out"
latest=model.ckpt-$(checkpoint_step "$shared/cancelled")
step=${latest##*-}
for suffix in index data-00000-of-00001 input_position.json; do
	if [ ! -s "$shared/cancelled/$latest.$suffix" ]; then
		echo "test-slurm: the latest checkpoint after scancel, $latest, lacks its .$suffix" >&2
		exit 1
	fi
done
if [ "$step" -ge 512 ]; then
	echo "test-slurm: job $job finished (step $step) before scancel reached it" >&2
	exit 1
fi
echo "test-slurm: scancel left checkpoint $latest"
job=$(submit 300 "$shared/cancelled" 4096 --wait) || {
	cat "$shared"/job-*.out >&2
	exit 1
}
cat "$shared/job-$job.out"
grep -q "trained steps $step\.\.512 " "$shared/job-$job.out" || {
	echo "test-slurm: the resubmitted job $job did not resume from step $step to 512" >&2
	exit 1
}
echo "test-slurm: all green"
