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
// nothing, so callers need no checks.
type timeline struct {
	// mu serializes the writer (the holder of the loop's turn) and an abort's last flush
	// (flushNow), which may come from the watchdog.
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
	t := &timeline{f: f, buf: []byte("[\n"), origin: timeNow(), pids: map[string]int{}}
	return t, nil
}

func (t *timeline) emit(e traceEvent) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return
	}
	b, err := json.Marshal(e)
	if err != nil {
		t.err = err
		return
	}
	if t.events > 0 {
		t.buf = append(t.buf, ",\n"...)
	}
	t.events++
	t.buf = append(t.buf, b...)
	if len(t.buf) >= timelineBuffer {
		t.write()
	}
}

// write puts the buffered events in the file; t.mu is held.
func (t *timeline) write() {
	if t.err == nil && len(t.buf) > 0 {
		_, t.err = t.f.Write(t.buf)
		t.buf = t.buf[:0]
	}
}

func (t *timeline) pid(name string) int {
	id, ok := t.pids[name]
	if !ok {
		id = len(t.pids) + 1
		t.pids[name] = id
		t.emit(traceEvent{Name: "process_name", Phase: "M", PID: id, Args: map[string]string{"name": name}})
	}
	return id
}

func (t *timeline) at(ts time.Time) int64 { return ts.Sub(t.origin).Microseconds() }

func (t *timeline) begin(name, phase string, ts time.Time) {
	if t != nil {
		t.emit(traceEvent{Name: phase, Phase: "B", TS: t.at(ts), PID: t.pid(name)})
	}
}

func (t *timeline) finish(name string, ts time.Time) {
	if t != nil {
		t.emit(traceEvent{Name: "", Phase: "E", TS: t.at(ts), PID: t.pid(name)})
	}
}

// submitted opens the negotiation of a tensor that some rank has just announced.
func (t *timeline) submitted(name string, kind opKind, ts time.Time) {
	t.begin(name, "NEGOTIATE_"+upper(kind), ts)
}

// arrived marks rank r's submission of name during its negotiation.
func (t *timeline) arrived(name string, r int, ts time.Time) {
	if t != nil {
		t.emit(traceEvent{Name: fmt.Sprint(r), Phase: "i", Scope: "t", TS: t.at(ts), PID: t.pid(name)})
	}
}

// negotiated closes the negotiation and opens the operation itself, with the dtype that crosses
// the wire in its args (float16 or bfloat16 where a Reducer compresses).
func (t *timeline) negotiated(name string, kind opKind, dtype DType, ts time.Time) {
	t.finish(name, ts)
	if t != nil {
		t.emit(traceEvent{Name: upper(kind), Phase: "B", TS: t.at(ts), PID: t.pid(name), Args: map[string]string{"dtype": dtype.String()}})
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
