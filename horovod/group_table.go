package horovod

import (
	"fmt"
	"strings"
)

// groupTable answers, for one negotiation round, whether the groups in the message table
// (GroupedAllreduce, GroupedAllgather, GroupedReducescatter) are complete (Horovod's
// GroupTable): a group moves as a whole once every rank that has
// not joined has announced as many members as it put in the group, and fails as a whole when
// the ranks put different tensors in it (or different numbers of them).
type groupTable struct {
	t      *messageTable
	counts map[string][]int  // group -> members announced, by rank
	sizes  map[string][]int  // group -> members the rank put in it, by rank (0: none announced)
	errs   map[string]string // group -> checked: "" when consistent, else why not
}

func newGroupTable(t *messageTable) *groupTable {
	g := &groupTable{t: t, counts: map[string][]int{}, sizes: map[string][]int{}, errs: map[string]string{}}
	for _, name := range t.order {
		for r, s := range t.entries[name].specs {
			if s != nil && s.group != "" {
				if g.counts[s.group] == nil {
					g.counts[s.group], g.sizes[s.group] = make([]int, t.size), make([]int, t.size)
				}
				g.counts[s.group][r]++
				g.sizes[s.group][r] = s.groupSize
			}
		}
	}
	return g
}

// complete reports whether every rank that has not joined has announced every member it put in
// group.
func (g *groupTable) complete(group string) bool {
	sizes := g.sizes[group]
	for r, n := range g.counts[group] {
		if !g.t.joined(r) && (n == 0 || n != sizes[r]) {
			return false
		}
	}
	return true
}

// mismatch returns "" when every rank put the same tensors in group, and otherwise a
// description of each rank's members. It checks a group once per round.
func (g *groupTable) mismatch(group string) string {
	if why, ok := g.errs[group]; ok {
		return why
	}
	members := make([][]string, g.t.size)
	consistent := true
	for _, name := range g.t.order {
		e := g.t.entries[name]
		for r, s := range e.specs {
			if s != nil && s.group == group {
				members[r] = append(members[r], name)
			} else if s == nil && !g.t.joined(r) {
				consistent = consistent && !inGroup(e, group)
			}
		}
	}
	why := ""
	if !consistent {
		var parts []string
		for r, m := range members {
			if !g.t.joined(r) {
				parts = append(parts, fmt.Sprintf("rank %d: %v", r, m))
			}
		}
		why = fmt.Sprintf("ranks grouped different tensors in %s: %s", group, strings.Join(parts, "; "))
	}
	g.errs[group] = why
	return why
}

func inGroup(e *entry, group string) bool {
	for _, s := range e.specs {
		if s != nil && s.group == group {
			return true
		}
	}
	return false
}
