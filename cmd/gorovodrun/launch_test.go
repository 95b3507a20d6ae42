package main

// Tests that run gorovodrun for real: mpirun and its ranks on this machine, and across two
// machines simulated on it (scripts/fake-nodes). They use $GOROVODRUN_BIN when set (make
// test-launcher sets it to the built bin/gorovodrun), else this test binary acting as gorovodrun.

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// asMainEnv makes this test binary run gorovodrun's main instead of the tests.
const asMainEnv = "GOROVODRUN_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
	}
	os.Exit(m.Run())
}

// gorovodrun returns a command running gorovodrun with args, bounded by timeout.
func gorovodrun(t *testing.T, timeout time.Duration, args ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	bin := os.Getenv("GOROVODRUN_BIN")
	env := os.Environ()
	if bin == "" {
		bin = os.Args[0]
		env = append(env, asMainEnv+"=1")
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	// mpirun and its daemons go with it when the test times out.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd
}

// requireMpirun skips without mpirun, unless GOROVODRUN_TEST_REQUIRE_MPIRUN says it must be there.
func requireMpirun(t *testing.T) {
	if _, err := exec.LookPath("mpirun"); err != nil {
		if os.Getenv("GOROVODRUN_TEST_REQUIRE_MPIRUN") != "" {
			t.Fatalf("mpirun: %v", err)
		}
		t.Skipf("no mpirun on PATH (make setup installs Open MPI): %v", err)
	}
}

// requireFakeNodes skips unless GOROVOD_TEST_FAKE_NODES is set (make test-launcher: simulated
// machines need root) and mpirun is there, and returns the repository root (scripts/fake-nodes).
func requireFakeNodes(t *testing.T) string {
	t.Helper()
	if os.Getenv("GOROVOD_TEST_FAKE_NODES") == "" {
		t.Skip("set GOROVOD_TEST_FAKE_NODES=1 to simulate two machines (needs root; make test-launcher does)")
	}
	requireMpirun(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func sortedLines(out []byte) []string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	sort.Strings(lines)
	return lines
}

// Three ranks on this 2-core machine without --oversubscribe (the local host gets -np slots, as
// with horovodrun), each seeing its rank and the HOROVOD_* settings of the flags and environment,
// and each line they print tagged with the rank, as horovodrun's are, unless --mpi-args turns
// mpirun's tagging off.
func TestLaunchLocal(t *testing.T) {
	requireMpirun(t)
	cmd := gorovodrun(t, 60*time.Second, "-np", "3", "--fusion-threshold-mb", "3", "--no-stall-check", "--",
		"/bin/sh", "-c", `echo rank=$OMPI_COMM_WORLD_RANK size=$OMPI_COMM_WORLD_SIZE fusion=$HOROVOD_FUSION_THRESHOLD stall=$HOROVOD_STALL_CHECK_DISABLE cycle=$HOROVOD_CYCLE_TIME`)
	cmd.Env = append(cmd.Env, "HOROVOD_CYCLE_TIME=2.5")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\n%s", err, stderrOf(err))
	}
	var want []string
	for _, r := range []string{"0", "1", "2"} {
		want = append(want, "[1,"+r+"]<stdout>:rank="+r+" size=3 fusion=3145728 stall=1 cycle=2.5")
	}
	if got := sortedLines(out); !reflect.DeepEqual(got, want) {
		t.Errorf("ranks printed\n%q\nwant\n%q", got, want)
	}

	out, err = gorovodrun(t, 60*time.Second, "-np", "2", "--mpi-args", "--mca orte_tag_output 0", "/bin/echo", "untagged").Output()
	if err != nil {
		t.Fatalf("--mca orte_tag_output 0: %v\n%s", err, stderrOf(err))
	}
	if got, want := sortedLines(out), []string{"untagged", "untagged"}; !reflect.DeepEqual(got, want) {
		t.Errorf("--mca orte_tag_output 0: ranks printed %q, want %q", got, want)
	}
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

// gorovodrun's exit status is mpirun's, which is the failed rank's. (Open MPI ends a failed job
// two sigkill timeouts later, whether or not ranks are left: 1 s keeps the test short.)
func TestLaunchExitStatus(t *testing.T) {
	requireMpirun(t)
	cmd := gorovodrun(t, 60*time.Second, "-np", "2", "--sigkill-timeout", "1", "/bin/sh", "-c", `[ "$OMPI_COMM_WORLD_RANK" = 1 ] && exit 7; exit 0`)
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 {
		t.Errorf("exit %v, want status 7 (rank 1's)", err)
	}
}

// Ctrl-C on gorovodrun reaches every rank at once as SIGUSR2 (repeated until the job ends),
// whatever the sigkill timeout: a rank whose stop takes longer than two sigkill timeouts
// (finetune's rank 0 writing its checkpoint) finishes it, and the interrupted job exits 130
// though its ranks exit 0. A second Ctrl-C ends the job at once, whatever the ranks do with
// SIGUSR2.
func TestLaunchCtrlC(t *testing.T) {
	requireMpirun(t)
	for _, tc := range []struct {
		name, rank string
		ctrlC      int
		want       []string
	}{
		// As finetune: the first request stops the rank, the repeats are ignored.
		{"once", `trap 'stop=1' USR2; echo ready; while [ -z "$stop" ]; do sleep 0.1; done; trap '' USR2; sleep 3; echo saved $OMPI_COMM_WORLD_RANK; exit 0`,
			1, []string{"[1,0]<stdout>:saved 0", "[1,1]<stdout>:saved 1"}},
		{"twice", `trap '' USR2; echo ready; while :; do sleep 0.1; done`, 2, nil}, // the ranks ignore SIGUSR2
	} {
		t.Run(tc.name, func(t *testing.T) {
			rank := tc.rank
			cmd := gorovodrun(t, 60*time.Second, "-np", "2", "--sigkill-timeout", "1", "/bin/sh", "-c", rank)
			lines := startReady(t, cmd)
			for range tc.ctrlC {
				if err := cmd.Process.Signal(os.Interrupt); err != nil {
					t.Fatal(err)
				}
				time.Sleep(500 * time.Millisecond)
			}
			var saved []string
			for lines.Scan() {
				saved = append(saved, lines.Text())
			}
			err := cmd.Wait()
			sort.Strings(saved)
			if !reflect.DeepEqual(saved, tc.want) {
				t.Errorf("ranks printed %q, want %q", saved, tc.want)
			}
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() == 0 || (tc.ctrlC == 1 && ee.ExitCode() != 130) {
				t.Errorf("an interrupted job exited %v (want 130 after one Ctrl-C, non-zero after two)", err)
			}
		})
	}
}

// A Ctrl-C as soon as mpirun runs, before it has started the ranks (which mpirun's forwarding
// would miss) or while they start: the job still stops at once, and exits 130.
func TestLaunchCtrlCAtStart(t *testing.T) {
	requireMpirun(t)
	cmd := gorovodrun(t, 60*time.Second, "-np", "2", "/bin/sh", "-c", `trap 'exit 0' USR2; sleep 20 & wait`)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// gorovodrun catches SIGINT from before it starts the job's mpirun; the `mpirun --version`
	// it runs first, to check it is Open MPI's, comes before that (a Ctrl-C then ends gorovodrun
	// as any command ends before it starts work), and is not the one waited for here.
	for !hasJobMpirun(cmd.Process.Pid) {
		if time.Since(start) > 20*time.Second {
			t.Fatal("no mpirun after 20 s")
		}
		time.Sleep(time.Millisecond)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
		t.Errorf("exited %v, want 130", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v: the ranks missed the stop request", took)
	}
}

// hasChild reports whether process pid has a child process named name.
// hasJobMpirun reports whether pid has an mpirun child that runs a job: not `mpirun --version`.
func hasJobMpirun(pid int) bool {
	out, _ := exec.Command("pgrep", "-a", "-P", strconv.Itoa(pid), "-x", "mpirun").Output()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line != "" && !strings.HasSuffix(line, " --version") {
			return true
		}
	}
	return false
}

// gorovodrun killed outright (kill -9) takes its job with it: mpirun gets SIGUSR2, its Ctrl-C,
// which ends these ranks (they do not catch it).
func TestLaunchKilledEndsTheJob(t *testing.T) {
	requireMpirun(t)
	marker := filepath.Join(t.TempDir(), "ranks")
	cmd := gorovodrun(t, 60*time.Second, "-np", "2", "/bin/sh", "-c", `echo $$ >>`+marker+`; echo ready; while :; do sleep 0.1; done`)
	startReady(t, cmd)
	cmd.Process.Kill()
	cmd.Wait()
	b, err := os.ReadFile(marker)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		alive := 0
		for _, pid := range strings.Fields(string(b)) {
			if _, err := os.Stat("/proc/" + pid); err == nil {
				alive++
			}
		}
		if alive == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rank(s) still run 20 s after gorovodrun was killed", alive)
		}
	}
}

