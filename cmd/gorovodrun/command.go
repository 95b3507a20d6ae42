package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/gorovod/gorovod/horovod/mpi/mpiwait"
)

// Variables forwarded to every rank with mpirun -x. mpirun starts its daemons on other machines
// through ssh, whose shell has none of the launching environment: what a rank reads must travel.
var (
	// forwardedPrefixes: horovod's settings, NCCL's, gorovod's own (library paths, MPI wait mode,
	// GPU requirement) and TensorFlow's (TF_CPP_MIN_LOG_LEVEL, ...).
	forwardedPrefixes = []string{"HOROVOD_", "NCCL_", "GOROVOD_", "TF_"}
	// forwardedNames: where the ranks find programs and libraries.
	forwardedNames = []string{"PATH", "LD_LIBRARY_PATH", "PYTHONPATH"}
	// horovodReads: the HOROVOD_* variables gorovod's horovod package reads (horovod/config.go);
	// any other is forwarded with a warning, since a rank will not act on it.
	horovodReads = map[string]bool{
		"HOROVOD_FUSION_THRESHOLD":            true,
		"HOROVOD_CYCLE_TIME":                  true,
		"HOROVOD_CACHE_CAPACITY":              true,
		"HOROVOD_TIMELINE":                    true,
		"HOROVOD_STALL_CHECK_DISABLE":         true,
		"HOROVOD_STALL_CHECK_TIME_SECONDS":    true,
		"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": true,
	}
)

// mpirunArg is one setting gorovodrun gives mpirun. key names the setting, so that the same one
// in --mpi-args replaces it: Open MPI refuses an MCA parameter given twice on one command line.
type mpirunArg struct {
	key  string
	args []string
}

func mcaArg(name, value string) mpirunArg {
	return mpirunArg{"mca:" + name, []string{"--mca", name, value}}
}

func envArg(name, value string) mpirunArg {
	return mpirunArg{"x:" + name, []string{"-x", name + "=" + value}}
}

