# shellcheck shell=sh
# Machines simulated on this one, each with a network stack of its own: sourced by mpirun.sh and
# the network benchmark, fault and Slurm scripts next to it. Every name it makes starts with a
# per-job prefix (gorovod-PID-), so jobs running side by side on one machine do not meet:
#
#   PREFIX          network namespace of the switch: a bridge, br0, with the launcher's address
#                   198.18.0.254/24 (mpirun runs here, as on a cluster's login node)
#   PREFIX-HOST     network namespace of HOST: lo and fake0, a veth whose peer (pN) is a port of br0,
#                   with address 198.18.0.N/24 for the Nth host
#
# Only 198.18.0.0/15 is used (RFC 2544's range for network benchmarks) and no interface of this
# machine's own namespace is touched: traffic can go nowhere but between the simulated machines.
# The hosts' UTS namespaces are made per process, by rsh-agent.sh, which enters PREFIX-HOST when
# GOROVOD_FAKE_NODES_NETNS=PREFIX is in its environment.

FAKE_NODES_SUBNET=198.18.0
FAKE_NODES_CIDR=198.18.0.0/15
FAKE_NODES_IF=fake0

# fake_nodes_check: fails, saying why, where the namespaces cannot be made.
fake_nodes_check() {
	if [ "$(id -u)" != 0 ]; then
		echo "fake-nodes: simulating machines with network namespaces needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN)" >&2
		return 1
	fi
	for cmd in ip nsenter unshare; do
		if ! command -v "$cmd" >/dev/null 2>&1; then
			echo "fake-nodes: $cmd is missing (ip: Debian's iproute2; nsenter, unshare: util-linux)" >&2
			return 1
		fi
	done
	if ! err=$(unshare --net --uts true 2>&1); then
		echo "fake-nodes: network namespaces are not permitted here ($err)" >&2
		return 1
	fi
}

# fake_nodes_layout LAYOUT WHAT: prints "HOST COUNT" for each HOST:COUNT of LAYOUT
# (HOST:COUNT[,HOST:COUNT...]); fails, naming the entry, where a HOST is not of a-z, 0-9 and -, or
# a COUNT (of WHAT: slots, CPUs) is not a number >= 1.
fake_nodes_layout() {
	old_ifs=$IFS
	IFS=,
	for node in $1; do
		host=${node%%:*} count=${node#*:}
		[ "$host" != "$node" ] || count=
		case $host:$count in
		:* | *:*[!0-9]* | *: | *:0 | *[!a-z0-9-]*:*)
			echo "fake-nodes: bad host $node in layout $1: want HOST:$2, HOST of a-z, 0-9 and -, $2 >= 1" >&2
			IFS=$old_ifs
			return 2
			;;
		esac
		echo "$host $count"
	done
	IFS=$old_ifs
}

# fake_nodes_traps CLEANUP: runs the command CLEANUP when the script exits, and makes TERM, INT
# and HUP (timeout, Ctrl-C, a closed terminal) exit it.
fake_nodes_traps() {
	# shellcheck disable=SC2064 # expanded now, meant
	trap "$1" EXIT
	trap 'exit 143' TERM
	trap 'exit 130' INT
	trap 'exit 129' HUP
}

