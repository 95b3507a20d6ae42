package horovod

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/gorovod/gorovod/horovod/internal/parallel"
)

// ReducerOptions configure the distributed optimizer step (Horovod's DistributedOptimizer
// arguments). The zero value averages uncompressed gradients every step.
type ReducerOptions struct {
	// Op is Average (the default), Sum or Adasum.
	Op ReduceOp
	// Compression puts float32 and float64 gradients on the wire as float16 or bfloat16.
	Compression Compression
	// GradientPredivideFactor splits averaging into a division by the factor before the sum
	// and by Size/factor after it, to keep large sums in range; 0 means 1. Average only.
	GradientPredivideFactor float64
	// BackwardPassesPerStep accumulates this many calls of Reduce locally before one allreduce;
	// 0 means 1.
	BackwardPassesPerStep int
	// AverageAggregatedGradients divides the locally accumulated gradients by
	// BackwardPassesPerStep before the allreduce (Horovod's average_aggregated_gradients).
	AverageAggregatedGradients bool
	// Prefix is prepended to each gradient's name on the wire; "" means "gradients/".
	Prefix string
	// InPlace writes the reduced gradients over the ones given instead of into Reducer-owned
	// memory: no second copy of the gradients, and gradients that lie back to back in one buffer
	// are reduced with a single in-place backend call.
	InPlace bool
	// DeferAverage hands Average's division to the consumer of the gradients, which multiplies
	// by the factor anyway (an optimizer's clipping: bertgraph.Model.Apply's gradientScale):
	// Reduce returns the sum over ranks (of the predivided, locally averaged gradients, as
	// Average would sum them) and GradientScale the factor that makes it the average, saving a
	// pass over every gradient per step. Horovod has no such option. It does nothing with
	// compression, whose division is done while widening the 16-bit sums, and is for Average
	// only.
	DeferAverage bool
}

// Reducer averages the named per-variable gradients of each train step across ranks: the
// allreduce of Horovod's DistributedOptimizer. All gradients of a step are submitted at once, so
// they negotiate in one round and fuse into buffers of up to the fusion threshold. A Reducer is
// not safe for concurrent use.
type Reducer struct {
	h       *Horovod
	opts    ReducerOptions
	passes  int                     // backward passes accumulated in this step
	accum   map[string]*NamedTensor // running sums while passes < BackwardPassesPerStep
	first   []NamedTensor           // the first pass's tensors (names, dtypes, shapes) of this step
	inFirst map[string]bool         // the names of first
	// Results and 16-bit wire copies, each gradient's back to back in the order given, so that
	// fusion reads and writes them in place; reused from step to step.
	outArena, wireArena arena
}

// NewReducer checks opts and returns a Reducer.
func (h *Horovod) NewReducer(opts ReducerOptions) (*Reducer, error) {
	if opts.Op != Average && opts.Op != Sum && opts.Op != Adasum {
		return nil, fmt.Errorf("horovod: reducer op %v: gradients are averaged, summed or combined by Adasum", opts.Op)
	}
	if opts.Compression > BF16Compression {
		return nil, fmt.Errorf("horovod: unknown compression %v", opts.Compression)
	}
	if opts.GradientPredivideFactor == 0 {
		opts.GradientPredivideFactor = 1
	}
	if f := opts.GradientPredivideFactor; !(f > 0) || math.IsInf(f, 1) {
		// Each rank's part divided by an infinite factor is 0, times the factor after the sum NaN.
		return nil, fmt.Errorf("horovod: gradient predivide factor %v: want a positive finite number", f)
	}
	if opts.GradientPredivideFactor != 1 && opts.Op != Average {
		return nil, errors.New("horovod: gradient predivide factor applies to Average only")
	}
	if opts.DeferAverage && opts.Op != Average {
		return nil, errors.New("horovod: DeferAverage applies to Average only")
	}
	if opts.Compression != NoCompression {
		opts.DeferAverage = false // the division is free while widening: see GradientScale
	}
	if opts.BackwardPassesPerStep == 0 {
		opts.BackwardPassesPerStep = 1
	}
	if opts.BackwardPassesPerStep < 0 {
		return nil, fmt.Errorf("horovod: backward passes per step %d is negative", opts.BackwardPassesPerStep)
	}
	if opts.Prefix == "" {
		opts.Prefix = "gradients/"
	}
	r := &Reducer{h: h, opts: opts, accum: map[string]*NamedTensor{}}
	r.outArena, r.wireArena = h.hostArena(h.ctl.data), h.hostArena(h.ctl.data)
	return r, nil
}

