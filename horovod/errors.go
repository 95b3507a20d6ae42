package horovod

import "fmt"

// Error is a collective that failed for a reason every rank agrees on: a disagreement between
// ranks (shape, dtype, op, root, group), found during negotiation and reported identically on
// every rank, or a local misuse such as a duplicate name.
type Error struct {
	Op     string // "allreduce", "allgather", "broadcast", "barrier"
	Tensor string // the operation's name
	Reason string
}

func (e *Error) Error() string { return fmt.Sprintf("horovod: %s %q: %s", e.Op, e.Tensor, e.Reason) }

// MissingDriverError is Init in a job that a launcher started with more than one process, in a
// program that registered no driver to join it with: the program must import the driver's
// package for its side effect, as a database/sql program imports its driver.
type MissingDriverError struct {
	Launcher Launcher
	Driver   string // the backend.Register name looked up ("mpi")
	Import   string // the package that registers it
}

func (e *MissingDriverError) Error() string {
	return fmt.Sprintf("horovod: %s started %d processes but no %s backend is registered: import _ %q in the program",
		e.Launcher.Name, e.Launcher.Size, e.Driver, e.Import)
}
