package horovod

import (
	"bytes"
	"encoding/gob"
	"fmt"
	"slices"
)

// BroadcastObject returns root's v on every rank (Horovod's broadcast_object): v is encoded
// with encoding/gob on root, which stands for Horovod's pickle, and its length and then its
// bytes are broadcast in place with BroadcastVariables, as name + "/length" and name + "/bytes"
// (so the operations are "broadcast/" + name + "/length" and so on); every other rank decodes
// them into a new T. So v may be anything gob encodes (structs' exported fields, maps, slices;
// an interface value's concrete type registered with gob.Register), a training state or a
// configuration, say; the values other ranks pass are ignored. A root that cannot encode v
// returns gob's error and the others an error naming root, rather than wait for bytes that
// never come.
func BroadcastObject[T any](h *Horovod, name string, v T, root int) (T, error) {
	var zero T
	if name == "" {
		return zero, &Error{Op: "broadcast_object", Reason: "every operation needs a name, the same on every rank"}
	}
	if root < 0 || root >= h.Size() {
		return zero, &Error{Op: "broadcast_object", Tensor: name, Reason: fmt.Sprintf("root rank %d outside 0..%d", root, h.Size()-1)}
	}
	var encoded []byte
	var encodeErr error
	length := []int64{0}
	if h.Rank() == root {
		if encoded, encodeErr = encodeObject(v); encodeErr != nil {
			length[0] = -1
		} else {
			length[0] = int64(len(encoded))
		}
	}
	n, err := NewTensor([]int{1}, length)
	if err != nil {
		return zero, err
	}
	if err := h.BroadcastVariables([]NamedTensor{{Name: name + "/length", Tensor: n}}, root); err != nil {
		return zero, err
	}
	switch {
	case encodeErr != nil:
		return zero, &Error{Op: "broadcast_object", Tensor: name, Reason: fmt.Sprintf("encoding this rank's %T with gob: %v", v, encodeErr)}
	case length[0] < 0:
		return zero, &Error{Op: "broadcast_object", Tensor: name, Reason: fmt.Sprintf("root rank %d could not encode its object (its error says why)", root)}
	}
	if h.Rank() != root {
		encoded = make([]byte, length[0])
	}
	b := Tensor{DType: Uint8, Shape: []int{len(encoded)}, Data: encoded}
	if err := h.BroadcastVariables([]NamedTensor{{Name: name + "/bytes", Tensor: b}}, root); err != nil {
		return zero, err
	}
	// Root decodes its own bytes too: every rank gets a copy that shares no memory with the
	// caller's v, and what gob leaves out of a T (unexported fields) reads alike everywhere.
	return decodeObject[T]("broadcast_object", name, root, encoded)
}

// AllgatherObject returns every rank's v, in rank order (Horovod's allgather_object): each rank
// encodes its v with encoding/gob, the lengths and then the bytes are allgathered under
// name + "/length" and name + "/bytes", and every rank decodes each into a new T. v may be
// anything gob encodes, as for BroadcastObject. A rank that cannot encode its v returns gob's
// error and the others an error naming it.
func AllgatherObject[T any](h *Horovod, name string, v T) ([]T, error) {
	if name == "" {
		return nil, &Error{Op: "allgather_object", Reason: "every operation needs a name, the same on every rank"}
	}
	encoded, encodeErr := encodeObject(v)
	length := []int64{int64(len(encoded))}
	if encodeErr != nil {
		length[0], encoded = -1, nil
	}
	n, err := NewTensor([]int{1}, length)
	if err != nil {
		return nil, err
	}
	lengthsT, err := h.Allgather(name+"/length", n)
	if err != nil {
		return nil, err
	}
	lengths, err := Values[int64](lengthsT)
	if err != nil {
		return nil, err
	}
	lengths = slices.Clone(lengths)
	if err := h.Release(lengthsT); err != nil {
		return nil, err
	}
	if encodeErr != nil {
		return nil, &Error{Op: "allgather_object", Tensor: name, Reason: fmt.Sprintf("encoding this rank's %T with gob: %v", v, encodeErr)}
	}
	for r, l := range lengths {
		if l < 0 {
			return nil, &Error{Op: "allgather_object", Tensor: name, Reason: fmt.Sprintf("rank %d could not encode its object (its error says why)", r)}
		}
	}
	all, err := h.Allgather(name+"/bytes", Tensor{DType: Uint8, Shape: []int{len(encoded)}, Data: encoded})
	if err != nil {
		return nil, err
	}
	out := make([]T, len(lengths))
	at := 0
	for r, l := range lengths {
		if out[r], err = decodeObject[T]("allgather_object", name, r, all.Data[at:at+int(l)]); err != nil {
			break
		}
		at += int(l)
	}
	if rerr := h.Release(all); err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

func encodeObject(v any) ([]byte, error) {
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decodeObject decodes rank from's encoded object into a new T, for the operation op.
func decodeObject[T any](op, name string, from int, encoded []byte) (T, error) {
	var v T
	if err := gob.NewDecoder(bytes.NewReader(encoded)).Decode(&v); err != nil {
		var zero T
		return zero, &Error{Op: op, Tensor: name, Reason: fmt.Sprintf("decoding rank %d's object as %T with gob: %v", from, v, err)}
	}
	return v, nil
}
