package horovod

import (
	"fmt"
	"math"
	"slices"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/internal/parallel"
)

// ReduceOp is what Allreduce computes across ranks.
type ReduceOp uint8

// Average is the zero value, as it is Horovod's default.
const (
	Average ReduceOp = iota
	Sum
	Min
	Max
	// Product multiplies across ranks (Horovod's hvd.Product, MPI_PROD, ncclProd).
	Product
	// Adasum combines floating-point tensors by adaptive summation (Horovod's hvd.Adasum: "Scaling
	// Distributed Training with Adaptive Summation", Maleki et al., 2021): per tensor, two ranks'
	// gradients a and b become a*(1-a·b/(2|a|²)) + b*(1-a·b/(2|b|²)), pair after pair up a binary
	// tree of the ranks. Allreduce only; float16, bfloat16, float32 and float64.
	Adasum
)

func (o ReduceOp) String() string {
	switch o {
	case Average:
		return "average"
	case Sum:
		return "sum"
	case Min:
		return "min"
	case Max:
		return "max"
	case Product:
		return "product"
	case Adasum:
		return "adasum"
	}
	return fmt.Sprintf("ReduceOp(%d)", uint8(o))
}

// backendOp is the reduction the backend performs for o; Average is a sum scaled afterwards.
func (o ReduceOp) backendOp() backend.ReduceOp {
	switch o {
	case Min:
		return backend.Min
	case Max:
		return backend.Max
	case Product:
		return backend.Product
	}
	return backend.Sum
}

// execute runs the responses of one round in order. Each allreduce, broadcast, allgather or
// reducescatter takes along the later ready ones it fuses with (fuse), and the batch runs as
// one backend call. Every rank computes the same batches from the same responses.
// An error from the backend is returned: the collective state is then unknown and the loop stops.
func (c *controller) execute(responses []*response) error {
	used := make([]bool, len(responses))
	for i, r := range responses {
		if used[i] {
			continue
		}
		used[i] = true
		if r.err != nil {
			if req := c.take(r.spec.name); req != nil {
				req.complete(Tensor{}, r.err)
			}
			c.timeline.done(r.spec.name)
			continue
		}
		batch := []*response{r}
		var err error
		c.executing = c.executing[:0]
		if r.spec.kind != kindBarrier && r.spec.kind != kindAlltoall && r.spec.kind != kindProcessSet {
			batch = c.fuse(responses, i, used)
		}
		switch r.spec.kind {
		case kindAllreduce:
			err = c.allreduce(batch)
		case kindReducescatter:
			err = c.reducescatter(batch)
		case kindAllgather:
			err = c.allgather(batch)
		case kindBroadcast:
			if len(batch) == 1 {
				err = c.broadcast(r)
			} else {
				err = c.fusedBroadcast(batch)
			}
		case kindBarrier:
			err = c.barrier(r)
		case kindAlltoall:
			err = c.alltoall(r)
		case kindProcessSet:
			err = c.addProcessSet(r)
		}
		if err != nil {
			err = fmt.Errorf("horovod: rank %d: %s %q on the %s backend: %w", c.rank, r.spec.kind, r.spec.name, c.data.Name(), err)
			for _, req := range c.executing {
				select {
				case <-req.done: // finished before the failure
				default:
					req.complete(Tensor{}, err)
				}
			}
			return err
		}
		// The batch's requests are complete; stale pointers left past the slice's length would
		// keep their inputs and results alive until a later batch overwrites them.
		clear(c.executing)
		for _, done := range batch {
			c.timeline.done(done.spec.name)
		}
	}
	return nil
}

