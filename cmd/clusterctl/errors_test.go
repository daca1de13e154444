package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
)

// oneErrorLine checks that stderr is one line, "clusterctl: ...", holding
// want and none of the words a person should not see.
func oneErrorLine(t *testing.T, r result, want string, never ...string) {
	t.Helper()
	if strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "clusterctl: ") || !strings.Contains(r.stderr, want) {
		t.Errorf("stderr %q; want one line clusterctl: ... saying %q", r.stderr, want)
	}
	for _, n := range never {
		if strings.Contains(r.stderr, n) {
			t.Errorf("stderr %q says %q", r.stderr, n)
		}
	}
}

// TestErrorsInTheCommandLinesWords: every refusal is one line, with the
// reason once, flags instead of field paths, the cluster as the user named
// it and plain words instead of the state machine's events; a start of a
// RUNNING cluster and a stop of a STOPPED one succeed, saying so.
func TestErrorsInTheCommandLinesWords(t *testing.T) {
	addr := serve(t)
	env := map[string]string{"CLUSTERCTL_SERVER": addr}
	ok(t, env, "create", "demo", "--kubernetes-version", "1.30.2", "--workers", "1", "--offering", "medium", "--wait")

	r := ctl(t, env, "create", "Not_A_Label", "--kubernetes-version", "1.30.2", "--offering", "medium", "--workers", "0")
	if r.code != 1 {
		t.Errorf("invalid create: exit %d; want 1", r.code)
	}
	oneErrorLine(t, r, "clusterctl: invalid argument: NAME: must be a DNS label", "INVALID_ARGUMENT", "display_name", "worker_node_count")
	if !strings.Contains(r.stderr, "; --workers: must be at least 1, got 0") {
		t.Errorf("invalid create: %q; want --workers named", r.stderr)
	}
	r = ctl(t, env, "scale", "demo", "--autoscale-min", "3", "--autoscale-max", "4", "--workers", "1")
	oneErrorLine(t, r, "--autoscale-min", "min_size", "worker_node_count", "autoscaling")

	r = ok(t, env, "start", "demo")
	if strings.TrimSpace(r.stdout) != "Cluster demo is already RUNNING; nothing to do." || r.stderr != "" {
		t.Errorf("start of a RUNNING cluster: stdout %q, stderr %q", r.stdout, r.stderr)
	}
	ok(t, env, "stop", "demo", "--wait")
	if r := ok(t, env, "stop", "demo", "-o", "json"); clusterJSON(t, r.stdout).GetState().String() != "STOPPED" ||
		!strings.Contains(r.stderr, "cluster demo is already STOPPED") {
		t.Errorf("stop of a STOPPED cluster -o json: stdout %q, stderr %q; want the cluster, and a note", r.stdout, r.stderr)
	}
	r = refused(t, env, 1, "clusterctl: cluster demo is STOPPED; upgrade needs RUNNING or ALERT (INVALID_STATE_TRANSITION)\n", "upgrade", "demo", "1.30.5")
	oneErrorLine(t, r, "upgrade needs", "UPGRADE_REQUESTED", "clusters/", "FAILED_PRECONDITION")
	r = refused(t, env, 1, "clusterctl: cluster demo is STOPPED; add-nodes needs RUNNING or ALERT (INVALID_STATE_TRANSITION)\n", "add-nodes", "demo", "0192f0c1-7a3e-7000-8000-000000000001")
	oneErrorLine(t, r, "add-nodes", "ADD_NODE_REQUESTED")
	r = refused(t, env, 1, `clusterctl: invalid argument: MACHINE[0]: "machines/m1" is not a machines/{uuid} name`+"\n", "add-nodes", "demo", "m1")

	r = refused(t, env, 1, `clusterctl: no cluster named "nosuch" (NOT_FOUND)`, "get", "nosuch")
	oneErrorLine(t, r, "nosuch")
	r = refused(t, env, 1, "clusterctl: clusters/0192f0c1-7a3e-7000-8000-000000000000 not found\n", "get", "clusters/0192f0c1-7a3e-7000-8000-000000000000")
	oneErrorLine(t, r, "not found", "NOT_FOUND")
}

// TestUsageMistakes: an unknown command exits 2 suggesting the command it
// is likely a misspelling of; so does any other usage mistake, on one line.
func TestUsageMistakes(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"lsit"}, `unknown command "lsit" for "clusterctl"; did you mean list?`},
		{[]string{"dlete", "demo"}, `did you mean delete?`},
		{[]string{"operations", "lsit"}, `unknown command "lsit" for "clusterctl operations"; did you mean list or wait?`},
		{[]string{"frobnicate"}, `unknown command "frobnicate" for "clusterctl" (see 'clusterctl --help')`},
		{[]string{"get"}, "accepts 1 arg"},
		{[]string{"config"}, "name a subcommand: set-context"},
		{[]string{"list", "--colour"}, "unknown flag: --colour (see 'clusterctl list --help')"},
		{[]string{"list", "--server", "ftp://example.com"}, "want host:port or an http://, https://, grpc:// or grpcs:// URL"},
		{[]string{"list", "--server", "https://example.com/v1"}, "without a path"},
	} {
		r := ctl(t, nil, tt.args...)
		if r.code != 2 {
			t.Errorf("clusterctl %s: exit %d; want 2", strings.Join(tt.args, " "), r.code)
		}
		oneErrorLine(t, r, tt.want)
	}
	if r := ok(t, nil); !strings.Contains(r.stdout, "Usage:") {
		t.Errorf("clusterctl alone = %q; want its help", r.stdout)
	}
}

