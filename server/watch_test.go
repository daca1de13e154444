package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// watchLine is a message of WatchClusters as the tests compare it.
func watchLine(m *clv1.WatchClustersResponse) string {
	s := m.GetKind().String()
	if c := m.GetCluster(); c != nil {
		s += " " + c.GetState().String()
	}
	if e := m.GetEvent(); e != nil {
		s += " " + e.GetEvent()
	}
	if p := m.GetProgress(); p != nil && m.GetKind() != clv1.WatchClustersResponse_CHANGED && m.GetKind() != clv1.WatchClustersResponse_CREATED && m.GetKind() != clv1.WatchClustersResponse_LEFT_FILTER {
		s += fmt.Sprintf(" %s %d/%d", p.GetStep(), p.GetStepsDone(), p.GetStepsTotal())
		if p.GetDone() {
			s += " done"
		}
	}
	return s
}

// watchStream is an open WatchClusters call.
type watchStream struct {
	stream grpc.ServerStreamingClient[clv1.WatchClustersResponse]
	cancel context.CancelFunc
}

func watch(t *testing.T, c clv1.ClusterLifecycleClient, ctx context.Context, req *clv1.WatchClustersRequest) *watchStream {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	s, err := c.WatchClusters(ctx, req)
	if err != nil {
		t.Fatalf("WatchClusters: %v", err)
	}
	return &watchStream{stream: s, cancel: cancel}
}

// next returns the next message but a BOOKMARK (which a slow test may
// see once a minute), failing the test on an error.
func (w *watchStream) next(t *testing.T) *clv1.WatchClustersResponse {
	t.Helper()
	for {
		m, err := w.stream.Recv()
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		if m.GetKind() != clv1.WatchClustersResponse_BOOKMARK {
			return m
		}
	}
}

// synced reads the initial state up to SYNCED and returns its clusters.
func (w *watchStream) synced(t *testing.T) []*clv1.Cluster {
	t.Helper()
	var out []*clv1.Cluster
	for {
		m := w.next(t)
		switch m.GetKind() {
		case clv1.WatchClustersResponse_EXISTING:
			out = append(out, m.GetCluster())
		case clv1.WatchClustersResponse_SYNCED:
			return out
		default:
			t.Fatalf("before SYNCED: %s", watchLine(m))
		}
	}
}

// until reads messages up to and including the first that done accepts.
func (w *watchStream) until(t *testing.T, done func(*clv1.WatchClustersResponse) bool) []*clv1.WatchClustersResponse {
	t.Helper()
	var out []*clv1.WatchClustersResponse
	for {
		m := w.next(t)
		out = append(out, m)
		if done(m) {
			return out
		}
	}
}

func endsOperation(name string) func(*clv1.WatchClustersResponse) bool {
	return func(m *clv1.WatchClustersResponse) bool {
		return m.GetKind() == clv1.WatchClustersResponse_OPERATION_ENDED && m.GetProgress().GetOperation() == name
	}
}

