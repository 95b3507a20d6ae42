package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestParseHosts(t *testing.T) {
	o := mustParse(t, "-np", "5", "--hosts=host1:2,10.0.0.2:1,fe80::1:2", "p")
	want := []host{{"host1", 2}, {"10.0.0.2", 1}, {"fe80::1", 2}}
	if !reflect.DeepEqual(o.hosts, want) {
		t.Errorf("hosts %v, want %v", o.hosts, want)
	}

	hf := writeFile(t, "hosts", "# the cluster\nhost1 slots=4\n\n  host2   slots=2   # the small one\n")
	o = mustParse(t, "-np", "6", "-hostfile", hf, "p")
	want = []host{{"host1", 4}, {"host2", 2}}
	if !reflect.DeepEqual(o.hosts, want) {
		t.Errorf("hostfile hosts %v, want %v", o.hosts, want)
	}
	if argv, _ := mpirunCommand(o, nil, false); argv[4] != "host1:4,host2:2" {
		t.Errorf("hostfile becomes -H %q", argv[4])
	}
}

func TestParseCommandStart(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		command []string
	}{
		{[]string{"-np", "2", "prog", "-np", "3", "--", "x"}, []string{"prog", "-np", "3", "--", "x"}},
		{[]string{"-np", "2", "--", "./-weird", "--verbose"}, []string{"./-weird", "--verbose"}},
		{[]string{"-np=2", "--verbose", "./a b"}, []string{"./a b"}},
	} {
		o := mustParse(t, tc.args...)
		if !reflect.DeepEqual(o.command, tc.command) {
			t.Errorf("%q: command %q, want %q", tc.args, o.command, tc.command)
		}
	}
	if o := mustParse(t, "-np", "2", "--verbose", "p"); !o.verbose || o.np != 2 {
		t.Errorf("flags before the command: %+v", o)
	}
}

