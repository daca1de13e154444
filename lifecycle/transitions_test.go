package lifecycle

import (
	"errors"
	"fmt"
	"testing"
)

// specTransitions is SPEC §2, copied by hand, one row per allowed pair
// (rows with "A / B / C" events are expanded). It is deliberately not
// derived from the package's table: the exhaustive test compares the two.
var specTransitions = []struct {
	from  State
	event Event
	to    State
}{
	{Created, StartRequested, Starting},
	{Created, CreateFailed, Error},
	{Created, DestroyRequested, Destroying},

	{Starting, OperationSucceeded, Running},
	{Starting, OperationFailed, Alert},
	{Starting, CreateFailed, Error},
	{Starting, StopRequested, Stopping},

	{Running, StopRequested, Stopping},
	{Running, FaultsDetected, Alert},
	{Running, AutoscaleRequested, Scaling},
	{Running, ScaleUpRequested, Scaling},
	{Running, ScaleDownRequested, Scaling},
	{Running, UpgradeRequested, Upgrading},
	{Running, AddNodeRequested, Importing},
	{Running, RemoveNodeRequested, RemovingNodes},
	{Running, DestroyRequested, Destroying},

	{Stopping, OperationSucceeded, Stopped},
	{Stopping, OperationFailed, Alert},

	{Stopped, StartRequested, Starting},
	{Stopped, ScaleUpRequested, ScalingStoppedCluster},
	{Stopped, FaultsDetected, Alert},
	{Stopped, DestroyRequested, Destroying},

	{Scaling, OperationSucceeded, Running},
	{Scaling, OperationFailed, Alert},

	{ScalingStoppedCluster, OperationSucceeded, Stopped},
	{ScalingStoppedCluster, OperationFailed, Alert},

	{Upgrading, OperationSucceeded, Running},
	{Upgrading, OperationFailed, Alert},

	{Importing, OperationSucceeded, Running},
	{Importing, OperationFailed, Running},

	{RemovingNodes, OperationSucceeded, Running},
	{RemovingNodes, OperationFailed, Running},

	{Alert, StartRequested, Starting},
	{Alert, AutoscaleRequested, Scaling},
	{Alert, ScaleUpRequested, Scaling},
	{Alert, ScaleDownRequested, Scaling},
	{Alert, StopRequested, Stopping},
	{Alert, UpgradeRequested, Upgrading}, // clusterd: the way out of nodes that all differ from the record
	{Alert, AddNodeRequested, Importing},
	{Alert, RemoveNodeRequested, RemovingNodes},
	{Alert, RecoveryRequested, Recovering},
	{Alert, DestroyRequested, Destroying},

	{Recovering, OperationSucceeded, Running},
	{Recovering, OperationFailed, Alert},

	{Error, DestroyRequested, Destroying},

	{Destroying, OperationSucceeded, Destroyed},
}

// specInPlace is SPEC §3.4, copied by hand.
var specInPlace = []struct {
	from  State
	event Event
}{
	{Error, StartRequested},
	{Created, StopRequested},
	{Error, StopRequested},
	{Destroying, DestroyRequested},
}

type pair struct {
	from  State
	event Event
}

// specTable indexes specTransitions, failing the test on a duplicate row so
// that the count check below means something.
func specTable(t *testing.T) map[pair]State {
	t.Helper()
	want := make(map[pair]State, len(specTransitions))
	for _, r := range specTransitions {
		k := pair{r.from, r.event}
		if _, dup := want[k]; dup {
			t.Fatalf("specTransitions lists (%v, %v) twice", r.from, r.event)
		}
		want[k] = r.to
	}
	return want
}

func specInPlaceSet() map[pair]bool {
	set := make(map[pair]bool, len(specInPlace))
	for _, r := range specInPlace {
		set[pair{r.from, r.event}] = true
	}
	return set
}

