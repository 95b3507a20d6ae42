package features

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// Labels maps label texts to ids: the id of a label is its index in the list.
type Labels struct {
	names []string
	ids   map[string]int32
}

// NewLabels returns the label map of names in order (run_classifier's label_list); names must be
// non-empty and distinct.
func NewLabels(names []string) (*Labels, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("features: empty label list")
	}
	l := &Labels{names: slices.Clone(names), ids: make(map[string]int32, len(names))}
	for i, n := range l.names {
		if n == "" {
			return nil, fmt.Errorf("features: label %d is empty", i)
		}
		if _, dup := l.ids[n]; dup {
			return nil, fmt.Errorf("features: label %q appears twice in the label list", n)
		}
		l.ids[n] = int32(i)
	}
	return l, nil
}

// SortedLabels returns the label map of the distinct names, sorted numerically when every name
// is an integer ("2" before "10") and as strings otherwise.
func SortedLabels(names []string) (*Labels, error) {
	set := slices.Clone(names)
	slices.Sort(set)
	set = slices.Compact(set)
	numeric := true
	for _, n := range set {
		if _, err := strconv.ParseInt(n, 10, 64); err != nil {
			numeric = false
			break
		}
	}
	if numeric {
		slices.SortFunc(set, func(a, b string) int {
			x, _ := strconv.ParseInt(a, 10, 64)
			y, _ := strconv.ParseInt(b, 10, 64)
			return cmp.Compare(x, y)
		})
	}
	return NewLabels(set)
}

// LabelsFromFile reads every data line of a training file (all ranks' lines, whatever
// opts.Rank and opts.Size say) and returns the sorted set of its labels, as SortedLabels.
// Bad lines are errors, or skipped with opts.SkipBad.
func LabelsFromFile(path string, opts ReadOptions) (*Labels, error) {
	opts.Rank, opts.Size, opts.Labels = 0, 1, nil
	r, err := Open(path, opts)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var names []string
	seen := map[string]bool{}
	for {
		ex, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if ex.Label != "" && !seen[ex.Label] {
			seen[ex.Label] = true
			names = append(names, ex.Label)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("features: %s: no labelled examples to take the label list from", path)
	}
	return SortedLabels(names)
}

// Names returns the labels in id order.
func (l *Labels) Names() []string { return slices.Clone(l.names) }

// Len is the number of labels.
func (l *Labels) Len() int { return len(l.names) }

// ID returns the id of label.
func (l *Labels) ID(label string) (int32, bool) {
	id, ok := l.ids[label]
	return id, ok
}