// Every bad input is refused with an error that names what is wrong.
func TestBadInput(t *testing.T) {
	badFile := writeFile(t, "bad", "host1 slots=2\nhost2 max_slots=4\n")
	zeroFile := writeFile(t, "zero", "host1 slots=0\n")
	emptyFile := writeFile(t, "empty", "# nobody\n\n")
	dupFile := writeFile(t, "dup", "a slots=1\nb slots=1\na slots=2\n")
	for _, tc := range []struct {
		args []string
		want []string // substrings of the error
	}{
		{[]string{"p"}, []string{"-np N is required"}},
		{[]string{"-np", "2"}, []string{"no command"}},
		{[]string{"-np", "2", "--"}, []string{"no command"}},
		{[]string{"-np", "0", "p"}, []string{`-np "0"`, ">= 1"}},
		{[]string{"-np", "two", "p"}, []string{`-np "two"`}},
		{[]string{"-np"}, []string{"-np needs a value"}},
		{[]string{"-np", "2", "-H", "a:2,b", "p"}, []string{`-H "a:2,b": "b": want HOST:SLOTS`}},
		{[]string{"-np", "2", "-H", "a:2,b:0", "p"}, []string{`"b:0"`, "slots"}},
		{[]string{"-np", "2", "-H", "a:x", "p"}, []string{`"a:x"`, `slots "x"`}},
		{[]string{"-np", "2", "-H", ":2", "p"}, []string{`":2"`, "host name"}},
		{[]string{"-np", "2", "-H", "a\nb:2", "p"}, []string{`"a\nb:2"`, `bad host name "a\nb"`}},
		{[]string{"-np", "2", "-H", "a#b:2", "p"}, []string{`"a#b:2"`, `bad host name "a#b"`}},
		{[]string{"-np", "2", "-H", "a:1,,b:1", "p"}, []string{`-H "a:1,,b:1": "": want`}},
		{[]string{"-np", "2", "-H", "", "p"}, []string{"empty host list"}},
		{[]string{"-np", "2", "-H", "a:1,a:1", "p"}, []string{`"a" is listed twice`}},
		{[]string{"-np", "5", "-H", "a:2,b:2", "p"}, []string{"-np 5 exceeds the 4 slots of -H a:2,b:2"}},
		{[]string{"-np", "2", "-H", "a:2", "--hostfile", badFile, "p"}, []string{"once, with -H or --hostfile"}},
		{[]string{"-np", "2", "--hostfile", badFile, "p"}, []string{`--hostfile "` + badFile + `": line 2: "host2 max_slots=4"`, "HOST slots=N"}},
		{[]string{"-np", "2", "--hostfile", zeroFile, "p"}, []string{zeroFile, `line 1: "host1 slots=0": slots "0"`}},
		{[]string{"-np", "2", "--hostfile", emptyFile, "p"}, []string{emptyFile, "no hosts"}},
		{[]string{"-np", "2", "--hostfile", dupFile, "p"}, []string{`"a" is listed twice`}},
		{[]string{"-np", "2", "--hostfile", "/nonexistent/hosts", "p"}, []string{"/nonexistent/hosts"}},
		{[]string{"-np", "3", "--hostfile", writeFile(t, "two", "a slots=2\n"), "p"}, []string{"-np 3 exceeds the 2 slots of --hostfile"}},
		{[]string{"-np", "2", "--frobnicate", "p"}, []string{"unknown flag --frobnicate"}},
		{[]string{"-np", "2", "--verbose=yes", "p"}, []string{"--verbose takes no value"}},
		{[]string{"-np", "2", "-p", "0", "p"}, []string{`-p "0"`, "port"}},
		{[]string{"-np", "2", "--ssh-port", "70000", "p"}, []string{`--ssh-port "70000"`}},
		{[]string{"-np", "2", "-i", "/k/id rsa", "p"}, []string{`-i "/k/id rsa"`, "a space", "plm_rsh_args"}},
		{[]string{"-np", "2", "--network-interface", "eth0,,eth1", "p"}, []string{`bad interface name ""`}},
		{[]string{"-np", "2", "--sigkill-timeout", "-1", "p"}, []string{"--sigkill-timeout"}},
		{[]string{"-np", "2", "--fusion-threshold-mb", "-1", "p"}, []string{`--fusion-threshold-mb "-1"`}},
		{[]string{"-np", "2", "--fusion-threshold-mb", "1.5", "p"}, []string{`--fusion-threshold-mb "1.5"`}},
		{[]string{"-np", "2", "--cycle-time-ms", "NaN", "p"}, []string{`--cycle-time-ms "NaN"`}},
		{[]string{"-np", "2", "--cycle-time-ms", "-0.5", "p"}, []string{`--cycle-time-ms "-0.5"`}},
		{[]string{"-np", "2", "--cache-capacity", "lots", "p"}, []string{`--cache-capacity "lots"`}},
		{[]string{"-np", "2", "--stall-check-warning-time-seconds", "1.5", "p"}, []string{"--stall-check-warning-time-seconds"}},
		{[]string{"-np", "2", "--stall-check-shutdown-time-seconds", "x", "p"}, []string{"--stall-check-shutdown-time-seconds"}},
		{[]string{"-np", "2", "--timeline-filename=", "p"}, []string{"--timeline-filename", "empty"}},
		{[]string{"-np", "2", "--mpi-args", "--mca btl 'tcp", "p"}, []string{"unterminated '"}},
		{[]string{"-np", "2", "--mpi-args", "-np 3", "p"}, []string{"--mpi-args: -np", "gorovodrun's own"}},
		{[]string{"-np", "2", "--mpi-args", "--hostfile h", "p"}, []string{"--mpi-args: --hostfile"}},
		{[]string{"-np", "2", "--binding-args", "", "p"}, []string{"--binding-args", "empty"}},
		// mpirun words that would take the command as an option's value or as the program.
		{[]string{"-np", "2", "--mpi-args", "--bind-to", "true"}, []string{"--mpi-args ends with --bind-to, which takes 1 value"}},
		{[]string{"-np", "2", "--mpi-args", "--mca btl", "p"}, []string{"--mpi-args ends with --mca, which takes 2 values"}},
		{[]string{"-np", "2", "--mpi-args", "-mca", "p"}, []string{"ends with -mca, which takes 2 values"}},
		{[]string{"-np", "2", "--mpi-args", "--map-by node", "--mpi-args", "-x", "p"}, []string{"ends with -x, which takes 1 value"}},
		{[]string{"-np", "2", "--mpi-args", "--rank-by", "p"}, []string{"ends with --rank-by"}},
		{[]string{"-np", "2", "--mpi-args", "--report-bindings --output-filename", "p"}, []string{"ends with --output-filename"}},
		{[]string{"-np", "2", "--mpi-args", "-H", "p"}, []string{"ends with -H"}},
		{[]string{"-np", "2", "--mpi-args", "--hostfile", "p"}, []string{"ends with --hostfile"}},
		{[]string{"-np", "2", "--mpi-args", "--map-by node stray", "p"}, []string{`--mpi-args: "stray" is neither an mpirun option nor the value of one`}},
		{[]string{"-np", "2", "--binding-args", "--bind-to", "p"}, []string{"--binding-args ends with --bind-to"}},
		// A command mpirun would read as its own option.
		{[]string{"-np", "2", "--", "-x"}, []string{`the command "-x" starts with -`, "./-x"}},
		{[]string{"-np", "2", "-", "p"}, []string{`the command "-" starts with -`}},
	} {
		_, err := parseArgs(tc.args)
		if err == nil {
			t.Errorf("%q: no error", tc.args)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q does not say %q", tc.args, err, w)
			}
		}
	}
}