// directMin is the size from which a broadcast, an allgather or a reducescatter goes on its own,
// straight from its input into its output, and up to which such tensors fuse: through the fusion
// buffer a tensor costs copies on the critical path (a broadcast's root's in and the others'
// out; a reducescatter's whole input in and its block out; an allgather's rows in and the whole
// result out), more than a call of its own from about this size, and a batch of about this size
// stays in the cores' caches between its copies and the collective. MiniLM's 105 variables apart
// in memory, 2 ranks: 47 ms fused, 19-21 ms with the 39 large ones on their own. Grouped
// reducescatters and allgathers of 64 tensors (make bench-peer on a 2-core AMD EPYC of family
// 26), released, fused up to the threshold against batches of up to directMin: reducescatter 3 ranks, 64 x 256 KiB (just under)
// 9.1-11.2 against 5.5-6.2 ms, 64 x 64 KiB 2.3-2.5 against 1.7-1.9 ms (64 x 16 KiB 0.56-0.66
// against 0.74-0.75 ms); allgather 2 ranks, 64 x 256 KiB 6.5-6.8 against 3.5-4.0 ms, 64 x 1 MiB
// 23 against 15 ms. The choice rests on sizes alone, the same on every rank; where the tensors
// lie in memory (back to back or not) differs between ranks and must not change which calls a
// rank makes.
const directMin = 256 << 10

// fuse returns the batch responses[i] heads: it and every later response not yet used that fuses
// with it (fusable), in order, while they fit the fusion threshold, marking them used. Broadcasts,
// allgathers and reducescatters fuse only below directMin: a batch of them takes tensors while it
// holds less than directMin bytes, and one of directMin or more goes on its own. Allreduces fuse
// at any size (a Reducer's, back to back, need no fusion buffer).
func (c *controller) fuse(responses []*response, i int, used []bool) []*response {
	r := responses[i]
	batch := []*response{r}
	capped := r.spec.kind != kindAllreduce
	bytes := fusedBytes(r)
	for j := i + 1; j < len(responses) && !(capped && bytes >= directMin); j++ {
		o := responses[j]
		n := fusedBytes(o)
		if used[j] || !fusable(r, o) || capped && n >= directMin || bytes+n > c.h.cfg.FusionThreshold {
			continue
		}
		used[j] = true
		bytes += n
		batch = append(batch, o)
	}
	return batch
}

// fusedBytes is how much of the fusion buffer r takes: an allgather's result (every rank's rows),
// another operation's tensor.
func fusedBytes(r *response) int {
	if r.spec.kind == kindAllgather {
		return gatheredBytes(r)
	}
	return r.spec.bytes()
}

// fusable reports whether b, which has not failed, fuses with a: the same kind, and for an
// allreduce or a reducescatter the same dtype, reduce op and scale factors, for a broadcast the
// same root. Barriers and alltoalls never fuse.
func fusable(a, b *response) bool {
	x, y := a.spec, b.spec
	if b.err != nil || x.kind != y.kind {
		return false
	}
	switch x.kind {
	case kindAllreduce, kindReducescatter:
		return x.dtype == y.dtype && x.op == y.op && x.prescale == y.prescale && x.postscale == y.postscale
	case kindBroadcast:
		return x.root == y.root
	case kindAllgather:
		return true
	}
	return false
}

// take removes and returns this rank's request for name; nil on a rank that has joined.
func (c *controller) take(name string) *request {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.queue.take(name)
	if r != nil {
		c.executing = append(c.executing, r)
	}
	return r
}

// operand is one tensor's part in a collective on this rank: its input and where the result goes.
// A rank that has joined contributes zeros and discards the result.
type operand struct {
	req    *request
	spec   *spec
	input  []byte
	output []byte
}

func (c *controller) operand(s *spec) operand {
	op := operand{req: c.take(s.name), spec: s}
	if op.req == nil {
		op.output = make([]byte, s.bytes())
		op.input = op.output
		return op
	}
	op.input, op.output = op.req.input, op.req.output
	if op.output == nil {
		op.output = c.h.results.get(s.bytes()) // all of it written: reduced into or broadcast
	}
	return op
}

func (o operand) finish(shape []int) {
	if o.req != nil {
		o.req.complete(Tensor{DType: o.spec.dtype, Shape: slices.Clone(shape), Data: o.output}, nil)
	}
}

