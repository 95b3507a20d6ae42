package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultSigkillTimeout is Open MPI's odls_base_sigkill_timeout for the job, Open MPI's own
// default: when a rank fails, mpirun sends the others SIGTERM after this many seconds and
// SIGKILL as many again later, and waits that long, twice, before it ends a failed job even when
// no rank is left. gorovodrun's Ctrl-C does not go through it (see launch): rank 0's checkpoint
// needs no time here.
const DefaultSigkillTimeout = 1

// options is a parsed gorovodrun command line.
type options struct {
	np        int
	hosts     []host // nil: the local host with np slots, as horovodrun
	hostsFrom string // the flag the hosts came from, for messages

	sshPort         int
	sshIdentityFile string
	nics            []string
	// startTimeoutSeconds bounds probeInterfaces; 0: HOROVOD_START_TIMEOUT or DefaultStartTimeout.
	startTimeoutSeconds int

	oversubscribe   bool
	sigkillTimeout  int
	bindingArgs     []string // nil: --bind-to none --map-by slot
	mpiArgs         []string
	outputFilename  string
	timestampOutput bool

	// tuning holds the HOROVOD_* settings of the tuning flags, in flag order; a later flag for
	// the same variable replaces the earlier one.
	tuning []envSetting

	verbose, dryRun, help bool
	command               []string
}

type envSetting struct{ name, value string }

func (o *options) setTuning(name, value string) {
	for i := range o.tuning {
		if o.tuning[i].name == name {
			o.tuning[i].value = value
			return
		}
	}
	o.tuning = append(o.tuning, envSetting{name, value})
}

// flagSpec is one accepted flag. value is the placeholder of its argument in the usage, "" for a
// flag without one.
type flagSpec struct {
	names []string
	value string
	usage string
	set   func(o *options, v string) error
}

// refusedFlag is one of horovodrun's flags that gorovodrun does not take, and why: accepting it
// and ignoring it would let a user believe a setting is in force.
type refusedFlag struct {
	names []string
	why   string
}

