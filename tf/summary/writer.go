// Package summary writes TensorBoard event files: tensorflow.Event protocol buffers framed as
// TFRecords (package tfrecord's Writer), the format of tf.summary's FileWriter, so that
// TensorBoard and tf.compat.v1.train.summary_iterator read the training curves of a run.
package summary

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gorovod/gorovod/tf/internal/walltime"
	"github.com/gorovod/gorovod/tf/tfrecord"
)

// fileVersion is the first event of every file; TensorBoard checks it.
const fileVersion = "brain.Event:2"

// Field numbers of tensorflow.Event, Summary and Summary.Value (tensorflow/core/util/event.proto,
// tensorflow/core/framework/summary.proto).
const (
	eventWallTime    protowire.Number = 1
	eventStep        protowire.Number = 2
	eventFileVersion protowire.Number = 3
	eventSummary     protowire.Number = 5
	eventSessionLog  protowire.Number = 7
	sessionStatus    protowire.Number = 1 // SessionLog.status
	summaryValue     protowire.Number = 1
	valueTag         protowire.Number = 1
	valueSimpleValue protowire.Number = 2
)

// Writer appends events to one file. It is not safe for concurrent use.
type Writer struct {
	path string
	f    *os.File
	buf  *bufio.Writer
	rec  *tfrecord.Writer
	now  func() time.Time
	ev   []byte // reused encoding buffer
}

// Create starts a new event file in dir, named events.out.tfevents.<unix time>.<host>.<pid>.<n>
// as TensorFlow 2 names them (n counts this process's files), and writes its file_version
// event. The file is new: two writers never share one, whatever their clocks say.
func Create(dir string) (*Writer, error) {
	return create(dir, time.Now)
}

// filesCreated numbers the event files of this process.
var filesCreated atomic.Uint64

func create(dir string, now func() time.Time) (*Writer, error) {
	host, err := os.Hostname()
	if err != nil {
		host = "localhost"
	}
	var path string
	var f *os.File
	for {
		path = filepath.Join(dir, fmt.Sprintf("events.out.tfevents.%d.%s.%d.%d", now().Unix(), host, os.Getpid(), filesCreated.Add(1)))
		if f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); !errors.Is(err, fs.ErrExist) {
			break // a name left by a process of the same pid before: the next number
		}
	}
	if err != nil {
		return nil, fmt.Errorf("summary: %w", err)
	}
	buf := bufio.NewWriter(f)
	w := &Writer{path: path, f: f, buf: buf, rec: tfrecord.NewWriter(buf), now: now}
	w.ev = w.header(0)
	w.ev = protowire.AppendTag(w.ev, eventFileVersion, protowire.BytesType)
	w.ev = protowire.AppendString(w.ev, fileVersion)
	if err := w.emit(); err != nil {
		f.Close()
		return nil, err
	}
	return w, nil
}

// Path is the event file's path.
func (w *Writer) Path() string { return w.path }

func (w *Writer) header(step int64) []byte {
	b := w.ev[:0]
	b = protowire.AppendTag(b, eventWallTime, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, math.Float64bits(walltime.Seconds(w.now())))
	if step != 0 {
		b = protowire.AppendTag(b, eventStep, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(step))
	}
	return b
}

// sessionStart is SessionLog.SessionStatus START.
const sessionStart = 1

// SessionStart writes a SessionLog START event at step, as TensorFlow's summary hooks write one
// when a session starts training: TensorBoard then drops the events at step or later of the
// files before this one (those of a run killed after its last checkpoint, which the resumed run
// trains again), so that each step has one point. Write it before the run's first step.
func (w *Writer) SessionStart(step int64) error {
	var log []byte
	log = protowire.AppendTag(log, sessionStatus, protowire.VarintType)
	log = protowire.AppendVarint(log, sessionStart)
	return w.event(step, eventSessionLog, log)
}

// event writes an event at step holding payload as its field (a SessionLog, a Summary).
func (w *Writer) event(step int64, field protowire.Number, payload []byte) error {
	w.ev = w.header(step)
	w.ev = protowire.AppendTag(w.ev, field, protowire.BytesType)
	w.ev = protowire.AppendBytes(w.ev, payload)
	return w.emit()
}

// Scalars writes one event at step holding a scalar summary per tag (tags sorted, so files are
// reproducible), and flushes it to the operating system: a killed run loses no written step.
func (w *Writer) Scalars(step int64, values map[string]float64) error {
	var summary []byte
	for _, t := range slices.Sorted(maps.Keys(values)) {
		var v []byte
		v = protowire.AppendTag(v, valueTag, protowire.BytesType)
		v = protowire.AppendString(v, t)
		v = protowire.AppendTag(v, valueSimpleValue, protowire.Fixed32Type)
		v = protowire.AppendFixed32(v, math.Float32bits(float32(values[t])))
		summary = protowire.AppendTag(summary, summaryValue, protowire.BytesType)
		summary = protowire.AppendBytes(summary, v)
	}
	return w.event(step, eventSummary, summary)
}

func (w *Writer) emit() error {
	if err := w.rec.Write(w.ev); err != nil {
		return fmt.Errorf("summary: %s: %w", w.path, err)
	}
	if err := w.buf.Flush(); err != nil {
		return fmt.Errorf("summary: %s: %w", w.path, err)
	}
	return nil
}

// Close flushes the file, syncs it to stable storage and closes it, as TensorFlow's
// EventsWriter::Close does, and returns the first error of the three (naming the file): nil
// means every event written is on disk. Calls after the first do nothing and return nil, so a
// deferred Close is a harmless backstop behind the checked one.
func (w *Writer) Close() error {
	if w.f == nil {
		return nil
	}
	err := w.buf.Flush()
	if err == nil {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	w.f = nil
	if err != nil {
		return fmt.Errorf("summary: %s: %w", w.path, err)
	}
	return nil
}