func (c *controller) allreduce(batch []*response) error {
	s := batch[0].spec
	post := s.postscale
	if s.op == Average {
		post /= float64(c.size)
	}
	ops := make([]operand, len(batch))
	for i, r := range batch {
		ops[i] = c.operand(r.spec)
		c.timeline.start(r.spec.name, "QUEUE", r.ready)
		c.timeline.end(r.spec.name)
	}
	names := make([]string, len(batch))
	for i, r := range batch {
		names[i] = r.spec.name
	}
	wire := c.backendPhase(kindAllreduce)
	reduce := func(in, out []byte) error {
		if s.op == Adasum {
			tensorBytes := make([]int, len(ops))
			for i, o := range ops {
				tensorBytes[i] = len(o.output)
			}
			return c.phase(names, "ADASUM", func() error { return c.adasum(in, out, tensorBytes, s.dtype) })
		}
		return c.onWire(kindAllreduce, names, wire, func() error { return c.data.Allreduce(in, out, s.dtype, s.op.backendOp()) })
	}
	if len(ops) == 1 {
		// One tensor needs no fusion buffer: reduce straight from its input into its output.
		o := ops[0]
		in := o.input
		if parallel.Overlap(in, o.output) && !parallel.Same(in, o.output) {
			// Partly overlapping (a Reducer's previous results handed back at other offsets):
			// neither the copy below nor a backend may read and write such buffers at once.
			c.fusion.grow(len(in), false)
			if err := c.fusion.settle(); err != nil {
				return err
			}
			parallel.Copy(c.fusion.buf, in, c.h.workers)
			in = c.fusion.buf
		}
		if s.prescale != 1 {
			parallel.Copy(o.output, in, c.h.workers)
			scale(o.output, s.dtype, s.prescale, c.h.workers)
			in = o.output
		}
		if err := reduce(in, o.output); err != nil {
			return err
		}
		scale(o.output, s.dtype, post, c.h.workers)
		o.finish(s.shape)
		return nil
	}
	total := 0
	for _, o := range ops {
		total += len(o.output)
	}
	// Tensors that lie back to back in memory (a Reducer's outputs; gradients sliced from one flat
	// buffer) need no fusion buffer on that side: the backend reads or writes them where they are.
	in := span(ops, func(o operand) []byte { return o.input })
	var out []byte
	if given(ops) { // outputs horovod allocated itself are adjacent only by chance
		out = span(ops, func(o operand) []byte { return o.output })
	}
	if out != nil && !reducibleInto(ops, out) {
		out = nil
	}
	buf := out
	if buf == nil {
		// The buffer outgrown held nothing of this batch: it goes at once.
		c.fusion.grow(total, false)
		if err := c.fusion.settle(); err != nil {
			return err
		}
		buf = c.fusion.buf
	}
	if in == nil || s.prescale != 1 {
		parts := [][]byte{in}
		if in == nil {
			parts = partsOf(ops, func(o operand) []byte { return o.input })
		}
		_ = c.phase(names, "MEMCPY_IN_FUSION_BUFFER", func() error {
			parallel.Gather(buf, parts, c.h.workers)
			scale(buf, s.dtype, s.prescale, c.h.workers)
			return nil
		})
		in = buf
	}
	if err := reduce(in, buf); err != nil {
		return err
	}
	if out != nil {
		scale(buf, s.dtype, post, c.h.workers)
	} else {
		parts := partsOf(ops, func(o operand) []byte { return o.output })
		_ = c.phase(names, "MEMCPY_OUT_FUSION_BUFFER", func() error {
			scale(buf, s.dtype, post, c.h.workers)
			parallel.Scatter(parts, buf, c.h.workers)
			return nil
		})
	}
	for i, o := range ops {
		o.finish(batch[i].spec.shape)
	}
	return nil
}

// given reports whether every operand's output was provided by the caller (a Reducer's arena).
func given(ops []operand) bool {
	for _, o := range ops {
		if o.req == nil || o.req.output == nil {
			return false
		}
	}
	return true
}

// reducibleInto reports whether the batch can be gathered into, and reduced in, out (the
// outputs' span) itself: every input is either its own output (in place) or apart from all of
// out. An input elsewhere in out (a Reducer's previous results handed back in another order or
// next to other tensors) would be overwritten before it is read; such a batch goes through the
// fusion buffer, whose results are scattered only once every input has been read. When it
// holds, the inputs' span, if they have one, is out itself or apart from it (inputs as long as
// their outputs, each its own or outside out, lie back to back only as out or outside it), so
// the backend never sees send and receive buffers that partly overlap.
func reducibleInto(ops []operand, out []byte) bool {
	for _, o := range ops {
		if !parallel.Same(o.input, o.output) && parallel.Overlap(o.input, out) {
			return false
		}
	}
	return true
}

