package lifecycle

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrUnknownState is wrapped by ParseState so callers that read a state from
// storage or a request can tell a bad name (a corrupt row, a newer server's
// state) from every other failure with errors.Is.
var ErrUnknownState = errors.New("lifecycle: unknown state")

// ErrUnknownEvent is wrapped by ParseEvent, for the same reason as
// ErrUnknownState.
var ErrUnknownEvent = errors.New("lifecycle: unknown event")

// State is where a cluster is in its lifecycle (SPEC §1).
//
// It is a typed enum rather than a string so the compiler catches a state
// passed where an event is expected, and so the transition table can be keyed
// on small comparable values. The zero value, StateUnspecified, is
// deliberately invalid: a State that was never set (a zero struct field, a
// missing column, an unset proto enum) must be refused by Next instead of
// silently meaning some real state. It mirrors the proto enum's
// STATE_UNSPECIFIED, which the API never returns.
type State uint8

// The states of SPEC §1, in declaration order. The numeric values are not a
// storage format: persist and transmit String() and read back with
// ParseState, so reordering here can never rewrite stored clusters.
const (
	// StateUnspecified is the invalid zero value; no transition leads to
	// or from it.
	StateUnspecified State = iota
	// Created: the row exists, nothing is provisioned yet.
	Created
	// Starting: machines are being provisioned or powered on (operation).
	Starting
	// Running: provisioned and healthy.
	Running
	// Stopping: machines are being powered off (operation).
	Stopping
	// Stopped: machines are off, resources are kept.
	Stopped
	// Scaling: size, offering or autoscaler of a running cluster is
	// changing (operation).
	Scaling
	// ScalingStoppedCluster: the offering of a stopped cluster is changing
	// (operation). It is separate from Scaling so that success returns the
	// cluster to STOPPED, not RUNNING.
	ScalingStoppedCluster
	// Upgrading: a Kubernetes version upgrade is in progress (operation).
	Upgrading
	// Importing: external machines are being added as workers (operation).
	Importing
	// RemovingNodes: nodes are being removed (operation).
	RemovingNodes
	// Alert: not in its desired state; recoverable.
	Alert
	// Recovering: the scanner is bringing an ALERT cluster back (operation).
	Recovering
	// Destroying: being torn down; also where a failed destroy waits for a
	// retry (operation).
	Destroying
	// Destroyed: gone (soft-deleted); terminal.
	Destroyed
	// Error: creation failed; only a start (in place) or a destroy leaves it.
	Error

	stateEnd // one past the last valid state; keep last
)

// stateNames is indexed by State. The names are the proto enum's, so the same
// string means the same state in the database, the API and the logs.
var stateNames = [stateEnd]string{
	StateUnspecified:      "STATE_UNSPECIFIED",
	Created:               "CREATED",
	Starting:              "STARTING",
	Running:               "RUNNING",
	Stopping:              "STOPPING",
	Stopped:               "STOPPED",
	Scaling:               "SCALING",
	ScalingStoppedCluster: "SCALING_STOPPED_CLUSTER",
	Upgrading:             "UPGRADING",
	Importing:             "IMPORTING",
	RemovingNodes:         "REMOVING_NODES",
	Alert:                 "ALERT",
	Recovering:            "RECOVERING",
	Destroying:            "DESTROYING",
	Destroyed:             "DESTROYED",
	Error:                 "ERROR",
}

// String returns the proto enum name, so logs and error messages (SPEC §3.3
// "cluster X is in state S") use the same words as the API. An out-of-range
// value prints as State(N) rather than panicking or masquerading as a real
// state, so corruption is visible.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// ParseState is the inverse of String for valid states. It accepts only the
// exact upper-case names and refuses STATE_UNSPECIFIED, so a value read back
// from storage is either a real state or an error wrapping ErrUnknownState;
// a lenient parser would let a typo or a missing value become a state.
func ParseState(s string) (State, error) {
	for st := Created; st < stateEnd; st++ {
		if stateNames[st] == s {
			return st, nil
		}
	}
	return StateUnspecified, fmt.Errorf("parse state %q: %w", s, ErrUnknownState)
}

// States returns every valid state in declaration order. Tests and the
// scanner iterate over it instead of hard-coding lists, so adding a state
// makes exhaustive checks cover it automatically. The slice is fresh on every
// call so no caller can alter what another sees.
func States() []State {
	out := make([]State, 0, stateEnd-Created)
	for st := Created; st < stateEnd; st++ {
		out = append(out, st)
	}
	return out
}

