package service

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

func TestParseFilter(t *testing.T) {
	eq := func(f repository.Field, v any) repository.Filter { return repository.Compare(f, repository.Eq, v) }
	running, stopped := eq(repository.ClusterState, lifecycle.Running), eq(repository.ClusterState, lifecycle.Stopped)
	jan := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	good := []struct {
		in   string
		want repository.Filter
	}{
		{"", repository.Filter{}},
		{"state = RUNNING", running},
		{"state=running", running},
		{`state = "RUNNING"`, running},
		{"state = RUNNING OR state = STOPPED", repository.Or(running, stopped)},
		{"state != RUNNING", repository.Compare(repository.ClusterState, repository.Ne, lifecycle.Running)},
		{"NOT state = RUNNING", repository.Not(running)},
		{"-state = RUNNING", repository.Not(running)},
		{`display_name = "a AND b" AND state = STOPPED`, repository.And(eq(repository.ClusterDisplayName, "a AND b"), stopped)},
		{"display_name = web", eq(repository.ClusterDisplayName, "web")},
		{"display_name = 42", eq(repository.ClusterDisplayName, "42")},
		// AIP-160: OR binds tighter than AND.
		{"account = a AND state = RUNNING OR state = STOPPED", repository.And(eq(repository.ClusterAccount, "a"), repository.Or(running, stopped))},
		{"(account = a AND state = RUNNING) OR state = STOPPED", repository.Or(repository.And(eq(repository.ClusterAccount, "a"), running), stopped)},
		{`create_time > "2026-01-02T15:04:05Z"`, repository.Compare(repository.ClusterCreateTime, repository.Gt, jan)},
		{`update_time <= "2026-01-02T16:04:05+01:00"`, repository.Compare(repository.ClusterUpdateTime, repository.Le, jan.In(time.FixedZone("", 3600)))},
	}
	for _, tt := range good {
		got, err := parseFilter("filter", tt.in, clusterFilter)
		if err != nil || !sameFilter(got.Where, tt.want) {
			t.Errorf("parseFilter(%q) = %v, %v; want %v", tt.in, got.Where, err, tt.want)
		}
	}
	if got, _ := parseFilter("filter", "display_name = x AND NOT (state = RUNNING)", clusterFilter); !got.Uses["state"] || !got.Uses["display_name"] || got.Uses["account"] {
		t.Errorf("fields used = %v; want state and display_name", got.Uses)
	}
	if got, err := parseFilter("filter", `cluster = "clusters/0192F0C1-7A3E-7000-8000-000000000000" AND done = false AND verb = create`, operationFilter); err != nil ||
		!sameFilter(got.Where, repository.And(repository.And(eq(repository.JobCluster, "0192f0c1-7a3e-7000-8000-000000000000"), eq(repository.JobDone, false)), eq(repository.JobKind, "create"))) {
		t.Errorf("operation filter = %v, %v", got.Where, err)
	}

	// Each mistake names where it is and what is wrong.
	bad := []struct{ in, want string }{
		{"colour = red", `unknown field "colour" (fields: state, display_name, account, create_time, update_time) at column 1`},
		{"state = SIDEWAYS", `"SIDEWAYS" is not a state (CREATED, STARTING, RUNNING`},
		{"state = RUNNING OR state = SIDEWAYS", `"SIDEWAYS" is not a state (CREATED, STARTING, RUNNING, STOPPING, STOPPED, SCALING, SCALING_STOPPED_CLUSTER, UPGRADING, IMPORTING, REMOVING_NODES, ALERT, RECOVERING, DESTROYING, DESTROYED, ERROR) at column 28`},
		{"state > RUNNING", "state can only be compared with = or != (<, <=, >, >= apply to create_time and update_time) at column 1"},
		{"state", `"state" is not a condition`},
		{"state = ", "a value or a condition is missing at column 8"},
		{"state = RUNNING AND", "unexpected text after a complete condition (a dangling AND or OR?) at column 16"},
		{`state = "unterminated`, "at column 9"},
		{"(state = RUNNING", "at column"},
		{"state = RUNNING state = STOPPED", "conditions must be joined by AND or OR at column 17"},
		{"display_name = my-web", `at column 18 of "display_name = my-web" (quote values that contain "-"`},
		{"create_time > 2026-01-02", `unexpected - at column 19 of "create_time > 2026-01-02" (quote values`},
		{`create_time > "yesterday"`, `"yesterday" is not an RFC 3339 timestamp (quote it, e.g. create_time > "2026-01-02T15:04:05Z") at column 15`},
		{"display_name:web", `the has operator ":" is not supported`},
		{"a.b = 1", `"a.b" is not a field`},
		{"f(x) = 1", "is not a field"},
		{"  colour = red", "at column 3"},
	}
	for _, tt := range bad {
		_, err := parseFilter("filter", tt.in, clusterFilter)
		var inv *InvalidArgumentError
		if !errors.As(err, &inv) || inv.Violations[0].Field != "filter" || !strings.Contains(inv.Violations[0].Description, tt.want) {
			t.Errorf("parseFilter(%q) = %v; want an INVALID_ARGUMENT on filter saying %q", tt.in, err, tt.want)
		}
	}
	for _, tt := range []struct{ in, want string }{
		{"cluster = clusters/x", "at column"},
		{`cluster = "clusters/x"`, `"clusters/x" is not a cluster name`},
		{"done = maybe", `done must be true or false, not "maybe" at column 8`},
		{"state = RUNNING", `unknown field "state" (fields: cluster, done, verb, create_time, update_time)`},
	} {
		_, err := parseFilter("filter", tt.in, operationFilter)
		var inv *InvalidArgumentError
		if !errors.As(err, &inv) || !strings.Contains(inv.Violations[0].Description, tt.want) {
			t.Errorf("operations: parseFilter(%q) = %v; want %q", tt.in, err, tt.want)
		}
	}
}

// sameFilter compares filters by what they select (their SQL and arguments).
func sameFilter(a, b repository.Filter) bool { return a.String() == b.String() }

func TestPageTokens(t *testing.T) {
	tok := encodePageToken("id-7", "clusters?state = RUNNING", true)
	if after, err := decodePageToken("page_token", tok, "clusters?state = RUNNING"); err != nil || after != "id-7" {
		t.Errorf("round trip = %q, %v", after, err)
	}
	if _, err := decodePageToken("page_token", tok, "clusters?state = STOPPED"); err == nil {
		t.Error("a token was accepted for a different filter")
	}
	if _, err := decodePageToken("page_token", "garbage!", "q"); err == nil {
		t.Error("a malformed token was accepted")
	}
	if encodePageToken("id", "q", false) != "" {
		t.Error("last page has a next token")
	}
	for _, tt := range []struct {
		in   int32
		want int
		ok   bool
	}{{0, defaultPageSize, true}, {7, 7, true}, {5000, maxPageSize, true}, {-1, 0, false}} {
		got, err := pageSize("page_size", tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("pageSize(%d) = %d, %v", tt.in, got, err)
		}
	}
}