// checkRefused asserts that err is the refusal of (from, e) and that the
// state was left alone.
func checkRefused(t *testing.T, fn string, from State, e Event, got State, err error) {
	t.Helper()
	if got != from {
		t.Errorf("%s(%v, %v) state = %v, want unchanged %v", fn, from, e, got, from)
	}
	if !errors.Is(err, ErrTransitionNotAllowed) {
		t.Errorf("%s(%v, %v) error = %v, want one wrapping ErrTransitionNotAllowed", fn, from, e, err)
		return
	}
	var te *TransitionError
	if !errors.As(err, &te) {
		t.Errorf("%s(%v, %v) error = %T, want *TransitionError", fn, from, e, err)
		return
	}
	if te.From != from || te.Event != e {
		t.Errorf("%s(%v, %v) TransitionError = {%v, %v}, want {%v, %v}", fn, from, e, te.From, te.Event, from, e)
	}
}

// allStates and allEvents add the invalid zero values (and one value out
// of range) to States() and Events(), so the exhaustive tests prove those
// are refused too.
func allStates() []State { return append([]State{StateUnspecified, State(99)}, States()...) }
func allEvents() []Event { return append([]Event{EventUnspecified, Event(99)}, Events()...) }

// TestNextExhaustive checks Next for every (state, event) pair against the
// hand-copied SPEC §2 table: allowed pairs reach the exact target, every
// other pair is refused with a *TransitionError naming the pair.
func TestNextExhaustive(t *testing.T) {
	want := specTable(t)
	allowed := 0
	for _, from := range allStates() {
		for _, e := range allEvents() {
			got, err := Next(from, e)
			if to, ok := want[pair{from, e}]; ok {
				allowed++
				if err != nil || got != to {
					t.Errorf("Next(%v, %v) = %v, %v; want %v, nil", from, e, got, err, to)
				}
				continue
			}
			if err == nil {
				t.Errorf("Next(%v, %v) = %v, nil; want refusal (not in SPEC §2)", from, e, got)
				continue
			}
			checkRefused(t, "Next", from, e, got, err)
		}
	}
	if allowed != len(specTransitions) {
		t.Errorf("Next allows %d pairs of the spec table, want all %d", allowed, len(specTransitions))
	}
	if len(specTransitions) != 46 {
		t.Errorf("spec table has %d rows, want 46 (SPEC §2 expanded, with ALERT + UPGRADE_REQUESTED)", len(specTransitions))
	}
}

func TestUnspecifiedNeverAllowed(t *testing.T) {
	for _, s := range States() {
		for _, fn := range []struct {
			name string
			f    func(State, Event) (State, error)
		}{{"Next", Next}, {"Admit", Admit}} {
			got, err := fn.f(s, EventUnspecified)
			checkRefused(t, fn.name, s, EventUnspecified, got, err)
		}
		if InPlace(s, EventUnspecified) {
			t.Errorf("InPlace(%v, EVENT_UNSPECIFIED) = true", s)
		}
	}
	for _, e := range Events() {
		got, err := Admit(StateUnspecified, e)
		checkRefused(t, "Admit", StateUnspecified, e, got, err)
		if InPlace(StateUnspecified, e) {
			t.Errorf("InPlace(STATE_UNSPECIFIED, %v) = true", e)
		}
	}
	if _, ok := OrphanEvent(StateUnspecified); ok {
		t.Error("OrphanEvent(STATE_UNSPECIFIED) ok = true")
	}
}

// TestAdmitExhaustive checks Admit and InPlace for every pair: the SPEC §2
// target if the table allows it, the same state with no error if SPEC §3.4
// lets it go ahead in place, else a refusal.
func TestAdmitExhaustive(t *testing.T) {
	want := specTable(t)
	inPlace := specInPlaceSet()
	for _, from := range allStates() {
		for _, e := range allEvents() {
			k := pair{from, e}
			if got := InPlace(from, e); got != inPlace[k] {
				t.Errorf("InPlace(%v, %v) = %v, want %v", from, e, got, inPlace[k])
			}
			got, err := Admit(from, e)
			switch to, ok := want[k]; {
			case ok:
				if err != nil || got != to {
					t.Errorf("Admit(%v, %v) = %v, %v; want %v, nil", from, e, got, err, to)
				}
			case inPlace[k]:
				if err != nil || got != from {
					t.Errorf("Admit(%v, %v) = %v, %v; want %v, nil (in place)", from, e, got, err, from)
				}
			default:
				if err == nil {
					t.Errorf("Admit(%v, %v) = %v, nil; want refusal", from, e, got)
					continue
				}
				checkRefused(t, "Admit", from, e, got, err)
			}
		}
	}
}