// partsOf returns every operand's part, in order.
func partsOf(ops []operand, part func(operand) []byte) [][]byte {
	parts := make([][]byte, len(ops))
	for i, o := range ops {
		parts[i] = part(o)
	}
	return parts
}

// span returns every operand's part as one slice when the parts lie back to back, in order,
// within the capacity of the first (so within one allocation: slices of one flat buffer); nil
// otherwise.
func span(ops []operand, part func(operand) []byte) []byte {
	first := part(ops[0])
	n := 0
	for _, o := range ops {
		p := part(o)
		if len(p) == 0 || cap(first) < n+len(p) || &first[:n+1][n] != &p[0] {
			return nil
		}
		n += len(p)
	}
	return first[:n]
}

// rowBytes is the size of one row (one index of the first dimension) of an allgather's tensor.
func rowBytes(s *spec) int {
	row := s.dtype.Size()
	for _, d := range s.shape[1:] {
		row *= d
	}
	return row
}

// gatheredBytes is the size of an allgather's result: every rank's rows.
func gatheredBytes(r *response) int {
	rows := 0
	for _, d := range r.firstDims {
		rows += d
	}
	return rows * rowBytes(r.spec)
}

// allgather gathers the tensors of batch in one backend call: each rank sends its inputs back to
// back, and each tensor's result is then copied out of every rank's part. A single tensor is
// gathered straight into its result.
func (c *controller) allgather(batch []*response) error {
	reqs := make([]*request, len(batch))
	outs := make([][]byte, len(batch))
	names := make([]string, len(batch))
	counts := make([]int, c.size) // bytes each rank sends: its rows of every tensor
	for i, r := range batch {
		reqs[i] = c.take(r.spec.name)
		switch n := gatheredBytes(r); {
		case reqs[i] != nil && len(reqs[i].output) == n && n > 0:
			outs[i] = reqs[i].output // AllgatherInto's buffer
		case reqs[i] != nil && reqs[i].output == nil:
			outs[i] = c.h.results.get(n) // all of it written: every rank's rows
		default:
			outs[i] = make([]byte, n)
		}
		names[i] = r.spec.name
		for k, d := range r.firstDims {
			counts[k] += d * rowBytes(r.spec)
		}
		c.timeline.start(r.spec.name, "QUEUE", r.ready)
		c.timeline.end(r.spec.name)
	}
	var send, recv []byte
	if len(batch) == 1 {
		recv = outs[0]
		if reqs[0] != nil {
			send = reqs[0].input
		}
	} else {
		total := 0
		for _, n := range counts {
			total += n
		}
		c.fusion.grow(total+counts[c.rank], false)
		if err := c.fusion.settle(); err != nil {
			return err
		}
		recv, send = c.fusion.buf[:total], c.fusion.buf[total:]
		off := 0
		for _, req := range reqs {
			if req != nil { // a joined rank sends no rows
				off += copy(send[off:], req.input)
			}
		}
	}
	if err := c.onWire(kindAllgather, names, "allgather", func() error { return c.data.Allgatherv(send, recv, counts) }); err != nil {
		return err
	}
	if len(batch) > 1 {
		// recv holds rank 0's rows of every tensor, then rank 1's, ...; each result wants its
		// own rows of rank 0, then of rank 1, ...
		written := make([]int, len(batch))
		off := 0
		for k := range c.size {
			for i, r := range batch {
				n := r.firstDims[k] * rowBytes(r.spec)
				written[i] += copy(outs[i][written[i]:], recv[off:off+n])
				off += n
			}
		}
	}
	for i, r := range batch {
		if reqs[i] == nil {
			continue
		}
		if out := reqs[i].output; out != nil && len(out) != len(outs[i]) {
			reqs[i].complete(Tensor{}, &Error{Op: "allgather", Tensor: r.spec.name, Reason: fmt.Sprintf(
				"the output buffer holds %d bytes for a result of %d (every rank's rows)", len(out), len(outs[i]))})
			continue
		}
		rows := 0
		for _, d := range r.firstDims {
			rows += d
		}
		shape := append([]int{rows}, r.spec.shape[1:]...)
		reqs[i].complete(Tensor{DType: r.spec.dtype, Shape: shape, Data: outs[i]}, nil)
	}
	return nil
}

