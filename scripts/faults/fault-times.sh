#!/usr/bin/env bash
# fault-times.sh: fault injection into 2-rank finetune jobs of the tiny model, timing how long
# each takes to end (docs/faults.md). Each case prints one line: what was done, what the job
# said, and the seconds from the fault (the error, the kill, the signal) to the launcher's exit.
#
#   scripts/faults/fault-times.sh [LAUNCHER WORDS...]
#
# The launcher defaults to bin/gorovodrun --oversubscribe -np 2; give another to compare, e.g.
#   scripts/faults/fault-times.sh mpirun --oversubscribe --bind-to none --mca odls_base_sigkill_timeout 10 -np 2
# Needs bin/finetune (make finetune-bin) and .cache/model/tiny (make setup). Exits non-zero
# when a case misses its target (FAULT_TARGETS=0 only reports).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
finetune=${FINETUNE_BIN:-$root/bin/finetune}
model=${TINY_MODEL:-$root/.cache/model/tiny}
launcher=("$@")
[ ${#launcher[@]} -gt 0 ] || launcher=("$root/bin/gorovodrun" --oversubscribe -np 2)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2 CUDA_VISIBLE_DEVICES=
work=$(mktemp -d)
job_pid=
cleanup() {
	[ -n "$job_pid" ] && pkill -KILL -s "$job_pid" 2>/dev/null || true
	[ -n "${FAULT_KEEP:-}" ] && echo "logs kept in $work" || rm -rf "$work"
}
trap cleanup EXIT
missed=0

# A separable task in the tiny vocabulary (w0..w29 for label 0, w40..w69 for label 1).
mkdir -p "$work/data"
awk -v n=2000 'BEGIN { srand(1); for (i = 0; i < n; i++) { y = int(rand() * 2); s = "";
	for (k = 0; k < 20; k++) s = s " w" (40 * y + int(rand() * 30)); print y "\t" s } }' >"$work/data/train.tsv"
head -40 "$work/data/train.tsv" >"$work/data/dev.tsv"
cp "$work/data/dev.tsv" "$work/data/test.tsv"
flags=(--saved_model="$model" --data_dir="$work/data" --max_seq_length=32 --threads=1 --inter_op_threads=1
	--log_step_count_steps=1 --do_train --train_batch_size=4 --num_train_epochs=50 --save_checkpoints_steps=20)

# untagged LOG: the log without the [JOB,RANK]<stdout>: (or <stderr>:) that mpirun's --tag-output,
# which gorovodrun passes, starts each line with.
untagged() { sed 's/^\[[0-9]*,[0-9]*\]<std[a-z]*>://' "$1"; }

