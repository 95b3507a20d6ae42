package horovod

import (
	"fmt"
	"slices"

	"github.com/gorovod/gorovod/horovod/internal/parallel"
)

// AllreduceOptions are Horovod's allreduce arguments. The zero value averages with no scaling.
type AllreduceOptions struct {
	Op ReduceOp
	// Prescale multiplies each rank's input before the reduction, Postscale the result after it
	// (after the division of Average); 0 means 1.
	Prescale, Postscale float64
	// Output, when not nil, receives the result instead of a new buffer, which saves allocating
	// (and zeroing) one per call: a buffer the caller reuses from call to call, or the tensor's
	// own Data to reduce in place (Horovod's allreduce_). It is exactly as long as the tensor's
	// Data, does not partly overlap it, and must not be used until the operation completes; the
	// result's Data is Output. A single tensor's option: GroupedAllreduce refuses it.
	Output []byte
}

func (o AllreduceOptions) factors() (pre, post float64) { return scaleFactors(o.Prescale, o.Postscale) }

// scaleFactors reads the options' Prescale and Postscale, where 0 means 1.
func scaleFactors(pre, post float64) (float64, float64) {
	if pre == 0 {
		pre = 1
	}
	if post == 0 {
		post = 1
	}
	return pre, post
}

// Handle is an operation in flight; Wait returns its result.
type Handle struct{ req *request }

// Wait blocks until the operation completes on this rank.
func (h *Handle) Wait() (Tensor, error) {
	<-h.req.done
	return h.req.result, h.req.err
}

// ReceivedSplits is, for an alltoall that has completed, the number of rows this rank received
// from each rank, in rank order (Horovod's received_splits); nil for other operations, and for
// an alltoall still in flight or failed.
func (h *Handle) ReceivedSplits() []int {
	select {
	case <-h.req.done:
		if h.req.err == nil {
			return slices.Clone(h.req.received)
		}
	default:
	}
	return nil
}

func (h *Horovod) allreduceRequest(name string, groupSize int, t Tensor, o AllreduceOptions) (*request, error) {
	if err := checkOperand("allreduce", name, t); err != nil {
		return nil, err
	}
	if o.Op > Adasum {
		return nil, &Error{Op: "allreduce", Tensor: name, Reason: fmt.Sprintf("unknown reduce op %v", o.Op)}
	}
	if o.Op == Adasum && !adasumFloats(t.DType) {
		return nil, &Error{Op: "allreduce", Tensor: name, Reason: fmt.Sprintf("Adasum combines float16, bfloat16, float32 and float64 tensors, not %v", t.DType)}
	}
	if o.Output != nil {
		if groupSize > 0 {
			return nil, &Error{Op: "allreduce", Tensor: name, Reason: "Output is for a single tensor's allreduce, not a group's"}
		}
		if len(o.Output) != len(t.Data) {
			return nil, &Error{Op: "allreduce", Tensor: name, Reason: fmt.Sprintf("Output holds %d bytes for a tensor of %d", len(o.Output), len(t.Data))}
		}
		if parallel.Overlap(o.Output, t.Data) && !parallel.Same(o.Output, t.Data) {
			return nil, &Error{Op: "allreduce", Tensor: name, Reason: "Output partly overlaps the tensor's Data (it may be the same slice, or apart from it)"}
		}
	}
	pre, post := o.factors()
	return &request{
		spec: spec{name: name, kind: kindAllreduce, dtype: t.DType, shape: slices.Clone(t.Shape), op: o.Op,
			prescale: pre, postscale: post, groupSize: groupSize},
		input:  t.Data,
		output: o.Output,
	}, nil
}

func checkOperand(op, name string, t Tensor) error {
	if name == "" {
		return &Error{Op: op, Reason: "every operation needs a name, the same on every rank"}
	}
	if err := t.check(); err != nil {
		return &Error{Op: op, Tensor: name, Reason: err.Error()}
	}
	return nil
}

