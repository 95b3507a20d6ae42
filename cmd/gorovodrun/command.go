package main

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/gorovod/gorovod/horovod"
)

// Every variable of the launching environment goes to every rank with mpirun -x, as horovodrun
// does: mpirun starts its daemons on other machines through ssh, whose shell has none of it, so
// the ranks there would otherwise miss what the ranks on this machine see (CUDA_VISIBLE_DEVICES,
// OMP_NUM_THREADS, LD_PRELOAD, ...). Not forwarded: horovodrun's exceptions (shell functions,
// OLDPWD, secret keys), the MPI launcher's own variables, which mpirun sets for each rank, and
// the shell's per-machine state.
var (
	notForwardedPrefixes = []string{"BASH_FUNC_", "OMPI_", "PMIX_", "PMI_"}
	notForwardedNames    = []string{"OLDPWD", "HOSTNAME", "SHLVL", "_"}
	notForwardedSuffixes = []string{"_SECRET_KEY"}
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
// root. warnings name forwarded variables no rank will act on, and a job over several machines
// with no interface chosen for MPI. It is a pure function of its arguments: what --dry-run
// prints is what runs.
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
	// A failed job: Open MPI sends the other ranks SIGTERM this many seconds later and SIGKILL as
	// many again after that, and ends the job only then (DefaultSigkillTimeout).
	add(mcaArg("odls_base_sigkill_timeout", strconv.Itoa(o.sigkillTimeout)))
	if o.oversubscribe {
		// More ranks than slots (or cores): right for one small machine, as the Makefile's
		// MPIRUN. Open MPI then makes a rank waiting in MPI yield its core by itself, and
		// gorovod's ranks wait sleeping in any case (GOROVOD_MPI_WAIT).
		add(mpirunArg{"oversubscribe", []string{"--oversubscribe"}})
	}
	if ssh := sshArgs(o); ssh != nil {
		add(*ssh)
	}
	setByFlags := map[string]bool{}
	if o.nics != nil {
		// MPI's TCP transport and NCCL's bootstrap sockets both stay on the given interfaces
		// (a docker bridge or a down link elsewhere would otherwise be tried).
		nics := strings.Join(o.nics, ",")
		add(mcaArg("btl_tcp_if_include", nics), envArg("NCCL_SOCKET_IFNAME", nics))
		setByFlags["NCCL_SOCKET_IFNAME"] = true
	}
	// Each line a rank writes starts with [1,RANK]<stdout>: or <stderr>:, as under horovodrun,
	// whose users' log tooling reads it; --mpi-args "--mca orte_tag_output 0" leaves it off, and
	// Open MPI 5's --output in --mpi-args chooses the output's form instead (tag among its values).
	add(mpirunArg{"tag-output", []string{"--tag-output"}})
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
		if strings.HasPrefix(name, "HOROVOD_") && !horovod.ReadsVariable(name) && name != startTimeoutVariable {
			w := fmt.Sprintf("%s is forwarded, but gorovod's horovod package does not read it", name)
			if strings.HasPrefix(name, "HOROVOD_GPU_") {
				w += " (finetune's --allreduce_backend=nccl asks for NCCL)"
			}
			warnings = append(warnings, w)
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
	if needsProbe(o, env) {
		// A launch probes the hosts for the interfaces they share (probeInterfaces) and sets
		// o.nics; without it, Open MPI's TCP transport tries them all, a docker bridge (the
		// same address on every machine) included, which can hang the job.
		warnings = append(warnings, fmt.Sprintf("ranks on %d machines and no network interface chosen: MPI may try one "+
			"the machines cannot reach each other on (docker0, a link that is down) and hang; "+
			"name the one they share with --network-interface", len(hosts)))
	}
	return append(argv, o.command...), warnings
}

// sshArgs is the setting that puts -p and -i on each ssh command line mpirun starts a host's
// daemon with; nil without them. Open MPI splits plm_rsh_args at spaces and passes the pieces to
// ssh as they are, with no shell between: quoting them would hand ssh the quotes (the -i flag
// refuses a path with a space instead).
func sshArgs(o options) *mpirunArg {
	var ssh []string
	if o.sshPort != 0 {
		ssh = append(ssh, "-p", strconv.Itoa(o.sshPort))
	}
	if o.sshIdentityFile != "" {
		ssh = append(ssh, "-i", o.sshIdentityFile)
	}
	if ssh == nil {
		return nil
	}
	a := mcaArg("plm_rsh_args", strings.Join(ssh, " "))
	return &a
}

// checkForwardedValues refuses a setting every rank's horovod.Init would refuse (the HOROVOD_*
// variables horovod reads, GOROVOD_MPI_WAIT), read with horovod's own parser over the environment
// the ranks get: one message before the launch instead of one per rank after mpirun started them
// all and, under the sigkill timeout, took its time to end the failed job.
func checkForwardedValues(o options, env []string) error {
	if _, err := horovod.ReadSettings(rankLookup(o, env)); err != nil {
		return fmt.Errorf("%v (every rank would refuse it)", err)
	}
	return nil
}

// rankLookup looks a variable up in the environment mpirunCommand gives the ranks: a forwarded
// variable of env, replaced by a tuning flag's value, each replaced by --mpi-args's -x (NAME=VALUE,
// or NAME forwarding env's value).
func rankLookup(o options, env []string) func(string) (string, bool) {
	launching := map[string]string{}
	ranks := map[string]string{}
	for _, kv := range env {
		name, value, ok := strings.Cut(kv, "=")
		if _, seen := launching[name]; !ok || seen {
			continue // the first of a name is the one getenv, and so mpirun's -x, reads
		}
		launching[name] = value
		if forwarded(name) {
			ranks[name] = value
		}
	}
	for _, s := range o.tuning {
		ranks[s.name] = s.value
	}
	opts, _ := parseMpirunArgs("--mpi-args", o.mpiArgs)
	for _, opt := range opts {
		if opt.name != "x" {
			continue
		}
		name, value, ok := strings.Cut(opt.values[0], "=")
		if !ok {
			value, ok = launching[name]
		}
		if ok {
			ranks[name] = value
		} else {
			delete(ranks, name)
		}
	}
	return func(name string) (string, bool) {
		v, ok := ranks[name]
		return v, ok
	}
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
	if !shellName(name) || slices.Contains(notForwardedNames, name) {
		return false
	}
	for _, p := range notForwardedPrefixes {
		if strings.HasPrefix(name, p) {
			return false
		}
	}
	for _, suffix := range notForwardedSuffixes {
		if strings.HasSuffix(name, suffix) {
			return false
		}
	}
	return true
}

// shellName reports whether name is a variable name a shell exports (letters, digits and _, not
// starting with a digit): what mpirun's -x and the remote shell can carry.
func shellName(name string) bool {
	for i, c := range name {
		if !(c == '_' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return name != ""
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
			if opt.values[0] == "orte_tag_output" {
				keys["tag-output"] = true // --tag-output's parameter, which turns it off as 0
			}
		case "x":
			name, _, _ := strings.Cut(opt.values[0], "=")
			keys["x:"+name] = true
		case "bind-to", "map-by", "oversubscribe", "tag-output", "output-filename", "timestamp-output":
			keys[opt.name] = true
		case "output":
			keys["tag-output"] = true // Open MPI 5's --output tag,...: the user's choice of form
		}
	}
	return keys
}
