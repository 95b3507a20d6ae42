package backend

import (
	"fmt"
	"slices"
	"sync"
)

// Driver opens the control backend that joins this process to the job a launcher started (MPI
// under mpirun or srun). Drivers register under a name in their package's init, as database/sql
// drivers do, so that package horovod links no engine of its own: a program that runs under a
// launcher imports the driver for its side effect,
//
//	import _ "github.com/gorovod/gorovod/horovod/mpi"
//
// and horovod.Init opens it by name when the launcher started more than one process.
type Driver func(cfg DriverConfig) (Backend, error)

// DriverConfig is the part of horovod's configuration that a Driver opens with.
type DriverConfig struct {
	Wait Wait // how a rank early in a negotiation round waits for its peers
	// ProcessSets asks for a backend that can be split into process sets (Splitter) whose
	// backends run concurrently with it (HOROVOD_DYNAMIC_PROCESS_SETS): MPI then initializes
	// with MPI_THREAD_MULTIPLE instead of MPI_THREAD_SERIALIZED.
	ProcessSets bool
}

// Wait is how a rank that reaches a negotiation round (a small allgather) before its peers waits
// for them (GOROVOD_MPI_WAIT). The zero value is the default, WaitSleep.
type Wait uint8

const (
	// WaitSleep tests the collective without pause for a moment, then sleeps between tests,
	// leaving the core to the peers' computation.
	WaitSleep Wait = iota
	// WaitSpin is the engine's blocking call, which polls until the last peer arrives (for
	// dedicated cores).
	WaitSpin
)

func (w Wait) String() string {
	switch w {
	case WaitSleep:
		return "sleep"
	case WaitSpin:
		return "spin"
	}
	return fmt.Sprintf("Wait(%d)", uint8(w))
}

var (
	driversMu sync.RWMutex
	drivers   = map[string]Driver{}
)

// Register makes a driver available under name. It panics when name is registered twice or d is
// nil: both are programming errors found at start-up.
func Register(name string, d Driver) {
	driversMu.Lock()
	defer driversMu.Unlock()
	if d == nil {
		panic("backend: Register driver " + name + " is nil")
	}
	if _, dup := drivers[name]; dup {
		panic("backend: Register called twice for driver " + name)
	}
	drivers[name] = d
}

// Lookup returns the driver registered under name.
func Lookup(name string) (Driver, bool) {
	driversMu.RLock()
	defer driversMu.RUnlock()
	d, ok := drivers[name]
	return d, ok
}

// Drivers lists the names of the registered drivers, sorted.
func Drivers() []string {
	driversMu.RLock()
	defer driversMu.RUnlock()
	names := make([]string, 0, len(drivers))
	for name := range drivers {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