func (c *controller) broadcast(r *response) error {
	s := r.spec
	o := c.operand(s)
	buf, during := o.output, func() {}
	if c.rank == s.root && len(o.input) > 0 && !parallel.Same(o.input, o.output) {
		// The root's result is a copy of its input (Horovod's root returns the input tensor
		// itself, which TensorFlow's immutable tensors allow and a Go slice the caller may still
		// write does not): the broadcast sends from the input while the root makes the copy,
		// where the backend can leave it in flight.
		buf, during = o.input, func() { copy(o.output, o.input) }
	}
	send := func() error {
		during()
		return c.data.Broadcast(buf, s.root)
	}
	// Every rank calls the same kind of broadcast: MPI matches a nonblocking collective only
	// with a nonblocking one, and only the root knows whether it copies.
	if ob, ok := c.data.(backend.OverlappedBroadcaster); ok {
		send = func() error { return ob.BroadcastWhile(buf, s.root, during) }
	}
	c.timeline.start(s.name, "QUEUE", r.ready)
	c.timeline.end(s.name)
	if err := c.onWire(kindBroadcast, []string{s.name}, "broadcast", send); err != nil {
		return err
	}
	o.finish(s.shape)
	return nil
}

// fusedBroadcast sends the tensors of batch, all from one root, as one broadcast: the root lays
// its inputs back to back in the fusion buffer, every rank receives the buffer and copies each
// tensor out. Where the outputs already lie back to back (variables sliced from one flat buffer,
// broadcast in place), the backend fills them where they are, with no copy on any rank.
func (c *controller) fusedBroadcast(batch []*response) error {
	root := batch[0].spec.root
	ops := make([]operand, len(batch))
	names := make([]string, len(batch))
	total := 0
	for i, r := range batch {
		ops[i] = c.operand(r.spec)
		names[i] = r.spec.name
		total += len(ops[i].output)
		c.timeline.start(r.spec.name, "QUEUE", r.ready)
		c.timeline.end(r.spec.name)
	}
	buf := span(ops, func(o operand) []byte { return o.output })
	if buf != nil && c.rank == root {
		// The root's inputs go where they are broadcast from: its own outputs, unless in place.
		for _, o := range ops {
			if !parallel.Same(o.input, o.output) {
				buf = nil // through the fusion buffer: an input may lie in another's output
				break
			}
		}
	}
	direct := buf != nil
	if !direct {
		c.fusion.grow(total, false)
		if err := c.fusion.settle(); err != nil {
			return err
		}
		buf = c.fusion.buf[:total]
		if c.rank == root {
			parts := partsOf(ops, func(o operand) []byte { return o.input })
			_ = c.phase(names, "MEMCPY_IN_FUSION_BUFFER", func() error {
				parallel.Gather(buf, parts, c.h.workers)
				return nil
			})
		}
	}
	if err := c.onWire(kindBroadcast, names, c.backendPhase(kindBroadcast), func() error { return c.data.Broadcast(buf, root) }); err != nil {
		return err
	}
	if !direct {
		parts := partsOf(ops, func(o operand) []byte { return o.output })
		_ = c.phase(names, "MEMCPY_OUT_FUSION_BUFFER", func() error {
			parallel.Scatter(parts, buf, c.h.workers)
			return nil
		})
	}
	for i, o := range ops {
		o.finish(batch[i].spec.shape)
	}
	return nil
}

// scatterRows is the number of rows of a reducescatter's first dimension of rows rows that rank
// rank of size receives: as many as the others, one more on the first rows%size ranks (as
// Horovod splits them).
func scatterRows(rows, size, rank int) int {
	n := rows / size
	if rank < rows%size {
		n++
	}
	return n
}