# fake_nodes_reap: deletes the namespaces of jobs whose process is gone (one killed with SIGKILL,
# which no trap sees), and ends what still runs in them. A job's own prefix names its PID.
fake_nodes_reap() {
	[ -d /run/netns ] || return 0
	for ns in /run/netns/gorovod-*; do
		[ -e "$ns" ] || continue
		name=${ns#/run/netns/}
		pid=${name#gorovod-}
		pid=${pid%%-*}
		case $pid in '' | *[!0-9]*) continue ;; esac
		kill -0 "$pid" 2>/dev/null || fake_nodes_del "$name"
	done
}

# fake_nodes_del NS: ends every process in namespace NS (SIGTERM, then SIGKILL to those still
# there after 2 s: slurmstepd, a daemon waiting on a dead link) and deletes it. A process left
# inside would keep the namespace alive, unnamed and unreachable by any later cleanup.
fake_nodes_del() {
	pids=$(ip netns pids "$1" 2>/dev/null) || pids=
	if [ -n "$pids" ]; then
		# One pid a line: split, meant.
		# shellcheck disable=SC2086
		kill $pids 2>/dev/null || true
		tries=0
		while [ -n "$(ip netns pids "$1" 2>/dev/null)" ] && [ "$tries" -lt 20 ]; do
			tries=$((tries + 1))
			sleep 0.1
		done
		pids=$(ip netns pids "$1" 2>/dev/null) || pids=
		# shellcheck disable=SC2086
		[ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
	fi
	ip netns del "$1" 2>/dev/null || true
}

# fake_nodes_no_ipv6 NS: no IPv6 in namespace NS, so no link-local address either (only
# 198.18.0.0/15 is used). /proc/sys/net is the namespace's of the process that opens it.
fake_nodes_no_ipv6() {
	[ -d /proc/sys/net/ipv6 ] || return 0
	nsenter --net="/run/netns/$1" sh -c 'echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6 && echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6'
}

# fake_nodes_up PREFIX HOST...: the switch and one namespace per host, wired and addressed.
fake_nodes_up() {
	prefix=$1
	shift
	ip netns add "$prefix"
	fake_nodes_no_ipv6 "$prefix"
	ip -n "$prefix" link set lo up
	ip -n "$prefix" link add br0 type bridge
	ip -n "$prefix" addr add "$FAKE_NODES_SUBNET.254/24" dev br0
	ip -n "$prefix" link set br0 up
	n=0
	for host in "$@"; do
		n=$((n + 1))
		if [ "$n" -gt 250 ]; then
			echo "fake-nodes: at most 250 hosts" >&2
			return 1
		fi
		ns=$prefix-$host
		ip netns add "$ns"
		fake_nodes_no_ipv6 "$ns"
		ip -n "$ns" link set lo up
		ip -n "$ns" link add "$FAKE_NODES_IF" type veth peer name "p$n" netns "$prefix"
		ip -n "$ns" addr add "$FAKE_NODES_SUBNET.$n/24" dev "$FAKE_NODES_IF"
		ip -n "$ns" link set "$FAKE_NODES_IF" up
		ip -n "$prefix" link set "p$n" master br0 up
	done
}

# fake_nodes_down PREFIX: ends every process still in the job's namespaces (a daemon, a rank
# whose link is down) and deletes them, and so their interfaces.
fake_nodes_down() {
	[ -d /run/netns ] || return 0
	for ns in "/run/netns/$1" "/run/netns/$1"-*; do
		[ ! -e "$ns" ] || fake_nodes_del "${ns#/run/netns/}"
	done
	return 0
}

# fake_nodes_mpirun PREFIX HOSTFILE NP [MPIRUN-ARGS] PROGRAM [ARGS]: mpirun in the switch's
# namespace, its daemons started on the hosts by rsh-agent.sh; out-of-band and MPI TCP traffic
# only on the 198.18.0.0/15 interfaces, shared memory (vader) within a host. The ranks find the
# name of their host's interface in GOROVOD_FAKE_NODES_IF.
fake_nodes_mpirun() {
	prefix=$1 hostfile=$2 np=$3
	shift 3
	GOROVOD_FAKE_NODES_NETNS=$prefix nsenter --net="/run/netns/$prefix" \
		mpirun --hostfile "$hostfile" -np "$np" --map-by slot --bind-to none \
		--mca plm_rsh_agent "${FAKE_NODES_DIR:?the folder of netns.sh}/rsh-agent.sh" \
		--mca oob_tcp_if_include "$FAKE_NODES_CIDR" --mca btl_tcp_if_include "$FAKE_NODES_CIDR" \
		--mca btl tcp,self,vader -x GOROVOD_FAKE_NODES_IF="$FAKE_NODES_IF" "$@"
}

# fake_nodes_shape PREFIX HOST MBIT [DELAY]: HOST's interface sends at most MBIT megabits per
# second (tbf), each packet delayed by DELAY (netem, e.g. 0.2ms) where the kernel has netem; the
# other direction is shaped on the other hosts. Says so on stderr where the delay cannot be added.
fake_nodes_shape() {
	ns=$1-$2 mbit=$3 delay=${4:-}
	# The bucket holds a millisecond at the rate, and at least two 64 KiB segments (veth sends
	# TCP segmentation-offloaded), so the rate, not the bucket, is the limit.
	burst=$((mbit * 1000000 / 8 / 1000))
	[ "$burst" -ge 131072 ] || burst=131072
	tc -n "$ns" qdisc del dev "$FAKE_NODES_IF" root 2>/dev/null || true
	parent=root
	if [ -n "$delay" ]; then
		if tc -n "$ns" qdisc add dev "$FAKE_NODES_IF" root handle 1: netem delay "$delay" limit 100000 2>/dev/null; then
			parent="parent 1:"
		else
			echo "fake-nodes: no delay added on $2: this kernel has no netem (CONFIG_NET_SCH_NETEM)" >&2
		fi
	fi
	# $parent is one word or two: split, meant.
	# shellcheck disable=SC2086
	tc -n "$ns" qdisc add dev "$FAKE_NODES_IF" $parent handle 2: tbf rate "${mbit}mbit" burst "$burst" latency 50ms
}

# fake_nodes_link PREFIX HOST up|down: HOST's interface up or down (its cable plugged or pulled).
fake_nodes_link() {
	ip -n "$1-$2" link set "$FAKE_NODES_IF" "$3"
}

# fake_nodes_loss PREFIX HOST PERCENT: HOST drops PERCENT% of the packets it sends and of those it
# receives on its interface, at random (nftables; netem's loss where the kernel lacks netem).
# PERCENT 0 removes the rule.
fake_nodes_loss() {
	ns=/run/netns/$1-$2
	nsenter --net="$ns" nft delete table inet gorovod_loss 2>/dev/null || true
	[ "$3" -gt 0 ] || return 0
	nsenter --net="$ns" nft -f - <<NFT
table inet gorovod_loss {
	chain out { type filter hook output priority 0; oifname "$FAKE_NODES_IF" numgen random mod 100 < $3 drop; }
	chain in { type filter hook input priority 0; iifname "$FAKE_NODES_IF" numgen random mod 100 < $3 drop; }
}
NFT
}