// AllreduceAsync submits an allreduce of t (not modified; it must stay unchanged until the handle
// completes) and returns at once. Every rank must submit an allreduce of the same name, dtype and
// shape with the same options.
func (h *Horovod) AllreduceAsync(name string, t Tensor, o AllreduceOptions) (*Handle, error) {
	req, err := h.allreduceRequest(name, 0, t, o)
	if err != nil {
		return nil, err
	}
	if err := h.ctl.submit(req); err != nil {
		return nil, err
	}
	return &Handle{req}, nil
}

// Allreduce reduces t across ranks and returns the result in a new tensor, or in o.Output.
func (h *Horovod) Allreduce(name string, t Tensor, o AllreduceOptions) (Tensor, error) {
	req, err := h.allreduceRequest(name, 0, t, o)
	if err != nil {
		return Tensor{}, err
	}
	return h.ctl.awaitOne(req)
}

// GroupedAllreduce reduces the tensors as one unit: they are negotiated together and execute in
// the same round (fused where they fit the threshold), never split across steps. Every rank must
// group the same names, and the ranks' calls are matched by their order, as Horovod's groups
// are: the n-th grouped call of every rank (GroupedAllreduce, GroupedAllgather or
// GroupedReducescatter, counting the calls that submitted a group, since the last Join every
// rank completed) forms one group, so goroutines that group concurrently must call in the same
// order on every rank. A rank that has joined takes part in the others' groups. Ranks that
// grouped different tensors get an error naming each rank's members. A group fails as a whole:
// when one member fails (different shapes on two ranks, say), every member fails on every rank.
func (h *Horovod) GroupedAllreduce(ts []NamedTensor, o AllreduceOptions) ([]Tensor, error) {
	return h.grouped(ts, func(t NamedTensor) (*request, error) { return h.allreduceRequest(t.Name, len(ts), t.Tensor, o) })
}

// GroupedAllgather is Allgather of every tensor as one unit, as GroupedAllreduce is Allreduce's
// (Horovod's grouped_allgather): negotiated together, gathered in the same round (fused in
// batches closed once their results reach 256 KiB, a larger result gathered on its own), failing as a
// whole, matched across ranks by the order of the calls. A rank that has joined takes part with
// no rows.
func (h *Horovod) GroupedAllgather(ts []NamedTensor) ([]Tensor, error) {
	return h.grouped(ts, func(t NamedTensor) (*request, error) { return allgatherRequest(t.Name, len(ts), t.Tensor) })
}

// GroupedReducescatter is Reducescatter of every tensor as one unit, as GroupedAllreduce is
// Allreduce's (Horovod's grouped_reducescatter): negotiated together and reduced in the same
// round (fused in batches closed once they reach 256 KiB, a larger tensor reduced on its
// own), failing as a whole, matched across ranks by the order of the calls.
// o.Output is refused: it is one tensor's.
func (h *Horovod) GroupedReducescatter(ts []NamedTensor, o ReducescatterOptions) ([]Tensor, error) {
	return h.grouped(ts, func(t NamedTensor) (*request, error) { return h.reducescatterRequest(t.Name, len(ts), t.Tensor, o) })
}

// grouped submits the request made for each tensor as one group and waits for every member.
func (h *Horovod) grouped(ts []NamedTensor, member func(NamedTensor) (*request, error)) ([]Tensor, error) {
	reqs := make([]*request, len(ts))
	for i, t := range ts {
		req, err := member(t)
		if err != nil {
			return nil, err
		}
		reqs[i] = req
	}
	if err := h.ctl.await(reqs...); err != nil {
		return nil, err
	}
	return waitAll(reqs)
}

func waitAll(reqs []*request) ([]Tensor, error) {
	out := make([]Tensor, len(reqs))
	var first error
	for i, r := range reqs {
		<-r.done
		out[i] = r.result
		if r.err != nil && first == nil {
			first = r.err
		}
	}
	return out, first
}

func allgatherRequest(name string, groupSize int, t Tensor) (*request, error) {
	if err := checkOperand("allgather", name, t); err != nil {
		return nil, err
	}
	return &request{spec: spec{name: name, kind: kindAllgather, dtype: t.DType, shape: slices.Clone(t.Shape), groupSize: groupSize}, input: t.Data}, nil
}