// A watcher sees a create in commit order: CREATED, the claim of STARTING,
// each step's progress, RUNNING, the operation's end. A watch resumed from
// the token of any message of it gets exactly the messages after that one,
// then the changes that follow; a token past the retention is refused.
func TestWatchClusters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		w := watch(t, h.clients.clusters, ctx, &clv1.WatchClustersRequest{})
		if got := w.synced(t); len(got) != 0 {
			t.Fatalf("initial state of an empty database: %d clusters", len(got))
		}
		op, err := h.clients.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
			DisplayName: "web", KubernetesVersion: "1.30.2", WorkerNodeCount: 2, ServiceOffering: "medium"}})
		if err != nil {
			t.Fatal(err)
		}
		msgs := w.until(t, endsOperation(op.GetName()))
		var lines []string
		for _, m := range msgs {
			lines = append(lines, watchLine(m))
		}
		got := strings.Join(lines, "\n")
		// The create's job records its first step, then claims STARTING.
		if !strings.HasPrefix(got, "CREATED CREATED CLUSTER_CREATED\nPROGRESS CREATED claim_starting 0/1\nCHANGED STARTING START_REQUESTED\nPROGRESS STARTING ") ||
			!strings.Contains(got, "\nPROGRESS STARTING join_node ") ||
			!strings.Contains(got, "\nCHANGED RUNNING OPERATION_SUCCEEDED\n") || !strings.HasSuffix(lines[len(lines)-1], " done") {
			t.Fatalf("watch of a create:\n  %s", strings.Join(lines, "\n  "))
		}
		last := int32(0)
		for _, m := range msgs {
			if m.GetKind() == clv1.WatchClustersResponse_PROGRESS {
				if m.GetProgress().GetStepsDone() < last {
					t.Errorf("progress went back: %s after %d", watchLine(m), last)
				}
				last = m.GetProgress().GetStepsDone()
			}
			if m.GetResumeToken() == "" || m.GetCluster().GetName() != msgs[0].GetCluster().GetName() {
				t.Errorf("message %s: token %q, cluster %s", watchLine(m), m.GetResumeToken(), m.GetCluster().GetName())
			}
		}
		cluster := msgs[0].GetCluster().GetName()

		// Resume from a message in the middle: the rest, once each, then
		// the next change (a stop's claim), nothing in between.
		mid := len(msgs) / 2
		r := watch(t, h.clients.clusters, ctx, &clv1.WatchClustersRequest{ResumeToken: msgs[mid].GetResumeToken()})
		for i := mid + 1; i < len(msgs); i++ {
			if m := r.next(t); watchLine(m) != lines[i] {
				t.Fatalf("resumed watch, message %d: %s; want %s", i, watchLine(m), lines[i])
			}
		}
		if _, err := h.clients.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: cluster}); err != nil {
			t.Fatal(err)
		}
		if m := r.next(t); watchLine(m) != "CHANGED STOPPING STOP_REQUESTED" {
			t.Errorf("resumed watch after its rest: %s; want the stop's claim", watchLine(m))
		}
		if m := w.next(t); watchLine(m) != "CHANGED STOPPING STOP_REQUESTED" {
			t.Errorf("first watch after the create: %s; want the stop's claim", watchLine(m))
		}

		// A watch of one cluster starts with its state.
		one := watch(t, h.clients.clusters, ctx, &clv1.WatchClustersRequest{Name: cluster})
		if got := one.synced(t); len(got) != 1 || got[0].GetName() != cluster {
			t.Errorf("initial state of a watch of %s: %v", cluster, got)
		}

		// Past the retention: every row purged, an old token is refused.
		if _, err := h.seed.PurgeChanges(ctx, time.Microsecond, 100000); err != nil {
			t.Fatal(err)
		}
		old, err := h.clients.clusters.WatchClusters(ctx, &clv1.WatchClustersRequest{ResumeToken: msgs[0].GetResumeToken()})
		if err == nil {
			_, err = old.Recv()
		}
		if code, reason, _ := errorInfo(t, err); code != codes.FailedPrecondition || reason != service.ReasonWatchExpired {
			t.Errorf("expired token: %v %s (%v); want FAILED_PRECONDITION %s", code, reason, err, service.ReasonWatchExpired)
		}
		bad, err := h.clients.clusters.WatchClusters(ctx, &clv1.WatchClustersRequest{ResumeToken: "not-a-token"})
		if err == nil {
			_, err = bad.Recv()
		}
		if code, _, _ := errorInfo(t, err); code != codes.InvalidArgument {
			t.Errorf("a token that does not decode: %v; want INVALID_ARGUMENT", err)
		}
	})
}