var flagSpecs = []flagSpec{
	{[]string{"-np", "--num-proc"}, "N", "number of ranks (required)", func(o *options, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("want an integer >= 1")
		}
		o.np = n
		return nil
	}},
	{[]string{"-H", "--hosts"}, "HOST:SLOTS,...", "the machines and how many ranks each runs (default: this one, with N slots)", func(o *options, v string) error {
		if o.hosts != nil {
			return fmt.Errorf("give the hosts once, with -H or --hostfile")
		}
		hosts, err := parseHosts(v)
		o.hosts, o.hostsFrom = hosts, "-H "+v
		return err
	}},
	{[]string{"-hostfile", "--hostfile"}, "FILE", "the machines, one `HOST slots=N` a line", func(o *options, v string) error {
		if o.hosts != nil {
			return fmt.Errorf("give the hosts once, with -H or --hostfile")
		}
		hosts, err := parseHostfile(v)
		o.hosts, o.hostsFrom = hosts, "--hostfile "+v
		return err
	}},
	{[]string{"-p", "--ssh-port"}, "PORT", "ssh port on every host", func(o *options, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("want a port number 1-65535")
		}
		o.sshPort = n
		return nil
	}},
	{[]string{"-i", "--ssh-identity-file"}, "FILE", "ssh private key for every host", func(o *options, v string) error {
		if strings.Contains(v, " ") {
			return errors.New("a path with a space cannot reach ssh: mpirun passes ssh's options in plm_rsh_args, which Open MPI splits at spaces")
		}
		o.sshIdentityFile = v
		return nonEmpty(v)
	}},
	{[]string{"--network-interface", "--network-interfaces"}, "IF[,IF...]", "interfaces for MPI's TCP traffic and NCCL's sockets; repeatable", func(o *options, v string) error {
		for _, nic := range strings.Split(v, ",") {
			if nic == "" || strings.ContainsAny(nic, " \t") {
				return fmt.Errorf("bad interface name %q", nic)
			}
			o.nics = append(o.nics, nic)
		}
		return nil
	}},
	{[]string{"--start-timeout"}, "SECONDS", fmt.Sprintf("ranks on several machines and no --network-interface: the probe of the machines for the interfaces they share has SECONDS to report (default HOROVOD_START_TIMEOUT or %d)", DefaultStartTimeout), func(o *options, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("want an integer >= 1")
		}
		o.startTimeoutSeconds = n
		return nil
	}},
	{[]string{"--oversubscribe"}, "", "let ranks outnumber slots and cores (one small machine)", func(o *options, _ string) error {
		o.oversubscribe = true
		return nil
	}},
	{[]string{"--sigkill-timeout"}, "SECONDS", fmt.Sprintf("after a rank fails, the others get SIGTERM after SECONDS and SIGKILL as many again later; Open MPI takes twice SECONDS to end a failed job (default %d; Ctrl-C does not wait for it)", DefaultSigkillTimeout), func(o *options, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("want an integer >= 0")
		}
		o.sigkillTimeout = n
		return nil
	}},
	{[]string{"--binding-args"}, "ARGS", "process binding arguments instead of --bind-to none --map-by slot", func(o *options, v string) error {
		words, err := splitWords(v)
		if err == nil && len(words) == 0 {
			err = errors.New("empty")
		}
		o.bindingArgs = words
		return err
	}},
	{[]string{"--mpi-args"}, "ARGS", "extra mpirun arguments (shell words); an --mca, --bind-to, --map-by or -x here replaces gorovodrun's own", func(o *options, v string) error {
		words, err := splitWords(v)
		o.mpiArgs = append(o.mpiArgs, words...)
		return err
	}},
	{[]string{"--output-filename"}, "DIR", "mpirun writes each rank's output under DIR", func(o *options, v string) error {
		o.outputFilename = v
		return nonEmpty(v)
	}},
	{[]string{"-prefix-timestamp", "--prefix-output-with-timestamp"}, "", "timestamp each line of output", func(o *options, _ string) error {
		o.timestampOutput = true
		return nil
	}},
	{[]string{"--fusion-threshold-mb"}, "MB", "HOROVOD_FUSION_THRESHOLD in MiB; 0 disables fusion (default 128)", func(o *options, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > math.MaxInt>>20 {
			return fmt.Errorf("want an integer >= 0")
		}
		o.setTuning("HOROVOD_FUSION_THRESHOLD", strconv.Itoa(n<<20))
		return nil
	}},
	{[]string{"--cycle-time-ms"}, "MS", "HOROVOD_CYCLE_TIME: longest wait before an idle negotiation round (default 1)", func(o *options, v string) error {
		return o.setNumber("HOROVOD_CYCLE_TIME", v)
	}},
	{[]string{"--cache-capacity"}, "N", "HOROVOD_CACHE_CAPACITY: agreed signatures remembered; 0 disables (default 1024)", func(o *options, v string) error {
		return o.setInt("HOROVOD_CACHE_CAPACITY", v)
	}},
	{[]string{"--timeline-filename"}, "FILE", "HOROVOD_TIMELINE: rank 0 writes a Chrome trace there", func(o *options, v string) error {
		o.setTuning("HOROVOD_TIMELINE", v)
		return nonEmpty(v)
	}},
	{[]string{"--no-stall-check"}, "", "HOROVOD_STALL_CHECK_DISABLE=1: no stall warning, no stall shutdown", func(o *options, _ string) error {
		o.setTuning("HOROVOD_STALL_CHECK_DISABLE", "1")
		return nil
	}},
	{[]string{"--stall-check"}, "", "HOROVOD_STALL_CHECK_DISABLE=0: the stall check on (its default)", func(o *options, _ string) error {
		o.setTuning("HOROVOD_STALL_CHECK_DISABLE", "0")
		return nil
	}},
	{[]string{"--stall-check-warning-time-seconds"}, "SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS (default 60)", func(o *options, v string) error {
		return o.setInt("HOROVOD_STALL_CHECK_TIME_SECONDS", v)
	}},
	{[]string{"--stall-check-shutdown-time-seconds"}, "SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: abort a stalled job (default 0: never)", func(o *options, v string) error {
		return o.setInt("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", v)
	}},
	{[]string{"--mpi"}, "", "run over MPI (gorovodrun's only way; accepted for horovodrun command lines)", func(_ *options, _ string) error {
		return nil
	}},
	{[]string{"--no-autotune", "--no-hierarchical-allreduce", "--no-hierarchical-allgather", "--no-timeline-mark-cycles", "--disable-cache"}, "",
		"what gorovod always does: no autotuning, no hierarchical collectives, no cycle marks in the timeline, no cache of host checks (accepted for horovodrun command lines)", func(_ *options, _ string) error {
			return nil
		}},
	{[]string{"--verbose"}, "", "print the mpirun command line to standard error before running it", func(o *options, _ string) error {
		o.verbose = true
		return nil
	}},
	{[]string{"--dry-run"}, "", "print the mpirun command line to standard output and exit without running it", func(o *options, _ string) error {
		o.dryRun = true
		return nil
	}},
	{[]string{"-h", "--help"}, "", "this help", func(o *options, _ string) error {
		o.help = true
		return nil
	}},
}