// AllgatherAsync submits an allgather of t along its first dimension, which may differ between
// ranks; the other dimensions and the dtype must agree.
func (h *Horovod) AllgatherAsync(name string, t Tensor) (*Handle, error) {
	req, err := allgatherRequest(name, 0, t)
	if err != nil {
		return nil, err
	}
	if err := h.ctl.submit(req); err != nil {
		return nil, err
	}
	return &Handle{req}, nil
}

// Allgather concatenates every rank's t along the first dimension, in rank order.
func (h *Horovod) Allgather(name string, t Tensor) (Tensor, error) {
	req, err := allgatherRequest(name, 0, t)
	if err != nil {
		return Tensor{}, err
	}
	return h.ctl.awaitOne(req)
}

// AllgatherInto is Allgather into out, a buffer the caller reuses from call to call, which saves
// allocating (and zeroing) a result per call, as AllreduceOptions.Output does for Allreduce. out
// must be exactly as long as the result (every rank's rows) and apart from t's Data; the result's
// Data is out. A wrong length is this rank's error alone, found once the ranks have agreed on the
// result's size: the collective still runs, so the other ranks get their results.
func (h *Horovod) AllgatherInto(name string, t Tensor, out []byte) (Tensor, error) {
	req, err := allgatherRequest(name, 0, t)
	if err != nil {
		return Tensor{}, err
	}
	if out == nil {
		return Tensor{}, &Error{Op: "allgather", Tensor: name, Reason: "AllgatherInto needs an output buffer (Allgather allocates one)"}
	}
	if parallel.Overlap(out, t.Data) {
		return Tensor{}, &Error{Op: "allgather", Tensor: name, Reason: "the output buffer overlaps the tensor's Data"}
	}
	req.output = out
	return h.ctl.awaitOne(req)
}

// ReducescatterOptions are Horovod's reducescatter arguments. The zero value averages with no
// scaling.
type ReducescatterOptions struct {
	Op ReduceOp
	// Prescale multiplies each rank's input before the reduction, Postscale the result after it
	// (after the division of Average); 0 means 1.
	Prescale, Postscale float64
	// Output, when not nil, receives this rank's block instead of a new buffer, as
	// AllreduceOptions.Output does for Allreduce: a buffer the caller reuses from call to call,
	// exactly as long as the block (its rows of the first dimension, Reducescatter's split) and
	// apart from the tensor's Data; the result's Data is Output.
	Output []byte
}

func (h *Horovod) reducescatterRequest(name string, groupSize int, t Tensor, o ReducescatterOptions) (*request, error) {
	if err := checkOperand("reducescatter", name, t); err != nil {
		return nil, err
	}
	if len(t.Shape) == 0 {
		return nil, &Error{Op: "reducescatter", Tensor: name, Reason: "a scalar has no first dimension to scatter along"}
	}
	if o.Op == Adasum {
		return nil, &Error{Op: "reducescatter", Tensor: name, Reason: "Adasum is an allreduce's op only, as in Horovod"}
	}
	if o.Op > Product {
		return nil, &Error{Op: "reducescatter", Tensor: name, Reason: fmt.Sprintf("unknown reduce op %v", o.Op)}
	}
	if o.Output != nil {
		if groupSize > 0 {
			return nil, &Error{Op: "reducescatter", Tensor: name, Reason: "Output is for a single tensor's reducescatter, not a group's"}
		}
		block := 0 // bytes of this rank's rows
		if t.Shape[0] > 0 {
			block = scatterRows(t.Shape[0], h.Size(), h.Rank()) * (len(t.Data) / t.Shape[0])
		}
		if len(o.Output) != block {
			return nil, &Error{Op: "reducescatter", Tensor: name, Reason: fmt.Sprintf("Output holds %d bytes for this rank's block of %d", len(o.Output), block)}
		}
		if parallel.Overlap(o.Output, t.Data) {
			return nil, &Error{Op: "reducescatter", Tensor: name, Reason: "Output overlaps the tensor's Data"}
		}
	}
	pre, post := scaleFactors(o.Prescale, o.Postscale)
	return &request{
		spec: spec{name: name, kind: kindReducescatter, dtype: t.DType, shape: slices.Clone(t.Shape), op: o.Op,
			prescale: pre, postscale: post, groupSize: groupSize},
		input:  t.Data,
		output: o.Output,
	}, nil
}

