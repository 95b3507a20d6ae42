package horovod

import (
	"errors"
	"fmt"
	"log"
	"slices"

	"github.com/gorovod/gorovod/horovod/backend"
)

// AddProcessSet adds a process set (Horovod's hvd.add_process_set): every rank of the job calls
// it, with the same ranks (ascending, each a rank of the job), in the same order relative to its
// other collectives. On the ranks in ranks it returns a *Horovod whose operations run among
// those ranks alone: its Rank and Size are this process's place in the set (Horovod's
// ps.rank() and ps.size()), a broadcast's root is a rank of the set, and its collectives
// negotiate and move tensors on a backend of the set's own, while the job's collectives and
// other sets' go on at the same time. On the other ranks it returns nil (Horovod's
// ps.included() is false there).
//
// The job must allow process sets at Init, on every rank: HOROVOD_DYNAMIC_PROCESS_SETS=1 or
// WithDynamicProcessSets (MPI then runs with MPI_THREAD_MULTIPLE). A set runs over the job's MPI;
// a job whose tensors go over a data backend of their own (NCCL) has no process sets. A set that
// the job's rank 0 is in writes its operations into the job's timeline, on rows named after the
// set ("process set [0 2]: name"), its ranks' arrivals marked by their ranks in the job; its
// messages number its ranks as the set does. Its members end it
// with its Shutdown (Horovod's hvd.remove_process_set); the job's Shutdown ends the sets this
// rank is in first. A set adds no sets of its own.
func (h *Horovod) AddProcessSet(ranks []int) (*Horovod, error) {
	if h.members != nil {
		return nil, fmt.Errorf("horovod: process set %v: a process set adds no sets of its own: add them from the job's Horovod", h.members)
	}
	if err := checkMembers(ranks, h.topo.Size); err != nil {
		return nil, fmt.Errorf("horovod: AddProcessSet: %w", err)
	}
	if !h.cfg.DynamicProcessSets {
		return nil, fmt.Errorf("horovod: AddProcessSet: process sets need %s=1 (or WithDynamicProcessSets) at Init on every rank", envDynamicProcessSets)
	}
	return h.addSet("AddProcessSet", ranks)
}

// addSet adds the process set of ranks, already checked, for caller (AddProcessSet or Init): nil
// where this rank is not a member.
func (h *Horovod) addSet(caller string, ranks []int) (*Horovod, error) {
	if _, ok := h.ctl.data.(backend.Splitter); !ok || h.ctl.data != h.ctl.control {
		return nil, fmt.Errorf("horovod: %s: the %s backend has no process sets", caller, h.ctl.data.Name())
	}
	members := slices.Clone(ranks)
	req := &request{spec: spec{name: "horovod.process_set", kind: kindProcessSet, members: members}}
	if _, err := h.ctl.awaitOne(req); err != nil {
		return nil, err
	}
	if req.set == nil {
		return nil, nil
	}
	// workers stays the job's: this process shares the machine's cores with every rank of the job
	// on it, in the set or not.
	set := &Horovod{topo: req.set.Topology(), cfg: h.cfg, results: h.results, workers: h.workers, members: members}
	// The job's rank 0 alone writes the timeline: a set it is in writes into the job's file.
	set.cfg.Timeline = ""
	set.log = log.New(set.cfg.logOutput, fmt.Sprintf("horovod[%d] process set %v: ", h.topo.Rank, members), log.LstdFlags|log.Lmsgprefix)
	ctl, err := newController(set, req.set, req.set)
	if err != nil {
		return nil, errors.Join(err, req.set.Close())
	}
	ctl.timeline = h.ctl.timeline.view(members)
	set.ctl = ctl
	h.setsMu.Lock()
	h.sets = append(h.sets, set)
	h.setsMu.Unlock()
	ctl.start()
	return set, nil
}

// ProcessSetRanks is, for a process set, its ranks in the job; for the job, nil.
func (h *Horovod) ProcessSetRanks() []int { return slices.Clone(h.members) }

// ProcessSets returns the process sets WithProcessSets had Init add, in its order: each a
// *Horovod where this rank is a member, as AddProcessSet returns, and nil where it is not.
func (h *Horovod) ProcessSets() []*Horovod { return slices.Clone(h.initSets) }

// takeSets empties the list of this rank's process sets and returns what it held.
func (h *Horovod) takeSets() []*Horovod {
	h.setsMu.Lock()
	defer h.setsMu.Unlock()
	sets := h.sets
	h.sets = nil
	return sets
}

// addProcessSet splits the data backend among a process set's ranks, on every rank of the job in
// the same round (a split is a collective of the whole job), and gives the caller the set's
// backend, nil where this rank is not in it.
func (c *controller) addProcessSet(r *response) error {
	req := c.take(r.spec.name)
	splitter, ok := c.data.(backend.Splitter)
	if !ok {
		return fmt.Errorf("the %s backend has no process sets", c.data.Name())
	}
	var set backend.Backend
	err := c.busy("process set split", func() (err error) {
		set, err = splitter.Split(r.spec.members)
		return err
	})
	if errors.Is(err, backend.ErrCannotSplit) {
		// Every rank refused alike, before any collective: the job goes on without the set.
		if req != nil {
			req.complete(Tensor{}, &Error{Op: "process set", Tensor: r.spec.name, Reason: err.Error()})
		}
		return nil
	}
	if err != nil {
		return err
	}
	if req == nil {
		if set != nil {
			return set.Close()
		}
		return nil
	}
	req.set = set
	req.complete(Tensor{}, nil)
	return nil
}