var refusedFlags = []refusedFlag{
	{[]string{"--autotune", "--autotune-log-file", "--autotune-warmup-samples", "--autotune-steps-per-sample",
		"--autotune-bayes-opt-max-samples", "--autotune-gaussian-process-noise"},
		"gorovod's horovod package does not autotune: set --fusion-threshold-mb and --cycle-time-ms"},
	{[]string{"--hierarchical-allreduce", "--hierarchical-allgather"},
		"gorovod's horovod package has no hierarchical collectives"},
	{[]string{"--timeline-mark-cycles"},
		"gorovod's timeline does not mark cycles (--timeline-filename is supported)"},
	{[]string{"--mpi-threads-disable", "--no-mpi-threads-disable", "--num-nccl-streams", "--thread-affinity",
		"--log-level", "--log-with-timestamp", "--log-without-timestamp", "--log-hide-timestamp", "--no-log-hide-timestamp"},
		"gorovod's horovod package reads no such setting"},
	{[]string{"--gloo", "--gloo-timeout-seconds", "--jsrun"},
		"gorovodrun launches over Open MPI's mpirun only"},
	{[]string{"--tcp"},
		"it applies to IBM Spectrum MPI only; to keep Open MPI on some interfaces use --network-interface"},
	{[]string{"--min-np", "--min-num-proc", "--max-np", "--max-num-proc", "--slots-per-host", "--elastic-timeout",
		"--reset-limit", "--blacklist-cooldown-range", "--host-discovery-script"},
		"gorovod has no elastic training"},
	{[]string{"--config-file"},
		"give the settings as flags"},
	{[]string{"-cb", "--check-build", "-v", "--version"},
		"gorovodrun has no version or build report of its own: the backends a program has are the ones it imports (horovod/mpi, horovod/ncclbackend), and `mpirun --version` names Open MPI's"},
}

// startTimeoutVariable is horovodrun's variable for --start-timeout, which gorovodrun reads
// (the ranks do not).
const startTimeoutVariable = "HOROVOD_START_TIMEOUT"

// startTimeout is how long the probes of the hosts have: --start-timeout, else
// HOROVOD_START_TIMEOUT of env (seconds, as horovodrun reads it), else DefaultStartTimeout.
func (o options) startTimeout(env []string) (time.Duration, error) {
	n := o.startTimeoutSeconds
	if n == 0 {
		n = DefaultStartTimeout
		if v, ok := lookupEnv(env, startTimeoutVariable); ok {
			var err error
			if n, err = strconv.Atoi(v); err != nil || n < 1 {
				return 0, fmt.Errorf("%s=%q: want an integer number of seconds >= 1", startTimeoutVariable, v)
			}
		}
	}
	return time.Duration(n) * time.Second, nil
}

// lookupEnv finds name's value in env, the first of the name as getenv does.
func lookupEnv(env []string, name string) (string, bool) {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v, true
		}
	}
	return "", false
}

func nonEmpty(v string) error {
	if v == "" {
		return errors.New("empty")
	}
	return nil
}

func (o *options) setInt(name, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return fmt.Errorf("want an integer >= 0")
	}
	o.setTuning(name, strconv.Itoa(n))
	return nil
}

func (o *options) setNumber(name, v string) error {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return fmt.Errorf("want a number >= 0")
	}
	o.setTuning(name, v)
	return nil
}

// parseArgs reads gorovodrun's flags up to `--` or the first argument that is not a flag; the
// rest is the command every rank runs. A flag's value follows it or an = sign.
func parseArgs(args []string) (options, error) {
	o := options{sigkillTimeout: DefaultSigkillTimeout}
	for len(args) > 0 {
		arg := args[0]
		if arg == "--" {
			args = args[1:]
			break
		}
		if !strings.HasPrefix(arg, "-") || arg == "-" {
			break
		}
		args = args[1:]
		name, value, hasValue := strings.Cut(arg, "=")
		if r := findRefused(name); r != nil {
			return o, fmt.Errorf("%s is horovodrun's but gorovodrun refuses it: %s", name, r.why)
		}
		spec := findFlag(name)
		if spec == nil {
			return o, fmt.Errorf("unknown flag %s (gorovodrun --help lists them; the command follows the flags, or --)", name)
		}
		switch {
		case spec.value == "" && hasValue:
			return o, fmt.Errorf("%s takes no value (got %q)", name, value)
		case spec.value != "" && !hasValue:
			if len(args) == 0 {
				return o, fmt.Errorf("%s needs a value: %s %s", name, name, spec.value)
			}
			value, args = args[0], args[1:]
		}
		if err := spec.set(&o, value); err != nil {
			if spec.value == "" {
				return o, fmt.Errorf("%s: %v", name, err)
			}
			return o, fmt.Errorf("%s %q: %v", name, value, err)
		}
	}
	o.command = args
	if o.help {
		return o, nil
	}
	return o, o.validate()
}

