package horovod

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gorovod/gorovod/horovod/backend"
)

// sharedPathRank is a loopback rank whose broadcasts and allgathers report the shared-memory
// path, as the MPI backend's do on one machine (backend.PathReporter), and whose allreduces
// report none.
type sharedPathRank struct{ loopRank }

func (sharedPathRank) AllreducePath() string     { return "" }
func (sharedPathRank) BroadcastPath() string     { return "SHM" }
func (sharedPathRank) AllgatherPath() string     { return "SHM" }
func (sharedPathRank) ReduceScatterPath() string { return "SHM" }

var _ backend.PathReporter = sharedPathRank{}

// A broadcast, alone or fused (BroadcastVariables), and an allgather name their wire phase after
// the path the backend says they took, SHM_BCAST and SHM_ALLGATHER; an allreduce the backend
// reports no path for keeps the backend's name.
func TestTimelineNamesTheBroadcastPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeline.json")
	g := newLoopback(2)
	hs, errs := initRanks(g, func(r int) []Option {
		return []Option{WithBackend(sharedPathRank{loopRank{g, r}}), WithTimeline(path)}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	onEveryRank(t, hs, func(h *Horovod) error {
		x := mustTensor(t, []int{2}, []float32{1, 2})
		if _, err := h.Broadcast("single", x, 1); err != nil {
			return err
		}
		vars := []NamedTensor{{"fused/a", mustTensor(t, []int{2}, []float32{1, 2})}, {"fused/b", mustTensor(t, []int{1}, []float32{3})}}
		if err := h.BroadcastVariables(vars, 0); err != nil {
			return err
		}
		if _, err := h.Allgather("gather", x); err != nil {
			return err
		}
		_, err := h.Allreduce("sum", x, AllreduceOptions{})
		return err
	})
	rows := map[int]string{}
	phases := map[string][]string{}
	for _, e := range shutdownAndReadTimeline(t, hs, path) {
		switch e.Ph {
		case "M":
			rows[e.PID] = e.Args["name"]
		case "B":
			phases[rows[e.PID]] = append(phases[rows[e.PID]], e.Name)
		}
	}
	for name, want := range map[string]string{"single": "SHM_BCAST", "broadcast/fused/a": "SHM_BCAST", "broadcast/fused/b": "SHM_BCAST", "gather": "SHM_ALLGATHER", "sum": "LOOPBACK_ALLREDUCE"} {
		if !slices.Contains(phases[name], want) || slices.Contains(phases[name], "LOOPBACK_BCAST") || slices.Contains(phases[name], "LOOPBACK_ALLGATHER") {
			t.Errorf("%s: phases %v, want %s among them (and no LOOPBACK_BCAST or LOOPBACK_ALLGATHER)", name, phases[name], want)
		}
	}
}