// More ranks than slots pass with mpirun's own oversubscription in --mpi-args or --binding-args
// (horovodrun has no --oversubscribe: its users pass mpirun's), as with gorovodrun's flag.
func TestOversubscribingMpirunArgsAllowMoreRanksThanSlots(t *testing.T) {
	for _, extra := range [][]string{
		{"--oversubscribe"},
		{"--mpi-args", "--oversubscribe"},
		{"--mpi-args=-oversubscribe"},
		{"--mpi-args", "--map-by slot:OVERSUBSCRIBE"},
		{"--binding-args", "--map-by core:oversubscribe"},
	} {
		args := append(append([]string{"-np", "4", "-H", "localhost:2"}, extra...), "p")
		if _, err := parseArgs(args); err != nil {
			t.Errorf("%q: %v", args, err)
		}
	}
	if _, err := parseArgs([]string{"-np", "4", "-H", "localhost:2", "--mpi-args", "--map-by slot", "p"}); err == nil {
		t.Error("-np 4 on 2 slots without oversubscription accepted")
	}
}

// Each horovodrun flag gorovodrun does not honour is refused, naming the flag and why, whether
// given alone or with a value.
func TestRefusedFlags(t *testing.T) {
	for _, r := range refusedFlags {
		for _, name := range r.names {
			if findFlag(name) != nil {
				t.Errorf("%s is both accepted and refused", name)
			}
			for _, arg := range []string{name, name + "=1"} {
				_, err := parseArgs([]string{"-np", "2", arg, "p"})
				if err == nil || !strings.Contains(err.Error(), name+" is horovodrun's") || !strings.Contains(err.Error(), r.why) {
					t.Errorf("%s: error %v, want it refused with %q", arg, err, r.why)
				}
			}
		}
	}
}

// horovodrun's flags that ask for what gorovodrun and horovod always do (no autotuning, no
// hierarchical collectives, no cycle marks, no cache of host checks) are accepted, as --mpi is,
// and change nothing: a horovodrun command line that says so runs.
func TestFlagsOfWhatIsInForceChangeNothing(t *testing.T) {
	want, _ := mpirunCommand(mustParse(t, "-np", "2", "p"), nil, false)
	for _, name := range []string{"--disable-cache", "--no-autotune", "--no-hierarchical-allreduce",
		"--no-hierarchical-allgather", "--no-timeline-mark-cycles"} {
		o, err := parseArgs([]string{"-np", "2", name, "p"})
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got, _ := mpirunCommand(o, nil, false); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
}

// --help lists each accepted flag, and each refused one with its reason.
func TestHelp(t *testing.T) {
	var out, errOut strings.Builder
	if code := run([]string{"--help"}, nil, &out, &errOut); code != 0 {
		t.Fatalf("--help: exit %d, %s", code, errOut.String())
	}
	for _, f := range flagSpecs {
		for _, n := range f.names {
			if !strings.Contains(out.String(), n) {
				t.Errorf("--help does not list %s", n)
			}
		}
	}
	for _, r := range refusedFlags {
		if !strings.Contains(out.String(), r.why) {
			t.Errorf("--help does not say %q", r.why)
		}
	}
}

// --dry-run prints the command and the warnings, and runs nothing.
func TestDryRun(t *testing.T) {
	env := []string{"PATH=/bin", "HOROVOD_AUTOTUNE=1", "HOROVOD_GPU_OPERATIONS=NCCL"}
	var out, errOut strings.Builder
	if code := run([]string{"--dry-run", "-np", "2", "-H", "a:1,b:1", "prog", "x y"}, env, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	argv, _ := mpirunCommand(mustParse(t, "-np", "2", "-H", "a:1,b:1", "prog", "x y"), env, os.Geteuid() == 0)
	if out.String() != shellLine(argv)+"\n" {
		t.Errorf("printed %q, want %q", out.String(), shellLine(argv))
	}
	for _, want := range []string{
		"warning: HOROVOD_AUTOTUNE is forwarded, but gorovod's horovod package does not read it\n",
		"warning: HOROVOD_GPU_OPERATIONS is forwarded, but gorovod's horovod package does not read it (finetune's --allreduce_backend=nccl asks for NCCL)",
	} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr %q, want %q", errOut.String(), want)
		}
	}
	out.Reset()
	if code := run([]string{"-np", "2", "--autotune", "prog"}, env, &out, &errOut); code != exitUsage || out.Len() != 0 {
		t.Errorf("a refused flag: exit %d, printed %q", code, out.String())
	}
}

