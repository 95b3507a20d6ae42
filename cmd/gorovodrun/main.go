// Command gorovodrun launches a gorovod job, as horovodrun launches a Horovod one over MPI:
//
//	gorovodrun -np 4 -H host1:2,host2:2 bin/finetune --do_train=true ...
//
// It builds Open MPI's mpirun command line (no process binding, slots filled host by host, TCP and
// shared-memory transports, ssh options, network interfaces, the HOROVOD_* tuning flags, the
// environment every rank needs) and runs it, exiting with mpirun's status. Ranks on several
// machines with no interface named are preceded by a probe of the machines for the interfaces
// they share (probeInterfaces), as horovodrun does. A Ctrl-C reaches every
// rank at once as SIGUSR2, which finetune takes as an interrupt (see launch); a second one ends
// the job. --dry-run prints the command instead.
// gorovodrun --help lists the flags, and the horovodrun flags it refuses and why.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// Exit statuses of gorovodrun's own failures; any other is mpirun's.
const (
	exitNoInterface = 1   // the hosts share no network interface (probeInterfaces)
	exitUsage       = 2   // a bad command line
	exitCannotExec  = 126 // mpirun is there but cannot be run
	exitNoMpirun    = 127 // no Open MPI mpirun on PATH
)

// run returns gorovodrun's exit status.
func run(args, env []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == probeFlag {
		return runProbe(args[1:], stderr)
	}
	o, err := parseArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "gorovodrun: %v\n", err)
		return exitUsage
	}
	if o.help {
		printUsage(stdout)
		return 0
	}
	if err := checkForwardedValues(o, env); err != nil {
		fmt.Fprintf(stderr, "gorovodrun: %v\n", err)
		return exitUsage
	}
	root := os.Geteuid() == 0
	if o.dryRun {
		argv, warnings := mpirunCommand(o, env, root)
		if needsProbe(o, env) {
			warnings = append(warnings, "a launch first probes the machines for the network interfaces they share; --dry-run does not")
		}
		printWarnings(stderr, warnings)
		fmt.Fprintln(stdout, shellLine(argv))
		return 0
	}
	path, err := findOpenMPI()
	if err != nil {
		fmt.Fprintf(stderr, "gorovodrun: %v\n", err)
		return exitNoMpirun
	}
	if needsProbe(o, env) {
		timeout, err := o.startTimeout(env)
		if err != nil {
			fmt.Fprintf(stderr, "gorovodrun: %v\n", err)
			return exitUsage
		}
		nics, err := probeInterfaces(o, env, root, path, timeout)
		var none *noCommonInterfaceError
		switch {
		case errors.As(err, &none):
			fmt.Fprintf(stderr, "gorovodrun: %v\n", err)
			return exitNoInterface
		case err != nil:
			fmt.Fprintf(stderr, "gorovodrun: warning: could not probe the machines for the network interfaces they share: %v\n", err)
		default:
			o.nics = nics
			if o.verbose {
				fmt.Fprintf(stderr, "gorovodrun: every machine is reached on %s (probed): MPI's TCP transport and NCCL's sockets use it\n", strings.Join(nics, ","))
			}
		}
	}
	argv, warnings := mpirunCommand(o, env, root)
	printWarnings(stderr, warnings)
	if o.verbose {
		fmt.Fprintf(stderr, "gorovodrun: %s\n", shellLine(argv))
	}
	return launch(path, argv, env, stderr)
}

func printWarnings(stderr io.Writer, warnings []string) {
	for _, w := range warnings {
		fmt.Fprintf(stderr, "gorovodrun: warning: %s\n", w)
	}
}

// findOpenMPI finds mpirun on PATH and checks that it is Open MPI's, whose options gorovodrun
// writes (MPICH's or Intel's mpirun would misread them).
func findOpenMPI() (string, error) {
	path, err := exec.LookPath("mpirun")
	if err != nil {
		return "", fmt.Errorf("no mpirun on PATH (%s): install Open MPI (Debian: openmpi-bin, as `make setup` does) or put its bin directory on PATH", os.Getenv("PATH"))
	}
	out, err := exec.Command(path, "--version").CombinedOutput()
	version := strings.TrimSpace(string(out))
	if err != nil {
		return "", fmt.Errorf("%s --version: %v: %s", path, err, version)
	}
	if !strings.Contains(version, "Open MPI") && !strings.Contains(version, "OpenRTE") {
		first, _, _ := strings.Cut(version, "\n")
		return "", fmt.Errorf("%s is not Open MPI's mpirun (it says %q): gorovodrun writes Open MPI's options", path, first)
	}
	return path, nil
}
