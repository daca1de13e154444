// Package fault holds the simulator's fault-injection vocabulary: what a
// fault is and what a held step looks like. It is a leaf so that the
// Simulator gRPC handlers can speak it without depending on the simulator
// itself (which owns the database and the machinery that fires faults).
package fault

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/clusterd/clusterd/infra"
)

// Mode is what a fault does to the step it fires on.
type Mode string

// Modes (SPEC §6).
const (
	// Fail makes the step return an error without doing anything.
	Fail Mode = "FAIL"
	// Delay makes the step wait Fault.Delay before it runs.
	Delay Mode = "DELAY"
	// Hold blocks the step until it is released or its context ends, so
	// tests and demos can order events without sleeping.
	Hold Mode = "HOLD"
)

// Fault is one injected fault.
type Fault struct {
	// ID is assigned when the fault is injected.
	ID string
	// Step is one of infra.Steps().
	Step string
	Mode Mode
	// ClusterID restricts the fault to one cluster's steps; empty matches
	// every cluster.
	ClusterID string
	// Count is how many times the fault fires before it disappears; 0 fires
	// until the fault is cleared.
	Count int32
	// Delay is how long a Delay fault holds the step up.
	Delay time.Duration
}

// Held is a step that a Hold fault is blocking.
type Held struct {
	FaultID   string
	Step      string
	ClusterID string
	Operation string
	MachineID string
	// Since is when the step started waiting.
	Since time.Time
}

// ErrInvalid marks a fault that cannot be injected as given.
var ErrInvalid = errors.New("invalid fault")

// ErrUnknown marks a fault id that names no fault and holds nothing.
var ErrUnknown = errors.New("unknown fault")

// Validate says why f cannot be injected, naming the field at fault.
func (f Fault) Validate() error {
	if !slices.Contains(infra.Steps(), f.Step) {
		return fmt.Errorf("%w: step %q is not one of %s", ErrInvalid, f.Step, strings.Join(infra.Steps(), ", "))
	}
	switch f.Mode {
	case Fail, Hold:
		if f.Delay != 0 {
			return fmt.Errorf("%w: delay is only for %s faults, not %s", ErrInvalid, Delay, f.Mode)
		}
	case Delay:
		if f.Delay <= 0 {
			return fmt.Errorf("%w: a %s fault needs a positive delay, not %s", ErrInvalid, Delay, f.Delay)
		}
	default:
		return fmt.Errorf("%w: mode %q is not %s, %s or %s", ErrInvalid, f.Mode, Fail, Delay, Hold)
	}
	if f.Count < 0 {
		return fmt.Errorf("%w: count %d is negative", ErrInvalid, f.Count)
	}
	return nil
}

// Matches reports whether the fault applies to a step of the call.
func (f Fault) Matches(step string, c infra.Call) bool {
	return f.Step == step && (f.ClusterID == "" || f.ClusterID == c.ClusterID)
}
