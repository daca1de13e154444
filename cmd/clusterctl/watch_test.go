package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/internal/syncbuf"
)

// background runs clusterctl until stop is called, which cancels it (as
// Ctrl-C does) and returns its exit code.
type background struct {
	stdout, stderr syncbuf.Buffer
	cancel         context.CancelFunc
	code           chan int
}

func startCtl(t *testing.T, env map[string]string, args ...string) *background {
	t.Helper()
	ctx, cancel := context.WithCancel(tctx(t))
	b := &background{cancel: cancel, code: make(chan int, 1)}
	go func() {
		b.code <- run(ctx, args, func(k string) string { return env[k] }, strings.NewReader(""), &b.stdout, &b.stderr)
	}()
	t.Cleanup(func() { b.stop(t) })
	return b
}

// stop cancels the run and waits (bounded) for its exit code.
func (b *background) stop(t *testing.T) int {
	t.Helper()
	b.cancel()
	select {
	case code, ok := <-b.code:
		if ok {
			close(b.code)
			return code
		}
		return 0
	case <-time.After(30 * time.Second):
		t.Fatal("clusterctl did not end within 30s of its cancel")
		return -1
	}
}

// waitFor waits (bounded) until the run's stdout matches re.
func (b *background) waitFor(t *testing.T, re string) {
	t.Helper()
	pattern := regexp.MustCompile(re)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if pattern.MatchString(b.stdout.String()) {
			return
		}
		time.Sleep(20 * time.Millisecond) // sampling the output, not synchronising
	}
	t.Fatalf("stdout never matched %q within 60s:\n%s\nstderr: %s", re, b.stdout.String(), b.stderr.String())
}

// TestOperationsWaitFollowsAHeldOperation: operations wait follows an
// operation held at a step to its end once released, with progress lines
// and the resulting cluster.
func TestOperationsWaitFollowsAHeldOperation(t *testing.T) {
	addr := serve(t)
	env := map[string]string{"CLUSTERCTL_SERVER": addr}
	s := sim(t, addr)
	hold(t, s)
	r := ok(t, env, "create", "demo", "--kubernetes-version", "1.30.2", "--workers", "1", "--offering", "medium")
	op := operationPattern.FindString(r.stdout + r.stderr)
	if op == "" {
		t.Fatalf("create printed no operation:\n%s\n%s", r.stdout, r.stderr)
	}
	waitHeld(t, s)
	w := startCtl(t, env, "operations", "wait", op)
	release(t, s)
	w.waitFor(t, `(?m)^State:\s+RUNNING$`)
	if code := w.stop(t); code != 0 {
		t.Errorf("operations wait: exit %d\nstderr: %s", code, w.stderr.String())
	}
	if !regexp.MustCompile(`(?m)^` + op + ` create: succeeded after \d+s$`).MatchString(w.stderr.String()) {
		t.Errorf("operations wait progress = %q; want lines ending in succeeded", w.stderr.String())
	}
}

// TestGetWatchSeesStopThenStart: get -w prints the cluster, then a line per
// change: the stop's and the start's transitions, with their states.
func TestGetWatchSeesStopThenStart(t *testing.T) {
	addr := serve(t)
	env := map[string]string{"CLUSTERCTL_SERVER": addr}
	ok(t, env, "create", "demo", "--kubernetes-version", "1.30.2", "--workers", "1", "--offering", "medium", "--wait")
	w := startCtl(t, env, "get", "demo", "-w")
	w.waitFor(t, `(?m)^State:\s+RUNNING$`)
	ok(t, env, "stop", "demo", "--wait")
	w.waitFor(t, `(?m)^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+  (CHANGED|OPERATION_ENDED)  STOPPED\b`)
	ok(t, env, "start", "demo", "--wait")
	w.waitFor(t, `(?m)  STOPPED .*\n(.*\n)*.*  STARTING\b(.*\n)*.*  RUNNING\b`)
	if code := w.stop(t); code != 0 {
		t.Errorf("get -w ended %d (want 0 on Ctrl-C)\nstderr: %s", code, w.stderr.String())
	}
	out := w.stdout.String()
	t.Logf("get -w printed:\n%s", out)
	if !regexp.MustCompile(`(?m)  PROGRESS  \w+  stop \S+ \d+/\d+`).MatchString(out) {
		t.Errorf("get -w showed no step n/m of the stop:\n%s", out)
	}
}