// ReducescatterAsync submits a reducescatter of t (not modified; it must stay unchanged until
// the handle completes) and returns at once. Every rank must submit a reducescatter of the same
// name, dtype and shape with the same options.
func (h *Horovod) ReducescatterAsync(name string, t Tensor, o ReducescatterOptions) (*Handle, error) {
	req, err := h.reducescatterRequest(name, 0, t, o)
	if err != nil {
		return nil, err
	}
	if err := h.ctl.submit(req); err != nil {
		return nil, err
	}
	return &Handle{req}, nil
}

// Reducescatter reduces t across ranks, as Allreduce does, and returns to each rank only its
// block of the result's rows, in a new tensor: the first dimension's rows split in rank order,
// as evenly as they go, the first rows%Size ranks one row more (Horovod's split). A rank that has
// joined contributes zeros.
func (h *Horovod) Reducescatter(name string, t Tensor, o ReducescatterOptions) (Tensor, error) {
	req, err := h.reducescatterRequest(name, 0, t, o)
	if err != nil {
		return Tensor{}, err
	}
	return h.ctl.awaitOne(req)
}

func (h *Horovod) alltoallRequest(name string, t Tensor, splits []int) (*request, error) {
	if err := checkOperand("alltoall", name, t); err != nil {
		return nil, err
	}
	if len(t.Shape) == 0 {
		return nil, &Error{Op: "alltoall", Tensor: name, Reason: "a scalar has no first dimension to split along"}
	}
	size, rows := h.Size(), t.Shape[0]
	if splits == nil {
		if rows%size != 0 {
			return nil, &Error{Op: "alltoall", Tensor: name, Reason: fmt.Sprintf("the first dimension %d does not split evenly among %d ranks: give the splits", rows, size)}
		}
		splits = make([]int, size)
		for i := range splits {
			splits[i] = rows / size
		}
	}
	if err := checkSplits(splits, rows, size); err != nil {
		return nil, &Error{Op: "alltoall", Tensor: name, Reason: err.Error()}
	}
	return &request{
		spec:  spec{name: name, kind: kindAlltoall, dtype: t.DType, shape: slices.Clone(t.Shape), splits: slices.Clone(splits)},
		input: t.Data,
	}, nil
}

// AlltoallAsync submits an alltoall of t (not modified; it must stay unchanged until the handle
// completes) and returns at once; the handle's ReceivedSplits says, once it completes, how many
// rows came from each rank.
func (h *Horovod) AlltoallAsync(name string, t Tensor, splits []int) (*Handle, error) {
	req, err := h.alltoallRequest(name, t, splits)
	if err != nil {
		return nil, err
	}
	if err := h.ctl.submit(req); err != nil {
		return nil, err
	}
	return &Handle{req}, nil
}

// Alltoall sends rank r the splits[r] rows of t's first dimension that follow those sent to the
// ranks before it, and returns, in a new tensor, the rows every rank sent this one, in rank
// order, with the number that came from each rank (Horovod's alltoall with its received_splits).
// splits has one count per rank summing to the first dimension; nil splits the rows evenly,
// which the first dimension must allow. Ranks may send different numbers of rows, but all
// dimensions after the first, and the dtype, must agree. A rank that has joined fails it, as in
// Horovod.
func (h *Horovod) Alltoall(name string, t Tensor, splits []int) (Tensor, []int, error) {
	req, err := h.alltoallRequest(name, t, splits)
	if err != nil {
		return Tensor{}, nil, err
	}
	out, err := h.ctl.awaitOne(req)
	if err != nil {
		return Tensor{}, nil, err
	}
	return out, req.received, nil
}

