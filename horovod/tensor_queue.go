package horovod

import (
	"fmt"

	"github.com/gorovod/gorovod/horovod/backend"
)

// request is one operation submitted on this rank, from submission until its result is delivered.
type request struct {
	spec
	input  []byte
	output []byte // where the result goes; nil: allocated at execution
	// received is an alltoall's rows from each rank, set before it completes.
	received []int
	// set is a process set's backend on this rank (nil where it is not a member), set before
	// the request adding it completes.
	set    backend.Backend
	result Tensor
	err    error
	done   chan struct{}
}

func (r *request) complete(t Tensor, err error) {
	r.result, r.err = t, err
	close(r.done)
}

// tensorQueue holds the operations this rank has submitted (Horovod's TensorQueue): each is
// queued until the next negotiation round announces it, and in flight, by name, until it is
// taken for execution or the loop stops. Names are unique among the operations in flight. It
// has no lock of its own: the controller's mutex guards it together with the loop's stop, so that
// no request is queued after the stop has failed the ones in flight.
type tensorQueue struct {
	queued   []*request
	inflight map[string]*request
}

func newTensorQueue() tensorQueue { return tensorQueue{inflight: map[string]*request{}} }

// push queues reqs, all of them or none: it refuses a name already in flight on this rank, or
// given twice in reqs.
func (q *tensorQueue) push(rank int, reqs []*request) error {
	seen := map[string]bool{}
	for _, r := range reqs {
		why := ""
		switch {
		case q.inflight[r.name] != nil:
			why = fmt.Sprintf("an operation of that name is already in flight on rank %d", rank)
		case seen[r.name]:
			why = "the call names it twice" // a group or BroadcastVariables: nothing is in flight
		}
		if why != "" {
			return &Error{Op: r.kind.String(), Tensor: r.name, Reason: "duplicate name: " + why + " (names must be unique among outstanding operations)"}
		}
		seen[r.name] = true
	}
	for _, r := range reqs {
		r.done = make(chan struct{})
		q.inflight[r.name] = r
	}
	q.queued = append(q.queued, reqs...)
	return nil
}

// popQueued returns the requests queued since the last call, in submission order. They stay in
// flight.
func (q *tensorQueue) popQueued() []*request {
	reqs := q.queued
	q.queued = nil
	return reqs
}

// take removes the request named name from those in flight and returns it; nil when this rank
// has none of that name (it has joined).
func (q *tensorQueue) take(name string) *request {
	r := q.inflight[name]
	delete(q.inflight, name)
	return r
}

// drain empties the queue and returns every request in flight, for the caller to fail.
func (q *tensorQueue) drain() map[string]*request {
	pending := q.inflight
	q.inflight = map[string]*request{}
	q.queued = nil
	return pending
}
