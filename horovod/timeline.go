package horovod

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
)

var timeNow = time.Now

// timeline writes Horovod's timeline: a Chrome trace (JSON array of trace events, loadable in
// chrome://tracing and Perfetto) with one row per tensor and, on each row, the operation's phases:
// NEGOTIATE_<OP> from the first rank's submission until every rank has submitted (an instant event
// marks each rank's arrival), then <OP> enclosing QUEUE, MEMCPY_IN_FUSION_BUFFER, the backend's
// <BACKEND>_<OP> and MEMCPY_OUT_FUSION_BUFFER. Only rank 0 writes one; a nil *timeline writes
// nothing, so callers need no checks. A process set that rank 0 is in writes its operations into
// the job's file, on rows of their own (view).
type timeline struct {
	*timelineFile
	// row prefixes each tensor's row name: "" for the job, "process set [0 2]: " for a set.
	row string
	// ranks are a set's ranks in the job, by which its arrivals are marked; nil for the job.
	ranks []int
}

// timelineFile is a timeline's file, shared by the job's controller and its process sets'.
type timelineFile struct {
	// mu serializes the writers (the holder of each loop's turn: the job's and its sets') and an
	// abort's last flush (flushNow), which may come from the watchdog.
	mu        sync.Mutex
	f         *os.File
	buf       []byte // whole events not yet written: the file always ends at an event's end
	origin    time.Time
	pids      map[string]int
	events    int
	lastFlush time.Time
	err       error
}

// timelineBuffer is how many bytes of events wait before they are written, once a second
// otherwise (flushIfDue).
const timelineBuffer = 64 << 10

type traceEvent struct {
	Name  string            `json:"name"`
	Phase string            `json:"ph"`
	TS    int64             `json:"ts"` // microseconds since the timeline began
	PID   int               `json:"pid"`
	TID   int               `json:"tid"`
	Scope string            `json:"s,omitempty"`
	Args  map[string]string `json:"args,omitempty"`
}

func newTimeline(path string) (*timeline, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("HOROVOD_TIMELINE: %w", err)
	}
	return &timeline{timelineFile: &timelineFile{f: f, buf: []byte("[\n"), origin: timeNow(), pids: map[string]int{}}}, nil
}

// view is the timeline of a process set of ranks (in the job) on this rank: its rows in t's
// file, named after the set. Closing it leaves the file to the job.
func (t *timeline) view(ranks []int) *timeline {
	if t == nil {
		return nil
	}
	return &timeline{timelineFile: t.timelineFile, row: fmt.Sprintf("process set %v: ", ranks), ranks: ranks}
}

// emit writes e on the row of tensor name, naming the row (a metadata event) at its first event.
func (t *timeline) emit(name string, e traceEvent) {
	row := t.row + name
	f := t.timelineFile
	f.mu.Lock()
	defer f.mu.Unlock()
	id, ok := f.pids[row]
	if !ok {
		id = len(f.pids) + 1
		f.pids[row] = id
		f.append(traceEvent{Name: "process_name", Phase: "M", PID: id, Args: map[string]string{"name": row}})
	}
	e.PID = id
	f.append(e)
}

// append adds e to the buffered events, writing them once there are enough; f.mu is held.
func (f *timelineFile) append(e traceEvent) {
	if f.err != nil {
		return
	}
	b, err := json.Marshal(e)
	if err != nil {
		f.err = err
		return
	}
	if f.events > 0 {
		f.buf = append(f.buf, ",\n"...)
	}
	f.events++
	f.buf = append(f.buf, b...)
	if len(f.buf) >= timelineBuffer {
		f.write()
	}
}

// write puts the buffered events in the file; f.mu is held.
func (f *timelineFile) write() {
	if f.err == nil && len(f.buf) > 0 {
		_, f.err = f.f.Write(f.buf)
		f.buf = f.buf[:0]
	}
}

func (t *timeline) at(ts time.Time) int64 { return ts.Sub(t.origin).Microseconds() }

func (t *timeline) begin(name, phase string, ts time.Time) {
	if t != nil {
		t.emit(name, traceEvent{Name: phase, Phase: "B", TS: t.at(ts)})
	}
}

func (t *timeline) finish(name string, ts time.Time) {
	if t != nil {
		t.emit(name, traceEvent{Name: "", Phase: "E", TS: t.at(ts)})
	}
}

// submitted opens the negotiation of a tensor that some rank has just announced.
func (t *timeline) submitted(name string, kind opKind, ts time.Time) {
	t.begin(name, "NEGOTIATE_"+upper(kind), ts)
}

