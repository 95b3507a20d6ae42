// Package dirlock keeps two runs from writing one output directory: a run holds an exclusive
// flock(2) on a file in the directory for as long as its process lives, and a second run that
// finds it held refuses to start, naming the holder. The kernel drops the lock when the holder's
// process ends in any way (kill -9 included), so a crashed run never leaves the directory stuck;
// the file itself stays, describing the last holder, and is harmless.
package dirlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Name is the lock file's name in the directory it guards.
const Name = ".finetune.lock"

// Lock is a held directory lock.
type Lock struct {
	f *os.File
}

// ErrHeld is wrapped by Acquire's error when another process holds the lock.
var ErrHeld = errors.New("directory in use")

// ErrUnsupported is wrapped by Acquire's error when dir's filesystem takes no flock (Lustre
// mounted noflock, NFSv3 without its lock daemons): a caller may go on without the lock.
var ErrUnsupported = errors.New("the filesystem takes no locks")

// flock is syscall.Flock, which tests replace to fail as such filesystems do.
var flock = syscall.Flock

// Acquire locks dir (which must exist) for this process and writes holder, a one-line
// description of this run, into the lock file for the message another run gets. It fails at
// once, without waiting, when another process holds the lock; the error then names dir and
// quotes that process's description. Keep the Lock referenced for as long as the run holds the
// directory: once unreachable, its file's finalizer closes it and the lock is gone.
func Acquire(dir, holder string) (*Lock, error) {
	path := filepath.Join(dir, Name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		switch {
		case errors.Is(err, syscall.EWOULDBLOCK):
			b, _ := os.ReadFile(path)
			other := strings.TrimSpace(string(b))
			if other == "" {
				other = "a process that has not yet said which"
			}
			// NFS keeps a lock whose holder's machine crashed until that machine is back.
			return nil, fmt.Errorf("%s is in use by another run: %s (%w; it holds the lock on %s until it ends; "+
				"on NFS a machine that crashed holds it until it is back: if no run uses the directory, removing %s frees it)",
				dir, other, ErrHeld, path, path)
		case errors.Is(err, syscall.ENOSYS), errors.Is(err, syscall.ENOLCK), errors.Is(err, syscall.EOPNOTSUPP):
			return nil, fmt.Errorf("locking %s: %w (%w)", path, ErrUnsupported, err)
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(holder+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// Release gives the lock up; the process's end does the same.
func (l *Lock) Release() error { return l.f.Close() }
