package bertgraph

import (
	"fmt"

	"github.com/gorovod/gorovod/tf"
)

// ReadVariables copies every model variable's value into dst (see NewFlatTensors).
func (m *Model) ReadVariables(dst *FlatTensors) error {
	if err := dst.check(m.contract.Variables); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sigs[SigReadVariables]
	out, err := s.run(m.sm.Session, s.feeds, m.readFetches)
	if err != nil {
		return err
	}
	defer closeAll(out)
	for i, v := range m.contract.Variables {
		if err := copyOut(out[i], dst.Parts[i]); err != nil {
			return fmt.Errorf("bertgraph: value of %s: %w", v.Name, err)
		}
	}
	return nil
}

// AssignVariables sets every model variable from values (for the broadcast of rank 0's
// initial weights, and for initialisation from a checkpoint). Optimizer slots and the global
// step are left as they are.
func (m *Model) AssignVariables(values *FlatTensors) error {
	if err := values.check(m.contract.Variables); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sigs[SigAssignVariables]
	feeds := make([]*tf.Tensor, 0, len(m.contract.Variables))
	defer func() { closeAll(feeds) }()
	for i, v := range m.contract.Variables {
		t, err := tf.NewTensor(values.Parts[i], v.Shape...)
		if err != nil {
			return fmt.Errorf("bertgraph: value of %s: %w", v.Name, err)
		}
		feeds = append(feeds, t)
		s.feed(v.ValueKey, t)
	}
	out, err := s.run(m.sm.Session, s.feeds, s.fetches("num_assigned"))
	if err != nil {
		return err
	}
	defer closeAll(out)
	n, err := scalarValue[int32](out[0], "assign_variables num_assigned")
	if err == nil && int(n) != len(m.contract.Variables) {
		err = fmt.Errorf("bertgraph: assign_variables assigned %d of %d variables", n, len(m.contract.Variables))
	}
	return err
}

// GlobalStep is the number of updates applied so far.
func (m *Model) GlobalStep() (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sigs[SigReadVariables]
	out, err := s.run(m.sm.Session, s.feeds, s.fetches("global_step"))
	if err != nil {
		return 0, err
	}
	defer closeAll(out)
	return scalarValue[int64](out[0], "global_step")
}