// Close gives the Reducer's arenas back before Shutdown does: with a data backend that lends
// host memory (backend.HostAllocator: NCCL's pinned memory), that memory is the backend's until
// Shutdown unless Close returns it earlier. The results of the last Reduce are invalid
// afterwards; a later Reduce allocates anew. There is no finalizer to do it instead: the
// results the caller holds refer to the arenas without keeping the Reducer reachable. After
// Shutdown (or once the background loop has failed) Close does nothing: Shutdown frees that
// memory with the backend.
func (r *Reducer) Close() error {
	release, err := r.h.ctl.hold()
	if err != nil {
		r.abandon()
		return nil
	}
	defer release()
	return errors.Join(r.outArena.release(), r.wireArena.release())
}

// abandon forgets the arenas once the loop has stopped: Shutdown frees them with the backend.
func (r *Reducer) abandon() {
	r.outArena.abandon()
	r.wireArena.abandon()
}

// GradientScale is the factor Reduce's results must be multiplied by to be what Average
// returns: GradientPredivideFactor/Size with DeferAverage, else 1. It is exact for float32 and
// float64 gradients: rounding result x GradientScale once to the dtype (float32(float64(x) * f)
// for float32) gives Average's result to the bit, as Average computes the same product. With
// compression it is 1: the 16-bit sums are divided while they are widened, at no extra pass.
func (r *Reducer) GradientScale() float64 {
	if !r.opts.DeferAverage {
		return 1
	}
	return r.opts.GradientPredivideFactor / float64(r.h.Size())
}

// Reduce takes one backward pass's gradients. On the last pass of a step (every pass when
// BackwardPassesPerStep is 1) it returns the reduced gradients, in the order given, and ready ==
// true; on the other passes it accumulates them locally and returns ready == false. The returned
// tensors are owned by the Reducer and stay valid until the next call of Reduce has returned (so
// they may be given back to it, in any order, among other tensors), Close or Shutdown (with
// InPlace they are the given gradients, or with BackwardPassesPerStep > 1 the Reducer's
// accumulators). With a data backend that lends host memory (NCCL's pinned memory) they live in
// that memory, which Shutdown frees: copy what must outlive Shutdown. A pass whose gradients
// differ from the step's first pass (another name, dtype or shape) is an error that also drops
// the passes accumulated so far: the next call starts a new step. After Shutdown, Reduce
// returns the error every collective does then (wrapping ErrShutdown).
func (r *Reducer) Reduce(grads []NamedTensor) (reduced []NamedTensor, ready bool, err error) {
	release, err := r.h.ctl.hold()
	if err != nil {
		r.abandon()
		return nil, false, err
	}
	defer release()
	seen := make(map[string]bool, len(grads))
	for _, g := range grads {
		if seen[g.Name] {
			return nil, false, fmt.Errorf("horovod: reducer: gradient %q given twice", g.Name)
		}
		seen[g.Name] = true
		if err := checkOperand("allreduce", r.opts.Prefix+g.Name, g.Tensor); err != nil {
			return nil, false, err
		}
	}
	if r.opts.BackwardPassesPerStep > 1 {
		if err := r.accumulate(grads); err != nil {
			r.passes, r.first = 0, nil
			return nil, false, err
		}
		if r.passes < r.opts.BackwardPassesPerStep {
			return nil, false, nil
		}
		grads = make([]NamedTensor, len(r.first))
		for i, g := range r.first {
			grads[i] = *r.accum[g.Name]
			if r.opts.AverageAggregatedGradients {
				scale(grads[i].Data, grads[i].DType, 1/float64(r.opts.BackwardPassesPerStep), r.h.workers)
			}
		}
		r.passes, r.first = 0, nil
	}
	out, err := r.allreduce(grads)
	return out, err == nil, err
}