// operationStates are the states of SPEC §1 whose kind is "operation": a
// cluster in one of them is held by a running job, and if that job dies the
// scanner must end the operation (SPEC §5 step 1). Kept as data so the kind
// column of the spec can be compared line by line.
var operationStates = map[State]bool{
	Starting:              true,
	Stopping:              true,
	Scaling:               true,
	ScalingStoppedCluster: true,
	Upgrading:             true,
	Importing:             true,
	RemovingNodes:         true,
	Recovering:            true,
	Destroying:            true,
}

// IsOperation reports whether s is an operation state (SPEC §1). It exists so
// the scanner can find clusters that an operation claimed and that may have
// been orphaned, without keeping its own copy of the list.
func (s State) IsOperation() bool { return operationStates[s] }

// IsTerminal reports whether s is DESTROYED, the only state with no way out.
// Callers use it to skip clusters that no event can move, rather than asking
// the table and being refused.
func (s State) IsTerminal() bool { return s == Destroyed }

// Event is something that asks a cluster to move: a user request, the end of
// an operation, or a finding of the scanner (SPEC §1).
//
// Like State it is a typed enum whose zero value, EventUnspecified, is
// invalid, so an event that was never set cannot be mistaken for a real one
// and is refused by every transition.
type Event uint8

// The events of SPEC §1, in declaration order.
const (
	// EventUnspecified is the invalid zero value; it is never allowed.
	EventUnspecified Event = iota
	// StartRequested: a user asked to start the cluster.
	StartRequested
	// StopRequested: a user asked to stop the cluster.
	StopRequested
	// DestroyRequested: a user, the scanner or the garbage collector asked
	// to destroy the cluster (also a retried destroy).
	DestroyRequested
	// RecoveryRequested: the scanner found an ALERT cluster healthy again.
	RecoveryRequested
	// AutoscaleRequested: a user changed the cluster's autoscaler.
	AutoscaleRequested
	// ScaleUpRequested: a user asked for more nodes or a larger offering.
	ScaleUpRequested
	// ScaleDownRequested: a user asked for fewer nodes.
	ScaleDownRequested
	// AddNodeRequested: a user asked to import external machines.
	AddNodeRequested
	// RemoveNodeRequested: a user asked to remove nodes.
	RemoveNodeRequested
	// UpgradeRequested: a user asked for a Kubernetes version upgrade.
	UpgradeRequested
	// OperationSucceeded: the operation holding the cluster finished.
	OperationSucceeded
	// OperationFailed: the operation holding the cluster failed, was
	// cancelled, timed out, or was orphaned.
	OperationFailed
	// CreateFailed: creating the cluster failed (or its create job died).
	CreateFailed
	// FaultsDetected: the scanner found machines not in their desired
	// power state.
	FaultsDetected

	eventEnd // one past the last valid event; keep last
)

// eventNames is indexed by Event; the names are those of SPEC §1.
var eventNames = [eventEnd]string{
	EventUnspecified:    "EVENT_UNSPECIFIED",
	StartRequested:      "START_REQUESTED",
	StopRequested:       "STOP_REQUESTED",
	DestroyRequested:    "DESTROY_REQUESTED",
	RecoveryRequested:   "RECOVERY_REQUESTED",
	AutoscaleRequested:  "AUTOSCALE_REQUESTED",
	ScaleUpRequested:    "SCALE_UP_REQUESTED",
	ScaleDownRequested:  "SCALE_DOWN_REQUESTED",
	AddNodeRequested:    "ADD_NODE_REQUESTED",
	RemoveNodeRequested: "REMOVE_NODE_REQUESTED",
	UpgradeRequested:    "UPGRADE_REQUESTED",
	OperationSucceeded:  "OPERATION_SUCCEEDED",
	OperationFailed:     "OPERATION_FAILED",
	CreateFailed:        "CREATE_FAILED",
	FaultsDetected:      "FAULTS_DETECTED",
}

// String returns the SPEC §1 name, so refusals (SPEC §3.3 "which does not
// allow E") and event history read the same everywhere. An out-of-range
// value prints as Event(N) so corruption is visible.
func (e Event) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return "Event(" + strconv.Itoa(int(e)) + ")"
}

// ParseEvent is the inverse of String for valid events; like ParseState it
// is strict, and refuses EVENT_UNSPECIFIED, so that anything it returns
// without error is a real event.
func ParseEvent(s string) (Event, error) {
	for ev := StartRequested; ev < eventEnd; ev++ {
		if eventNames[ev] == s {
			return ev, nil
		}
	}
	return EventUnspecified, fmt.Errorf("parse event %q: %w", s, ErrUnknownEvent)
}

// Events returns every valid event in declaration order, as a fresh slice,
// for the same reasons as States.
func Events() []Event {
	out := make([]Event, 0, eventEnd-StartRequested)
	for ev := StartRequested; ev < eventEnd; ev++ {
		out = append(out, ev)
	}
	return out
}