// reducescatter reduces the batch's tensors across ranks and leaves each rank its block of rows
// of each: through the backend's own reduce-scatter where it has one (backend.ReduceScatterer),
// else an allreduce of the whole of them of which this rank keeps its blocks. Several tensors
// fuse as Horovod fuses them: the fusion buffer holds, for each rank in order, every tensor's
// block for that rank, so one reduce-scatter leaves each rank its blocks back to back. A lone
// tensor, unscaled, goes straight from its input into its output. A rank that has joined
// contributes zeros, as to an allreduce.
func (c *controller) reducescatter(batch []*response) error {
	s := batch[0].spec
	post := s.postscale
	if s.op == Average {
		post /= float64(c.size)
	}
	names := make([]string, len(batch))
	reqs := make([]*request, len(batch))
	ins, outs := make([][]byte, len(batch)), make([][]byte, len(batch))
	blocks := make([][]int, len(batch)) // bytes of each tensor's block for each rank
	counts := make([]int, c.size)       // bytes of the fused block for each rank
	total := 0
	for i, r := range batch {
		names[i] = r.spec.name
		row := rowBytes(r.spec)
		blocks[i] = make([]int, c.size)
		for k := range c.size {
			blocks[i][k] = scatterRows(r.spec.shape[0], c.size, k) * row
			counts[k] += blocks[i][k]
		}
		total += r.spec.bytes()
		reqs[i] = c.take(r.spec.name)
		switch req := reqs[i]; {
		case req == nil:
			ins[i], outs[i] = make([]byte, r.spec.bytes()), make([]byte, blocks[i][c.rank])
		case req.output != nil:
			ins[i], outs[i] = req.input, req.output
		default:
			ins[i], outs[i] = req.input, c.h.results.get(blocks[i][c.rank]) // all of it written by the reduction
		}
		c.timeline.start(r.spec.name, "QUEUE", r.ready)
		c.timeline.end(r.spec.name)
	}
	rs, native := c.data.(backend.ReduceScatterer)
	in, mine := ins[0], outs[0] // what the backend reduces; this rank's fused block
	if len(batch) > 1 || s.prescale != 1 || !native {
		// The fusion buffer holds the fused (or scaled) input, the caller's staying unchanged,
		// followed, for several tensors, by this rank's fused block; without a reduce-scatter of
		// the backend's, the whole reduction, in place.
		size := total
		if native && len(batch) > 1 {
			size += counts[c.rank]
		}
		c.fusion.grow(size, false)
		if err := c.fusion.settle(); err != nil {
			return err
		}
		buf := c.fusion.buf
		if len(batch) > 1 || s.prescale != 1 {
			parts := make([][]byte, 0, c.size*len(batch))
			at := make([]int, len(batch)) // each tensor's block for rank k starts at at[i]
			for k := range c.size {
				for i := range batch {
					parts = append(parts, ins[i][at[i]:at[i]+blocks[i][k]])
					at[i] += blocks[i][k]
				}
			}
			_ = c.phase(names, "MEMCPY_IN_FUSION_BUFFER", func() error {
				parallel.Gather(buf[:total], parts, c.h.workers)
				scale(buf[:total], s.dtype, s.prescale, c.h.workers)
				return nil
			})
			in = buf[:total]
		}
		if native && len(batch) > 1 {
			mine = buf[total : total+counts[c.rank]]
		}
	}
	if native {
		if err := c.onWire(kindReducescatter, names, c.backendPhase(kindReducescatter), func() error {
			return rs.ReduceScatter(in, mine, counts, s.dtype, s.op.backendOp())
		}); err != nil {
			return err
		}
	} else {
		whole := c.fusion.buf[:total]
		if err := c.onWire(kindAllreduce, names, c.backendPhase(kindAllreduce), func() error {
			return c.data.Allreduce(in, whole, s.dtype, s.op.backendOp())
		}); err != nil {
			return err
		}
		first := 0 // of this rank's fused block in the whole reduction
		for _, n := range counts[:c.rank] {
			first += n
		}
		mine = whole[first : first+counts[c.rank]]
	}
	if len(batch) == 1 && native {
		scale(mine, s.dtype, post, c.h.workers)
	} else {
		_ = c.phase(names, "MEMCPY_OUT_FUSION_BUFFER", func() error {
			scale(mine, s.dtype, post, c.h.workers)
			parallel.Scatter(outs, mine, c.h.workers)
			return nil
		})
	}
	for i, r := range batch {
		if reqs[i] != nil {
			shape := append([]int{scatterRows(r.spec.shape[0], c.size, c.rank)}, r.spec.shape[1:]...)
			reqs[i].complete(Tensor{DType: r.spec.dtype, Shape: shape, Data: outs[i]}, nil)
		}
	}
	return nil
}