// TestInPlaceIsNotATransition checks that the SPEC §3.4 pairs are not in
// the transition table: Next refuses them, only Admit lets them through.
func TestInPlaceIsNotATransition(t *testing.T) {
	for _, r := range specInPlace {
		got, err := Next(r.from, r.event)
		checkRefused(t, "Next", r.from, r.event, got, err)
	}
}

func TestAdmit(t *testing.T) {
	tests := []struct {
		from    State
		event   Event
		want    State
		refused bool
	}{
		{Error, StartRequested, Error, false},
		{Error, StopRequested, Error, false},
		{Created, StopRequested, Created, false},
		{Destroying, DestroyRequested, Destroying, false},
		{Error, DestroyRequested, Destroying, false},
		{Running, ScaleUpRequested, Scaling, false},
		{Alert, StartRequested, Starting, false},
		{Stopped, AddNodeRequested, Stopped, true},
		{Stopped, ScaleDownRequested, Stopped, true},
		{Stopped, StopRequested, Stopped, true},
		{Running, StartRequested, Running, true},
		{Created, ScaleUpRequested, Created, true},
		{Error, ScaleUpRequested, Error, true},
		{Destroyed, DestroyRequested, Destroyed, true},
		{Destroyed, StartRequested, Destroyed, true},
		{Destroying, StopRequested, Destroying, true},
		{Starting, StartRequested, Starting, true},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%v/%v", tc.from, tc.event), func(t *testing.T) {
			got, err := Admit(tc.from, tc.event)
			if tc.refused {
				checkRefused(t, "Admit", tc.from, tc.event, got, err)
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("Admit(%v, %v) = %v, %v; want %v, nil", tc.from, tc.event, got, err, tc.want)
			}
		})
	}
}

func TestTransitionErrorMessage(t *testing.T) {
	_, err := Next(Stopped, AddNodeRequested)
	if err == nil {
		t.Fatal("Next(STOPPED, ADD_NODE_REQUESTED) allowed")
	}
	if got, want := err.Error(), "state STOPPED does not allow ADD_NODE_REQUESTED"; got != want {
		t.Errorf("error = %q, want %q", got, want)
	}
	wrapped := fmt.Errorf("start cluster c1: %w", err)
	if !errors.Is(wrapped, ErrTransitionNotAllowed) {
		t.Errorf("errors.Is(%v, ErrTransitionNotAllowed) = false through wrapping", wrapped)
	}
	var te *TransitionError
	if !errors.As(wrapped, &te) || te.From != Stopped || te.Event != AddNodeRequested {
		t.Errorf("errors.As(%v) = %+v, want {STOPPED ADD_NODE_REQUESTED}", wrapped, te)
	}
}

// TestOperationStatesCanEnd: every operation state has a failure transition
// or a retry rule, so recovery can always move it (SPEC §2).
func TestOperationStatesCanEnd(t *testing.T) {
	n := 0
	for _, s := range States() {
		if !s.IsOperation() {
			continue
		}
		n++
		_, failErr := Next(s, OperationFailed)
		retry := InPlace(s, DestroyRequested)
		if failErr != nil && !retry {
			t.Errorf("operation state %v has neither an OPERATION_FAILED transition nor a retry rule", s)
		}
		if _, err := Next(s, OperationSucceeded); err != nil {
			t.Errorf("operation state %v has no OPERATION_SUCCEEDED transition: %v", s, err)
		}
	}
	if n != 9 {
		t.Errorf("found %d operation states, want 9 (SPEC §1)", n)
	}
}

