package lifecycle

import (
	"errors"
	"slices"
	"testing"
)

// TestStateNames pins every state's name to SPEC §1 (written out here, not
// read from the package) and checks String and ParseState round-trip.
func TestStateNames(t *testing.T) {
	want := []struct {
		state State
		name  string
	}{
		{Created, "CREATED"},
		{Starting, "STARTING"},
		{Running, "RUNNING"},
		{Stopping, "STOPPING"},
		{Stopped, "STOPPED"},
		{Scaling, "SCALING"},
		{ScalingStoppedCluster, "SCALING_STOPPED_CLUSTER"},
		{Upgrading, "UPGRADING"},
		{Importing, "IMPORTING"},
		{RemovingNodes, "REMOVING_NODES"},
		{Alert, "ALERT"},
		{Recovering, "RECOVERING"},
		{Destroying, "DESTROYING"},
		{Destroyed, "DESTROYED"},
		{Error, "ERROR"},
	}
	var wantStates []State
	for _, tc := range want {
		wantStates = append(wantStates, tc.state)
		if got := tc.state.String(); got != tc.name {
			t.Errorf("State(%d).String() = %q, want %q", uint8(tc.state), got, tc.name)
		}
		got, err := ParseState(tc.name)
		if err != nil || got != tc.state {
			t.Errorf("ParseState(%q) = %v, %v; want %v, nil", tc.name, got, err, tc.state)
		}
	}
	if got := States(); !slices.Equal(got, wantStates) {
		t.Errorf("States() = %v, want %v", got, wantStates)
	}
}

func TestStateStringInvalid(t *testing.T) {
	tests := []struct {
		state State
		want  string
	}{
		{StateUnspecified, "STATE_UNSPECIFIED"},
		{State(16), "State(16)"},
		{State(255), "State(255)"},
	}
	for _, tc := range tests {
		if got := tc.state.String(); got != tc.want {
			t.Errorf("State(%d).String() = %q, want %q", uint8(tc.state), got, tc.want)
		}
	}
}

func TestParseStateRejects(t *testing.T) {
	for _, in := range []string{"", "STATE_UNSPECIFIED", "running", "Running", " RUNNING", "RUNNING ", "State(3)", "3", "DELETED"} {
		got, err := ParseState(in)
		if !errors.Is(err, ErrUnknownState) {
			t.Errorf("ParseState(%q) error = %v, want one wrapping ErrUnknownState", in, err)
		}
		if got != StateUnspecified {
			t.Errorf("ParseState(%q) = %v, want STATE_UNSPECIFIED", in, got)
		}
	}
}

func TestStatesFresh(t *testing.T) {
	a := States()
	a[0] = Destroyed
	if got := States()[0]; got != Created {
		t.Errorf("States()[0] = %v after a caller modified an earlier result, want CREATED", got)
	}
	e := Events()
	e[0] = FaultsDetected
	if got := Events()[0]; got != StartRequested {
		t.Errorf("Events()[0] = %v after a caller modified an earlier result, want START_REQUESTED", got)
	}
}

// TestStateKinds checks IsOperation and IsTerminal against the kind column
// of SPEC §1, written out here.
func TestStateKinds(t *testing.T) {
	tests := []struct {
		state     State
		operation bool
		terminal  bool
	}{
		{StateUnspecified, false, false},
		{Created, false, false},
		{Starting, true, false},
		{Running, false, false},
		{Stopping, true, false},
		{Stopped, false, false},
		{Scaling, true, false},
		{ScalingStoppedCluster, true, false},
		{Upgrading, true, false},
		{Importing, true, false},
		{RemovingNodes, true, false},
		{Alert, false, false},
		{Recovering, true, false},
		{Destroying, true, false},
		{Destroyed, false, true},
		{Error, false, false},
		{State(200), false, false},
	}
	for _, tc := range tests {
		if got := tc.state.IsOperation(); got != tc.operation {
			t.Errorf("%v.IsOperation() = %v, want %v", tc.state, got, tc.operation)
		}
		if got := tc.state.IsTerminal(); got != tc.terminal {
			t.Errorf("%v.IsTerminal() = %v, want %v", tc.state, got, tc.terminal)
		}
	}
	if n := len(tests) - 2; n != len(States()) {
		t.Errorf("kind table covers %d states, States() has %d", n, len(States()))
	}
}

func TestEventNames(t *testing.T) {
	want := []struct {
		event Event
		name  string
	}{
		{StartRequested, "START_REQUESTED"},
		{StopRequested, "STOP_REQUESTED"},
		{DestroyRequested, "DESTROY_REQUESTED"},
		{RecoveryRequested, "RECOVERY_REQUESTED"},
		{AutoscaleRequested, "AUTOSCALE_REQUESTED"},
		{ScaleUpRequested, "SCALE_UP_REQUESTED"},
		{ScaleDownRequested, "SCALE_DOWN_REQUESTED"},
		{AddNodeRequested, "ADD_NODE_REQUESTED"},
		{RemoveNodeRequested, "REMOVE_NODE_REQUESTED"},
		{UpgradeRequested, "UPGRADE_REQUESTED"},
		{OperationSucceeded, "OPERATION_SUCCEEDED"},
		{OperationFailed, "OPERATION_FAILED"},
		{CreateFailed, "CREATE_FAILED"},
		{FaultsDetected, "FAULTS_DETECTED"},
	}
	var wantEvents []Event
	for _, tc := range want {
		wantEvents = append(wantEvents, tc.event)
		if got := tc.event.String(); got != tc.name {
			t.Errorf("Event(%d).String() = %q, want %q", uint8(tc.event), got, tc.name)
		}
		got, err := ParseEvent(tc.name)
		if err != nil || got != tc.event {
			t.Errorf("ParseEvent(%q) = %v, %v; want %v, nil", tc.name, got, err, tc.event)
		}
	}
	if got := Events(); !slices.Equal(got, wantEvents) {
		t.Errorf("Events() = %v, want %v", got, wantEvents)
	}
}

func TestEventStringInvalid(t *testing.T) {
	tests := []struct {
		event Event
		want  string
	}{
		{EventUnspecified, "EVENT_UNSPECIFIED"},
		{Event(15), "Event(15)"},
		{Event(255), "Event(255)"},
	}
	for _, tc := range tests {
		if got := tc.event.String(); got != tc.want {
			t.Errorf("Event(%d).String() = %q, want %q", uint8(tc.event), got, tc.want)
		}
	}
}

func TestParseEventRejects(t *testing.T) {
	for _, in := range []string{"", "EVENT_UNSPECIFIED", "start_requested", "START", "Event(1)", "1", "RUNNING"} {
		got, err := ParseEvent(in)
		if !errors.Is(err, ErrUnknownEvent) {
			t.Errorf("ParseEvent(%q) error = %v, want one wrapping ErrUnknownEvent", in, err)
		}
		if got != EventUnspecified {
			t.Errorf("ParseEvent(%q) = %v, want EVENT_UNSPECIFIED", in, got)
		}
	}
}