// alltoall sends each rank the rows this rank's splits give it and receives the rows every rank
// sends this one, concatenated in rank order: through the backend's own all-to-all where it has
// one (backend.Alltoaller), else an allgather of every rank's whole input into the fusion buffer
// out of which this rank copies the blocks addressed to it. No rank has joined (agree).
func (c *controller) alltoall(r *response) error {
	s := r.spec
	req := c.take(s.name)
	row := rowBytes(s)
	sendCounts, recvCounts, received := make([]int, c.size), make([]int, c.size), make([]int, c.size)
	total := 0
	for k := range c.size {
		sendCounts[k] = r.splits[c.rank][k] * row
		received[k] = r.splits[k][c.rank]
		recvCounts[k] = received[k] * row
		total += recvCounts[k]
	}
	var out []byte
	switch {
	case req.output != nil && len(req.output) == total:
		out = req.output // AlltoallInto's buffer
	case req.output != nil: // the wrong length: this rank's error once the collective is done
		out = make([]byte, total)
	default:
		out = c.h.results.get(total) // all of it written: every rank's block
	}
	c.timeline.start(s.name, "QUEUE", r.ready)
	c.timeline.end(s.name)
	names := []string{s.name}
	if a, ok := c.data.(backend.Alltoaller); ok && alltoallFitsCInts(r.splits, row) {
		if err := c.onWire(kindAlltoall, names, c.backendPhase(kindAlltoall), func() error {
			return a.Alltoallv(req.input, sendCounts, out, recvCounts)
		}); err != nil {
			return err
		}
	} else {
		inputs := make([]int, c.size) // every rank's whole input, in bytes
		all := 0
		for k := range c.size {
			for _, n := range r.splits[k] {
				inputs[k] += n * row
			}
			all += inputs[k]
		}
		c.fusion.grow(all, false)
		if err := c.fusion.settle(); err != nil {
			return err
		}
		gathered := c.fusion.buf[:all]
		if err := c.onWire(kindAllgather, names, c.backendPhase(kindAllgather), func() error {
			return c.data.Allgatherv(req.input, gathered, inputs)
		}); err != nil {
			return err
		}
		at, written := 0, 0 // rank k's input in gathered; the result so far
		for k := range c.size {
			before := 0 // rank k's rows for the ranks before this one
			for _, n := range r.splits[k][:c.rank] {
				before += n * row
			}
			written += copy(out[written:], gathered[at+before:at+before+recvCounts[k]])
			at += inputs[k]
		}
	}
	if req.output != nil && len(req.output) != total {
		req.complete(Tensor{}, &Error{Op: "alltoall", Tensor: s.name, Reason: fmt.Sprintf(
			"the output buffer holds %d bytes for a result of %d (the rows every rank sends this one)", len(req.output), total)})
		return nil
	}
	req.received = received
	shape := append([]int{0}, s.shape[1:]...)
	for _, n := range received {
		shape[0] += n
	}
	req.complete(Tensor{DType: s.dtype, Shape: shape, Data: out}, nil)
	return nil
}

// alltoallFitsCInts reports whether every rank's blocks and their offsets, in bytes, fit a C int:
// MPI_Alltoallv's counts and displacements are C ints, and a rank cannot tell from its own counts
// whether a peer's overflow, so every rank decides here, from every rank's splits, whether the
// backend's all-to-all can take the call or the allgather must.
func alltoallFitsCInts(splits [][]int, row int) bool {
	received := make([]int, len(splits))
	for _, from := range splits {
		sent := 0
		for to, n := range from {
			sent += n * row
			received[to] += n * row
			if sent > math.MaxInt32 || received[to] > math.MaxInt32 {
				return false
			}
		}
	}
	return true
}

func (c *controller) barrier(r *response) error {
	req := c.take(r.spec.name)
	if err := c.busy("barrier", c.control.Barrier); err != nil {
		return err
	}
	if req != nil {
		req.complete(Tensor{}, nil)
	}
	return nil
}