// A setting every rank's horovod.Init would refuse is refused before the launch, with horovod's
// message (horovod.ReadSettings, horovod's parser), as read in the environment the ranks would get:
// a tuning flag or --mpi-args's -x NAME=VALUE replaces a bad value of the launching environment,
// and --mpi-args's -x NAME forwards it again.
func TestRefusesWhatEveryRankWould(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		args []string
		want string // "" for a launch
	}{
		{[]string{"HOROVOD_CYCLE_TIME=abc"}, nil, `horovod: HOROVOD_CYCLE_TIME="abc": want a non-negative number`},
		{[]string{"GOROVOD_MPI_WAIT=bogus"}, nil, `horovod: GOROVOD_MPI_WAIT="bogus": want sleep or spin`},
		{[]string{"HOROVOD_STALL_CHECK_DISABLE=true"}, nil, `horovod: HOROVOD_STALL_CHECK_DISABLE="true": want an integer`},
		{[]string{"HOROVOD_FUSION_THRESHOLD=64MB"}, nil, `horovod: HOROVOD_FUSION_THRESHOLD="64MB": want a non-negative integer`},
		// The first of a name is the one mpirun forwards.
		{[]string{"HOROVOD_CACHE_CAPACITY=-1", "HOROVOD_CACHE_CAPACITY=5"}, nil, `horovod: HOROVOD_CACHE_CAPACITY="-1": want a non-negative integer`},
		{[]string{"HOROVOD_CACHE_CAPACITY=5", "HOROVOD_CACHE_CAPACITY=-1"}, nil, ""},
		{[]string{"GOROVOD_MPI_WAIT=spin", "HOROVOD_CYCLE_TIME=0.5"}, nil, ""},
		{[]string{"HOROVOD_CYCLE_TIME=abc"}, []string{"--cycle-time-ms", "2"}, ""},
		{[]string{"HOROVOD_STALL_CHECK_DISABLE=true"}, []string{"--no-stall-check"}, ""},
		{[]string{"HOROVOD_FUSION_THRESHOLD=64MB"}, []string{"--fusion-threshold-mb", "64"}, ""},
		{[]string{"HOROVOD_CYCLE_TIME=abc"}, []string{"--mpi-args", "-x HOROVOD_CYCLE_TIME=2"}, ""},
		{[]string{"GOROVOD_MPI_WAIT=bogus"}, []string{"--mpi-args=-x GOROVOD_MPI_WAIT=spin"}, ""},
		{[]string{}, []string{"--mpi-args", "-x HOROVOD_CYCLE_TIME=abc"}, `horovod: HOROVOD_CYCLE_TIME="abc": want a non-negative number`},
		{[]string{"HOROVOD_CYCLE_TIME=abc"}, []string{"--cycle-time-ms", "2", "--mpi-args", "-x HOROVOD_CYCLE_TIME"},
			`horovod: HOROVOD_CYCLE_TIME="abc": want a non-negative number`},
		// -x NAME of a variable the launching environment lacks: the ranks have none either.
		{[]string{}, []string{"--mpi-args", "-x HOROVOD_CYCLE_TIME"}, ""},
	} {
		var out, errOut strings.Builder
		args := append(append([]string{"--dry-run", "-np", "2"}, tc.args...), "prog")
		code := run(args, append([]string{"PATH=/bin"}, tc.env...), &out, &errOut)
		if tc.want == "" {
			if code != 0 || out.Len() == 0 {
				t.Errorf("%v %v: exit %d, stderr %q; want a launch", tc.env, tc.args, code, errOut.String())
			}
			continue
		}
		if code != exitUsage || out.Len() != 0 || !strings.HasPrefix(errOut.String(), "gorovodrun: "+tc.want) ||
			!strings.HasSuffix(errOut.String(), " (every rank would refuse it)\n") {
			t.Errorf("%v %v: exit %d, printed %q, stderr %q; want exit %d and %s", tc.env, tc.args, code, out.String(), errOut.String(), exitUsage, tc.want)
		}
	}
}

// gorovodrun stays pure Go: it reads horovod's settings with package horovod, which links no MPI
// (the MPI backend registers itself in the programs that import horovod/mpi, cgo), and it
// builds without cgo (make builds it so, static, to run on every host of a job).
func TestDoesNotLinkMPI(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		// The go command is what runs this test: an error here is a broken package, not a
		// missing tool, and skipping would pass a link of MPI unchecked.
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/gorovod/gorovod/horovod") {
		t.Fatalf("go list -deps does not list horovod:\n%s", out)
	}
	build := exec.Command("go", "build", "-o", os.DevNull, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Errorf("CGO_ENABLED=0 go build: %v\n%s", err, out)
	}
	for _, p := range deps {
		if p == "github.com/gorovod/gorovod/horovod/mpi" {
			t.Errorf("gorovodrun depends on %s", p)
		}
	}
}
