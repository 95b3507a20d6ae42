package dirlock

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The lock is per process (flock), so the contending holder runs in a child process: this
// test binary, re-run with lockerEnv naming the directory, holds the lock until it is killed.
const lockerEnv = "DIRLOCK_TEST_HOLD"

// childLock keeps the child's Lock reachable: an unreferenced Lock's file is closed by its
// finalizer at the next garbage collection, which drops the flock while the child still says it
// holds it.
var childLock *Lock

func TestMain(m *testing.M) {
	if dir := os.Getenv(lockerEnv); dir != "" {
		l, err := Acquire(dir, "the child")
		if err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(1)
		}
		childLock = l
		os.Stdout.WriteString("held\n")
		select {}
	}
	os.Exit(m.Run())
}

// holdInChild starts a process that holds dir's lock and returns once it does.
func holdInChild(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), lockerEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := out.Read(buf); err != nil || string(buf) != "held\n" {
		cmd.Process.Kill()
		t.Fatalf("the child did not take the lock: %q %v", buf, err)
	}
	return cmd
}

// A second holder is refused at once, told the directory and the first holder's description;
// once the first holder is killed with SIGKILL, the lock is free with no cleanup.
func TestSecondHolderIsRefusedUntilTheFirstDies(t *testing.T) {
	dir := t.TempDir()
	child := holdInChild(t, dir)
	start := time.Now()
	_, err := Acquire(dir, "the parent")
	if !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), dir+" is in use by another run: the child (") {
		t.Fatalf("Acquire while another process holds the lock: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("refusing took %v: it must not wait", d)
	}
	child.Process.Kill() // SIGKILL: the holder gets no chance to clean up
	child.Wait()
	l, err := Acquire(dir, "the parent")
	if err != nil {
		t.Fatalf("the lock of a killed holder is still held: %v", err)
	}
	defer l.Release()
	b, _ := os.ReadFile(dir + "/" + Name)
	if string(b) != "the parent\n" {
		t.Errorf("lock file holds %q, want the new holder's description alone", b)
	}
}

func TestAcquireInAMissingDirectoryFails(t *testing.T) {
	if _, err := Acquire(t.TempDir()+"/nope", "x"); err == nil || errors.Is(err, ErrHeld) {
		t.Errorf("Acquire in a missing directory: %v", err)
	}
}

// A filesystem that takes no flock (Lustre mounted noflock: ENOSYS; NFSv3 without its lock
// daemons: ENOLCK) is told apart from a lock held, so that a caller can go on without the lock;
// another failure stays an error of its own.
func TestFilesystemWithoutLocksIsToldApart(t *testing.T) {
	defer func(f func(int, int) error) { flock = f }(flock)
	for _, errno := range []syscall.Errno{syscall.ENOSYS, syscall.ENOLCK, syscall.EOPNOTSUPP, syscall.EBADF} {
		flock = func(int, int) error { return errno }
		_, err := Acquire(t.TempDir(), "me")
		if err == nil || errors.Is(err, ErrHeld) || errors.Is(err, ErrUnsupported) != (errno != syscall.EBADF) || !errors.Is(err, errno) {
			t.Errorf("flock failing with %v: %v", errno, err)
		}
	}
}

// A lock file that cannot be written (here a link to /dev/full, which takes no truncation) is an
// error naming it, not a lock whose holder nobody can read.
func TestUnwritableLockFileFails(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink("/dev/full", dir+"/"+Name); err != nil {
		t.Fatal(err)
	}
	l, err := Acquire(dir, "me")
	if err == nil {
		l.Release()
		t.Fatal("Acquire over an unwritable lock file succeeded")
	}
	if !strings.Contains(err.Error(), "writing "+dir+"/"+Name) {
		t.Errorf("the error does not name the lock file: %v", err)
	}
}