// validate checks what no single flag can: that there is a rank count and a command, and that
// the ranks fit the slots.
func (o *options) validate() error {
	if o.np == 0 {
		return errors.New("-np N is required: how many ranks to start")
	}
	if len(o.command) == 0 {
		return errors.New("no command: give the program every rank runs after the flags (or after --)")
	}
	if strings.HasPrefix(o.command[0], "-") {
		return fmt.Errorf("the command %q starts with -: mpirun would read it as one of its options; give the program's path (./%s)", o.command[0], o.command[0])
	}
	binding, err := parseMpirunArgs("--binding-args", o.bindingArgs)
	if err != nil {
		return err
	}
	opts, err := parseMpirunArgs("--mpi-args", o.mpiArgs)
	if err != nil {
		return err
	}
	for _, opt := range opts {
		switch opt.name {
		case "np", "n", "c", "H", "host", "hostfile", "machinefile", "default-hostfile":
			return fmt.Errorf("--mpi-args: %s: give the ranks and hosts with gorovodrun's own -np, -H or --hostfile", opt.word)
		}
	}
	if o.hosts != nil && !o.oversubscribe && !oversubscribes(append(binding, opts...)) {
		if slots := totalSlots(o.hosts); o.np > slots {
			return fmt.Errorf("-np %d exceeds the %d slots of %s (add slots, or --oversubscribe to run more ranks than slots)", o.np, slots, o.hostsFrom)
		}
	}
	return nil
}

// oversubscribes reports whether mpirun options allow more ranks than slots: --oversubscribe
// (horovodrun has no flag of its own for it, so its users pass it in --mpi-args) or a --map-by
// with the OVERSUBSCRIBE modifier.
func oversubscribes(opts []mpirunOption) bool {
	return slices.ContainsFunc(opts, func(opt mpirunOption) bool {
		return opt.name == "oversubscribe" ||
			opt.name == "map-by" && strings.Contains(strings.ToUpper(opt.values[0]), "OVERSUBSCRIBE")
	})
}

func findFlag(name string) *flagSpec {
	return findNamed(flagSpecs, name, func(f *flagSpec) []string { return f.names })
}

func findRefused(name string) *refusedFlag {
	return findNamed(refusedFlags, name, func(r *refusedFlag) []string { return r.names })
}

// findNamed returns the item one of whose names is name, nil when none is.
func findNamed[T any](items []T, name string, names func(*T) []string) *T {
	for i := range items {
		if slices.Contains(names(&items[i]), name) {
			return &items[i]
		}
	}
	return nil
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, `usage: gorovodrun -np N [-H HOST:SLOTS,... | --hostfile FILE] [flags] [--] COMMAND [ARGS...]

Starts COMMAND as N ranks of a gorovod job through Open MPI's mpirun, as horovodrun does, and
forwards its environment to every rank (all but shell functions, OLDPWD, *_SECRET_KEY, MPI's own
OMPI_*, PMIX_* and PMI_*, and HOSTNAME, SHLVL, _). A Ctrl-C (or SIGTERM) becomes SIGUSR2 to every
rank at once, repeated every 0.5 s until the job ends (a rank still starting would miss one),
which finetune takes as an interrupt (every rank stops after the same step, rank 0 checkpoints;
exit status 130); a second one ends the job at once. Otherwise the exit status is mpirun's.

flags:
`)
	for _, f := range flagSpecs {
		names := strings.Join(f.names, ", ")
		if f.value != "" {
			names += " " + f.value
		}
		fmt.Fprintf(w, "  %s\n        %s\n", names, f.usage)
	}
	fmt.Fprint(w, "\nhorovodrun flags refused (the setting would not be in force):\n")
	for _, r := range refusedFlags {
		fmt.Fprintf(w, "  %s\n        %s\n", strings.Join(r.names, ", "), r.why)
	}
}