// TestListWatchJSONIsOneObjectALine: list -w -o json prints every message
// as one JSON line, the existing cluster first.
func TestListWatchJSONIsOneObjectALine(t *testing.T) {
	addr := serve(t)
	env := map[string]string{"CLUSTERCTL_SERVER": addr}
	ok(t, env, "create", "demo", "--kubernetes-version", "1.30.2", "--workers", "1", "--offering", "medium", "--wait")
	w := startCtl(t, env, "list", "-w", "-o", "json")
	w.waitFor(t, `"kind":\s*"SYNCED"`)
	ok(t, env, "stop", "demo", "--wait")
	w.waitFor(t, `"kind":\s*"OPERATION_ENDED"`)
	w.stop(t)
	lines := strings.Split(strings.TrimSpace(w.stdout.String()), "\n")
	if !strings.Contains(lines[0], `"EXISTING"`) || !strings.Contains(lines[0], `"displayName":"demo"`) {
		t.Errorf("first line = %s; want the existing cluster", lines[0])
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "{") || !strings.HasSuffix(l, "}") {
			t.Errorf("line %q is not one JSON object", l)
		}
	}
}

// TestEventsFollowSeesANewEvent: events -f prints the history, then the
// entries a stop writes.
func TestEventsFollowSeesANewEvent(t *testing.T) {
	addr := serve(t)
	env := map[string]string{"CLUSTERCTL_SERVER": addr}
	ok(t, env, "create", "demo", "--kubernetes-version", "1.30.2", "--workers", "1", "--offering", "medium", "--wait")
	w := startCtl(t, env, "events", "demo", "-f")
	w.waitFor(t, `(?m)^TIME\s+EVENT`)
	before := w.stdout.String()
	ok(t, env, "stop", "demo", "--wait")
	w.waitFor(t, `(?m)^\d{4}-\d\d-\d\d .*  RUNNING  STOPPING  operations/`)
	w.waitFor(t, `  STOPPING  STOPPED  `)
	if code := w.stop(t); code != 0 {
		t.Errorf("events -f ended %d\nstderr: %s", code, w.stderr.String())
	}
	after := strings.TrimPrefix(w.stdout.String(), before)
	t.Logf("events -f printed:\n%s", w.stdout.String())
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(after), "\n") {
		if seen[l] {
			t.Errorf("events -f printed %q twice", l)
		}
		seen[l] = true
	}
}

// fakeStream plays messages, then an error.
type fakeStream struct {
	msgs []*clv1.WatchClustersResponse
	err  error
}

func (f *fakeStream) Recv() (*clv1.WatchClustersResponse, error) {
	if len(f.msgs) == 0 {
		return nil, f.err
	}
	m := f.msgs[0]
	f.msgs = f.msgs[1:]
	return m, nil
}

func withInfo(t *testing.T, c codes.Code, reason string, md map[string]string) error {
	t.Helper()
	st, err := status.New(c, reason).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: "clusterd.dev", Metadata: md})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// TestWatchLoopResumes: a stream that breaks UNAVAILABLE is opened again
