package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/sim/fault"
)

// Fault, Mode and Held are the fault vocabulary (package fault), named here
// too so that callers of the simulator need only this package.
type (
	Fault = fault.Fault
	Mode  = fault.Mode
	Held  = fault.Held
)

// Fault modes.
const (
	ModeFail  = fault.Fail
	ModeDelay = fault.Delay
	ModeHold  = fault.Hold
)

// ErrInjected is the error of a step that a FAIL fault failed, so that tests
// and logs can tell an injected failure from a real one.
var ErrInjected = errors.New("injected failure")

// ErrStopping is the error of a step that was held when the server began to
// stop (StopHolding): it did nothing.
var ErrStopping = errors.New("server stopping: held step not run")

// holding is one blocked step; closing release lets it go on.
type holding struct {
	fault.Held
	release chan struct{}
}

// injector keeps the faults and the steps they hold. Faults are in memory
// and per process (SPEC §6): they are a test and demo device, not state.
type injector struct {
	mu     sync.Mutex
	lastID int
	faults []Fault    // oldest first; Count is what is left to fire
	held   []*holding // oldest first
	// changed is closed, and replaced, whenever held changes, so that
	// WaitHeld wakes without polling.
	changed chan struct{}
	// stopping is closed by StopHolding.
	stopping chan struct{}
}

func newInjector() *injector {
	return &injector{changed: make(chan struct{}), stopping: make(chan struct{})}
}

// StopHolding is part of a graceful stop: every step held now returns
// ErrStopping without doing anything, and HOLD faults hold no step from now
// on (a failed operation repairing on its way out runs through; the jobs'
// own steps stop on their cancelled contexts). It may be called more than
// once.
func (s *Simulator) StopHolding() {
	in := s.inj
	in.mu.Lock()
	defer in.mu.Unlock()
	select {
	case <-in.stopping:
		return
	default:
	}
	close(in.stopping)
	s.log.Info("simulator stops holding steps", "held", len(in.held))
}

// InjectFault validates f, gives it an id ("f-<n>") and makes it fire on the
// matching steps from now on. It returns the fault as stored.
func (s *Simulator) InjectFault(f Fault) (Fault, error) {
	if err := f.Validate(); err != nil {
		return Fault{}, fmt.Errorf("inject fault: %w", err)
	}
	in := s.inj
	in.mu.Lock()
	defer in.mu.Unlock()
	in.lastID++
	f.ID = "f-" + strconv.Itoa(in.lastID)
	in.faults = append(in.faults, f)
	s.log.Info("fault injected", "fault", f.ID, "step", f.Step, "mode", f.Mode, "cluster", f.ClusterID, "count", f.Count, "delay", f.Delay)
	return f, nil
}

// Faults lists the faults in force, oldest first; Count is what is left to
// fire (0: until cleared).
func (s *Simulator) Faults() []Fault {
	in := s.inj
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Clone(in.faults)
}

// ListHeld lists the steps that HOLD faults are blocking, oldest first.
func (s *Simulator) ListHeld() []Held {
	in := s.inj
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]Held, len(in.held))
	for i, h := range in.held {
		out[i] = h.Held
	}
	return out
}

// WaitHeld returns the first held step that match accepts (any step when
// match is nil) as soon as there is one, or ctx's error. It lets a test
// order events ("the start is now blocked in power_on") without sleeping.
func (s *Simulator) WaitHeld(ctx context.Context, match func(Held) bool) (Held, error) {
	in := s.inj
	for {
		in.mu.Lock()
		for _, h := range in.held {
			if match == nil || match(h.Held) {
				in.mu.Unlock()
				return h.Held, nil
			}
		}
		changed := in.changed
		in.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return Held{}, ctx.Err()
		}
	}
}