// TestServerAddress: --server is host:port or a URL whose scheme says the
// transport and whose port defaults to the scheme's.
func TestServerAddress(t *testing.T) {
	for _, tt := range []struct{ in, addr, scheme string }{
		{"127.0.0.1:9090", "127.0.0.1:9090", ""},
		{"http://10.0.0.1:9090", "10.0.0.1:9090", "http"},
		{"https://clusterd.example.com", "clusterd.example.com:443", "https"},
		{"https://clusterd.example.com/", "clusterd.example.com:443", "https"},
		{"grpc://[::1]", "[::1]:9090", "grpc"},
		{"GRPCS://h:1", "h:1", "grpcs"},
		{"http://h", "h:80", "http"},
	} {
		addr, scheme, err := serverAddress(tt.in)
		if err != nil || addr != tt.addr || scheme != tt.scheme {
			t.Errorf("serverAddress(%q) = %q, %q, %v; want %q, %q", tt.in, addr, scheme, err, tt.addr, tt.scheme)
		}
	}
	for _, bad := range []string{"ftp://h", "https://", "https://h/path", "http://h?x=1"} {
		if _, _, err := serverAddress(bad); err == nil {
			t.Errorf("serverAddress(%q) accepted it", bad)
		}
	}
}

// TestDescribe: the one place that words errors, on errors as the server
// sends them.
func TestDescribe(t *testing.T) {
	with := func(c codes.Code, msg string, details ...protoadapt.MessageV1) error {
		st, err := status.New(c, msg).WithDetails(details...)
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	info := func(reason string, md map[string]string) *errdetails.ErrorInfo {
		return &errdetails.ErrorInfo{Reason: reason, Domain: "clusterd.dev", Metadata: md}
	}
	root := &cobra.Command{Use: "clusterctl"}
	scale := &cobra.Command{Use: "scale"}
	root.AddCommand(scale)
	a := &app{server: "h:1", named: map[string]string{"clusters/0192": "web"}}
	a.timeout.d = defaultTimeout
	for _, tt := range []struct {
		name string
		err  error
		want string
	}{
		{"fields and the words of descriptions", with(codes.InvalidArgument, "invalid argument: ...", info("INVALID_ARGUMENT", nil),
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
				{Field: "autoscaling", Description: "worker_node_count 5 must be within [min_size 1, max_size 2]"},
				{Field: "remove_nodes", Description: "must name nodes of the cluster"}}}),
			"invalid argument: --autoscale-min/--autoscale-max: --workers 5 must be within [--autoscale-min 1, --autoscale-max 2]; --remove-node: must name nodes of the cluster"},
		{"a transition the server explains", with(codes.FailedPrecondition, "cluster clusters/0192 is in state STOPPED, which does not allow SCALE_UP_REQUESTED: a stopped cluster may change its offering, not its size",
			info("INVALID_STATE_TRANSITION", map[string]string{"cluster": "clusters/0192", "state": "STOPPED", "event": "SCALE_UP_REQUESTED"})),
			"cluster web is STOPPED: a stopped cluster may change its offering, not its size (INVALID_STATE_TRANSITION)"},
		{"a delete", with(codes.FailedPrecondition, "…",
			info("INVALID_STATE_TRANSITION", map[string]string{"cluster": "clusters/0192", "state": "STARTING", "event": "DESTROY_REQUESTED"})),
			"cluster web is STARTING; delete needs CREATED, RUNNING, STOPPED, ALERT, DESTROYING or ERROR (INVALID_STATE_TRANSITION)"},
		{"in progress", with(codes.Aborted, "another operation is in progress on clusters/0192: operations/9; please retry once it has finished",
			info("OPERATION_IN_PROGRESS", nil)),
			"another operation is in progress on web: operations/9; please retry once it has finished (OPERATION_IN_PROGRESS)"},
		{"no reason", status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp h:1: connect: connection refused\""),
			`cannot reach clusterd at h:1: connection error: desc = "transport: Error while dialing: dial tcp h:1: connect: connection refused"; is it serving gRPC there? set --server or CLUSTERCTL_SERVER (UNAVAILABLE)`},
		{"the client's deadline", status.Error(codes.DeadlineExceeded, "context deadline exceeded"),
			"no answer from h:1 within --timeout 30s; a longer --timeout waits longer"},
		{"a plaintext call to TLS", status.Error(codes.Unavailable, "connection error: desc = \"error reading server preface: http2: frame too large\""),
			"is it serving TLS? add --tls"},
	} {
		if got := a.describe(scale, tt.err); !strings.Contains(got, tt.want) {
			t.Errorf("%s: %q; want %q", tt.name, got, tt.want)
		}
	}
	if got := a.describe(scale, with(codes.Internal, "boom\nbang", info("INTERNAL", nil))); !regexp.MustCompile(`^boom bang \(INTERNAL\)$`).MatchString(got) {
		t.Errorf("a multi-line message: %q", got)
	}
}
