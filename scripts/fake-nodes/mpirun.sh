#!/bin/sh
# mpirun over simulated machines: `mpirun.sh LAYOUT [MPIRUN-ARGS] PROGRAM [ARGS]`, where LAYOUT is
# HOST:SLOTS[,HOST:SLOTS...] (e.g. nodea:2,nodeb:2), runs one rank per slot, filling the hosts in
# order (rank 0 on the first host; MPIRUN-ARGS follow the script's own, so --map-by node deals them
# round-robin instead, but an --mca the script sets may not be repeated). Each host is a UTS
# namespace started by rsh-agent.sh; all traffic stays on the loopback interface. The ranks find
# LAYOUT in GOROVOD_FAKE_NODES, so tests can check what each rank sees against it. Nothing else of
# this environment reaches the ranks: pass it with -x NAME, as between real machines. Fails, saying
# why, where the namespaces cannot be made (no unshare, or not root), instead of running every rank
# on one host. Bound it with timeout(1), which signals the whole process group (this shell, mpirun
# and its daemons).
set -eu
if [ $# -lt 2 ]; then
	echo "usage: $0 HOST:SLOTS[,HOST:SLOTS...] [mpirun args] PROGRAM [args]" >&2
	exit 2
fi
layout=$1
shift
here=$(cd "$(dirname "$0")" && pwd)

if ! command -v unshare >/dev/null 2>&1; then
	echo "$0: unshare (util-linux) is missing: cannot simulate several machines" >&2
	exit 1
fi
if ! err=$(unshare --uts true 2>&1); then
	echo "$0: unshare --uts is not permitted here ($err): simulating several machines needs root (CAP_SYS_ADMIN)" >&2
	exit 1
fi

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
total=0
old_ifs=$IFS
IFS=,
for node in $layout; do
	host=${node%%:*}
	slots=${node#*:}
	case $host:$slots in
	:* | *:*[!0-9]* | *: | *:0)
		echo "$0: bad host $node in layout $layout: want HOST:SLOTS with SLOTS >= 1" >&2
		exit 2
		;;
	esac
	echo "$host slots=$slots" >>"$dir/hostfile"
	total=$((total + slots))
done
IFS=$old_ifs

# Not exec: the trap removes the hostfile after the job.
mpirun --hostfile "$dir/hostfile" -np "$total" --map-by slot --bind-to none \
	--mca plm_rsh_agent "$here/rsh-agent.sh" \
	--mca oob_tcp_if_include lo --mca btl_tcp_if_include lo --mca btl tcp,self,vader \
	-x GOROVOD_FAKE_NODES="$layout" "$@"
