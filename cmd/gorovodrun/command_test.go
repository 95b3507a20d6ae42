package main

import (
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func mustParse(t *testing.T, args ...string) options {
	t.Helper()
	o, err := parseArgs(args)
	if err != nil {
		t.Fatalf("parseArgs(%q): %v", args, err)
	}
	return o
}

func TestCommandDefaults(t *testing.T) {
	// Everything but horovodrun's exceptions, the MPI launcher's own variables and the shell's
	// per-machine state (and a name no shell exports).
	env := []string{"PATH=/usr/bin", "HOME=/root", "NCCL_DEBUG=INFO", "CUDA_VISIBLE_DEVICES=0", "LD_LIBRARY_PATH=/l",
		"HOROVOD_CYCLE_TIME=2", "GOROVOD_MPI_WAIT=spin", "TF_CPP_MIN_LOG_LEVEL=2", "OMPI_MCA_btl=self", "PYTHONPATH=/p",
		"OMP_NUM_THREADS=4", "BASH_FUNC_f%%=() { :; }", "OLDPWD=/", "HOSTNAME=h1", "SHLVL=2", "_=/usr/bin/env",
		"AWS_SECRET_KEY=s", "PMIX_RANK=0", "PMI_SIZE=2", "2BAD=x", "a-b=c"}
	o := mustParse(t, "-np", "3", "bin/finetune", "--do_train=true")
	argv, warnings := mpirunCommand(o, env, false)
	want := []string{"mpirun", "-np", "3", "-H", "localhost:3",
		"--bind-to", "none", "--map-by", "slot", "--mca", "pml", "ob1", "--mca", "btl", "^openib",
		"--mca", "odls_base_sigkill_timeout", "1", "--tag-output",
		"-x", "CUDA_VISIBLE_DEVICES", "-x", "GOROVOD_MPI_WAIT", "-x", "HOME", "-x", "HOROVOD_CYCLE_TIME",
		"-x", "LD_LIBRARY_PATH", "-x", "NCCL_DEBUG", "-x", "OMP_NUM_THREADS",
		"-x", "PATH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL",
		"bin/finetune", "--do_train=true"}
	if !reflect.DeepEqual(argv, want) {
		t.Errorf("argv:\n got %q\nwant %q", argv, want)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings for variables horovod reads: %q", warnings)
	}

	root, _ := mpirunCommand(o, env, true)
	if !reflect.DeepEqual(root, slices.Insert(slices.Clone(want), 1, "--allow-run-as-root")) {
		t.Errorf("as root: %q", root)
	}
}

func TestCommandAllFlags(t *testing.T) {
	o := mustParse(t, "-np", "4", "-H", "host1:2,host2:2", "-p", "2222", "-i", "/k/id_rsa", "--network-interface", "eth0",
		"--network-interface=eth1,ib0", "--oversubscribe", "--sigkill-timeout", "30", "--output-filename", "logs",
		"--prefix-output-with-timestamp", "--fusion-threshold-mb", "64", "--cycle-time-ms", "3.5", "--cache-capacity", "0",
		"--timeline-filename", "/t/tl.json", "--no-stall-check", "--stall-check-warning-time-seconds", "30",
		"--stall-check-shutdown-time-seconds", "120", "--mpi", "--verbose", "--", "prog", "-np", "9")
	env := []string{"NCCL_SOCKET_IFNAME=wrong", "HOROVOD_FUSION_THRESHOLD=1", "HOROVOD_HIERARCHICAL_ALLREDUCE=1"}
	argv, warnings := mpirunCommand(o, env, false)
	want := []string{"mpirun", "-np", "4", "-H", "host1:2,host2:2",
		"--bind-to", "none", "--map-by", "slot", "--mca", "pml", "ob1", "--mca", "btl", "^openib",
		"--mca", "odls_base_sigkill_timeout", "30",
		"--oversubscribe",
		"--mca", "plm_rsh_args", "-p 2222 -i /k/id_rsa",
		"--mca", "btl_tcp_if_include", "eth0,eth1,ib0", "-x", "NCCL_SOCKET_IFNAME=eth0,eth1,ib0",
		"--tag-output", "--output-filename", "logs", "--timestamp-output",
		"-x", "HOROVOD_FUSION_THRESHOLD=67108864", "-x", "HOROVOD_CYCLE_TIME=3.5", "-x", "HOROVOD_CACHE_CAPACITY=0",
		"-x", "HOROVOD_TIMELINE=/t/tl.json", "-x", "HOROVOD_STALL_CHECK_DISABLE=1",
		"-x", "HOROVOD_STALL_CHECK_TIME_SECONDS=30", "-x", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=120",
		"-x", "HOROVOD_HIERARCHICAL_ALLREDUCE",
		"prog", "-np", "9"}
	if !reflect.DeepEqual(argv, want) {
		t.Errorf("argv:\n got %q\nwant %q", argv, want)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "HOROVOD_HIERARCHICAL_ALLREDUCE") {
		t.Errorf("warnings: %q, want one naming HOROVOD_HIERARCHICAL_ALLREDUCE", warnings)
	}
}

// Open MPI splits plm_rsh_args at spaces and gives the pieces to ssh as they are, without a
// shell: the identity file must reach ssh unquoted, so that a path ssh expands itself
// (~/.ssh/id_rsa, as a command line or script writes --ssh-identity-file=~/...) or one with a
// quote is the file ssh opens.
func TestSSHArgsReachSSHAsOpenMPISplitsThem(t *testing.T) {
	for _, key := range []string{"~/.ssh/id_rsa", "/keys/o'brien", "/k/id_rsa"} {
		o := mustParse(t, "-np", "2", "-p", "2222", "--ssh-identity-file="+key, "prog")
		argv, _ := mpirunCommand(o, nil, false)
		i := slices.Index(argv, "plm_rsh_args")
		if i < 0 || i+1 == len(argv) {
			t.Fatalf("no plm_rsh_args in %q", argv)
		}
		if got, want := strings.Split(argv[i+1], " "), []string{"-p", "2222", "-i", key}; !reflect.DeepEqual(got, want) {
			t.Errorf("-i %s: ssh gets %q, want %q", key, got, want)
		}
	}
}

// Ranks on several machines with no interface chosen for MPI (by --network-interface, mpirun's
// btl_tcp_if_include or _exclude in --mpi-args or the environment) are what a launch probes the
// machines for (as horovodrun), and a command line without that probe's result is warned about.
func TestSeveralMachinesWithoutAnInterfaceAreProbed(t *testing.T) {
	const warning = "ranks on 2 machines and no network interface chosen"
	for _, tc := range []struct {
		args []string
		env  []string
		warn bool
	}{
		{[]string{"-H", "a:2,b:2"}, nil, true},
		{[]string{"-H", "a:4"}, nil, false},
		{nil, nil, false},
		{[]string{"-H", "a:2,b:2", "--network-interface", "eth0"}, nil, false},
		{[]string{"-H", "a:2,b:2", "--mpi-args", "--mca btl_tcp_if_include 10.0.0.0/8"}, nil, false},
		{[]string{"-H", "a:2,b:2", "--mpi-args", "--mca btl_tcp_if_exclude docker0,lo"}, nil, false},
		{[]string{"-H", "a:2,b:2"}, []string{"OMPI_MCA_btl_tcp_if_include=eth0"}, false},
	} {
		o := mustParse(t, append(append([]string{"-np", "4"}, tc.args...), "p")...)
		_, warnings := mpirunCommand(o, tc.env, false)
		warned := slices.ContainsFunc(warnings, func(w string) bool { return strings.HasPrefix(w, warning) })
		if warned != tc.warn {
			t.Errorf("%q with %q: warnings %q; want the interface warning: %v", tc.args, tc.env, warnings, tc.warn)
		}
		if got := needsProbe(o, tc.env); got != tc.warn {
			t.Errorf("%q with %q: needsProbe %v, want %v", tc.args, tc.env, got, tc.warn)
		}
	}
}

func TestCommandLaterFlagWins(t *testing.T) {
	o := mustParse(t, "-np", "1", "--no-stall-check", "--cycle-time-ms", "1", "--stall-check", "--cycle-time-ms=5", "p")
	argv, _ := mpirunCommand(o, nil, false)
	got := strings.Join(argv, " ")
	for _, want := range []string{"-x HOROVOD_STALL_CHECK_DISABLE=0 -x HOROVOD_CYCLE_TIME=5 p"} {
		if !strings.HasSuffix(got, want) {
			t.Errorf("%s\ndoes not end with %s", got, want)
		}
	}
}

// What --mpi-args sets replaces gorovodrun's own setting of the same name: Open MPI refuses an
// MCA parameter given twice, and a user's -x or --map-by is meant to win.
func TestCommandMpiArgsReplace(t *testing.T) {
	o := mustParse(t, "-np", "2", "--network-interface", "lo", "--mpi-args",
		`--mca btl tcp,self,vader -mca btl_tcp_if_include lo,eth0 --map-by node -x NCCL_DEBUG=WARN -x "X=a b"`, "p")
	argv, _ := mpirunCommand(o, []string{"NCCL_DEBUG=INFO", "PATH=/bin"}, false)
	want := []string{"mpirun", "-np", "2", "-H", "localhost:2", "--bind-to", "none", "--mca", "pml", "ob1",
		"--mca", "odls_base_sigkill_timeout", "1", "-x", "NCCL_SOCKET_IFNAME=lo", "--tag-output", "-x", "PATH",
		"--mca", "btl", "tcp,self,vader", "-mca", "btl_tcp_if_include", "lo,eth0", "--map-by", "node",
		"-x", "NCCL_DEBUG=WARN", "-x", "X=a b", "p"}
	if !reflect.DeepEqual(argv, want) {
		t.Errorf("argv:\n got %q\nwant %q", argv, want)
	}

	// A value that starts with - is a value: "-x" here is MCA's, not mpirun's -x.
	o = mustParse(t, "-np", "2", "--mpi-args", "--mca btl_tcp_port_min_v4 -x --mca pml -np", "p")
	if keys := mpirunKeys(o.mpiArgs); !reflect.DeepEqual(keys, map[string]bool{"mca:btl_tcp_port_min_v4": true, "mca:pml": true}) {
		t.Errorf("keys of values that start with -: %v", keys)
	}

	o = mustParse(t, "-np", "2", "--binding-args", "--bind-to socket --rankfile 'my ranks'", "p")
	argv, _ = mpirunCommand(o, nil, false)
	if got := strings.Join(argv[5:10], " "); got != "--bind-to socket --rankfile my ranks --mca" {
		t.Errorf("--binding-args: %q", argv)
	}
}

// Each line of a rank's output starts with its tag ([1,0]<stdout>:), as horovodrun has mpirun
// write it for the log tooling that reads it; mpirun's own --tag-output in --mpi-args does not
// double it, and its MCA parameter set to 0 there leaves the lines untagged, as Open MPI 5's
// --output there does (the user's list of forms, with tag in it or not).
func TestCommandTagsOutput(t *testing.T) {
	for _, tc := range []struct {
		mpiArgs []string
		tags    int
	}{
		{nil, 1},
		{[]string{"--mpi-args", "--tag-output"}, 1},
		{[]string{"--mpi-args", "--mca orte_tag_output 0"}, 0},
		{[]string{"--mpi-args", "-gmca orte_tag_output false"}, 0},
		{[]string{"--mpi-args", "--output timestamp"}, 0},
		{[]string{"--mpi-args", "--output tag,timestamp --display map"}, 0},
	} {
		argv, _ := mpirunCommand(mustParse(t, append(tc.mpiArgs, "-np", "2", "p")...), nil, false)
		if got := strings.Count(strings.Join(argv, " "), "--tag-output"); got != tc.tags {
			t.Errorf("%q: %d --tag-output in %q, want %d", tc.mpiArgs, got, argv, tc.tags)
		}
	}
}

// What --dry-run prints, read back by a real shell, is the argument list that runs.
func TestDryRunLineIsTheCommand(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	o := mustParse(t, "-np", "2", "-i", "~/it's_key", "--timeline-filename", "/a b/$HOME/`x`", "--",
		"prog", "", "a\"b", `c\d`, "e\nf", "*", "~", "^x", "--flag=1,2:3")
	argv, _ := mpirunCommand(o, []string{"PATH=/bin"}, true)
	out, err := exec.Command(sh, "-c", `printf '%s\0' `+shellLine(argv)).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	if !reflect.DeepEqual(got, argv) {
		t.Errorf("sh read back\n %q\nfrom %s\nwant %q", got, shellLine(argv), argv)
	}
}

// splitWords reads --mpi-args as sh reads the same words (no expansions in these inputs).
func TestSplitWordsAsShell(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	for _, s := range []string{
		`--mca btl tcp,self`, `  -x  A=1  `, `-x 'A=a b' -x "B=c d"`, `a'b'"c"d`, `"x\"y" 'p\q' r\ s`,
		`"\\ \a"`, `''`, `"" x`, "tab\tsep", `--map-by ppr:6:node`,
	} {
		words, err := splitWords(s)
		if err != nil {
			t.Errorf("splitWords(%q): %v", s, err)
			continue
		}
		out, err := exec.Command(sh, "-c", `eval "set -- $1"; for w in "$@"; do printf '%s\0' "$w"; done`, "sh", s).Output()
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		if len(out) > 0 {
			want = strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
		}
		if !reflect.DeepEqual(words, want) {
			t.Errorf("splitWords(%q) = %q, sh reads %q", s, words, want)
		}
	}
	for _, bad := range []string{`'open`, `"open`, `trailing\`} {
		if _, err := splitWords(bad); err == nil {
			t.Errorf("splitWords(%q): no error", bad)
		}
	}
}
