package tf

import (
	"errors"
	"fmt"
	"sync"
)

// ErrClosed is wrapped by the errors of calls on a closed Session, Graph or SavedModel (test
// with errors.Is).
var ErrClosed = errors.New("closed")

func errClosed(what string) error { return fmt.Errorf("tf: %s is %w", what, ErrClosed) }

// gate admits calls until close, which waits for the calls in flight, so freeing C memory
// after close cannot pull it from under a call. The zero gate is open.
type gate struct {
	mu       sync.Mutex
	idle     sync.Cond // broadcast when the last call in flight leaves a closed gate
	closed   bool
	inFlight int
}

// enter admits a call, which must exit; it returns false once close has started.
func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.inFlight++
	return true
}

func (g *gate) exit() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inFlight--
	if g.closed && g.inFlight == 0 {
		g.idle.Broadcast()
	}
}

// running is the number of calls in flight.
func (g *gate) running() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight
}

// close shuts the gate and waits for the calls in flight; it returns false when the gate was
// already closed, so only the first caller frees what the gate guards.
func (g *gate) close() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.closed = true
	g.idle.L = &g.mu
	for g.inFlight > 0 {
		g.idle.Wait()
	}
	return true
}
