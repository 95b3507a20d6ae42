package horovod

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
)

// SetupError is Init failing because some ranks could not set up (open the data backend, create
// the timeline). Every rank of the job returns one, the ready ranks included, naming the ranks
// that failed and each one's cause, so that no rank is left waiting for the others and each
// rank's log says what went wrong where. It unwraps to this rank's own cause, if it had one.
type SetupError struct {
	Rank   int      // the rank returning the error
	Failed []int    // the ranks that failed, ascending
	Causes []string // Causes[i] is the error text of rank Failed[i]
	local  error
}

func (e *SetupError) Error() string {
	causes := make([]string, len(e.Failed))
	for i, r := range e.Failed {
		causes[i] = fmt.Sprintf("rank %d: %s", r, e.Causes[i])
	}
	return fmt.Sprintf("horovod: rank %d: Init failed on ranks %v: %s", e.Rank, e.Failed, strings.Join(causes, "; "))
}

func (e *SetupError) Unwrap() error { return e.local }

// agreeOnSetup tells every rank which ranks failed their local setup and why, over control: an
// allgather of each rank's error length and settings and, when an error length is not zero, one
// of the error texts. It returns nil on every rank when no rank failed, and a *SetupError on
// every rank otherwise.
//
// The sequence settings decide which collectives a rank calls for the operations negotiation
// agreed on: which responses fuse into one call (FusionThreshold) and which signatures the
// response cache keeps (CacheCapacity). Ranks that differ there (an environment set per
// machine) would call different collectives: a wrong result, a truncation or a hang. As
// Horovod's coordinator decides the fusion for all, every rank takes rank 0's values into s;
// so too the stall times (StallCheck, StallShutdown, as Init settled them), since Horovod's
// coordinator alone checks for stalls: one rank's shorter shutdown time would otherwise abort
// the job alone. adopted says, for this rank's log, each one it had set otherwise. A rank whose
// process sets for Init (initSets) differ from rank 0's fails, as a rank failing its setup does.
func agreeOnSetup(control backend.Backend, topo backend.Topology, localErr error, s *Settings, initSets [][]int) (adopted []string, err error) {
	var text []byte
	if localErr != nil {
		if text = []byte(localErr.Error()); len(text) == 0 {
			text = fmt.Appendf(nil, "%T with an empty message", localErr) // a zero length means ready
		}
	}
	fail := func(step string, err error) error {
		return errors.Join(fmt.Errorf("horovod: rank %d: agreeing on Init with the other ranks (%s): %w", topo.Rank, step, err), localErr)
	}
	// error length, fusion threshold, cache capacity, stall check and shutdown times, dynamic
	// process sets, a digest of the process sets given to Init
	const record = 4 + 6*8
	sets := uint64(0)
	if s.DynamicProcessSets {
		sets = 1
	}
	mine := binary.LittleEndian.AppendUint32(nil, uint32(len(text)))
	for _, v := range []uint64{uint64(s.FusionThreshold), uint64(s.CacheCapacity), uint64(s.StallCheck), uint64(s.StallShutdown), sets, setsDigest(initSets)} {
		mine = binary.LittleEndian.AppendUint64(mine, v)
	}
	records := make([]byte, record*topo.Size)
	if err := backend.ControlAllgatherv(control, mine, records, slices.Repeat([]int{record}, topo.Size)); err != nil {
		return nil, fail("error lengths and settings", err)
	}
	rank0 := func(at int) uint64 { return binary.LittleEndian.Uint64(records[at:]) }
	const fuseAlike, stallAlike = "as every rank must fuse and cache alike", "as Horovod's rank 0 checks for stalls for all"
	adopted = takeRankZeros(adopted, envFusionThreshold, &s.FusionThreshold, rank0(4), fuseAlike)
	adopted = takeRankZeros(adopted, envCacheCapacity, &s.CacheCapacity, rank0(12), fuseAlike)
	adopted = takeRankZeros(adopted, envStallCheckTime, &s.StallCheck, rank0(20), stallAlike)
	adopted = takeRankZeros(adopted, envStallShutdownTime, &s.StallShutdown, rank0(28), stallAlike)
	// Process sets need every rank's backend opened for them (MPI's thread level is chosen as it
	// initializes, before this agreement): they are on where every rank has them on.
	var without []string
	for r := range topo.Size {
		if binary.LittleEndian.Uint64(records[record*r+36:]) == 0 {
			without = append(without, strconv.Itoa(r))
		}
	}
	if s.DynamicProcessSets && without != nil {
		adopted = append(adopted, fmt.Sprintf("%s is on on this rank, off on rank(s) %s: process sets are off, as they need every rank", envDynamicProcessSets, strings.Join(without, ",")))
		s.DynamicProcessSets = false
	}
	// Init adds its process sets as negotiated operations: a rank with other sets, or none, would
	// leave the others waiting in theirs. Every rank sees the same digests, and fails alike.
	differs := make([]bool, topo.Size)
	anyDiffers := false
	for r := range differs {
		differs[r] = binary.LittleEndian.Uint64(records[record*r+44:]) != binary.LittleEndian.Uint64(records[44:])
		anyDiffers = anyDiffers || differs[r]
	}
	counts := make([]int, topo.Size)
	total := 0
	for r := range counts {
		counts[r] = int(binary.LittleEndian.Uint32(records[record*r:]))
		total += counts[r]
	}
	if total == 0 && !anyDiffers {
		return adopted, nil
	}
	texts := make([]byte, total)
	if total > 0 {
		if err := backend.ControlAllgatherv(control, text, texts, counts); err != nil {
			return nil, fail("error texts", err)
		}
	}
	e := &SetupError{Rank: topo.Rank, local: localErr}
	for r, n := range counts {
		var causes []string
		if n > 0 {
			causes = append(causes, string(texts[:n]))
		}
		if differs[r] {
			causes = append(causes, "its process sets given to Init (WithProcessSets) differ from rank 0's")
		}
		if causes != nil {
			e.Failed = append(e.Failed, r)
			e.Causes = append(e.Causes, strings.Join(causes, "; "))
		}
		texts = texts[n:]
	}
	return nil, e
}

// setsDigest is a digest of the process sets given to Init, in order; 0 for none.
func setsDigest(sets [][]int) uint64 {
	if len(sets) == 0 {
		return 0
	}
	d := fnv.New64a()
	for _, ranks := range sets {
		d.Write(appendInts(nil, ranks))
	}
	return d.Sum64() | 1
}

// takeRankZeros sets *mine, the setting of variable name, to rank 0's value rank0, and appends to
// adopted a line saying so when this rank's own differs; why ends the line.
func takeRankZeros[T int | time.Duration](adopted []string, name string, mine *T, rank0 uint64, why string) []string {
	if v := T(rank0); v != *mine {
		adopted = append(adopted, fmt.Sprintf("%s is %v on this rank, %v on rank 0: using rank 0's, %s", name, *mine, v, why))
		*mine = v
	}
	return adopted
}