// accumulate adds one pass into the running sums, checking it has the first pass's variables.
func (r *Reducer) accumulate(grads []NamedTensor) error {
	if r.passes == 0 {
		if r.accumulatorsGivenBack(grads) {
			// The last step's results (with InPlace, the accumulators themselves) given back in
			// another order: copying one into its own accumulator would overwrite another's
			// before it is read. This step sums into fresh ones.
			r.accum = map[string]*NamedTensor{}
		}
		r.first = make([]NamedTensor, len(grads))
		r.inFirst = make(map[string]bool, len(grads))
		for i, g := range grads {
			r.inFirst[g.Name] = true
			r.first[i] = NamedTensor{Name: g.Name, Tensor: Tensor{DType: g.DType, Shape: slices.Clone(g.Shape)}}
			a := r.accum[g.Name]
			if a == nil || a.DType != g.DType || len(a.Data) != len(g.Data) {
				a = &NamedTensor{Name: g.Name, Tensor: Tensor{DType: g.DType, Data: make([]byte, len(g.Data))}}
				r.accum[g.Name] = a
			}
			a.Shape = slices.Clone(g.Shape)
			parallel.Copy(a.Data, g.Data, r.h.workers)
		}
		r.passes = 1
		return nil
	}
	if len(grads) != len(r.first) {
		return fmt.Errorf("horovod: reducer: backward pass %d has %d gradients, the first pass of the step had %d", r.passes+1, len(grads), len(r.first))
	}
	for _, g := range grads {
		a := r.accum[g.Name]
		if !r.inFirst[g.Name] { // r.accum also holds earlier steps' gradients
			return fmt.Errorf("horovod: reducer: gradient %q appears in backward pass %d but not in the first pass of the step", g.Name, r.passes+1)
		}
		if a.DType != g.DType || !slices.Equal(a.Shape, g.Shape) {
			return fmt.Errorf("horovod: reducer: gradient %q is %v%v in backward pass %d but %v%v in the first", g.Name, g.DType, g.Shape, r.passes+1, a.DType, a.Shape)
		}
		addInto(a.Data, g.Data, g.DType, r.h.workers)
	}
	r.passes++
	return nil
}

// accumulatorsGivenBack reports whether a gradient's data overlaps the accumulator of another
// name.
func (r *Reducer) accumulatorsGivenBack(grads []NamedTensor) bool {
	for _, g := range grads {
		for name, a := range r.accum {
			if name != g.Name && parallel.Overlap(g.Data, a.Data) {
				return true
			}
		}
	}
	return false
}