// arrived marks rank r's submission of name during its negotiation (by its rank in the job,
// for a process set's).
func (t *timeline) arrived(name string, r int, ts time.Time) {
	if t != nil {
		if t.ranks != nil {
			r = t.ranks[r]
		}
		t.emit(name, traceEvent{Name: fmt.Sprint(r), Phase: "i", Scope: "t", TS: t.at(ts)})
	}
}

// negotiated closes the negotiation and opens the operation itself, with the dtype that crosses
// the wire in its args (float16 or bfloat16 where a Reducer compresses).
func (t *timeline) negotiated(name string, kind opKind, dtype DType, ts time.Time) {
	t.finish(name, ts)
	if t != nil {
		t.emit(name, traceEvent{Name: upper(kind), Phase: "B", TS: t.at(ts), Args: map[string]string{"dtype": dtype.String()}})
	}
}

// done closes the operation.
func (t *timeline) done(name string) { t.finish(name, timeNow()) }

func (t *timeline) start(name, phase string, ts time.Time) { t.begin(name, phase, ts) }

func (t *timeline) end(name string) { t.finish(name, timeNow()) }

func (t *timeline) startAll(names []string, phase string) {
	now := timeNow()
	for _, n := range names {
		t.begin(n, phase, now)
	}
}

// spanAll writes a phase of every name that began at start and ends now, for a phase named
// only once it is over.
func (t *timeline) spanAll(names []string, phase string, start time.Time) {
	now := timeNow()
	for _, n := range names {
		t.begin(n, phase, start)
		t.finish(n, now)
	}
}

func (t *timeline) endAll(names []string) {
	now := timeNow()
	for _, n := range names {
		t.finish(n, now)
	}
}

// flushIfDue pushes events to the file about once a second, so a crashed job leaves a usable trace
// (trace viewers accept an array without its closing bracket, and the file ends at an event's end).
func (t *timeline) flushIfDue() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if time.Since(t.lastFlush) >= time.Second {
		t.lastFlush = time.Now()
		t.write()
	}
}

// flushNow writes every event so far, before the job is aborted: the operations in flight when
// it failed or stalled are what a reader of the trace looks for.
func (t *timeline) flushNow() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.write()
}

func (t *timeline) close() error {
	if t == nil {
		return nil
	}
	if t.ranks != nil {
		t.flushNow() // a set's view: the job closes the file
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err == nil {
		t.buf = append(t.buf, "\n]\n"...)
		t.write()
	}
	if err := t.f.Close(); t.err == nil {
		t.err = err
	}
	if t.err != nil {
		return fmt.Errorf("horovod: timeline %s: %w", t.f.Name(), t.err)
	}
	return nil
}

func upper(k opKind) string { return strings.ToUpper(strings.ReplaceAll(k.String(), " ", "_")) }

// backendPhase names the wire phase of an operation as Horovod's timeline does: MPI_ALLREDUCE,
// NCCL_ALLGATHER, and for broadcast the collective's own name, MPI_BCAST or NCCL_BCAST (while the
// negotiation and the operation itself are NEGOTIATE_BROADCAST and BROADCAST there too).
func (c *controller) backendPhase(k opKind) string {
	return strings.ToUpper(c.data.Name()) + "_" + phaseOp(k)
}

func phaseOp(k opKind) string {
	if k == kindBroadcast {
		return "BCAST"
	}
	return upper(k)
}

// phase runs f, a step of the batch names on this rank alone (a copy into or out of the fusion
// buffer), as the busy call what, and writes it as the batch's timeline phase what.
func (c *controller) phase(names []string, what string, f func() error) error {
	c.timeline.startAll(names, what)
	err := c.busy(what, f)
	c.timeline.endAll(names)
	return err
}

// onWire runs f, the backend's collective of kind k for names, as the busy call what (the stall
// check's name for it), and writes its wire phase, named once it is over after the way the
// backend says it went (wentPhase).
func (c *controller) onWire(k opKind, names []string, what string, f func() error) error {
	start := timeNow()
	err := c.busy(what, f)
	c.timeline.spanAll(names, c.wentPhase(k), start)
	return err
}

// wentPhase names the wire phase of the allreduce, broadcast or allgather that just ended after
// the way the backend says it went (backend.PathReporter: SHM_ALLREDUCE, SHM_BCAST,
// SHM_ALLGATHER where MPI's ranks used shared memory), else as backendPhase does.
func (c *controller) wentPhase(k opKind) string {
	if p, ok := c.data.(backend.PathReporter); ok && k != kindAlltoall {
		path := p.AllreducePath()
		switch k {
		case kindBroadcast:
			path = p.BroadcastPath()
		case kindAllgather:
			path = p.AllgatherPath()
		case kindReducescatter:
			path = p.ReduceScatterPath()
		}
		if path != "" {
			return path + "_" + phaseOp(k)
		}
	}
	return c.backendPhase(k)
}
