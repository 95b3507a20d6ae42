#!/bin/sh
# slurm.sh leaves nothing behind when its command fails while a job runs: `test-slurm-cleanup.sh`
# starts a cluster of 2 machines, submits a job whose step (srun sleep) runs on both, and fails
# once the job runs. Afterwards no slurmctld, slurmd, slurmstepd, munged or step of that cluster may
# be left, nor any of its namespaces: the next test that simulates machines must find none.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# A duration no other process on this machine sleeps, to find the job's steps by.
marker=7919
# The single quotes are meant: the inner shell, run on the controller's side, expands them.
# shellcheck disable=SC2016
if timeout -k 10 120 "$here/slurm.sh" nodea:1,nodeb:1 sh -c '
	job=$(sbatch --parsable -N2 -n2 --output=/dev/null --wrap "srun sleep $0")
	tries=0
	until [ "$(squeue -h -j "$job" -t R -o %i)" = "$job" ] && [ "$(pgrep -c -x -f "(/usr/bin/)?sleep $0")" = 2 ]; do
		tries=$((tries + 1))
		[ "$tries" -lt 120 ] || { echo "test-slurm-cleanup: job $job did not start its steps within 60 s" >&2; exit 2; }
		sleep 0.5
	done
	echo "test-slurm-cleanup: job $job runs on both machines; failing now"
	exit 3' "$marker" 2>/dev/null; then
	echo "test-slurm-cleanup: slurm.sh succeeded although its command failed" >&2
	exit 1
fi
# Zombies are not counted: where PID 1 reaps no orphans (some containers) they stay, holding nothing.
left=$(ps -eo stat=,pid=,args= | awk -v m="$marker" '$1 !~ /^Z/ && ($3 ~ /(^|\/)(slurmctld|slurmd)$/ || ($3 ~ /(^|\/)munged$/ && $4 ~ /^--socket=/) || $3 ~ /^slurmstepd:/ || ($3 ~ /(^|\/)sleep$/ && $4 == m))')
# Namespaces of a job whose script is gone (slurm.sh's, now); those of jobs still running on this
# machine (another test, a benchmark) are theirs.
netns=
for name in $(ip netns list 2>/dev/null | awk '$1 ~ /^gorovod-[0-9]+(-|$)/ {print $1}'); do
	pid=${name#gorovod-}
	kill -0 "${pid%%-*}" 2>/dev/null || netns="$netns $name"
done
if [ -n "$left$netns" ]; then
	echo "test-slurm-cleanup: slurm.sh left behind after a failure:" >&2
	[ -z "$left" ] || echo "$left" >&2
	[ -z "$netns" ] || echo "namespaces:$netns" >&2
	exit 1
fi
echo "test-slurm-cleanup: a failed command left no process or namespace behind"