// TestOrphanEvent checks SPEC §5 step 1: the expected event for each state
// (written out here), and that Admit lets it through to the spec's target.
func TestOrphanEvent(t *testing.T) {
	tests := []struct {
		state State
		event Event
		ok    bool
		to    State
	}{
		{Created, CreateFailed, true, Error},
		{Starting, OperationFailed, true, Alert},
		{Running, 0, false, 0},
		{Stopping, OperationFailed, true, Alert},
		{Stopped, 0, false, 0},
		{Scaling, OperationFailed, true, Alert},
		{ScalingStoppedCluster, OperationFailed, true, Alert},
		{Upgrading, OperationFailed, true, Alert},
		{Importing, OperationFailed, true, Running},
		{RemovingNodes, OperationFailed, true, Running},
		{Alert, 0, false, 0},
		{Recovering, OperationFailed, true, Alert},
		{Destroying, DestroyRequested, true, Destroying},
		{Destroyed, 0, false, 0},
		{Error, 0, false, 0},
		{StateUnspecified, 0, false, 0},
	}
	for _, tc := range tests {
		e, ok := OrphanEvent(tc.state)
		if e != tc.event || ok != tc.ok {
			t.Errorf("OrphanEvent(%v) = %v, %v; want %v, %v", tc.state, e, ok, tc.event, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		got, err := Admit(tc.state, e)
		if err != nil || got != tc.to {
			t.Errorf("Admit(%v, OrphanEvent %v) = %v, %v; want %v, nil", tc.state, e, got, err, tc.to)
		}
	}
}

// TestOrphanEventCoversOperations: every operation state, and CREATED, can
// be ended by the scanner through the table.
func TestOrphanEventCoversOperations(t *testing.T) {
	for _, s := range States() {
		if !s.IsOperation() && s != Created {
			continue
		}
		e, ok := OrphanEvent(s)
		if !ok {
			t.Errorf("OrphanEvent(%v) ok = false; an orphaned %v could never be recovered", s, s)
			continue
		}
		if _, err := Admit(s, e); err != nil {
			t.Errorf("Admit(%v, %v) refused the orphan event: %v", s, e, err)
		}
	}
}

func TestDestroyedHasNoWayOut(t *testing.T) {
	for _, e := range allEvents() {
		if got, err := Next(Destroyed, e); err == nil {
			t.Errorf("Next(DESTROYED, %v) = %v, nil; want refusal", e, got)
		}
		if got, err := Admit(Destroyed, e); err == nil {
			t.Errorf("Admit(DESTROYED, %v) = %v, nil; want refusal", e, got)
		}
		if InPlace(Destroyed, e) {
			t.Errorf("InPlace(DESTROYED, %v) = true", e)
		}
	}
	if e, ok := OrphanEvent(Destroyed); ok {
		t.Errorf("OrphanEvent(DESTROYED) = %v, true", e)
	}
}

// reachable returns the states Next can reach from start with any sequence
// of events (breadth-first), start included.
func reachable(start State) map[State]bool {
	seen := map[State]bool{start: true}
	queue := []State{start}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		for _, e := range Events() {
			to, err := Next(s, e)
			if err != nil || seen[to] {
				continue
			}
			seen[to] = true
			queue = append(queue, to)
		}
	}
	return seen
}

func TestEveryStateReachableFromCreated(t *testing.T) {
	seen := reachable(Created)
	for _, s := range States() {
		if !seen[s] {
			t.Errorf("%v is not reachable from CREATED", s)
		}
	}
	if seen[StateUnspecified] {
		t.Error("STATE_UNSPECIFIED is reachable from CREATED")
	}
}

func TestEveryStateCanBeDestroyed(t *testing.T) {
	for _, s := range States() {
		if s.IsTerminal() {
			continue
		}
		if !reachable(s)[Destroyed] {
			t.Errorf("DESTROYED is not reachable from %v", s)
		}
	}
}

func TestIsLive(t *testing.T) {
	// SPEC §3.6: only a running cluster, or one in ALERT, changes size.
	want := map[State]bool{Running: true, Alert: true}
	for _, s := range States() {
		if got := IsLive(s); got != want[s] {
			t.Errorf("IsLive(%s) = %v; want %v", s, got, want[s])
		}
	}
}

// TestDecisions: Decide agrees with Admit on every pair, End with Next (and
// stays where Next refuses), and Stay keeps the state.
func TestDecisions(t *testing.T) {
	for _, from := range States() {
		for _, e := range Events() {
			to, aerr := Admit(from, e)
			d, derr := Decide(from, e)
			if (aerr == nil) != (derr == nil) || (derr == nil && d != (Decision{From: from, Event: e, To: to})) {
				t.Errorf("Decide(%s, %s) = %+v, %v; Admit = %s, %v", from, e, d, derr, to, aerr)
			}
			end := End(from, e)
			if next, err := Next(from, e); err == nil {
				if end != (Decision{From: from, Event: e, To: next}) || !end.Moves() {
					t.Errorf("End(%s, %s) = %+v; want the move to %s", from, e, end, next)
				}
			} else if end != Stay(from) || end.Moves() {
				t.Errorf("End(%s, %s) = %+v; want to stay", from, e, end)
			}
		}
		if s := Stay(from); s.To != from || s.Moves() {
			t.Errorf("Stay(%s) = %+v", from, s)
		}
	}
}

func TestHealthy(t *testing.T) {
	// SPEC §1: RUNNING is "provisioned and healthy"; ALERT is the state that
	// says it is not.
	for _, s := range States() {
		if got := Healthy(s); got != (s == Running) {
			t.Errorf("Healthy(%s) = %v; want %v", s, got, s == Running)
		}
	}
}

func TestVersioned(t *testing.T) {
	for _, s := range States() {
		want := s == Running || s == Stopped
		if got := Versioned(s); got != want {
			t.Errorf("Versioned(%s) = %v; want %v", s, got, want)
		}
		if Healthy(s) && !Versioned(s) {
			t.Errorf("%s is Healthy but not Versioned", s)
		}
	}
}

// TestSettle: an operation's end that would leave the cluster RUNNING (or
// STOPPED) on machines that do not match the record ends ALERT by
// FAULTS_DETECTED,
// whichever operation state it ends and whether it succeeded or failed
// (IMPORTING and REMOVING_NODES end RUNNING either way); every other end is
// left as End decided it.
func TestSettle(t *testing.T) {
	for _, from := range States() {
		for _, e := range []Event{OperationSucceeded, OperationFailed, CreateFailed, DestroyRequested} {
			d := End(from, e)
			if got := Settle(d, true); got != d {
				t.Errorf("Settle(End(%s, %s), matches) = %+v; want %+v", from, e, got, d)
			}
			got := Settle(d, false)
			want := d
			if d.To == Running || d.To == Stopped {
				want = Decision{From: from, Event: FaultsDetected, To: Alert}
			}
			if got != want {
				t.Errorf("Settle(End(%s, %s), mismatch) = %+v; want %+v", from, e, got, want)
			}
		}
	}
	// The two cases of issue 17: a remove-nodes from ALERT that ends with a
	// machine off, and a recovery whose nodes all differ from the record.
	for _, d := range []Decision{End(RemovingNodes, OperationSucceeded), End(RemovingNodes, OperationFailed), End(Recovering, OperationSucceeded)} {
		if got := Settle(d, false); got.To != Alert || got.Event != FaultsDetected {
			t.Errorf("Settle(%+v, mismatch) = %+v; want ALERT by FAULTS_DETECTED", d, got)
		}
	}
}

// TestStatusOn: entering ALERT or ERROR sets the status message, RUNNING,
// STOPPED and DESTROYED clear it, every other state (the operation states,
// CREATED) and staying in ALERT or ERROR keeps it; every transition the
// table has into ALERT or ERROR comes from another state, so each sets it.
func TestStatusOn(t *testing.T) {
	for _, from := range States() {
		for _, to := range States() {
			want := StatusKept
			switch {
			case from != to && (to == Alert || to == Error):
				want = StatusSet
			case to == Running || to == Stopped || to == Destroyed:
				want = StatusCleared
			}
			if got := StatusOn(from, to); got != want {
				t.Errorf("StatusOn(%s, %s) = %d; want %d", from, to, got, want)
			}
		}
	}
	for m, to := range transitions {
		if (to == Alert || to == Error) && StatusOn(m.from, to) != StatusSet {
			t.Errorf("%s --%s--> %s does not set the status message", m.from, m.event, to)
		}
	}
}
