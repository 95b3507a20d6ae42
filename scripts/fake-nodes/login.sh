#!/bin/sh
# A login node for simulated machines: `login.sh HOST[,HOST...] COMMAND [ARGS]` makes the hosts
# as mpirun.sh does (a network namespace each, joined through a bridge; netns.sh) and runs COMMAND
# in the bridge's namespace, where mpirun.sh runs mpirun, with GOROVOD_FAKE_NODES_NETNS set: a
# launcher run there (bin/gorovodrun) starts its own mpirun, whose daemons rsh-agent.sh (given as
# plm_rsh_agent) starts in the hosts' namespaces. Each host also has a docker bridge, docker0
# with 172.17.0.1/16: the same address on every host, on which a host reaches only itself, the
# interface a launcher must not leave to MPI. Removes the namespaces when COMMAND ends, fails or
# is signalled. Bound it with timeout(1).
set -eu
if [ $# -lt 2 ]; then
	echo "usage: $0 HOST[,HOST...] COMMAND [ARGS]" >&2
	exit 2
fi
hosts=$(echo "$1" | tr , ' ')
shift
FAKE_NODES_DIR=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns.sh source-path=SCRIPTDIR
. "$FAKE_NODES_DIR/netns.sh"
fake_nodes_check
prefix=gorovod-$$
# shellcheck disable=SC2016 # expanded when the trap runs, meant
fake_nodes_traps 'fake_nodes_down "$prefix"'
for host in $hosts; do
	case $host in *[!a-z0-9-]*)
		echo "$0: bad host $host: want a-z, 0-9 and -" >&2
		exit 2
		;;
	esac
done
fake_nodes_reap
# Checked above: split on spaces, meant.
# shellcheck disable=SC2086
fake_nodes_up "$prefix" $hosts
for host in $hosts; do
	ip -n "$prefix-$host" link add docker0 type bridge
	ip -n "$prefix-$host" addr add 172.17.0.1/16 dev docker0
	ip -n "$prefix-$host" link set docker0 up
done
# Not exec: the trap removes the namespaces after COMMAND.
GOROVOD_FAKE_NODES_NETNS=$prefix nsenter --net="/run/netns/$prefix" "$@"
