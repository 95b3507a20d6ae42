package tf

/*
#include <stdlib.h>
#include <tensorflow/c/c_api.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
)

// Session runs a Graph. Run is safe for concurrent use; Close waits for the runs in flight.
// A cleanup closes a session that is garbage collected without Close.
type Session struct {
	c       *C.TF_Session
	graph   *Graph
	gate    gate // runs in flight; Close shuts it before freeing c
	cleanup runtime.Cleanup
}

// NewSession starts a session on g with the given options (nil: TensorFlow's defaults).
func NewSession(g *Graph, opts *SessionOptions) (*Session, error) {
	copts, err := opts.c()
	if err != nil {
		return nil, err
	}
	defer C.TF_DeleteSessionOptions(copts)
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.c == nil {
		return nil, errClosed("graph")
	}
	st := newStatus()
	defer st.delete()
	c := C.TF_NewSession(g.c, copts, st.c)
	if err := st.err("new session"); err != nil {
		return nil, err
	}
	return newSession(c, g), nil
}

func newSession(c *C.TF_Session, g *Graph) *Session {
	s := &Session{c: c, graph: g}
	s.cleanup = runtime.AddCleanup(s, deleteSession, c)
	return s
}

// deleteSession is the cleanup of a session never closed; no run can be in flight then.
func deleteSession(c *C.TF_Session) {
	st := newStatus()
	defer st.delete()
	C.TF_CloseSession(c, st.c)
	C.TF_DeleteSession(c, st.c)
}

// Graph is the graph the session runs.
func (s *Session) Graph() *Graph { return s.graph }

// enter registers a run in flight, which must call s.gate.exit; it fails once Close has started.
func (s *Session) enter() error {
	if !s.gate.enter() {
		return errClosed("session")
	}
	return nil
}

// Close waits for the runs in flight, then closes and frees the session. Later calls return nil.
func (s *Session) Close() error {
	if !s.gate.close() {
		return nil
	}
	s.cleanup.Stop()
	st := newStatus()
	defer st.delete()
	C.TF_CloseSession(s.c, st.c)
	errClose := st.err("close session")
	C.TF_DeleteSession(s.c, st.c)
	return errors.Join(errClose, st.err("delete session"))
}

// Run feeds the given tensors, computes fetches and runs targets (operations run for their
// effect), and returns the fetched tensors in the order of fetches; the caller closes them.
// Feeds are checked against the graph's dtype and static shape first, so a wrong feed is an
// error naming the tensor rather than a silently wrong result.
func (s *Session) Run(feeds map[Output]*Tensor, fetches []Output, targets []*Operation) ([]*Tensor, error) {
	return s.run(feeds, fetches, targets, "")
}

// run is Run with the caller's context (e.g. the signature) for errors.
func (s *Session) run(feeds map[Output]*Tensor, fetches []Output, targets []*Operation, context string) ([]*Tensor, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.gate.exit()

	inputs := make([]C.TF_Output, 0, len(feeds))
	values := make([]*C.TF_Tensor, 0, len(feeds))
	for o, t := range feeds {
		if err := s.checkFeed(o, t); err != nil {
			return nil, withContext(context, err)
		}
		inputs = append(inputs, o.c())
		values = append(values, t.c)
	}
	outputs := make([]C.TF_Output, len(fetches))
	for i, o := range fetches {
		if err := s.checkOutput(o); err != nil {
			return nil, withContext(context, err)
		}
		outputs[i] = o.c()
	}
	results := make([]*C.TF_Tensor, len(fetches))
	ops := make([]*C.TF_Operation, len(targets))
	for i, op := range targets {
		if op == nil {
			return nil, withContext(context, fmt.Errorf("tf: target %d is a nil operation", i))
		}
		if op.g != s.graph {
			return nil, withContext(context, fmt.Errorf("tf: target %s is an operation of another graph than the session's", op.Name()))
		}
		ops[i] = op.c
	}

	st := newStatus()
	defer st.delete()
	C.TF_SessionRun(s.c, nil,
		ptr(inputs), ptr(values), C.int(len(inputs)),
		ptr(outputs), ptr(results), C.int(len(outputs)),
		ptr(ops), C.int(len(ops)), nil, st.c)
	// The feeds (and the graph behind the outputs) must outlive the C call: their cleanups free them.
	runtime.KeepAlive(feeds)
	runtime.KeepAlive(s.graph)
	if !st.ok() { // the context string is built only for errors: Run is on the hot path
		return nil, st.err(runContext(context, fetches, targets))
	}
	out := make([]*Tensor, len(results))
	for i, c := range results {
		out[i] = adopt(c)
	}
	return out, nil
}

func ptr[T any](s []T) *T {
	if len(s) == 0 {
		return nil
	}
	return &s[0]
}

func withContext(context string, err error) error {
	if context == "" {
		return err
	}
	return fmt.Errorf("%s: %w", context, err)
}

func runContext(context string, fetches []Output, targets []*Operation) string {
	if context != "" {
		return context
	}
	names := make([]string, 0, len(fetches)+len(targets))
	for _, o := range fetches {
		names = append(names, o.Name())
	}
	for _, op := range targets {
		names = append(names, "^"+op.Name())
	}
	return "run " + strings.Join(names, ", ")
}

// checkOutput tells why o cannot be fed or fetched in s. TensorFlow would read out of bounds
// on a bad index, and would look an output of another graph up by name in the session's.
func (s *Session) checkOutput(o Output) error {
	if err := o.check(); err != nil {
		return err
	}
	if o.Op.g != s.graph {
		return fmt.Errorf("tf: output %s is of another graph than the session's", o.Name())
	}
	return nil
}

// checkFeed tells whether t fits the static type (a reference's base type) and shape of the
// tensor it replaces.
func (s *Session) checkFeed(o Output, t *Tensor) error {
	if err := s.checkOutput(o); err != nil {
		return err
	}
	if t == nil || t.c == nil {
		return fmt.Errorf("tf: feed %s: nil or closed tensor", o.Name())
	}
	if want := o.DataType().base(); t.dtype != want {
		return fmt.Errorf("tf: feed %s: got %s%s, the graph wants %s", o.Name(), t.dtype, shapeString(t.shape), want)
	}
	dims, known, err := o.Shape()
	if err != nil || !known {
		return err
	}
	if len(dims) != len(t.shape) {
		return fmt.Errorf("tf: feed %s: got shape %s, the graph wants %s", o.Name(), shapeString(t.shape), shapeString(dims))
	}
	for i, d := range dims {
		if d >= 0 && d != t.shape[i] {
			return fmt.Errorf("tf: feed %s: got shape %s, the graph wants %s", o.Name(), shapeString(t.shape), shapeString(dims))
		}
	}
	return nil
}

// Device is one device a session can place operations on.
type Device struct {
	Name        string // e.g. "/job:localhost/replica:0/task:0/device:CPU:0"
	Type        string // "CPU", "GPU"
	MemoryBytes int64
}

// ListDevices lists the session's devices.
func (s *Session) ListDevices() ([]Device, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.gate.exit()
	st := newStatus()
	defer st.delete()
	list := C.TF_SessionListDevices(s.c, st.c)
	if err := st.err("list devices"); err != nil {
		return nil, err
	}
	defer C.TF_DeleteDeviceList(list)
	n := int(C.TF_DeviceListCount(list))
	devices := make([]Device, n)
	for i := range n {
		d := &devices[i]
		d.Name = C.GoString(C.TF_DeviceListName(list, C.int(i), st.c))
		d.Type = C.GoString(C.TF_DeviceListType(list, C.int(i), st.c))
		d.MemoryBytes = int64(C.TF_DeviceListMemoryBytes(list, C.int(i), st.c))
		if err := st.err(fmt.Sprintf("device %d", i)); err != nil {
			return nil, err
		}
	}
	return devices, nil
}