func (r *Reducer) allreduce(grads []NamedTensor) (_ []NamedTensor, err error) {
	pre := 1 / r.opts.GradientPredivideFactor
	post := r.opts.GradientPredivideFactor
	outBytes, wireBytes := 0, 0
	for _, g := range grads {
		if !r.opts.InPlace {
			outBytes += len(g.Data)
		}
		if r.opts.Compression.compresses(g.DType) {
			wireBytes += 2 * g.NumElements()
		}
	}
	r.outArena.grow(outBytes, r.inputsInResults(grads, outBytes))
	// No input lies in the wire arena: results are widened out of it, never handed out in it.
	r.wireArena.grow(wireBytes, false)
	// Once every collective of the step is over (waitAll waits for all of them) and it has
	// succeeded, the memory the arenas outgrew may go: nothing of this step reads it any more.
	// After a failure the backend may still be at it: it goes after the next successful step.
	defer func() {
		if err == nil {
			err = errors.Join(r.outArena.settle(), r.wireArena.settle())
		}
	}()
	wireType, codec, _ := r.opts.Compression.wire()
	outs := make([][]byte, len(grads))
	wires := make([]Tensor, len(grads))
	var convs []conversion
	outOff, wireOff := 0, 0
	for i, g := range grads {
		if r.opts.InPlace {
			outs[i] = g.Data
		} else {
			outs[i] = r.outArena.buf[outOff : outOff+len(g.Data)] // capacity runs on: fusion sees one span
			outOff += len(g.Data)
		}
		wires[i] = g.Tensor
		if r.opts.Compression.compresses(g.DType) {
			n := 2 * g.NumElements()
			half := r.wireArena.buf[wireOff : wireOff+n] // reduced in place, then widened
			wireOff += n
			convs = append(convs, conversion{dt: g.DType, codec: codec, wide: g.Data, half: half})
			wires[i] = Tensor{DType: wireType, Shape: g.Shape, Data: half}
		}
	}
	compress(convs, r.h.workers) // all gradients in one pass: small ones share goroutines
	reqs := make([]*request, len(grads))
	for i, g := range grads {
		output := outs[i]
		op := AllreduceOptions{Op: r.opts.Op, Prescale: pre, Postscale: post}
		if r.opts.DeferAverage {
			op = AllreduceOptions{Op: Sum, Prescale: pre} // post/Size is GradientScale
		}
		if r.opts.Compression.compresses(g.DType) {
			output = wires[i].Data
			// Sum (or Adasum) in 16 bits, then scale while widening: the division of Average
			// happens at full precision.
			op = AllreduceOptions{Op: Sum, Prescale: pre}
			if r.opts.Op == Adasum {
				op.Op = Adasum
			}
		}
		req, err := r.h.allreduceRequest(r.opts.Prefix+g.Name, 0, wires[i], op)
		if err != nil {
			return nil, err
		}
		req.output = output
		reqs[i] = req
	}
	if err := r.h.ctl.await(reqs...); err != nil {
		return nil, err
	}
	results, err := waitAll(reqs)
	if err != nil {
		return nil, err
	}
	out := make([]NamedTensor, len(grads))
	convs = convs[:0]
	for i, g := range grads {
		if r.opts.Compression.compresses(g.DType) {
			convs = append(convs, conversion{dt: g.DType, codec: codec, wide: outs[i], half: results[i].Data})
		}
		out[i] = NamedTensor{Name: g.Name, Tensor: Tensor{DType: g.DType, Shape: slices.Clone(g.Shape), Data: outs[i]}}
	}
	factor := post
	if r.opts.Op == Average {
		factor /= float64(r.h.Size())
	}
	decompress(convs, factor, r.h.workers)
	return out, nil
}

// inputsInResults reports whether this step must put its results in new memory because an
// input lies where they would go: the previous step's results handed back to Reduce in another
// arrangement (another order, other tensors before them) would be overwritten by the fusion
// copies and the reductions before they are read. An input that is exactly its own result slot
// is reduced in place and needs nothing new.
func (r *Reducer) inputsInResults(grads []NamedTensor, outBytes int) bool {
	if r.opts.InPlace || outBytes > len(r.outArena.mem) {
		return false // results in the inputs themselves, or in new memory anyway
	}
	out := r.outArena.mem[:outBytes]
	off := 0
	for _, g := range grads {
		if parallel.Overlap(g.Data, out) && !parallel.Same(g.Data, out[off:off+len(g.Data)]) {
			return true
		}
		off += len(g.Data)
	}
	return false
}

// addInto adds src into dst elementwise (local gradient accumulation), over up to workers
// goroutines when dst is large; the result does not depend on workers.
func addInto(dst, src []byte, dt DType, workers int) {
	size := dt.Size()
	parallel.For(len(dst)/size, size, passAlign, workers, func(lo, hi int) {
		addRange(dst[lo*size:hi*size], src[lo*size:hi*size], dt)
	})
}

// addRange is addInto on one goroutine.
func addRange(dst, src []byte, dt DType) {
	if len(dst) == 0 {
		return
	}
	switch dt {
	case Float32:
		addSlices(view[float32](dst), view[float32](src))
	case Float64:
		addSlices(view[float64](dst), view[float64](src))
	case Int32:
		addSlices(view[int32](dst), view[int32](src))
	case Int64:
		addSlices(view[int64](dst), view[int64](src))
	case Int8:
		addSlices(view[int8](dst), view[int8](src))
	case Uint8:
		addSlices(view[uint8](dst), view[uint8](src))
	case Float16, BFloat16:
		codec, _ := codecOf(dt)
		codec.mapHalves(view[uint16](dst), view[uint16](src), func(d, s []float32) { addSlices(d, s) })
	}
}

func addSlices[T int8 | uint8 | int32 | int64 | float32 | float64](dst, src []T) {
	for i := range dst {
		dst[i] += src[i]
	}
}
