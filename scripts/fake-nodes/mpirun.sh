#!/bin/sh
# mpirun over simulated machines: `mpirun.sh LAYOUT [MPIRUN-ARGS] PROGRAM [ARGS]`, where LAYOUT is
# HOST:SLOTS[,HOST:SLOTS...] (e.g. nodea:2,nodeb:2), runs one rank per slot, filling the hosts in
# order (rank 0 on the first host; MPIRUN-ARGS follow the script's own, so --map-by node deals them
# round-robin instead, but an --mca the script sets may not be repeated). Each host is a network
# namespace and a UTS namespace of its own (netns.sh), wired to the others through a bridge with
# addresses from 198.18.0.0/15: MPI's TCP traffic between hosts crosses veth interfaces, shared
# memory stays within a host, and mpirun itself runs on the bridge's side, as on a login node.
# The script makes the namespaces and removes them when the job ends, fails or is signalled.
# With GOROVOD_FAKE_NODES_MBIT=N (and GOROVOD_FAKE_NODES_DELAY=0.2ms, say) each host's interface
# sends at most N Mbit/s, each packet delayed (netns.sh's fake_nodes_shape). The namespaces of
# the job are named after this script's process id: gorovod-PID-HOST (netns.sh), so a script that
# started it in the background can act on a host's link while the job runs.
# The ranks find LAYOUT in GOROVOD_FAKE_NODES, so tests can check what each rank sees against it.
# Nothing else of this environment reaches the ranks: pass it with -x NAME, as between real
# machines. Fails, saying why, where the namespaces cannot be made (not root, no ip, no netns)
# instead of running every rank on one host. Bound it with timeout(1), which signals the whole
# process group (this shell, mpirun and its daemons).
set -eu
if [ $# -lt 2 ]; then
	echo "usage: $0 HOST:SLOTS[,HOST:SLOTS...] [mpirun args] PROGRAM [args]" >&2
	exit 2
fi
layout=$1
shift
FAKE_NODES_DIR=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns.sh source-path=SCRIPTDIR
. "$FAKE_NODES_DIR/netns.sh"
fake_nodes_check

dir=$(mktemp -d)
prefix=gorovod-$$
# shellcheck disable=SC2016 # expanded when the trap runs, meant
fake_nodes_traps 'fake_nodes_down "$prefix"; rm -rf "$dir"'
fake_nodes_layout "$layout" SLOTS >"$dir/layout"
total=0
hosts=
while read -r host slots; do
	echo "$host slots=$slots" >>"$dir/hostfile"
	hosts="$hosts $host"
	total=$((total + slots))
done <"$dir/layout"

fake_nodes_reap
# The host names are checked by fake_nodes_layout: split on spaces, meant.
# shellcheck disable=SC2086
fake_nodes_up "$prefix" $hosts
if [ -n "${GOROVOD_FAKE_NODES_MBIT:-}" ]; then
	for host in $hosts; do
		fake_nodes_shape "$prefix" "$host" "$GOROVOD_FAKE_NODES_MBIT" "${GOROVOD_FAKE_NODES_DELAY:-}"
	done
fi
# Not exec: the trap removes the namespaces and the hostfile after the job.
fake_nodes_mpirun "$prefix" "$dir/hostfile" "$total" -x GOROVOD_FAKE_NODES="$layout" "$@"