// WatchOperation sends the operation, then again at each change, and ends
// OK once it is done.
func TestWatchOperation(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		op, err := h.clients.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
			DisplayName: "web", KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium"}})
		if err != nil {
			t.Fatal(err)
		}
		s, err := h.clients.clusters.WatchOperation(ctx, &clv1.WatchOperationRequest{Name: op.GetName()})
		if err != nil {
			t.Fatal(err)
		}
		var got []*longrunningpb.Operation
		for {
			o, err := s.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("after %d messages: %v", len(got), err)
			}
			got = append(got, o)
		}
		if len(got) < 2 || !got[len(got)-1].GetDone() || got[len(got)-1].GetResponse() == nil {
			t.Fatalf("watch of a create: %d messages, last %v; want several, the last done with its cluster", len(got), got[len(got)-1])
		}
		last := int32(-1)
		for _, o := range got[:len(got)-1] {
			md := &clv1.OperationMetadata{}
			if err := o.GetMetadata().UnmarshalTo(md); err != nil {
				t.Fatal(err)
			}
			if o.GetDone() || md.GetStepsDone() < last {
				t.Errorf("message before the end: done %v, %d steps after %d", o.GetDone(), md.GetStepsDone(), last)
			}
			last = md.GetStepsDone()
		}
		// A done operation: itself, then the end of the stream.
		s, err = h.clients.clusters.WatchOperation(ctx, &clv1.WatchOperationRequest{Name: op.GetName()})
		if err != nil {
			t.Fatal(err)
		}
		if o, err := s.Recv(); err != nil || !o.GetDone() {
			t.Fatalf("watch of a done operation: %v, %v", o, err)
		}
		if _, err := s.Recv(); !errors.Is(err, io.EOF) {
			t.Errorf("after a done operation: %v; want the end of the stream", err)
		}
	})
}

// A change made through one server reaches a watcher on another server of
// the same database. On Galera the two servers use two nodes.
func TestWatchAcrossServers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		dsn := b.NewDSN(t)
		watchAcross(t, dsn, dsn)
	})
	t.Run("galera", func(t *testing.T) {
		g, ok := repotest.Galera(t)
		if !ok {
			return
		}
		nodes := g.NodeDSNs(t)
		watchAcross(t, nodes[0], nodes[1])
	})
}