// ReleaseHeld lets the steps held by fault id go on and says how many it
// released. The fault itself stays (and holds the next matching step); an
// id that names no fault and holds nothing is fault.ErrUnknown.
func (s *Simulator) ReleaseHeld(id string) (int, error) {
	in := s.inj
	in.mu.Lock()
	defer in.mu.Unlock()
	n := in.releaseLocked(func(h *holding) bool { return h.FaultID == id })
	known := slices.ContainsFunc(in.faults, func(f Fault) bool { return f.ID == id })
	if n == 0 && !known {
		return 0, fmt.Errorf("release held steps of fault %q: %w", id, fault.ErrUnknown)
	}
	s.log.Info("held steps released", "fault", id, "released", n)
	return n, nil
}

// ReleaseAll lets every held step go on and says how many it released.
func (s *Simulator) ReleaseAll() int {
	in := s.inj
	in.mu.Lock()
	defer in.mu.Unlock()
	n := in.releaseLocked(func(*holding) bool { return true })
	s.log.Info("all held steps released", "released", n)
	return n
}

// ClearFaults removes every fault and lets every held step go on.
func (s *Simulator) ClearFaults() {
	in := s.inj
	in.mu.Lock()
	defer in.mu.Unlock()
	in.faults = nil
	n := in.releaseLocked(func(*holding) bool { return true })
	s.log.Info("faults cleared", "released", n)
}

// releaseLocked lets the held steps that pick accepts go on.
func (in *injector) releaseLocked(pick func(*holding) bool) int {
	n := 0
	in.held = slices.DeleteFunc(in.held, func(h *holding) bool {
		if !pick(h) {
			return false
		}
		close(h.release)
		n++
		return true
	})
	if n > 0 {
		in.broadcastLocked()
	}
	return n
}

func (in *injector) broadcastLocked() {
	close(in.changed)
	in.changed = make(chan struct{})
}

// fire applies the oldest fault matching a step of call c, if any: it
// returns ErrInjected for FAIL, waits for DELAY, blocks for HOLD until the
// step is released, and returns ctx's error if ctx ends first.
func (s *Simulator) fire(ctx context.Context, step string, c infra.Call) error {
	in := s.inj
	in.mu.Lock()
	i := slices.IndexFunc(in.faults, func(f Fault) bool { return f.Matches(step, c) })
	if i < 0 {
		in.mu.Unlock()
		return nil
	}
	f := in.faults[i]
	if f.Mode == ModeHold {
		select {
		case <-in.stopping:
			in.mu.Unlock()
			s.log.Info("hold fault not applied: server stopping", "fault", f.ID, "step", step, "cluster", c.ClusterID, "operation", c.Operation)
			return nil
		default:
		}
	}
	switch {
	case f.Count == 1:
		in.faults = slices.Delete(in.faults, i, i+1)
	case f.Count > 1:
		in.faults[i].Count--
	}
	var h *holding
	if f.Mode == ModeHold {
		h = &holding{
			Held: Held{
				FaultID: f.ID, Step: step, ClusterID: c.ClusterID, Operation: c.Operation,
				MachineID: c.MachineID, Since: s.now(),
			},
			release: make(chan struct{}),
		}
		in.held = append(in.held, h)
		in.broadcastLocked()
	}
	in.mu.Unlock()

	s.log.Info("fault fired", "fault", f.ID, "mode", f.Mode, "step", step,
		"cluster", c.ClusterID, "operation", c.Operation, "machine", c.MachineID)
	switch f.Mode {
	case ModeFail:
		return fmt.Errorf("%w (fault %s)", ErrInjected, f.ID)
	case ModeDelay:
		return sleep(ctx, f.Delay)
	default: // ModeHold
		forget := func() {
			in.mu.Lock()
			if i := slices.Index(in.held, h); i >= 0 {
				in.held = slices.Delete(in.held, i, i+1)
				in.broadcastLocked()
			}
			in.mu.Unlock()
		}
		select {
		case <-h.release:
			return nil
		case <-ctx.Done():
			forget()
			return ctx.Err()
		case <-in.stopping:
			forget()
			return fmt.Errorf("%w (fault %s)", ErrStopping, f.ID)
		}
	}
}
