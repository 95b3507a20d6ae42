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