// mpirunCommand is the mpirun argument list (argv[0] "mpirun") that runs o.command as o.np
// ranks, forwarding the variables of env the ranks read; root says whether mpirun will run as
// root. warnings name forwarded variables no rank will act on. It is a pure function of its
// arguments: what --dry-run prints is what runs.
func mpirunCommand(o options, env []string, root bool) (argv, warnings []string) {
	var settings []mpirunArg
	add := func(a ...mpirunArg) { settings = append(settings, a...) }

	if o.bindingArgs != nil {
		add(mpirunArg{"binding", o.bindingArgs})
	} else {
		// TensorFlow's thread pools span every core: a rank bound to one core (Open MPI's default
		// for up to 2 ranks) would starve them. By slot: a host's slots fill before the next
		// host's, so consecutive ranks share a machine, as horovodrun places them.
		add(mpirunArg{"bind-to", []string{"--bind-to", "none"}}, mpirunArg{"map-by", []string{"--map-by", "slot"}})
	}
	// Open MPI's own point-to-point layer over TCP and shared memory, as horovodrun chooses: the
	// UCX layer a distribution may build in wants InfiniBand hardware, and without it can fail or
	// warn at start. NCCL carries GPU traffic, so MPI's fast-interconnect layers are not needed.
	add(mcaArg("pml", "ob1"))
	// The openib transport is deprecated; where verbs devices exist it warns and can hang on fork.
	add(mcaArg("btl", "^openib"))
	// Ctrl-C: Open MPI sends every rank SIGTERM this many seconds later and SIGKILL as many again
	// after that (its default is 1). finetune's rank 0 uses the time after SIGTERM to finish its
	// step and write a checkpoint.
	add(mcaArg("odls_base_sigkill_timeout", strconv.Itoa(o.sigkillTimeout)))
	if o.oversubscribe {
		// More ranks than slots (or cores): right for one small machine, as the Makefile's
		// MPIRUN. Open MPI then makes a rank waiting in MPI yield its core by itself, and
		// gorovod's ranks wait sleeping in any case (GOROVOD_MPI_WAIT).
		add(mpirunArg{"oversubscribe", []string{"--oversubscribe"}})
	}
	var ssh []string
	if o.sshPort != 0 {
		ssh = append(ssh, "-p", strconv.Itoa(o.sshPort))
	}
	if o.sshIdentityFile != "" {
		ssh = append(ssh, "-i", o.sshIdentityFile)
	}
	if ssh != nil {
		// Options mpirun puts on each ssh command line it starts a host's daemon with.
		add(mcaArg("plm_rsh_args", shellLine(ssh)))
	}
	setByFlags := map[string]bool{}
	if o.nics != nil {
		// MPI's TCP transport and NCCL's bootstrap sockets both stay on the given interfaces
		// (a docker bridge or a down link elsewhere would otherwise be tried).
		nics := strings.Join(o.nics, ",")
		add(mcaArg("btl_tcp_if_include", nics), envArg("NCCL_SOCKET_IFNAME", nics))
		setByFlags["NCCL_SOCKET_IFNAME"] = true
	}
	if o.outputFilename != "" {
		add(mpirunArg{"output-filename", []string{"--output-filename", o.outputFilename}})
	}
	if o.timestampOutput {
		add(mpirunArg{"timestamp-output", []string{"--timestamp-output"}})
	}
	for _, s := range o.tuning {
		add(envArg(s.name, s.value))
		setByFlags[s.name] = true
	}
	for _, name := range forwardedVariables(env) {
		if setByFlags[name] {
			continue // the flag's value wins over the environment's
		}
		add(mpirunArg{"x:" + name, []string{"-x", name}})
		if strings.HasPrefix(name, "HOROVOD_") && !horovodReads[name] {
			warnings = append(warnings, fmt.Sprintf("%s is forwarded, but gorovod's horovod package does not read it", name))
		}
	}

	argv = []string{"mpirun"}
	if root {
		// Open MPI refuses to run as root unless told; containers usually run as root.
		argv = append(argv, "--allow-run-as-root")
	}
	hosts := o.hosts
	if hosts == nil {
		// horovodrun's default: np slots on this machine, however many cores it has.
		hosts = []host{{name: "localhost", slots: o.np}}
	}
	argv = append(argv, "-np", strconv.Itoa(o.np), "-H", hostList(hosts))
	replaced := mpirunKeys(o.mpiArgs)
	for _, s := range settings {
		if !replaced[s.key] {
			argv = append(argv, s.args...)
		}
	}
	argv = append(argv, o.mpiArgs...)
	return append(argv, o.command...), warnings
}

// checkForwardedValues refuses a forwarded setting that every rank would refuse at its start
// (GOROVOD_MPI_WAIT): one message before the launch instead of one per rank after it. The
// HOROVOD_* variables gorovod's horovod package reads are checked by each rank's horovod.Init.
func checkForwardedValues(env []string) error {
	for _, kv := range env {
		if name, value, _ := strings.Cut(kv, "="); name == mpiwait.Env {
			if _, err := mpiwait.Sleeping(value); err != nil {
				return fmt.Errorf("%v (every rank would refuse it)", err)
			}
		}
	}
	return nil
}

// forwardedVariables lists, sorted, the names of env's variables that travel to the ranks.
func forwardedVariables(env []string) []string {
	var names []string
	seen := map[string]bool{}
	for _, kv := range env {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || seen[name] || !forwarded(name) {
			continue
		}
		seen[name] = true
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

func forwarded(name string) bool {
	for _, n := range forwardedNames {
		if name == n {
			return true
		}
	}
	for _, p := range forwardedPrefixes {
		if strings.HasPrefix(name, p) && len(name) > len(p) {
			return true
		}
	}
	return false
}

// mpirunKeys reads which of gorovodrun's settings the words of --mpi-args give themselves
// (validated by parseArgs).
func mpirunKeys(words []string) map[string]bool {
	keys := map[string]bool{}
	opts, _ := parseMpirunArgs("--mpi-args", words)
	for _, opt := range opts {
		switch opt.name {
		case "mca", "gmca":
			keys["mca:"+opt.values[0]] = true
		case "x":
			name, _, _ := strings.Cut(opt.values[0], "=")
			keys["x:"+name] = true
		case "bind-to", "map-by", "oversubscribe", "output-filename", "timestamp-output":
			keys[opt.name] = true
		}
	}
	return keys
}
