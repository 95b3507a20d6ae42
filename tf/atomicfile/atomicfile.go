// Package atomicfile writes files that appear complete or not at all: the content goes to a
// temporary file beside the target, is synced, and is renamed over the target; the directory is
// synced after. A crash or a kill leaves either the old file or the new one, never a torn one.
package atomicfile

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// File is a file being written; its content becomes visible at Commit.
type File struct {
	*bufio.Writer
	path string
	f    *os.File
	done bool
}

// Create starts writing path. The file gets the mode os.Create gives a new file, 0666 less the
// umask (os.CreateTemp's 0600 would hide results and checkpoints from the other users of a
// shared output directory), under a temporary name .<base>.tmp<random> beside path.
func Create(path string) (*File, error) {
	prefix := tempPrefix(path)
	for tries := 0; ; tries++ {
		f, err := os.OpenFile(prefix+strconv.FormatUint(rand.Uint64(), 36), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if errors.Is(err, fs.ErrExist) && tries < 100 {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("writing %s: %w", path, err)
		}
		return &File{Writer: bufio.NewWriter(f), path: path, f: f}, nil
	}
}

// tempPrefix is the path every temporary file of path starts with.
func tempPrefix(path string) string {
	return filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
}

// RemoveStale removes the temporary files of path that a writer killed before its Commit or
// Abort left behind (a kill -9, the OOM killer): nothing else ever does, and a temporary file
// can be as large as the file. Call it only where no other writer of path can be at work (the
// caller holds the directory), since it cannot tell a live writer's file from a dead one's.
func RemoveStale(path string) error {
	dir, prefix := filepath.Dir(path), filepath.Base(tempPrefix(path))
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Commit flushes, syncs and renames the file into place.
func (a *File) Commit() error {
	if a.done {
		return fmt.Errorf("writing %s: already committed or aborted", a.path)
	}
	a.done = true
	err := a.Flush()
	if err == nil {
		err = a.f.Sync()
	}
	if cerr := a.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(a.f.Name(), a.path)
	}
	if err != nil {
		os.Remove(a.f.Name())
		return fmt.Errorf("writing %s: %w", a.path, err)
	}
	return SyncDir(filepath.Dir(a.path))
}

// Abort discards the file; it is a no-op after Commit, so `defer f.Abort()` is safe.
func (a *File) Abort() {
	if a.done {
		return
	}
	a.done = true
	a.f.Close()
	os.Remove(a.f.Name())
}

// Write replaces path with data.
func Write(path string, data []byte) error {
	f, err := Create(path)
	if err != nil {
		return err
	}
	defer f.Abort()
	if _, err := f.Writer.Write(data); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Commit()
}

// SyncDir makes the renames inside dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}
