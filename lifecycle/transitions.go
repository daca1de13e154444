package lifecycle

import (
	"errors"
	"fmt"
)

// ErrTransitionNotAllowed is the sentinel every refused (state, event) pair
// wraps. Callers map it to FAILED_PRECONDITION / INVALID_STATE_TRANSITION
// (SPEC §3.3) with errors.Is, without caring which pair was refused; those
// that need the pair use errors.As with *TransitionError.
var ErrTransitionNotAllowed = errors.New("lifecycle: transition not allowed")

// TransitionError says which (state, event) pair the table refuses. It
// carries the pair rather than only a message so the RPC layer can build
// the SPEC §3.3 text ("cluster X is in state S, which does not allow E") and
// its ErrorInfo metadata without parsing strings.
type TransitionError struct {
	From  State
	Event Event
}

// Error reads "state S does not allow E", so the message names both halves
// of the refused pair in the words of the API.
func (e *TransitionError) Error() string {
	return fmt.Sprintf("state %s does not allow %s", e.From, e.Event)
}

// Unwrap returns ErrTransitionNotAllowed, so errors.Is works through any
// amount of %w wrapping added by callers.
func (e *TransitionError) Unwrap() error { return ErrTransitionNotAllowed }

// move is a key of the transition table: one (state, event) pair.
type move struct {
	from  State
	event Event
}

// transitions is the SPEC §2 table, row for row. It is the only place in
// clusterd that says which state an event leads to (SPEC §3.9): a pair that
// is not here is not allowed. It is written as a literal so that a reviewer
// can check it against the spec line by line, and it is never modified
// after init.
var transitions = map[move]State{
	{Created, StartRequested}:   Starting,
	{Created, CreateFailed}:     Error,      // clusterd: orphaned create
	{Created, DestroyRequested}: Destroying, // clusterd

	{Starting, OperationSucceeded}: Running,
	{Starting, OperationFailed}:    Alert,
	{Starting, CreateFailed}:       Error,
	{Starting, StopRequested}:      Stopping,

	{Running, StopRequested}:       Stopping,
	{Running, FaultsDetected}:      Alert,
	{Running, AutoscaleRequested}:  Scaling,
	{Running, ScaleUpRequested}:    Scaling,
	{Running, ScaleDownRequested}:  Scaling,
	{Running, UpgradeRequested}:    Upgrading,
	{Running, AddNodeRequested}:    Importing,
	{Running, RemoveNodeRequested}: RemovingNodes,
	{Running, DestroyRequested}:    Destroying,

	{Stopping, OperationSucceeded}: Stopped,
	{Stopping, OperationFailed}:    Alert,

	{Stopped, StartRequested}:   Starting,
	{Stopped, ScaleUpRequested}: ScalingStoppedCluster,
	{Stopped, FaultsDetected}:   Alert, // clusterd: CKS sends it but has no such transition
	{Stopped, DestroyRequested}: Destroying,

	{Scaling, OperationSucceeded}: Running,
	{Scaling, OperationFailed}:    Alert,

	{ScalingStoppedCluster, OperationSucceeded}: Stopped,
	{ScalingStoppedCluster, OperationFailed}:    Alert,

	{Upgrading, OperationSucceeded}: Running,
	{Upgrading, OperationFailed}:    Alert,

	{Importing, OperationSucceeded}: Running,
	{Importing, OperationFailed}:    Running,

	{RemovingNodes, OperationSucceeded}: Running,
	{RemovingNodes, OperationFailed}:    Running,

	{Alert, StartRequested}:     Starting,
	{Alert, AutoscaleRequested}: Scaling,
	{Alert, ScaleUpRequested}:   Scaling,
	{Alert, ScaleDownRequested}: Scaling,
	{Alert, StopRequested}:      Stopping,
	// clusterd: nodes that all run a version other than the record (an
	// upgrade cancelled after its last node) keep the cluster in ALERT
	// until an upgrade makes them equal to the record (SPEC §5.2), and no
	// other operation may end RUNNING on them (Settle): without this row
	// such a cluster could only be destroyed.
	{Alert, UpgradeRequested}:    Upgrading,
	{Alert, AddNodeRequested}:    Importing,
	{Alert, RemoveNodeRequested}: RemovingNodes,
	{Alert, RecoveryRequested}:   Recovering,
	{Alert, DestroyRequested}:    Destroying,

	{Recovering, OperationSucceeded}: Running,
	{Recovering, OperationFailed}:    Alert,

	{Error, DestroyRequested}: Destroying,

	{Destroying, OperationSucceeded}: Destroyed,
}

