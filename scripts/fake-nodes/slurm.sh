#!/bin/sh
# A Slurm cluster over simulated machines: `slurm.sh LAYOUT COMMAND [ARGS]`, where LAYOUT is
# HOST:CPUS[,HOST:CPUS...], starts munged, slurmctld on the switch's side of the network
# (netns.sh: the controller at 198.18.0.254, hostname ctl) and one slurmd per host inside the
# host's network and UTS namespaces, waits until every node is idle, then runs COMMAND there, on
# the controller's side, as a user logged into the cluster would: srun, sbatch, squeue, scancel
# find the cluster through SLURM_CONF. Everything (keys, configuration, spool, logs, the
# namespaces) lives in a temporary folder and in namespaces named gorovod-PID-*, made here and
# removed, with every process in them, when COMMAND ends, fails or is signalled; the daemons'
# logs are printed if COMMAND fails. The jobs' programs get GOROVOD_SLURM_DIR, a folder shared by
# every node, for their files, and GOROVOD_FAKE_NODES_IF, the name of each host's interface (as
# under mpirun.sh). Needs root, Debian's slurmd, slurmctld, slurm-client and munge (make
# test-slurm installs them), and mpi_pmix for srun --mpi=pmix.
set -eu
if [ $# -lt 2 ]; then
	echo "usage: $0 HOST:CPUS[,HOST:CPUS...] COMMAND [ARGS]" >&2
	exit 2
fi
layout=$1
shift
FAKE_NODES_DIR=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns.sh source-path=SCRIPTDIR
. "$FAKE_NODES_DIR/netns.sh"
fake_nodes_check
for cmd in munged slurmctld slurmd srun sinfo; do
	if ! command -v "$cmd" >/dev/null 2>&1; then
		echo "$0: $cmd is missing: install Debian's slurmd, slurmctld, slurm-client and munge (make test-slurm does)" >&2
		exit 1
	fi
done

dir=$(mktemp -d)
# munged requires every folder above its socket to be searchable by all.
chmod 711 "$dir"
prefix=gorovod-$$
# Every daemon, job step and rank runs inside the job's namespaces: deleting them ends them all,
# slurmstepd and the steps of a job still running included.
cleanup() {
	fake_nodes_down "$prefix"
	rm -rf "$dir"
}
fake_nodes_traps cleanup
fake_nodes_layout "$layout" CPUS >"$dir/layout"
nodes=
hosts=
n=0
while read -r host cpus; do
	n=$((n + 1))
	nodes="${nodes}NodeName=$host NodeAddr=$FAKE_NODES_SUBNET.$n CPUs=$cpus State=UNKNOWN
"
	hosts="$hosts $host"
done <"$dir/layout"
node_list=$(echo "$hosts" | sed 's/^ //; s/ /,/g')

mkdir -p "$dir/state" "$dir/shared"
chmod 1777 "$dir/shared"
cat >"$dir/slurm.conf" <<CONF
ClusterName=gorovod
SlurmctldHost=ctl($FAKE_NODES_SUBNET.254)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SlurmdTimeout=30
KillWait=10
MaxJobCount=100
$nodes
PartitionName=main Nodes=$node_list Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
# Slurm's PMIx plugin keeps a folder per job step under PMIxCliTmpDirBase: each machine has its
# own on $dir/tmp (mounted below), as each has its own /tmp.
echo "PMIxCliTmpDirBase=$dir/tmp" >"$dir/mpi.conf"
export SLURM_CONF="$dir/slurm.conf"

dd if=/dev/urandom of="$dir/munge.key" bs=128 count=1 2>/dev/null
chmod 600 "$dir/munge.key"
# Each machine runs its own munged, as on a cluster (one munged for all would see the
# credential a job step sends to every node as replayed): a host's mount namespace puts its own
# folder on $dir/munge, where slurm.conf's AuthInfo looks; the controller's side uses $dir/munge.
# munged_cmd, run by sh -c with $0 the job's folder and $1 a machine, starts the munged of the
# mount namespace it runs in, its pid file and log named after the machine.
# shellcheck disable=SC2016
munged_cmd='munged --socket="$0/munge/munge.sock" --key-file="$0/munge.key" --pid-file="$0/munged-$1.pid" --log-file="$0/munged-$1.log" --seed-file="$0/munge/munged.seed" --origin=lo'
mkdir -m 711 "$dir/munge"
mkdir -m 1777 "$dir/tmp"
for host in $hosts; do
	mkdir -m 711 "$dir/munge-$host"
	mkdir -m 1777 "$dir/tmp-$host"
	mkdir "$dir/spool-$host"
done

fake_nodes_reap
# The host names are checked by fake_nodes_layout: split on spaces, meant.
# shellcheck disable=SC2086
fake_nodes_up "$prefix" $hosts
nsenter --net="/run/netns/$prefix" sh -c "$munged_cmd" "$dir" ctl
# The daemons fork into the background, each in its namespaces; their pid files are in $dir.
# The single quotes are meant: $1 is the inner shell's.
# shellcheck disable=SC2016
nsenter --net="/run/netns/$prefix" unshare --uts sh -c 'hostname ctl && exec slurmctld -i' ctl
for host in $hosts; do
	nsenter --net="/run/netns/$prefix-$host" unshare --uts --mount sh -c \
		"hostname \"\$1\" && mount --bind \"\$0/munge-\$1\" \"\$0/munge\" && mount --bind \"\$0/tmp-\$1\" \"\$0/tmp\" &&
		$munged_cmd && exec slurmd -N \"\$1\"" \
		"$dir" "$host"
done

fail() {
	echo "$0: $*" >&2
	for log in "$dir"/*.log; do
		echo "--- $log" >&2
		tail -n 20 "$log" >&2
	done
	exit 1
}
tries=0
until [ "$(nsenter --net="/run/netns/$prefix" sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" = "$n" ]; do
	tries=$((tries + 1))
	[ "$tries" -lt 60 ] || fail "the nodes did not become idle within 30 s"
	sleep 0.5
done

GOROVOD_SLURM_DIR=$dir/shared GOROVOD_FAKE_NODES_IF=$FAKE_NODES_IF nsenter --net="/run/netns/$prefix" "$@" || fail "$* failed (exit $?)"
