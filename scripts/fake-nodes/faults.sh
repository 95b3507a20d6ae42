#!/bin/sh
# Faults on the wire during training: `faults.sh FINETUNE MODEL DATA WORK [FAULT...]` trains MODEL
# on DATA with 2 simulated machines of one rank each (mpirun.sh nodea:1,nodeb:1), once undisturbed
# and once per FAULT, injected on nodeb's link once the checkpoint of step 16 exists:
#   down      the link goes down for good
#   flap      down for 5 s, then up again
#   loss1     1% of nodeb's packets lost each way (loss10: 10%)
# (all four by default). Each run is bounded (LIMIT seconds, 300 by default). For each it prints
# how the job ended and after how long, the error lines that name a host or rank, and then either
# the largest weight difference from the undisturbed run, or, for a job that failed, whether its
# latest checkpoint is whole and a resumed run (no fault) finishes with the undisturbed weights.
# For each failed run it also prints when the last rank ended (its process looked for on its
# machine, since a rank cut off from the launcher cannot be heard). The link down for good must
# end every rank within down_bound seconds, with rank 0's stall message naming nodeb as the
# machine that does not answer: the script fails otherwise. mpirun, which may wait for the
# cut-off machine's daemon long after that, is stopped 30 s after the last rank ended.
# With TCP_RETRIES2=N every machine of the job gives up on an unacknowledged TCP connection after
# N retransmissions (net.ipv4.tcp_retries2, 15 by default: about 15 minutes), set as the fault
# begins. Needs root (mpirun.sh) and nft (Debian's nftables) for the losses. WORK is emptied first.
set -eu
if [ $# -lt 4 ]; then
	echo "usage: $0 FINETUNE MODEL DATA WORK [down|flap|loss1|loss10...]" >&2
	exit 2
fi
finetune=$1 model=$2 data=$3 work=$4
shift 4
[ $# -gt 0 ] || set -- down flap loss1 loss10
limit=${LIMIT:-300}
here=$(cd "$(dirname "$0")" && pwd)
FAKE_NODES_DIR=$here
# shellcheck source=netns.sh source-path=SCRIPTDIR
. "$here/netns.sh"
python=${PYTHON:-python3}
export TF_CPP_MIN_LOG_LEVEL=2
rm -rf "$work"
mkdir -p "$work"

# train NAME: the training into $work/NAME, bounded; its output in $work/NAME.log. Runs in the
# background: sets job (the process to wait for).
train() {
	timeout -k 10 "$limit" "$here/mpirun.sh" nodea:1,nodeb:1 -x TF_CPP_MIN_LOG_LEVEL=2 \
		-x HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=60 "$finetune" \
		--saved_model="$model" --data_dir="$data" --output_dir="$work/$1" --max_seq_length=32 \
		--threads=1 --inter_op_threads=1 --log_step_count_steps=64 --do_train --train_batch_size=4 \
		--max_train_examples=4096 --num_train_epochs=1 --save_checkpoints_steps=16 --export_dir=none \
		--seed=5 >>"$work/$1.log" 2>&1 &
	job=$!
}

# checkpoint_whole DIR: the latest checkpoint of DIR has all its files, and TensorFlow reads it.
checkpoint_whole() {
	latest=$(sed -n 's/^model_checkpoint_path: "\(.*\)"$/\1/p' "$1/checkpoint")
	for suffix in index data-00000-of-00001 input_position.json; do
		[ -s "$1/$latest.$suffix" ] || {
			echo "  latest checkpoint $latest lacks its .$suffix: CORRUPT"
			return 1
		}
	done
	"$python" "$here/../compare_checkpoints.py" "$1/$latest" "$1/$latest" >/dev/null || {
		echo "  latest checkpoint $latest does not load: CORRUPT"
		return 1
	}
	echo "  latest checkpoint $latest is whole (all files, loads)"
}

# ranks_left PREFIX: how many finetune processes run on the job's machines.
ranks_left() {
	n=0
	for ns in "/run/netns/$1"-*; do
		[ -e "$ns" ] || continue
		for pid in $(ip netns pids "${ns#/run/netns/}" 2>/dev/null); do
			[ "$(cat "/proc/$pid/comm" 2>/dev/null)" != finetune ] || n=$((n + 1))
		done
	done
	echo "$n"
}

# A link down for good: every rank must have ended within the stall shutdown time (60 s), a
# second of probing, MPI_Abort's 10 s of grace, and 20 s for a loaded machine.
down_bound=91
failed=0

echo "== undisturbed run"
train reference
wait "$job" || {
	echo "the undisturbed run failed:" >&2
	cat "$work/reference.log" >&2
	exit 1
}
grep 'trained steps' "$work/reference.log"

for fault in "$@"; do
	echo "== fault: $fault on nodeb's link, after the checkpoint of step 16"
	train "$fault"
	tries=0
	until [ -e "$work/$fault/model.ckpt-16.index" ]; do
		tries=$((tries + 1))
		if [ "$tries" -gt $((limit * 2)) ] || ! kill -0 "$job" 2>/dev/null; then
			echo "  no checkpoint of step 16: the run ended before the fault" >&2
			cat "$work/$fault.log" >&2
			exit 1
		fi
		sleep 0.5
	done
	# mpirun.sh is timeout's child; its namespaces are named after it.
	prefix=gorovod-$(pgrep -P "$job" -n)
	if [ -n "${TCP_RETRIES2:-}" ]; then
		for ns in "/run/netns/$prefix" "/run/netns/$prefix"-*; do
			echo "$TCP_RETRIES2" | nsenter --net="$ns" tee /proc/sys/net/ipv4/tcp_retries2 >/dev/null
		done
	fi
	start=$(date +%s)
	case $fault in
	down) fake_nodes_link "$prefix" nodeb down ;;
	flap) fake_nodes_link "$prefix" nodeb down && sleep 5 && fake_nodes_link "$prefix" nodeb up ;;
	loss*) fake_nodes_loss "$prefix" nodeb "${fault#loss}" ;;
	*)
		echo "$0: unknown fault $fault" >&2
		exit 2
		;;
	esac
	# Until the job ends, the time at which no rank is left on any machine: a rank cut off from
	# the launcher cannot be heard, so its process is looked for in its machine's namespace.
	# mpirun may wait for a cut-off machine's daemon long after the last rank ended: 30 s after
	# that, the script stops it (timeout signals mpirun.sh, which removes the machines).
	ranks_gone='' stopped=''
	while kill -0 "$job" 2>/dev/null; do
		now=$(($(date +%s) - start))
		if [ -z "$ranks_gone" ] && [ "$(ranks_left "$prefix")" = 0 ]; then
			ranks_gone=$now
		fi
		if [ -n "$ranks_gone" ] && [ -z "$stopped" ] && [ "$now" -ge $((ranks_gone + 30)) ]; then
			stopped=$now
			kill -TERM "$job" 2>/dev/null || true
		fi
		sleep 0.5
	done
	code=0
	wait "$job" || code=$?
	took=$(($(date +%s) - start))
	[ -n "$ranks_gone" ] || ranks_gone=$took
	if [ "$code" = 0 ]; then
		echo "  finished (exit 0) $took s after the fault began"
		grep 'trained steps' "$work/$fault.log" | sed 's/^/  /'
		"$python" "$here/../compare_checkpoints.py" "$work/reference" "$work/$fault" | sed 's/^/  /'
		continue
	fi
	if [ -n "$stopped" ]; then
		echo "  mpirun still running $stopped s after the fault, 30 s after the last rank ended: stopped by this script"
	elif [ "$code" = 124 ] || [ "$code" = 137 ]; then
		echo "  still running $took s after the fault: ended by the ${limit}s bound (exit $code)"
	else
		echo "  failed (exit $code) $took s after the fault began"
	fi
	echo "  every rank had ended $ranks_gone s after the fault began"
	grep -i -E 'error|unreachable|node|host|rank [0-9]' "$work/$fault.log" | grep -v -E 'examples|^step ' | head -n 8 | sed 's/^/  | /'
	if [ "$fault" = down ]; then
		# The survivor's watchdog must name the machine whose link is down, and every rank must
		# end within the stall shutdown, the probe, MPI_Abort's grace and a margin for the load.
		if grep -q "network: rank 1 on nodeb (198.18.0.2) does not answer" "$work/$fault.log"; then
			echo "  rank 0 named the unreachable machine: rank 1 on nodeb (198.18.0.2)"
		else
			echo "  FAILED: no rank named nodeb, the machine whose link is down" >&2
			failed=1
		fi
		if [ "$ranks_gone" -gt "$down_bound" ]; then
			echo "  FAILED: the ranks ended $ranks_gone s after the link went down, past the ${down_bound}s bound" >&2
			failed=1
		fi
	fi
	checkpoint_whole "$work/$fault"
	echo "  resuming without the fault"
	train "$fault"
	if wait "$job"; then
		grep 'trained steps' "$work/$fault.log" | tail -n 1 | sed 's/^/  /'
		"$python" "$here/../compare_checkpoints.py" "$work/reference" "$work/$fault" | sed 's/^/  /'
	else
		echo "  FAILED: the resumed run failed too" >&2
		tail -n 20 "$work/$fault.log" >&2
		failed=1
	fi
done
exit "$failed"