now() { printf '%s\n' "${EPOCHREALTIME/,/.}"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# start OUTPUT_DIR LOG [FLAGS...]: the job in the background, in a session of its own.
start() {
	local out=$1 log=$2
	shift 2
	setsid "${launcher[@]}" "$finetune" "${flags[@]}" --output_dir="$out" "$@" >"$log" 2>&1 &
	job_pid=$!
}

# wait_for LOG PATTERN [SECONDS]: until the log matches.
wait_for() {
	local deadline=$((SECONDS + ${3:-120}))
	until grep -q -- "$2" "$1"; do
		[ $SECONDS -lt $deadline ] || { echo "no '$2' in $1 within ${3:-120}s:" >&2; cat "$1" >&2; exit 1; }
		sleep 0.05
	done
}

# wait_end: until the job's launcher exits (at most 120 s); sets $status.
wait_end() {
	local deadline=$((SECONDS + 120))
	while kill -0 "$job_pid" 2>/dev/null; do
		[ $SECONDS -lt $deadline ] || { echo "the job still runs 120s later" >&2; exit 1; }
		sleep 0.02
	done
	status=0
	wait "$job_pid" || status=$?
	job_pid=
}

# rank_pid N: the process of rank N of the running job.
rank_pid() {
	local p
	for p in $(pgrep -s "$job_pid" 2>/dev/null); do
		if grep -qxz "OMPI_COMM_WORLD_RANK=$1" "/proc/$p/environ" 2>/dev/null &&
			[ "$(readlink "/proc/$p/exe")" = "$(readlink -f "$finetune")" ]; then
			echo "$p"
			return
		fi
	done
	echo "no rank $1 in the job's session" >&2
	exit 1
}

# report CASE SECONDS TARGET WHAT: one line, and a miss when SECONDS exceeds TARGET.
report() {
	local verdict=ok
	if awk -v s="$2" -v t="$3" 'BEGIN { exit !(s > t) }'; then verdict="MISSED (target ${3} s)"; missed=1; fi
	printf '%-34s %6s s  %-8s %s\n' "$1" "$2" "$verdict" "$4"
}

echo "launcher: ${launcher[*]}"

# 1. A mistyped flag: the ranks fail before MPI starts.
start "$work/flag" "$work/flag.log" --bogus=1
wait_for "$work/flag.log" "flag provided but not defined"
t0=$(now)
wait_end
report "mistyped flag (error to end)" "$(elapsed "$t0" "$(now)")" 2 "exit $status"

# 2. A setup error on every rank (a missing data file), before training.
start "$work/setup" "$work/setup.log" --data_dir="$work/nowhere"
wait_for "$work/setup.log" "no such file"
t0=$(now)
wait_end
report "setup error (error to end)" "$(elapsed "$t0" "$(now)")" 2 "exit $status"

# 3. kill -9 of rank 1 mid-training.
start "$work/kill" "$work/kill.log"
wait_for "$work/kill.log" "saved checkpoint"
kill -KILL "$(rank_pid 1)"
t0=$(now)
wait_end
report "kill -9 rank 1 (kill to end)" "$(elapsed "$t0" "$(now)")" 5 "exit $status"

# 4. Ctrl-C (SIGINT to the launcher) mid-training: rank 0 must write the checkpoint of the step
# every rank stopped after.
start "$work/int" "$work/int.log"
wait_for "$work/int.log" "saved checkpoint"
kill -INT "$job_pid"
t0=$(now)
wait_end
took=$(elapsed "$t0" "$(now)")
# The step every rank stopped after: the last one the log reports (mpirun may drop what the
# ranks write once one has exited, so the checkpoint state file decides).
stopped=$(untagged "$work/int.log" | sed -n 's|^step \([0-9]*\)/.*|\1|p' | tail -1)
latest=$(sed -n 's/^model_checkpoint_path: "model.ckpt-\(.*\)"/\1/p' "$work/int/checkpoint")
if [ -n "$latest" ] && [ "$latest" = "$stopped" ]; then
	report "Ctrl-C (signal to end)" "$took" 30 "exit $status, rank 0 checkpointed"
else
	report "Ctrl-C (signal to end)" "$took" 0 "exit $status, NO checkpoint of the last step"
fi

# 5. Two runs into one output directory: the second must refuse, naming the first.
start "$work/busy" "$work/busy.log"
first=$job_pid
wait_for "$work/busy.log" "saved checkpoint"
job_pid=
t0=$(now)
set +e
"${launcher[@]}" "$finetune" "${flags[@]}" --output_dir="$work/busy" --seed=99 >"$work/busy2.log" 2>&1
second=$?
set -e
took=$(elapsed "$t0" "$(now)")
job_pid=$first
if grep -q "is in use by another run: finetune, pid" "$work/busy2.log"; then
	report "second run into a busy output_dir" "$took" 30 "exit $second, refused naming the holder"
else
	report "second run into a busy output_dir" "$took" 0 "exit $second, NOT refused"
fi

# 6. The first of those killed with SIGKILL (its launcher: no cleanup), its latest checkpoint
# truncated: a new run resumes from the newest sound one, naming the damaged file.
session=$job_pid
kill -KILL "$job_pid"
wait_end
deadline=$((SECONDS + 30))
while pgrep -s "$session" >/dev/null; do
	[ $SECONDS -lt $deadline ] || { echo "the killed launcher's ranks still run 30 s later" >&2; exit 1; }
	sleep 0.1
done
latest=$(sed -n 's/^model_checkpoint_path: "\(.*\)"/\1/p' "$work/busy/checkpoint")
data_file="$work/busy/$latest.data-00000-of-00001"
truncate -s 100 "$data_file"
start "$work/busy" "$work/resume.log" --num_train_epochs=1
wait_end
if [ "$status" = 0 ] && grep -q "$data_file is damaged" "$work/resume.log"; then
	report "resume past a truncated checkpoint" 0 1 "exit 0, warned naming the file"
else
	report "resume past a truncated checkpoint" 1 0 "exit $status, no warning naming $data_file"
fi

# 7. Rank 1 stopped (SIGSTOP) for 4 s with a 1 s stall check: rank 0 must name rank 1, and no
# rank may be reported missing operations once it continues.
HOROVOD_STALL_CHECK_TIME_SECONDS=1 start "$work/stop" "$work/stop.log"
wait_for "$work/stop.log" "saved checkpoint"
stopped=$(rank_pid 1)
from=$(($(wc -l <"$work/stop.log") + 1))
kill -STOP "$stopped"
sleep 4
kill -CONT "$stopped"
sleep 2
kill -INT "$job_pid"
wait_end
tail -n "+$from" "$work/stop.log" >"$work/stopped.log" # what was said from the stop on
# Rank 0 names rank 1 when the stop caught it outside a collective; inside one, MPI cannot tell
# which rank is late, and rank 1 says it was stopped once it runs again.
if untagged "$work/stopped.log" | grep -A1 "Missing ranks" | grep -q "^0"; then
	report "SIGSTOP of rank 1 for 4 s" 1 0 "rank 0, the healthy one, reported missing"
elif grep -q "horovod\[0\]: stall: .*rank 1 has not entered it" "$work/stopped.log"; then
	report "SIGSTOP of rank 1 for 4 s" 0 1 "rank 0 named rank 1"
elif grep -q "horovod\[1\]: stall: this rank did not run for" "$work/stopped.log"; then
	report "SIGSTOP of rank 1 for 4 s" 0 1 "rank 1 said it was stopped"
else
	report "SIGSTOP of rank 1 for 4 s" 1 0 "rank 1 not named, or a rank blamed: $(grep -m2 'stall' "$work/stopped.log" | tr '\n' ' ')"
fi

[ "${FAULT_TARGETS:-1}" = 0 ] || exit $missed