// Next is the transition function of SPEC §2: the state that event e moves
// a cluster in state from to. Handlers, workers and the scanner all call it
// (SPEC §3.9) so no caller compares states to decide a move on its own.
//
// A pair the table does not list returns (from, *TransitionError): the
// unchanged state, so a caller that ignores the error still cannot write a
// made-up state, and an error that says which pair was refused.
func Next(from State, e Event) (State, error) {
	if to, ok := transitions[move{from, e}]; ok {
		return to, nil
	}
	return from, &TransitionError{From: from, Event: e}
}

// inPlace lists the requests that SPEC §3.4 lets go ahead without a state
// change, as in the CKS model: start from ERROR (so a failed create that
// fails to start again stays ERROR, not ALERT), stop from CREATED or ERROR,
// and destroy from DESTROYING (a retried destroy, also used by the scanner
// and the garbage collector). They are kept apart from the transition table
// because they are not transitions: Next must still refuse them, so an
// operation's end event can never be confused with a request that was let
// through.
var inPlace = map[move]bool{
	{Error, StartRequested}:        true,
	{Created, StopRequested}:       true,
	{Error, StopRequested}:         true,
	{Destroying, DestroyRequested}: true,
}

// InPlace reports whether request e may go ahead on a cluster in state from
// without changing its state (SPEC §3.4). The operation still claims the
// cluster as its current operation, so two of them never run at once; only
// the state stays put.
func InPlace(from State, e Event) bool { return inPlace[move{from, e}] }

// Admit decides what a request does to a cluster in state from, and is what
// RPC handlers (and the scanner's retried destroy) ask before claiming.
//
// It exists beside Next because a request has one more way to be accepted
// than a transition: the in-place operations of SPEC §3.4, modelled on CKS,
// where start from ERROR, stop from CREATED or ERROR and destroy from
// DESTROYING run without a state change. Folding those into Next as
// self-loops would let an operation's OperationSucceeded/OperationFailed
// logic, or the scanner, treat them as moves; keeping Next strict and adding
// them here keeps both questions answered by data in one place.
//
// It returns Next's target when the table allows the pair, (from, nil) when
// the request goes ahead in place, and (from, *TransitionError) otherwise.
func Admit(from State, e Event) (State, error) {
	to, err := Next(from, e)
	if err == nil {
		return to, nil
	}
	if InPlace(from, e) {
		return from, nil
	}
	return from, err
}

// orphanEvents is the event that ends an orphaned operation found in each
// state (SPEC §5 step 1). It is data, not a switch in the scanner, so that
// recovery goes through the same table as everything else: an operation
// state ends with OperationFailed (-> ALERT, or RUNNING for IMPORTING and
// REMOVING_NODES), an unheld CREATED cluster whose create job died ends with
// CreateFailed (-> ERROR), and DESTROYING is destroyed again in place, since
// destroy is retried rather than failed.
var orphanEvents = map[State]Event{
	Starting:              OperationFailed,
	Stopping:              OperationFailed,
	Scaling:               OperationFailed,
	ScalingStoppedCluster: OperationFailed,
	Upgrading:             OperationFailed,
	Recovering:            OperationFailed,
	Importing:             OperationFailed,
	RemovingNodes:         OperationFailed,
	Created:               CreateFailed,
	Destroying:            DestroyRequested,
}

// OrphanEvent is the event the scanner sends to end an orphaned operation
// found in state s (SPEC §5 step 1); the scanner then passes it to Admit
// and CASes the result like any other write. ok is false for states that no
// operation holds, which recovery must leave alone.
func OrphanEvent(s State) (e Event, ok bool) {
	e, ok = orphanEvents[s]
	return e, ok
}

// live lists the states of a cluster whose machines are meant to be running
// (SPEC §3.6): only such a cluster changes size (a stopped one can change its
// offering, which the table lets through as SCALE_UP_REQUESTED ->
// SCALING_STOPPED_CLUSTER, so the event alone cannot tell), and its offering
// can only grow, since its machines are resized while in use.
var live = map[State]bool{Running: true, Alert: true}

// IsLive reports whether a cluster in state s is running (RUNNING, or ALERT
// on its way back), for the scale rules of SPEC §3.6.
func IsLive(s State) bool { return live[s] }

// healthy lists the states that vouch for a cluster's machines: RUNNING
// ("provisioned and healthy", SPEC §1) says every machine runs, has joined
// and runs the recorded Kubernetes version.
var healthy = map[State]bool{Running: true}

// Healthy reports whether a cluster in state s must have every machine
// running, joined and at its recorded Kubernetes version (SPEC §5.2):
// reconciliation compares such a cluster's machines with its record, and an
// operation that would end in s compares them first (Settle).
func Healthy(s State) bool { return healthy[s] }