// AlltoallInto is Alltoall into out, a buffer the caller reuses from call to call, as
// AllgatherInto is Allgather's. out must be exactly as long as the result (the rows every rank
// sends this one) and apart from t's Data; the result's Data is out. A wrong length is this
// rank's error alone, found once the ranks have agreed on the splits: the collective still runs,
// so the other ranks get their results.
func (h *Horovod) AlltoallInto(name string, t Tensor, splits []int, out []byte) (Tensor, []int, error) {
	req, err := h.alltoallRequest(name, t, splits)
	if err != nil {
		return Tensor{}, nil, err
	}
	if out == nil {
		return Tensor{}, nil, &Error{Op: "alltoall", Tensor: name, Reason: "AlltoallInto needs an output buffer (Alltoall allocates one)"}
	}
	if parallel.Overlap(out, t.Data) {
		return Tensor{}, nil, &Error{Op: "alltoall", Tensor: name, Reason: "the output buffer overlaps the tensor's Data"}
	}
	req.output = out
	res, err := h.ctl.awaitOne(req)
	if err != nil {
		return Tensor{}, nil, err
	}
	return res, req.received, nil
}

func (h *Horovod) broadcastRequest(name string, t Tensor, root int, inPlace bool) (*request, error) {
	if err := checkOperand("broadcast", name, t); err != nil {
		return nil, err
	}
	if root < 0 || root >= h.Size() {
		return nil, &Error{Op: "broadcast", Tensor: name, Reason: fmt.Sprintf("root rank %d outside 0..%d", root, h.Size()-1)}
	}
	req := &request{spec: spec{name: name, kind: kindBroadcast, dtype: t.DType, shape: slices.Clone(t.Shape), root: root}, input: t.Data}
	if inPlace {
		req.output = t.Data
	}
	return req, nil
}

// BroadcastAsync submits a broadcast of root's t; every rank passes a tensor of the same dtype
// and shape (its contents are ignored except on root).
func (h *Horovod) BroadcastAsync(name string, t Tensor, root int) (*Handle, error) {
	req, err := h.broadcastRequest(name, t, root, false)
	if err != nil {
		return nil, err
	}
	if err := h.ctl.submit(req); err != nil {
		return nil, err
	}
	return &Handle{req}, nil
}

// Broadcast returns root's t on every rank, in a new tensor.
func (h *Horovod) Broadcast(name string, t Tensor, root int) (Tensor, error) {
	req, err := h.broadcastRequest(name, t, root, false)
	if err != nil {
		return Tensor{}, err
	}
	return h.ctl.awaitOne(req)
}

// BroadcastVariables overwrites every rank's variables with root's, in place: the initial
// synchronization of a data-parallel job (Horovod's broadcast_variables). The broadcasts are
// submitted together and named "broadcast/" + the variable's name.
func (h *Horovod) BroadcastVariables(vars []NamedTensor, root int) error {
	reqs := make([]*request, len(vars))
	for i, v := range vars {
		req, err := h.broadcastRequest("broadcast/"+v.Name, v.Tensor, root, true)
		if err != nil {
			return err
		}
		reqs[i] = req
	}
	if err := h.ctl.await(reqs...); err != nil {
		return err
	}
	_, err := waitAll(reqs)
	return err
}

// Barrier returns once every rank has called it. Calls from concurrent goroutines of one rank
// are an error (a duplicate name), as in Horovod.
func (h *Horovod) Barrier() error {
	_, err := h.ctl.awaitOne(&request{spec: spec{name: "horovod.barrier", kind: kindBarrier}})
	return err
}

// Join tells the other ranks that this one has run out of data: until every rank has joined, it
// takes part in their allreduces and reducescatters with zeros (Average still divides by Size)
// and in their allgathers with no rows; their alltoalls fail. It returns, on every rank, the rank
// that joined last.
func (h *Horovod) Join() (lastRank int, err error) { return h.ctl.join() }