// watchAcross runs two servers, on dsnA and dsnB (one database), with a
// watch on each, and races creates through both: each watch sees every
// cluster's history entries exactly once and in the order the history
// lists them, the first being its creation.
func watchAcross(t *testing.T, dsnA, dsnB string) {
	servers := []*harness{
		startOn(t, dsnA, func(c *Config) { c.ServerID = "watch-a" }),
		startOn(t, dsnB, func(c *Config) { c.ServerID = "watch-b" }),
	}
	ctx := tctx(t)
	var watches []*watchStream
	for _, h := range servers {
		w := watch(t, h.clients.clusters, ctx, &clv1.WatchClustersRequest{})
		w.synced(t)
		watches = append(watches, w)
	}
	const creates = 6
	ops := make([]*longrunningpb.Operation, creates)
	errs := make([]error, creates)
	var wg sync.WaitGroup
	for i := range creates {
		wg.Go(func() {
			// Sent again with its request id while the database answers
			// UNAVAILABLE, as clients do: on Galera, creates racing
			// through two nodes may lose every attempt at certification.
			req := &clv1.CreateClusterRequest{RequestId: uuid.NewString(), Cluster: &clv1.Cluster{
				DisplayName: fmt.Sprintf("web-%d", i), KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium"}}
			for range 10 {
				ops[i], errs[i] = servers[i%2].clients.clusters.CreateCluster(ctx, req)
				if status.Code(errs[i]) != codes.Unavailable {
					return
				}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		servers[i%2].wait(t, ops[i])
	}
	// A kubeconfig read writes a history entry too (KUBECONFIG_READ); a
	// stop after it ends the test's changes.
	first := &clv1.Cluster{}
	if err := servers[0].wait(t, ops[0]).GetResponse().UnmarshalTo(first); err != nil {
		t.Fatal(err)
	}
	if _, err := servers[0].clients.clusters.GetKubeconfig(ctx, &clv1.GetKubeconfigRequest{Name: first.GetName()}); err != nil {
		t.Fatal(err)
	}
	stop, err := servers[1].clients.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: first.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	servers[1].wait(t, stop)
	for wi, w := range watches {
		ended := map[string]bool{}
		seen := map[string][]string{} // cluster: its history entries, as the watch sent them
		for len(ended) < creates+1 {
			m := w.next(t)
			if e := m.GetEvent(); e != nil {
				seen[m.GetCluster().GetName()] = append(seen[m.GetCluster().GetName()], e.GetName()+" "+e.GetEvent())
			}
			if m.GetKind() == clv1.WatchClustersResponse_OPERATION_ENDED && m.GetProgress().GetDone() {
				ended[m.GetProgress().GetOperation()] = true
			}
		}
		if len(seen) != creates {
			t.Errorf("the watch on server %d saw %d clusters; want %d", wi, len(seen), creates)
		}
		for cluster, got := range seen {
			events, err := servers[0].clients.clusters.ListClusterEvents(ctx, &clv1.ListClusterEventsRequest{Parent: cluster, PageSize: 1000})
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, e := range events.GetEvents() {
				want = append(want, e.GetName()+" "+e.GetEvent())
			}
			if cluster == first.GetName() && !slices.ContainsFunc(got, func(e string) bool { return strings.HasSuffix(e, " KUBECONFIG_READ") }) {
				t.Errorf("the watch on server %d did not see the kubeconfig read of %s", wi, cluster)
			}
			if !slices.Equal(got, want) || !strings.HasSuffix(got[0], " CLUSTER_CREATED") {
				t.Errorf("the watch on server %d saw %s as\n  %s\nwant its history\n  %s", wi, cluster, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
			}
		}
	}
}

// With identities: a user's watch sees nothing of another account's
// clusters, and the other account's operation is NOT_FOUND to it, as
// GetOperation answers.
func TestWatchTenancy(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, withTokens(t))
		conn := bareConn(t, h)
		c := clv1.NewClusterLifecycleClient(conn)
		ctxA := metadata.AppendToOutgoingContext(tctx(t), "authorization", "Bearer "+tokenA)
		ctxB := metadata.AppendToOutgoingContext(tctx(t), "authorization", "Bearer "+tokenB)
		wb := watch(t, c, ctxB, &clv1.WatchClustersRequest{})
		wb.synced(t)
		opA, err := c.CreateCluster(ctxA, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
			DisplayName: "a", KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium"}})
		if err != nil {
			t.Fatal(err)
		}
		h.wait(t, opA)
		s, err := c.WatchOperation(ctxB, &clv1.WatchOperationRequest{Name: opA.GetName()})
		if err == nil {
			_, err = s.Recv()
		}
		if code, reason, _ := errorInfo(t, err); code != codes.NotFound || reason != service.ReasonNotFound {
			t.Errorf("team-b watching team-a's operation: %v %s; want NOT_FOUND", code, reason)
		}
		// team-b's own create is the first thing its watch sees.
		opB, err := c.CreateCluster(ctxB, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
			DisplayName: "b", KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range wb.until(t, endsOperation(opB.GetName())) {
			if m.GetCluster().GetAccount() != "team-b" {
				t.Errorf("team-b's watch saw %s of account %s", watchLine(m), m.GetCluster().GetAccount())
			}
		}
		// The admin sees both accounts' clusters.
		ctxAdmin := metadata.AppendToOutgoingContext(tctx(t), "authorization", "Bearer "+tokenAdmin)
		if got := watch(t, c, ctxAdmin, &clv1.WatchClustersRequest{}).synced(t); len(got) != 2 {
			t.Errorf("the admin's watch starts with %d clusters; want 2", len(got))
		}
		if got := watch(t, c, ctxA, &clv1.WatchClustersRequest{}).synced(t); len(got) != 1 || got[0].GetAccount() != "team-a" {
			t.Errorf("team-a's watch starts with %v; want its one cluster", got)
		}
	})
}

// A watcher that does not read falls behind its buffer and is ended
// RESOURCE_EXHAUSTED with its resume token, from which a new watch (on
// another server) gets the rest, once each.
func TestWatchSlowConsumerIsCutOff(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		dsn := b.NewDSN(t)
		h := startOn(t, dsn, func(c *Config) { c.WatchBuffer = 4 })
		ctx := tctx(t)
		// A fixed window, so a client that does not read stops the
		// server's sends (no dynamic window growing under it).
		conn, err := grpc.NewClient(h.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		w := watch(t, clv1.NewClusterLifecycleClient(conn), ctx, &clv1.WatchClustersRequest{})
		w.synced(t)
		c, j, err := h.seed.CreateCluster(ctx, repository.NewCluster{Account: "default", DisplayName: "busy",
			Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium"}},
			repository.NewJob{Kind: "create", ServerID: "test-server", ServerIncarnation: h.srv.self.Incarnation, Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		// Far more than the stream's window holds: the server's sends
		// block, the watcher's buffer fills.
		const steps = 1500
		for i := int32(1); i <= steps; i++ {
			if _, err := h.seed.RecordProgress(ctx, j.ID, repository.Progress{Step: "busy", StepsDone: i, StepsTotal: steps}); err != nil {
				t.Fatal(err)
			}
		}
		seen := map[int32]int{}
		var token string
		for {
			m, err := w.stream.Recv()
			if err != nil {
				st := status.Convert(err)
				for _, d := range st.Details() {
					if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == service.ReasonWatchTooSlow {
						token = info.GetMetadata()["resume_token"]
					}
				}
				if st.Code() != codes.ResourceExhausted || token == "" {
					t.Fatalf("a watcher that fell behind: %v; want RESOURCE_EXHAUSTED %s with a resume token", err, service.ReasonWatchTooSlow)
				}
				break
			}
			if m.GetKind() == clv1.WatchClustersResponse_PROGRESS {
				seen[m.GetProgress().GetStepsDone()]++
			}
		}
		if len(seen) >= steps {
			t.Fatalf("the slow watcher got all %d steps before it was cut off", steps)
		}
		// The client resumes on another server of the database, whose
		// watchers have the default buffer.
		h2 := startOn(t, dsn, func(c *Config) { c.ServerID = "test-server-2" })
		r := watch(t, h2.clients.clusters, ctx, &clv1.WatchClustersRequest{ResumeToken: token})
		for len(seen) < steps {
			m := r.next(t)
			if m.GetKind() == clv1.WatchClustersResponse_PROGRESS && m.GetCluster().GetName() == "clusters/"+c.ID {
				seen[m.GetProgress().GetStepsDone()]++
			}
		}
		for i := int32(1); i <= steps; i++ {
			if seen[i] != 1 {
				t.Errorf("step %d seen %d times across the cut; want once", i, seen[i])
			}
		}
	})
}

// The gateway serves a watch as newline-delimited JSON, one {"result": ...}
// a line; a server that shuts down ends its watches UNAVAILABLE.
func TestWatchRESTAndShutdown(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.base+"/v1/clusters:watch", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		lines := bufio.NewScanner(resp.Body)
		lines.Buffer(make([]byte, 1<<20), 1<<20)
		next := func() map[string]any {
			t.Helper()
			for {
				if !lines.Scan() {
					t.Fatalf("REST watch ended: %v", lines.Err())
				}
				var line struct {
					Result map[string]any `json:"result"`
				}
				if err := json.Unmarshal(lines.Bytes(), &line); err != nil || line.Result == nil {
					t.Fatalf("REST watch line %q: %v", lines.Text(), err)
				}
				if line.Result["kind"] != "BOOKMARK" {
					return line.Result
				}
			}
		}
		if m := next(); m["kind"] != "SYNCED" || m["resumeToken"] == "" {
			t.Fatalf("first line: %v; want SYNCED with a token", m)
		}
		if _, err := h.clients.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
			DisplayName: "web", KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium"}}); err != nil {
			t.Fatal(err)
		}
		if m := next(); m["kind"] != "CREATED" || m["cluster"].(map[string]any)["displayName"] != "web" {
			t.Errorf("line after the create: %v", m)
		}

		w := watch(t, h.clients.clusters, ctx, &clv1.WatchClustersRequest{})
		w.synced(t)
		if err := h.stop(); err != nil {
			t.Fatal(err)
		}
		for {
			_, err := w.stream.Recv()
			if err == nil {
				continue
			}
			if code, reason, _ := errorInfo(t, err); code != codes.Unavailable || reason != service.ReasonShuttingDown {
				t.Errorf("watch at shutdown: %v %s (%v); want UNAVAILABLE %s", code, reason, err, service.ReasonShuttingDown)
			}
			break
		}
	})
}

// An account may have --max-watches-per-account watches open on a server;
// one more is refused RESOURCE_EXHAUSTED (WATCH_LIMIT) until one ends.
func TestWatchLimitPerAccount(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, func(c *Config) { c.MaxWatchesPerAccount = 1 })
		ctx := tctx(t)
		first := watch(t, h.clients.clusters, ctx, &clv1.WatchClustersRequest{})
		first.synced(t)
		s, err := h.clients.clusters.WatchClusters(ctx, &clv1.WatchClustersRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		if code, reason, _ := errorInfo(t, err); code != codes.ResourceExhausted || reason != service.ReasonWatchLimit {
			t.Fatalf("a second watch: %v %s (%v); want RESOURCE_EXHAUSTED %s", code, reason, err, service.ReasonWatchLimit)
		}
		op, err := h.clients.clusters.WatchOperation(ctx, &clv1.WatchOperationRequest{Name: "operations/01a2365d-a3e4-7a93-86d1-f4a1252a6be0"})
		if err == nil {
			_, err = op.Recv()
		}
		if code, reason, _ := errorInfo(t, err); code != codes.ResourceExhausted || reason != service.ReasonWatchLimit {
			t.Errorf("a watch of an operation beside it: %v %s; want RESOURCE_EXHAUSTED %s", code, reason, service.ReasonWatchLimit)
		}
		// Once the first ends (its handler returns after the client
		// cancels), a watch is accepted again.
		first.cancel()
		for {
			s, err := h.clients.clusters.WatchClusters(ctx, &clv1.WatchClustersRequest{})
			if err == nil {
				var m *clv1.WatchClustersResponse
				if m, err = s.Recv(); err == nil && m.GetKind() == clv1.WatchClustersResponse_SYNCED {
					return
				}
			}
			if code, reason, _ := errorInfo(t, err); code != codes.ResourceExhausted || reason != service.ReasonWatchLimit {
				t.Fatalf("a watch after the first ended: %v", err)
			}
			select {
			case <-ctx.Done():
				t.Fatal("the first watch's place was never given back")
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
}

// A watch filtered on state is told when a transition takes a cluster out
// of it (LEFT_FILTER), and when one brings it back (CHANGED), and nothing
// in between.
func TestWatchFollowsAClusterOutOfItsFilter(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		c := h.create(t, "web", 1)
		w := watch(t, h.clients.clusters, ctx, &clv1.WatchClustersRequest{Filter: "state = RUNNING"})
		if got := w.synced(t); len(got) != 1 || got[0].GetName() != c.GetName() {
			t.Fatalf("a watch of RUNNING clusters starts with %v; want %s", got, c.GetName())
		}
		op, err := h.clients.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: c.GetName()})
		if err != nil {
			t.Fatal(err)
		}
		h.wait(t, op)
		op, err = h.clients.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: c.GetName()})
		if err != nil {
			t.Fatal(err)
		}
		h.wait(t, op)
		var got []string
		for _, m := range w.until(t, func(m *clv1.WatchClustersResponse) bool { return m.GetEvent().GetToState() == clv1.Cluster_RUNNING }) {
			if m.GetCluster().GetName() != c.GetName() {
				t.Errorf("message %s is of %s; want %s", watchLine(m), m.GetCluster().GetName(), c.GetName())
			}
			got = append(got, watchLine(m))
		}
		want := []string{"LEFT_FILTER STOPPING STOP_REQUESTED", "CHANGED RUNNING OPERATION_SUCCEEDED"}
		if !slices.Equal(got, want) {
			t.Errorf("a watch of RUNNING clusters over a stop and a start saw\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	})
}