// after the last token handled, one ended WATCH_TOO_SLOW after its
// metadata's token, one refused WATCH_EXPIRED is started afresh (saying
// so), and any other error ends the watch.
func TestWatchLoopResumes(t *testing.T) {
	msg := func(kind clv1.WatchClustersResponse_Kind, token string) *clv1.WatchClustersResponse {
		return &clv1.WatchClustersResponse{Kind: kind, ResumeToken: token, Cluster: &clv1.Cluster{DisplayName: "demo", State: clv1.Cluster_RUNNING}}
	}
	streams := []*fakeStream{
		{msgs: []*clv1.WatchClustersResponse{msg(clv1.WatchClustersResponse_EXISTING, "t0"), msg(clv1.WatchClustersResponse_SYNCED, "t1"), msg(clv1.WatchClustersResponse_CHANGED, "t2")},
			err: status.Error(codes.Unavailable, "connection reset")},
		{msgs: []*clv1.WatchClustersResponse{msg(clv1.WatchClustersResponse_CHANGED, "t3")},
			err: withInfo(t, codes.ResourceExhausted, "WATCH_TOO_SLOW", map[string]string{"resume_token": "t4"})},
		{err: withInfo(t, codes.FailedPrecondition, "WATCH_EXPIRED", nil)},
		{msgs: []*clv1.WatchClustersResponse{msg(clv1.WatchClustersResponse_EXISTING, "u0"), msg(clv1.WatchClustersResponse_SYNCED, "u1")},
			err: withInfo(t, codes.PermissionDenied, "CREDENTIALS_REVOKED", nil)},
	}
	var tokens []string
	open := func(_ context.Context, token string) (watchStream, error) {
		tokens = append(tokens, token)
		if len(streams) == 0 {
			return nil, errors.New("opened once too often")
		}
		s := streams[0]
		streams = streams[1:]
		return s, nil
	}
	var stdout, stderr bytes.Buffer
	a := &app{stdout: &stdout, stderr: &stderr, output: "table", now: time.Now}
	err := a.watchClusters(tctx(t), open, true)
	if client := status.Code(err); client != codes.PermissionDenied {
		t.Errorf("watch ended with %v; want the PERMISSION_DENIED that no resume covers", err)
	}
	if got, want := strings.Join(tokens, ","), ",t2,t4,"; got != want {
		t.Errorf("opened with tokens %q; want %q", got, want)
	}
	if !strings.Contains(stderr.String(), "restarted it with a fresh watch") {
		t.Errorf("stderr = %q; want the restart said", stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var changes []string
	for _, l := range lines {
		if f := strings.Split(l, "  "); len(f) > 2 && regexp.MustCompile(`^\d{4}-`).MatchString(f[0]) {
			changes = append(changes, f[1])
		}
	}
	if got, want := strings.Join(changes, ","), "CHANGED,CHANGED,EXISTING"; got != want {
		t.Errorf("change lines' kinds = %s; want %s (each once, the fresh watch's state after the restart)\n%s", got, want, stdout.String())
	}
	if !regexp.MustCompile(`(?m)^Display name:\s+demo$`).MatchString(stdout.String()) {
		t.Errorf("no cluster printed first:\n%s", stdout.String())
	}
}

// oldOperations is an older server's Operations: WaitOperation answers the
// operation done on the second call.
type oldOperations struct {
	longrunningpb.UnimplementedOperationsServer
	mu    sync.Mutex
	calls int
}

func (o *oldOperations) WaitOperation(_ context.Context, req *longrunningpb.WaitOperationRequest) (*longrunningpb.Operation, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls++
	return &longrunningpb.Operation{Name: req.GetName(), Done: o.calls > 1}, nil
}

// TestWaitFallsBackToPollingOnAnOlderServer: a server without
// WatchOperation (Unimplemented) is polled with WaitOperation, as before.
func TestWaitFallsBackToPollingOnAnOlderServer(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	clv1.RegisterClusterLifecycleServer(srv, clv1.UnimplementedClusterLifecycleServer{})
	ops := &oldOperations{}
	longrunningpb.RegisterOperationsServer(srv, ops)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
	c := sim(t, lis.Addr().String())
	done, err := waitOperation(tctx(t), c, &longrunningpb.Operation{Name: "operations/old"}, nil)
	if err != nil || !done.GetDone() {
		t.Fatalf("waitOperation = %v, %v; want the operation done by polling", done, err)
	}
	ops.mu.Lock()
	defer ops.mu.Unlock()
	if ops.calls != 2 {
		t.Errorf("WaitOperation called %d times; want 2", ops.calls)
	}
}