// startReady starts cmd, whose 2 ranks each print "ready" first (tagged with the rank), and
// returns its standard output once both have.
func startReady(t *testing.T, cmd *exec.Cmd) *bufio.Scanner {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	var ready []string
	for len(ready) < 2 && lines.Scan() {
		ready = append(ready, lines.Text())
	}
	sort.Strings(ready)
	if !reflect.DeepEqual(ready, []string{"[1,0]<stdout>:ready", "[1,1]<stdout>:ready"}) {
		t.Fatalf("want both ranks ready, got %q (%v)", ready, lines.Err())
	}
	return lines
}

// Without Open MPI's mpirun on PATH, gorovodrun says so instead of running anything.
func TestLaunchWithoutOpenMPI(t *testing.T) {
	dir := t.TempDir()
	cmd := gorovodrun(t, 30*time.Second, "-np", "1", "true")
	cmd.Env = append(cmd.Env, "PATH="+dir)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitNoMpirun || !strings.Contains(string(out), "no mpirun on PATH ("+dir+")") {
		t.Errorf("no mpirun: %v, %s", err, out)
	}

	// Another MPI's mpirun would misread Open MPI's options.
	if err := os.WriteFile(filepath.Join(dir, "mpirun"), []byte("#!/bin/sh\necho 'HYDRA build details:'\necho '    Version: 4.1 (MPICH)'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd = gorovodrun(t, 30*time.Second, "-np", "1", "true")
	cmd.Env = append(cmd.Env, "PATH="+dir)
	out, err = cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitNoMpirun || !strings.Contains(string(out), "is not Open MPI's mpirun") {
		t.Errorf("MPICH's mpirun: %v, %s", err, out)
	}
}

// A bad command line exits 2 with the reason, before anything runs.
func TestLaunchBadInput(t *testing.T) {
	out, err := gorovodrun(t, 30*time.Second, "-np", "5", "-H", "a:2,b:2", "true").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitUsage || !strings.Contains(string(out), "-np 5 exceeds the 4 slots") {
		t.Errorf("%v, %s", err, out)
	}
}

// A setting every rank's horovod.Init would refuse exits 2 with horovod's message before mpirun
// runs (a failed job would take the sigkill timeout twice to end); the tuning flag that replaces
// the bad value launches, and the ranks see the flag's value.
func TestLaunchRefusesWhatEveryRankWould(t *testing.T) {
	dir := t.TempDir()
	ran := filepath.Join(dir, "mpirun-ran")
	if err := os.WriteFile(filepath.Join(dir, "mpirun"), []byte("#!/bin/sh\ntouch "+ran+"\necho 'mpirun (Open MPI) 4.1.6'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dryRun := range []bool{false, true} {
		args := []string{"-np", "2", "true"}
		if dryRun {
			args = append([]string{"--dry-run"}, args...)
		}
		cmd := gorovodrun(t, 30*time.Second, args...)
		cmd.Env = append(cmd.Env, "PATH="+dir, "HOROVOD_CYCLE_TIME=abc")
		out, err := cmd.CombinedOutput()
		want := `gorovodrun: horovod: HOROVOD_CYCLE_TIME="abc": want a non-negative number (every rank would refuse it)` + "\n"
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitUsage || string(out) != want {
			t.Errorf("%v: %v, %q; want exit %d, %q", args, err, out, exitUsage, want)
		}
	}
	if _, err := os.Stat(ran); !os.IsNotExist(err) {
		t.Errorf("mpirun ran (%v)", err)
	}

	requireMpirun(t)
	cmd := gorovodrun(t, 60*time.Second, "-np", "2", "--cycle-time-ms", "2", "/bin/sh", "-c", "echo cycle=$HOROVOD_CYCLE_TIME")
	cmd.Env = append(cmd.Env, "HOROVOD_CYCLE_TIME=abc")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("--cycle-time-ms 2 over HOROVOD_CYCLE_TIME=abc: %v\n%s", err, stderrOf(err))
	}
	if got, want := sortedLines(out), []string{"[1,0]<stdout>:cycle=2", "[1,1]<stdout>:cycle=2"}; !reflect.DeepEqual(got, want) {
		t.Errorf("ranks printed %q, want %q", got, want)
	}
}

// Two machines simulated on this one (scripts/fake-nodes: a UTS namespace per host, started by
// an rsh agent as mpirun would start ssh): each rank runs on the host -H or --hostfile gives its
// slot, and sees the HOROVOD_* variables of the flags and the variables of the environment,
// which cross to another machine only because gorovodrun forwards them (CUDA_VISIBLE_DEVICES
// here); one it does not forward (a secret key, as horovodrun) stays behind. -p reaches the agent as it would reach ssh. Needs root; runs when
// GOROVOD_TEST_FAKE_NODES is set (make test-launcher).
func TestLaunchTwoMachines(t *testing.T) {
	root := requireFakeNodes(t)
	// The agent notes its arguments, drops the ssh port (rsh-agent.sh takes none) and starts the
	// host's daemon.
	dir := t.TempDir()
	log := filepath.Join(dir, "agent.log")
	agent := filepath.Join(dir, "agent.sh")
	script := "#!/bin/sh\necho \"$1 $2 $3\" >>" + log + "\n[ \"$1\" = -p ] && shift 2\nexec " +
		filepath.Join(root, "scripts/fake-nodes/rsh-agent.sh") + " \"$@\"\n"
	if err := os.WriteFile(agent, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	hostfile := writeFile(t, "hosts", "nodea slots=2\nnodeb slots=2\n")
	rank := `echo rank=$OMPI_COMM_WORLD_RANK host=$(hostname) fusion=$HOROVOD_FUSION_THRESHOLD cycle=$HOROVOD_CYCLE_TIME ifname=$NCCL_SOCKET_IFNAME visible=$CUDA_VISIBLE_DEVICES secret=$MY_SECRET_KEY`
	for _, tc := range []struct {
		hosts []string
		np    string
		want  []string // host of each rank
	}{
		{[]string{"-H", "nodea:2,nodeb:2"}, "4", []string{"nodea", "nodea", "nodeb", "nodeb"}},
		{[]string{"--hostfile", hostfile}, "3", []string{"nodea", "nodea", "nodeb"}},
	} {
		args := append(slices.Clone(tc.hosts), "-np", tc.np, "-p", "2222", "--network-interface", "lo", "--fusion-threshold-mb", "3",
			"--mpi-args", "--mca plm_rsh_agent "+agent+" --mca oob_tcp_if_include lo --mca btl tcp,self,vader",
			"/bin/sh", "-c", rank)
		if err := os.Remove(log); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		cmd := gorovodrun(t, 60*time.Second, args...)
		cmd.Env = append(cmd.Env, "HOROVOD_CYCLE_TIME=2.5", "CUDA_VISIBLE_DEVICES=2,3", "MY_SECRET_KEY=s")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%q: %v\n%s", args, err, stderrOf(err))
		}
		var want []string
		for r, h := range tc.want {
			rank := string(rune('0' + r))
			want = append(want, "[1,"+rank+"]<stdout>:rank="+rank+" host="+h+" fusion=3145728 cycle=2.5 ifname=lo visible=2,3 secret=")
		}
		if got := sortedLines(out); !reflect.DeepEqual(got, want) {
			t.Errorf("%q: ranks printed\n%q\nwant\n%q", tc.hosts, got, want)
		}
		agentLog, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := sortedLines(agentLog), []string{"-p 2222 nodea", "-p 2222 nodeb"}; !reflect.DeepEqual(got, want) {
			t.Errorf("%q: agent started with %q, want %q", tc.hosts, got, want)
		}
	}
}

// --verbose prints, before running it, the command --dry-run prints instead of running it.
func TestLaunchVerbose(t *testing.T) {
	requireMpirun(t)
	dry, err := gorovodrun(t, 30*time.Second, "--dry-run", "-np", "1", "--cache-capacity", "7", "/bin/echo", "a b").Output()
	if err != nil {
		t.Fatalf("--dry-run: %v\n%s", err, stderrOf(err))
	}
	cmd := gorovodrun(t, 30*time.Second, "--verbose", "-np", "1", "--cache-capacity", "7", "/bin/echo", "a b")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("--verbose: %v\n%s", err, stderr.String())
	}
	if want := "gorovodrun: " + string(dry); stderr.String() != want {
		t.Errorf("--verbose printed %q, want %q", stderr.String(), want)
	}
	if string(out) != "[1,0]<stdout>:a b\n" {
		t.Errorf("the rank printed %q", out)
	}
}

// Ranks on two machines simulated with network namespaces (scripts/fake-nodes/login.sh), each
// with its own network stack and a docker bridge whose address, 172.17.0.1, every machine has:
// without --network-interface gorovodrun probes the machines and gives MPI and NCCL fake0, the
// one interface on which each reaches the other, not docker0, on which each reaches itself (an
// MPI job over it hangs: make test-launcher runs one). Needs root; runs when
// GOROVOD_TEST_FAKE_NODES is set (make test-launcher).
func TestLaunchProbesInterfaces(t *testing.T) {
	root := requireFakeNodes(t)
	login := filepath.Join(root, "scripts/fake-nodes/login.sh")
	cmd := gorovodrun(t, 60*time.Second, "--verbose", "-np", "3", "-H", "nodea:2,nodeb:1",
		"--mpi-args", "--mca plm_rsh_agent "+filepath.Join(root, "scripts/fake-nodes/rsh-agent.sh")+" --mca oob_tcp_if_include 198.18.0.0/15",
		"/bin/sh", "-c", "echo $(hostname) $NCCL_SOCKET_IFNAME")
	cmd.Args = append([]string{login, "nodea,nodeb"}, cmd.Args...)
	cmd.Path = login
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if got, want := sortedLines(out), []string{"[1,0]<stdout>:nodea fake0", "[1,1]<stdout>:nodea fake0", "[1,2]<stdout>:nodeb fake0"}; !reflect.DeepEqual(got, want) {
		t.Errorf("ranks printed %q, want %q\n%s", got, want, stderr.String())
	}
	for _, want := range []string{"gorovodrun: every machine is reached on fake0 (probed)", "--mca btl_tcp_if_include fake0"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr.String())
		}
	}
}
