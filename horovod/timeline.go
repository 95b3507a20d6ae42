package horovod

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
)

var timeNow = time.Now

// timeline writes Horovod's timeline: a Chrome trace (JSON array of trace events, loadable in
// chrome://tracing and Perfetto) with one row per tensor and, on each row, the operation's phases:
// NEGOTIATE_<OP> from the first rank's submission until every rank has submitted (an instant event
// marks each rank's arrival), then <OP> enclosing QUEUE, MEMCPY_IN_FUSION_BUFFER, the backend's
// <BACKEND>_<OP> and MEMCPY_OUT_FUSION_BUFFER. Only the job's rank 0 has one, which records from
// Init with HOROVOD_TIMELINE and between StartTimeline and StopTimeline; a nil *timeline, and one
// not recording, write nothing, so callers need no checks. A process set that rank 0 is in writes
// its operations into the job's file, on rows of their own (view).
type timeline struct {
	*timelineFile
	// row prefixes each tensor's row name: "" for the job, "process set [0 2]: " for a set.
	row string
	// ranks are a set's ranks in the job, by which its arrivals are marked; nil for the job.
	ranks []int
}

// timelineFile is the job's timeline file, shared by the job's controller and its process sets'.
type timelineFile struct {
	// recording is whether a file is open, read without mu so that a rank 0 that records nothing
	// builds no events; emit checks f again under mu, since a stop may come in between.
	recording atomic.Bool
	// mu serializes the writers (the holder of each loop's turn: the job's and its sets'), an
	// abort's last flush (flushNow), which may come from the watchdog, and the caller of
	// StartTimeline and StopTimeline.
	mu        sync.Mutex
	f         *os.File // nil while not recording
	buf       []byte   // whole events not yet written: the file always ends at an event's end
	origin    time.Time
	pids      map[string]int
	open      map[int]int // by row: the phases begun in this file and not yet ended
	events    int
	lastFlush time.Time
	err       error
	shut      bool // the job has shut down: no file is started again
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

// newTimeline is the job's rank 0's timeline, recording nothing until started.
func newTimeline() *timeline { return &timeline{timelineFile: &timelineFile{}} }

// on reports whether t records: the writers build no event otherwise.
func (t *timeline) on() bool { return t != nil && t.recording.Load() }

// startFile makes the timeline record into a new file at path, completing the one it records into
// first, if any (that file's error is returned, joined with the new one's).
func (f *timelineFile) startFile(path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.shut {
		return ErrShutdown
	}
	prev := f.stopLocked()
	file, err := os.Create(path)
	if err != nil {
		return errors.Join(prev, err)
	}
	f.f, f.buf, f.origin, f.lastFlush = file, append(f.buf[:0], "[\n"...), timeNow(), time.Time{}
	f.pids, f.open, f.events, f.err = map[string]int{}, map[int]int{}, 0, nil
	f.recording.Store(true)
	return prev
}

// stopLocked ends the phases still open in the file at this moment, completes the JSON array and
// closes the file; f.mu is held. The timeline then records nothing until started again.
func (f *timelineFile) stopLocked() error {
	if f.f == nil {
		return nil
	}
	f.recording.Store(false)
	ts := timeNow().Sub(f.origin).Microseconds()
	for _, id := range slices.Sorted(maps.Keys(f.open)) {
		for range f.open[id] {
			f.append(traceEvent{Phase: "E", TS: ts, PID: id})
		}
	}
	if f.err == nil {
		f.buf = append(f.buf, "\n]\n"...)
		f.write()
	}
	name := f.f.Name()
	if err := f.f.Close(); f.err == nil {
		f.err = err
	}
	f.f = nil
	if f.err != nil {
		return fmt.Errorf("horovod: timeline %s: %w", name, f.err)
	}
	return nil
}

// view is the timeline of a process set of ranks (in the job) on this rank: its rows in t's
// file, named after the set. Closing it leaves the file to the job.
func (t *timeline) view(ranks []int) *timeline {
	if t == nil {
		return nil
	}
	return &timeline{timelineFile: t.timelineFile, row: fmt.Sprintf("process set %v: ", ranks), ranks: ranks}
}

// emit writes e, at ts, on the row of tensor name, naming the row (a metadata event) at its first
// event in the file. The end of a phase that began before the file did is left out, as is every
// event while no file is open; an event from before the file began is put at its beginning.
func (t *timeline) emit(name string, e traceEvent, ts time.Time) {
	row := t.row + name
	f := t.timelineFile
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.f == nil {
		return
	}
	id, ok := f.pids[row]
	if e.Phase == "E" {
		if f.open[id] == 0 {
			return
		}
		f.open[id]--
	} else if !ok {
		id = len(f.pids) + 1
		f.pids[row] = id
		f.append(traceEvent{Name: "process_name", Phase: "M", PID: id, Args: map[string]string{"name": row}})
	}
	if e.Phase == "B" {
		f.open[id]++
	}
	e.PID, e.TS = id, max(0, ts.Sub(f.origin).Microseconds())
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
	if f.f != nil && f.err == nil && len(f.buf) > 0 {
		_, f.err = f.f.Write(f.buf)
		f.buf = f.buf[:0]
	}
}

func (t *timeline) begin(name, phase string, ts time.Time) {
	if t.on() {
		t.emit(name, traceEvent{Name: phase, Phase: "B"}, ts)
	}
}

func (t *timeline) finish(name string, ts time.Time) {
	if t.on() {
		t.emit(name, traceEvent{Name: "", Phase: "E"}, ts)
	}
}

// submitted opens the negotiation of a tensor that some rank has just announced.
func (t *timeline) submitted(name string, kind opKind, ts time.Time) {
	if t.on() {
		t.begin(name, "NEGOTIATE_"+upper(kind), ts)
	}
}

// arrived marks rank r's submission of name during its negotiation (by its rank in the job,
// for a process set's).
func (t *timeline) arrived(name string, r int, ts time.Time) {
	if t.on() {
		if t.ranks != nil {
			r = t.ranks[r]
		}
		t.emit(name, traceEvent{Name: strconv.Itoa(r), Phase: "i", Scope: "t"}, ts)
	}
}

// negotiated closes the negotiation and opens the operation itself, with the dtype that crosses
// the wire in its args (float16 or bfloat16 where a Reducer compresses).
func (t *timeline) negotiated(name string, kind opKind, dtype DType, ts time.Time) {
	if t.on() {
		t.finish(name, ts)
		t.emit(name, traceEvent{Name: upper(kind), Phase: "B", Args: map[string]string{"dtype": dtype.String()}}, ts)
	}
}

// done closes the operation.
func (t *timeline) done(name string) {
	if t.on() {
		t.finish(name, timeNow())
	}
}

func (t *timeline) start(name, phase string, ts time.Time) { t.begin(name, phase, ts) }

func (t *timeline) end(name string) {
	if t.on() {
		t.finish(name, timeNow())
	}
}

func (t *timeline) startAll(names []string, phase string) {
	if !t.on() {
		return
	}
	now := timeNow()
	for _, n := range names {
		t.begin(n, phase, now)
	}
}

// spanAll writes a phase of every name that began at start and ends now, for a phase named
// only once it is over.
func (t *timeline) spanAll(names []string, phase string, start time.Time) {
	if !t.on() {
		return
	}
	now := timeNow()
	for _, n := range names {
		t.begin(n, phase, start)
		t.finish(n, now)
	}
}

func (t *timeline) endAll(names []string) {
	if !t.on() {
		return
	}
	now := timeNow()
	for _, n := range names {
		t.finish(n, now)
	}
}

// flushIfDue pushes events to the file about once a second, so a crashed job leaves a usable trace
// (trace viewers accept an array without its closing bracket, and the file ends at an event's end).
func (t *timeline) flushIfDue() {
	if !t.on() {
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

// close completes the job's timeline file, if one is open, and starts none again (Shutdown);
// a process set's view only writes out its events, leaving the file to the job.
func (t *timeline) close() error {
	if t == nil {
		return nil
	}
	if t.ranks != nil {
		t.flushNow()
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.shut = true
	return t.stopLocked()
}

// StartTimeline makes the job's rank 0 write Horovod's timeline to path from now on, as
// HOROVOD_TIMELINE does from Init (Horovod's hvd.start_timeline): the job's operations and those
// of the process sets rank 0 is in. A timeline already being written is completed first. Every
// rank may call it, and only rank 0 creates the file, so a path it cannot create fails there
// alone. A phase under way as it starts is in the file from its next phase on; Horovod's
// mark_cycles has no counterpart (HOROVOD_TIMELINE_MARK_CYCLES is not read either).
func (h *Horovod) StartTimeline(path string) error {
	if err := h.timelineCall("StartTimeline"); err != nil {
		return err
	}
	if path == "" {
		return errors.New("horovod: StartTimeline: the path is empty")
	}
	if h.ctl.timeline == nil {
		return nil
	}
	if err := h.ctl.timeline.startFile(path); err != nil {
		return fmt.Errorf("horovod: StartTimeline: %w", err)
	}
	return nil
}

// StopTimeline completes the file StartTimeline (or HOROVOD_TIMELINE) began on rank 0: the
// phases still under way end at this moment, and the JSON array is closed. Without a timeline
// being written it does nothing, as Horovod's hvd.stop_timeline; Shutdown completes one left open.
func (h *Horovod) StopTimeline() error {
	if err := h.timelineCall("StopTimeline"); err != nil {
		return err
	}
	if h.ctl.timeline == nil {
		return nil
	}
	t := h.ctl.timeline
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stopLocked()
}

// timelineCall refuses StartTimeline and StopTimeline on a process set (the timeline is the
// job's) and after Shutdown.
func (h *Horovod) timelineCall(what string) error {
	if h.members != nil {
		return fmt.Errorf("horovod: %s on process set %v: the timeline is the job's, started and stopped on the job's Horovod", what, h.members)
	}
	c := h.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopErr
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
