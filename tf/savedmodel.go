package tf

/*
#include <stdlib.h>
#include <tensorflow/c/c_api.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"
)

// SavedModel is a SavedModel loaded into a session: its graph, its signatures (sorted by key)
// and its SaverDef. TF2 SavedModels have their variables restored by the load; TF1 ones run
// their init/main op. Close closes the session and frees the graph; it waits for the calls in
// flight, and later calls fail with ErrClosed.
type SavedModel struct {
	Dir        string
	Tags       []string
	Session    *Session
	Graph      *Graph
	Signatures []Signature
	// SaverDef is the saver of the MetaGraphDef, nil when it has none (Save and Restore fail).
	SaverDef *SaverDef

	// resolved holds the graph Outputs of every signature's inputs and outputs.
	resolved map[string]resolvedSignature
	// gate holds the calls in flight (RunSignature, Save, Restore): they use the graph
	// before they reach the session, so closing the session alone would not be enough.
	gate gate
}

type resolvedSignature struct {
	inputs, outputs map[string]Output
}

// LoadSavedModel loads the MetaGraphDef with the given tags (usually "serve") from dir into a
// new session with the given options (nil: TensorFlow's defaults).
func LoadSavedModel(dir string, tags []string, opts *SessionOptions) (*SavedModel, error) {
	context := fmt.Sprintf("load SavedModel %s (tags %s)", dir, strings.Join(tags, ","))
	// TensorFlow's own message for these is about a protobuf, not the path we were given.
	if _, err := os.Stat(filepath.Join(dir, "saved_model.pb")); err != nil {
		if _, errTxt := os.Stat(filepath.Join(dir, "saved_model.pbtxt")); errTxt != nil {
			return nil, fmt.Errorf("%s: %w", context, err)
		}
	}
	copts, err := opts.c()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", context, err)
	}
	defer C.TF_DeleteSessionOptions(copts)

	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	ctags := make([]*C.char, len(tags))
	for i, tag := range tags {
		ctags[i] = C.CString(tag)
		defer C.free(unsafe.Pointer(ctags[i]))
	}
	meta := C.TF_NewBuffer()
	defer C.TF_DeleteBuffer(meta)
	graph := NewGraph()
	st := newStatus()
	defer st.delete()
	c := C.TF_LoadSessionFromSavedModel(copts, nil, cdir, ptr(ctags), C.int(len(ctags)), graph.c, meta, st.c)
	if err := st.err(context); err != nil {
		graph.Close()
		if hint := diagnoseSavedModel(dir, err.(*Error).Code); hint != "" {
			err.(*Error).Message += " (" + hint + ")"
		}
		return nil, err
	}
	m := &SavedModel{Dir: dir, Session: newSession(c, graph), Graph: graph}
	mg, err := parseMetaGraph(C.GoBytes(meta.data, C.int(meta.length)))
	if err == nil {
		m.Tags, m.Signatures, m.SaverDef = mg.tags, mg.signatures, mg.saver
		err = m.resolve()
	}
	if err == nil {
		err = variablesMissing(dir, m.SaverDef)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("%s: %w", context, err), m.Close())
	}
	return m, nil
}

// variablesMissing tells why a loaded SavedModel whose MetaGraphDef has a saver, so variables,
// holds none: TensorFlow's C++ loader takes a SavedModel without variables/variables.index for one
// without variables and loads it with them uninitialized (every run then fails on a variable
// read), where Python's tf.saved_model.load fails.
func variablesMissing(dir string, saver *SaverDef) error {
	if saver == nil {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, "variables", "variables.index")); err != nil {
		return fmt.Errorf("the MetaGraphDef has a SaverDef, so variables to restore, but TensorFlow restored none: %w", err)
	}
	return nil
}

// diagnoseSavedModel says what TensorFlow's load error leaves out: that saved_model.pb is not
// a SavedModel protobuf at all, that its variables file is truncated, or, when no meta graph
// matched the tags (code NOT_FOUND), which tag sets it has. It runs only after a failed load.
func diagnoseSavedModel(dir string, code Code) string {
	const savedModelMetaGraphs = 2
	pb, err := os.ReadFile(filepath.Join(dir, "saved_model.pb"))
	if err != nil {
		return ""
	}
	fs, err := fields(pb, "SavedModel")
	if err != nil {
		return "saved_model.pb is not a SavedModel protobuf: " + err.Error()
	}
	variables := filepath.Join(dir, "variables", "variables")
	if _, err := os.Stat(variables + ".index"); err == nil {
		if err := VerifyCheckpoint(variables); err != nil {
			return err.Error()
		}
	}
	if code != CodeNotFound {
		return ""
	}
	var tagSets []string
	for _, f := range fs {
		if f.num != savedModelMetaGraphs {
			continue
		}
		mg, err := parseMetaGraph(f.b)
		if err != nil {
			return "saved_model.pb has a malformed MetaGraphDef: " + err.Error()
		}
		tagSets = append(tagSets, "["+strings.Join(mg.tags, ",")+"]")
	}
	return "saved_model.pb has tag sets " + strings.Join(tagSets, " ")
}

// resolve finds the graph tensor of every signature input and output.
func (m *SavedModel) resolve() error {
	m.resolved = make(map[string]resolvedSignature)
	for _, sig := range m.Signatures {
		r := resolvedSignature{inputs: make(map[string]Output), outputs: make(map[string]Output)}
		for _, part := range []struct {
			infos []TensorInfo
			into  map[string]Output
		}{{sig.Inputs, r.inputs}, {sig.Outputs, r.outputs}} {
			for _, info := range part.infos {
				o, err := m.Graph.Output(info.Name)
				if err != nil {
					return fmt.Errorf("signature %q key %q: %w", sig.Key, info.Key, err)
				}
				part.into[info.Key] = o
			}
		}
		m.resolved[sig.Key] = r
	}
	return nil
}

// Close waits for the calls in flight, closes the session and frees the graph. Later calls
// return nil.
func (m *SavedModel) Close() error {
	if !m.gate.close() {
		return nil
	}
	err := m.Session.Close()
	m.Graph.Close()
	return err
}

// Signature returns the signature with the given key.
func (m *SavedModel) Signature(key string) (*Signature, error) {
	for i := range m.Signatures {
		if m.Signatures[i].Key == key {
			return &m.Signatures[i], nil
		}
	}
	keys := make([]string, len(m.Signatures))
	for i, s := range m.Signatures {
		keys[i] = s.Key
	}
	return nil, fmt.Errorf("tf: SavedModel %s has no signature %q (it has: %s)", m.Dir, key, strings.Join(keys, ", "))
}

// RunSignature runs signature key with the inputs given by input key, which must be exactly the
// signature's inputs, and returns the outputs named by outputKeys in that order (none named:
// every output, in the order of Signature.Outputs). The caller closes the returned tensors.
func (m *SavedModel) RunSignature(key string, inputs map[string]*Tensor, outputKeys ...string) ([]*Tensor, error) {
	if err := m.enter(); err != nil {
		return nil, err
	}
	defer m.gate.exit()
	sig, err := m.Signature(key)
	if err != nil {
		return nil, err
	}
	context := fmt.Sprintf("signature %q of %s", key, m.Dir)
	r := m.resolved[key]
	feeds := make(map[Output]*Tensor, len(inputs))
	for k, t := range inputs {
		o, ok := r.inputs[k]
		if !ok {
			return nil, fmt.Errorf("tf: %s: no input %q (inputs: %s)", context, k, infoKeys(sig.Inputs))
		}
		if err := m.Session.checkFeed(o, t); err != nil { // named by the caller's key, not only the graph's tensor
			return nil, fmt.Errorf("tf: %s: input %q: %w", context, k, err)
		}
		feeds[o] = t
	}
	for _, in := range sig.Inputs {
		if _, ok := inputs[in.Key]; !ok {
			return nil, fmt.Errorf("tf: %s: input %q not given (inputs: %s)", context, in.Key, infoKeys(sig.Inputs))
		}
	}
	if len(outputKeys) == 0 {
		for _, out := range sig.Outputs {
			outputKeys = append(outputKeys, out.Key)
		}
	}
	fetches := make([]Output, len(outputKeys))
	for i, k := range outputKeys {
		o, ok := r.outputs[k]
		if !ok {
			return nil, fmt.Errorf("tf: %s: no output %q (outputs: %s)", context, k, infoKeys(sig.Outputs))
		}
		fetches[i] = o
	}
	return m.Session.run(feeds, fetches, nil, context)
}

// Save writes the variables to the checkpoint prefix (files prefix.index and prefix.data-*)
// through the SaverDef, and returns the prefix TensorFlow reports having written.
func (m *SavedModel) Save(prefix string) (string, error) {
	if err := m.enter(); err != nil {
		return "", err
	}
	defer m.gate.exit()
	context := fmt.Sprintf("save %s to checkpoint %s", m.Dir, prefix)
	feeds, err := m.saverFeed(prefix, context)
	if err != nil {
		return "", err
	}
	for _, t := range feeds {
		defer t.Close()
	}
	save, err := m.Graph.Output(m.SaverDef.SaveTensor)
	if err != nil {
		return "", fmt.Errorf("tf: %s: SaverDef save tensor: %w", context, err)
	}
	out, err := m.Session.run(feeds, []Output{save}, nil, context)
	if err != nil {
		return "", err
	}
	defer out[0].Close()
	if out[0].DataType() != String || out[0].NumElements() != 1 {
		return prefix, nil
	}
	written, err := out[0].Strings()
	if err != nil {
		return "", err
	}
	return written[0], nil
}

// Restore reads the variables from the checkpoint prefix through the SaverDef.
func (m *SavedModel) Restore(prefix string) error {
	if err := m.enter(); err != nil {
		return err
	}
	defer m.gate.exit()
	context := fmt.Sprintf("restore %s from checkpoint %s", m.Dir, prefix)
	feeds, err := m.saverFeed(prefix, context)
	if err != nil {
		return err
	}
	for _, t := range feeds {
		defer t.Close()
	}
	name, _, _ := strings.Cut(m.SaverDef.RestoreOp, ":")
	op := m.Graph.Operation(name)
	if op == nil {
		return fmt.Errorf("tf: %s: SaverDef restore op %q is not in the graph", context, m.SaverDef.RestoreOp)
	}
	_, err = m.Session.run(feeds, nil, []*Operation{op}, context)
	return err
}

// enter registers a call in flight, which must call m.gate.exit; it fails once Close has started.
func (m *SavedModel) enter() error {
	if !m.gate.enter() {
		return errClosed("SavedModel " + m.Dir)
	}
	return nil
}

func (m *SavedModel) saverFeed(prefix, context string) (map[Output]*Tensor, error) {
	if m.SaverDef == nil {
		return nil, fmt.Errorf("tf: %s: the MetaGraphDef has no SaverDef", context)
	}
	filename, err := m.Graph.Output(m.SaverDef.FilenameTensor)
	if err != nil {
		return nil, fmt.Errorf("tf: %s: SaverDef filename tensor: %w", context, err)
	}
	t, err := NewStringTensor([]string{prefix})
	if err != nil {
		return nil, err
	}
	return map[Output]*Tensor{filename: t}, nil
}
