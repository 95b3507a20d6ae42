#!/bin/sh
# OpenMPI's remote-shell agent for a job over several simulated machines on this one (see
# mpirun.sh). mpirun calls it as it would call ssh, `rsh-agent.sh HOST COMMAND...`, to start its
# daemon on HOST. The daemon starts in a new UTS namespace whose hostname is HOST, so it and the
# ranks it spawns see HOST as their machine and OpenMPI places, numbers and connects them as on a
# node of their own: local ranks per host, shared memory within a host, TCP between hosts. With
# GOROVOD_FAKE_NODES_NETNS=PREFIX (set by netns.sh's fake_nodes_mpirun) it also enters HOST's
# network namespace, PREFIX-HOST, so TCP between hosts crosses veth interfaces and a bridge;
# without it every host shares this machine's network stack (loopback).
# Like ssh, it passes on no environment but PATH and HOME: what the ranks need travels with
# mpirun -x, as it must between real machines. The namespaces need root (CAP_SYS_ADMIN).
set -eu
if [ $# -lt 2 ]; then
	echo "usage: $0 HOST COMMAND..." >&2
	exit 2
fi
host=$1
shift
# The command words are joined and parsed again by a shell, as ssh's remote shell does; the
# single quotes are meant: $1 and $* are the inner shell's.
# shellcheck disable=SC2016
set -- unshare --uts sh -c 'hostname "$1" && shift && eval "$*"' rsh-agent "$host" "$@"
if [ -n "${GOROVOD_FAKE_NODES_NETNS:-}" ]; then
	ns=/run/netns/$GOROVOD_FAKE_NODES_NETNS-$host
	if [ ! -e "$ns" ]; then
		echo "$0: no simulated machine $host (network namespace $ns is missing)" >&2
		exit 255
	fi
	set -- nsenter --net="$ns" "$@"
fi
exec env -i PATH="$PATH" HOME="${HOME:-/}" "$@"