// versioned lists the states at rest that vouch for the nodes' Kubernetes
// version: RUNNING (which Healthy asks more of) and STOPPED, whose nodes,
// though off, are the record's.
var versioned = map[State]bool{Running: true, Stopped: true}

// Versioned reports whether a cluster in state s must have every node at
// its recorded Kubernetes version (SPEC §5.2: nodes on another version than
// the record are not healthy, and the cluster stays ALERT until an upgrade
// makes them equal). An operation that would end in s compares them first
// (Settle), so a stop from ALERT after a failed upgrade does not file the
// cluster as STOPPED on nodes the record does not describe.
func Versioned(s State) bool { return versioned[s] }

// StatusEffect is what a write that moves a cluster into a state does to
// the cluster's status message, the one line that says why it is not
// healthy (what reconciliation found, what recovery repaired, why its
// operation failed): a user reads it next to the state, without walking the
// history.
type StatusEffect uint8

const (
	// StatusKept: the message stays as it was (an operation state: while
	// a start from ALERT runs, the reason for the ALERT still holds).
	StatusKept StatusEffect = iota
	// StatusSet: the write's history message becomes the status message.
	StatusSet
	// StatusCleared: the state vouches for the cluster; no message.
	StatusCleared
)

// statusEffects lists the states whose entry sets or clears the status
// message; every other state keeps it.
var statusEffects = map[State]StatusEffect{
	Alert:     StatusSet,
	Error:     StatusSet,
	Running:   StatusCleared,
	Stopped:   StatusCleared,
	Destroyed: StatusCleared,
}

// StatusOn is what a write that moves a cluster from one state to another
// does to its status message. Staying in a state keeps the message, so a
// write that only releases an ALERT cluster does not replace the reason it
// is ALERT with its own words.
func StatusOn(from, to State) StatusEffect {
	if from == to && statusEffects[to] == StatusSet {
		return StatusKept
	}
	return statusEffects[to]
}

// Decision is the state machine's answer for one write: a cluster in state
// From receives Event (EventUnspecified: none, the cluster keeps its state)
// and goes to To. Like raft's Ready, it is computed once, by whoever read the
// cluster, and carried to the write: the repository writes what was decided
// without asking again, and the caller knows the state it will have written.
type Decision struct {
	From  State
	Event Event
	To    State
}

// Moves reports whether the decision changes the state or records an event
// (an in-place request records its event but keeps the state).
func (d Decision) Moves() bool { return d.Event != EventUnspecified }

// Decide is Admit as a Decision: what request e does to a cluster in state
// from (a transition, or an in-place operation that keeps the state), or a
// *TransitionError.
func Decide(from State, e Event) (Decision, error) {
	to, err := Admit(from, e)
	if err != nil {
		return Decision{}, err
	}
	return Decision{From: from, Event: e, To: to}, nil
}

// Stay is the decision to keep state from: an operation that ends without
// a state change (SPEC §3.4) only releases the cluster.
func Stay(from State) Decision { return Decision{From: from, To: from} }

// Settle is how an operation ends, given its decision d (End's) and
// whether the cluster's machines match the record (every machine running,
// joined and at the recorded Kubernetes version for a Healthy state; every
// node at the recorded version for another Versioned one, STOPPED). An end
// that would leave the cluster in a Versioned state with machines that do
// not match finds the
// faults in the same write (SPEC §5.2: an operation that ends RUNNING
// leaves every machine running, joined and at the recorded version, or ends
// ALERT naming what is not, whether it started from RUNNING or ALERT): the
// end moves the cluster to d.To, and FAULTS_DETECTED from there, so the
// decision is FAULTS_DETECTED to where the table takes d.To with it. Any
// other decision is d.
//
// It is a composition of two rows of the table rather than a row of its
// own, so the table stays SPEC §2's: IMPORTING and REMOVING_NODES end
// RUNNING whether they succeed or fail, as in the model, and the finding
// is what the scanner would write a moment later, without the moment in
// which the cluster is RUNNING on machines that say otherwise.
func Settle(d Decision, matches bool) Decision {
	if matches || !Versioned(d.To) {
		return d
	}
	to, err := Next(d.To, FaultsDetected)
	if err != nil {
		return d
	}
	return Decision{From: d.From, Event: FaultsDetected, To: to}
}

// End is how an operation ends on a cluster in state from: e (OPERATION_
// SUCCEEDED, OPERATION_FAILED, CREATE_FAILED) where the table has it, and
// otherwise no state change (the in-place operations of SPEC §3.4).
func End(from State, e Event) Decision {
	if to, err := Next(from, e); err == nil {
		return Decision{From: from, Event: e, To: to}
	}
	return Stay(from)
}
