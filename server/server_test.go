package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// harness is a real clusterd server on free ports, a gRPC client connected
// to it over TCP, and a second Store on the same database to seed rows that
// the API cannot create yet.
type harness struct {
	srv     *Server
	conn    *grpc.ClientConn
	seed    *repository.Store
	base    string // http://host:port
	clients struct {
		clusters clv1.ClusterLifecycleClient
		ops      longrunningpb.OperationsClient
		sim      clv1.SimulatorClient
		catalog  clv1.CatalogClient
	}
	stop func() error
}

func start(t testing.TB, b repotest.Backend, mutate ...func(*Config)) *harness {
	t.Helper()
	return startOn(t, b.NewDSN(t), mutate...)
}

// startOn is start on the database dsn, which other servers may share.
func startOn(t testing.TB, dsn string, mutate ...func(*Config)) *harness {
	t.Helper()
	cfg := Config{
		Database: dsn, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ServerID: "test-server",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), HealthInterval: 50 * time.Millisecond,
		// The scanner passes once at start; tests of recovery ask for more.
		ScanInterval: time.Hour, ReconcileInterval: time.Hour,
		// A loaded machine delays heartbeats by seconds: with the default
		// 2.5 s a server may lose its lease and hand its operation off to
		// a scanner that never passes again. Tests of liveness set their
		// own.
		PeerTimeout: time.Minute,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	if (cfg.AuthTokens != "" || cfg.TLSClientCA != "") && cfg.SecretsKeyFile == "" {
		// With identities a server needs a key file of its own.
		cfg.SecretsKeyFile = testKeyFile(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	h := &harness{srv: srv, base: "http://" + srv.HTTPAddr()}
	h.stop = func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return errors.New("Serve did not return within 30s of cancellation")
		}
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			if err := h.stop(); err != nil {
				t.Errorf("shutdown: %v", err)
			}
		}
	})
	h.stop = func(inner func() error) func() error {
		return func() error { stopped = true; return inner() }
	}(h.stop)
	dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if cfg.AuthTokens != "" {
		// With identities configured, the harness's own client is the admin
		// of the test token file (accessTokens), so every helper sees all.
		dial = append(dial, grpc.WithUnaryInterceptor(withBearer(tokenAdmin)), grpc.WithStreamInterceptor(withBearerStream(tokenAdmin)))
	}
	h.conn, err = grpc.NewClient(srv.GRPCAddr(), dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.conn.Close() })
	h.clients.clusters = clv1.NewClusterLifecycleClient(h.conn)
	h.clients.ops = longrunningpb.NewOperationsClient(h.conn)
	h.clients.sim = clv1.NewSimulatorClient(h.conn)
	h.clients.catalog = clv1.NewCatalogClient(h.conn)
	h.seed, err = repository.Open(ctx, dsn, repository.WithServerID(cfg.ServerID))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.seed.Close() })
	return h
}

func forEachBackend(t *testing.T, fn func(t *testing.T, b repotest.Backend)) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) { fn(t, b) })
	}
}

// waitServing waits, within ctx, until the health service on conn reports
// service ("" for the whole server) SERVING. Health is a status that follows
// the database and the lease (healthProbe), so a test that needs SERVING
// waits for it rather than assume it at a given instant.
func waitServing(ctx context.Context, t testing.TB, conn grpc.ClientConnInterface, service string) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("watch health: %v", err)
	}
	for {
		resp, err := watch.Recv()
		if err != nil {
			t.Fatalf("health %q not SERVING: %v", service, err)
		}
		if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
	}
}

// tctx is a test's context: its deadline catches a hung test, and is no
// speed goal (a rig's whole test runs on one, and a loaded machine makes
// some take minutes).
func tctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// seedRunning creates a cluster through the repository and runs its create
// job to RUNNING, as the create operation will.
func (h *harness) seedRunning(t *testing.T, name string) repository.Cluster {
	t.Helper()
	ctx := tctx(t)
	c, j, err := h.seed.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: name,
		Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 2, ServiceOffering: "medium"}},
		// The server's own incarnation: the scanner must not take the job
		// for one of an earlier incarnation of test-server and fail it.
		repository.NewJob{Kind: "create", ServerID: "test-server", ServerIncarnation: h.srv.self.Incarnation, Deadline: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	c, err = h.seed.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.StartRequested, Operation: j.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.seed.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobSucceeded,
		Release: &repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.OperationSucceeded}}); err != nil {
		t.Fatal(err)
	}
	c, err = h.seed.GetCluster(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// errorInfo returns the status code and ErrorInfo reason of err, failing the
// test if the error carries no ErrorInfo (every clusterd error must).
func errorInfo(t *testing.T, err error) (codes.Code, string, *errdetails.BadRequest) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("not a gRPC status: %v", err)
	}
	var reason string
	var br *errdetails.BadRequest
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.Reason
			if d.Domain != "clusterd.dev" {
				t.Errorf("ErrorInfo domain = %q", d.Domain)
			}
		case *errdetails.BadRequest:
			br = d
		}
	}
	if reason == "" {
		t.Errorf("error %v carries no google.rpc.ErrorInfo", err)
	}
	return st.Code(), reason, br
}

// opErrorInfo returns the reason and metadata of a failed operation's
// ErrorInfo, failing the test if it carries none: every failed or cancelled
// operation's error must, as every RPC error does.
func opErrorInfo(t *testing.T, st *spb.Status) (string, map[string]string) {
	t.Helper()
	for _, d := range status.FromProto(st).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == service.Domain {
			return info.GetReason(), info.GetMetadata()
		}
	}
	t.Errorf("operation error %v carries no google.rpc.ErrorInfo of domain %s", st, service.Domain)
	return "", nil
}

func TestServicesAreListedByReflection(t *testing.T) {
	h := start(t, repotest.Backends(t)[0])
	stream, err := reflectionpb.NewServerReflectionClient(h.conn).ServerReflectionInfo(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		got = append(got, s.GetName())
	}
	for _, want := range []string{"clusterlifecycle.v1.ClusterLifecycle", "clusterlifecycle.v1.Simulator", "google.longrunning.Operations", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !slices.Contains(got, want) {
			t.Errorf("reflection lists %v; missing %s", got, want)
		}
	}
	// grpcurl -format-error resolves error details by name through reflection.
	for _, symbol := range []string{"google.rpc.ErrorInfo", "google.rpc.BadRequest"} {
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			t.Errorf("reflection cannot resolve %s: %s", symbol, e.GetErrorMessage())
		}
	}
}

func TestGetCluster(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		c := h.seedRunning(t, "web")
		got, err := h.clients.clusters.GetCluster(ctx, &clv1.GetClusterRequest{Name: "clusters/" + c.ID})
		if err != nil {
			t.Fatal(err)
		}
		if got.GetName() != "clusters/"+c.ID || got.GetState() != clv1.Cluster_RUNNING || got.GetDisplayName() != "web" ||
			got.GetWorkerNodeCount() != 2 || got.GetEtag() != fmt.Sprint(c.Version) || got.GetCurrentOperation() != "" || got.GetCreateTime() == nil {
			t.Errorf("GetCluster = %v", got)
		}

		_, err = h.clients.clusters.GetCluster(ctx, &clv1.GetClusterRequest{Name: "clusters/0192f0c1-7a3e-7000-8000-000000000000"})
		if code, reason, _ := errorInfo(t, err); code != codes.NotFound || reason != "NOT_FOUND" {
			t.Errorf("missing cluster: %v %s; want NOT_FOUND", code, reason)
		}
		for _, bad := range []string{"", "clusters/abc", "projects/x/clusters/" + c.ID, c.ID} {
			_, err = h.clients.clusters.GetCluster(ctx, &clv1.GetClusterRequest{Name: bad})
			code, reason, br := errorInfo(t, err)
			if code != codes.InvalidArgument || reason != "INVALID_ARGUMENT" || br == nil || br.GetFieldViolations()[0].GetField() != "name" {
				t.Errorf("name %q: %v %s %v; want INVALID_ARGUMENT with a violation on name", bad, code, reason, br)
			}
		}
	})
}

func TestListClustersPaginationAndFilter(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		var want []string
		for i := range 5 {
			want = append(want, "clusters/"+h.seedRunning(t, fmt.Sprintf("c%d", i)).ID)
		}
		if _, _, err := h.seed.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: "still-creating",
			Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium"}},
			repository.NewJob{Kind: "create", ServerID: "test-server", Deadline: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}

		var got []string
		token, pages := "", 0
		for {
			resp, err := h.clients.clusters.ListClusters(ctx, &clv1.ListClustersRequest{PageSize: 2, PageToken: token, Filter: "state = RUNNING"})
			if err != nil {
				t.Fatal(err)
			}
			pages++
			for _, c := range resp.GetClusters() {
				got = append(got, c.GetName())
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
			if pages > 10 {
				t.Fatal("pagination does not end")
			}
		}
		if !slices.Equal(got, want) || pages != 3 {
			t.Errorf("RUNNING clusters over %d pages = %v; want %v over 3 pages", pages, got, want)
		}

		all, err := h.clients.clusters.ListClusters(ctx, &clv1.ListClustersRequest{})
		if err != nil || len(all.GetClusters()) != 6 || all.GetNextPageToken() != "" {
			t.Errorf("unfiltered list = %d clusters, token %q, %v; want 6 and no token", len(all.GetClusters()), all.GetNextPageToken(), err)
		}
		one, err := h.clients.clusters.ListClusters(ctx, &clv1.ListClustersRequest{Filter: `display_name = "c3" AND state=RUNNING`})
		if err != nil || len(one.GetClusters()) != 1 || one.GetClusters()[0].GetName() != want[3] {
			t.Errorf("filter by name = %v, %v", one.GetClusters(), err)
		}

		first, err := h.clients.clusters.ListClusters(ctx, &clv1.ListClustersRequest{PageSize: 1, Filter: "state = RUNNING"})
		if err != nil {
			t.Fatal(err)
		}
		bad := []*clv1.ListClustersRequest{
			{PageSize: -1},
			{Filter: "colour = blue"},
			{Filter: "state = SIDEWAYS"},
			{Filter: "state > RUNNING"},
			{PageToken: "not-a-token"},
			{PageToken: first.GetNextPageToken(), Filter: "state = STOPPED"},
		}
		for _, req := range bad {
			_, err := h.clients.clusters.ListClusters(ctx, req)
			if code, reason, br := errorInfo(t, err); code != codes.InvalidArgument || reason != "INVALID_ARGUMENT" || br == nil {
				t.Errorf("ListClusters(%v): %v %s; want INVALID_ARGUMENT with BadRequest", req, code, reason)
			}
		}
	})
}

func TestListClusterEvents(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		c := h.seedRunning(t, "web")
		var got []string
		token := ""
		for {
			resp, err := h.clients.clusters.ListClusterEvents(ctx, &clv1.ListClusterEventsRequest{Parent: "clusters/" + c.ID, PageSize: 1, PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range resp.GetEvents() {
				got = append(got, fmt.Sprintf("%s:%s->%s", e.GetEvent(), e.GetFromState(), e.GetToState()))
				if e.GetOperation() == "" || e.GetServer() != "test-server" {
					t.Errorf("event %v lacks its operation or server", e)
				}
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
		want := []string{"CLUSTER_CREATED:STATE_UNSPECIFIED->CREATED", "START_REQUESTED:CREATED->STARTING", "OPERATION_SUCCEEDED:STARTING->RUNNING"}
		if !slices.Equal(got, want) {
			t.Errorf("history = %v; want %v", got, want)
		}
		_, err := h.clients.clusters.ListClusterEvents(ctx, &clv1.ListClusterEventsRequest{Parent: "clusters/0192f0c1-7a3e-7000-8000-000000000000"})
		if code, _, _ := errorInfo(t, err); code != codes.NotFound {
			t.Errorf("events of a missing cluster: %v; want NOT_FOUND", code)
		}
	})
}

func TestOperations(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		done := h.seedRunning(t, "done")
		c, j, err := h.seed.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: "busy",
			Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium"}},
			repository.NewJob{Kind: "create", ServerID: "test-server", StepsTotal: 7, Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.seed.RecordProgress(ctx, j.ID, repository.Progress{Step: "join_node", StepsDone: 3, StepsTotal: 7}); err != nil {
			t.Fatal(err)
		}

		op, err := h.clients.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: "operations/" + j.ID})
		if err != nil {
			t.Fatal(err)
		}
		md := &clv1.OperationMetadata{}
		if err := op.GetMetadata().UnmarshalTo(md); err != nil {
			t.Fatal(err)
		}
		if op.GetDone() || md.GetCluster() != "clusters/"+c.ID || md.GetVerb() != "create" || md.GetStep() != "join_node" ||
			md.GetStepsDone() != 3 || md.GetStepsTotal() != 7 || md.GetServer() != "test-server" {
			t.Errorf("running operation = %v, metadata %v", op, md)
		}

		list, err := h.clients.ops.ListOperations(ctx, &longrunningpb.ListOperationsRequest{Name: "operations", Filter: `cluster = "clusters/` + c.ID + `" AND done = false`})
		if err != nil || len(list.GetOperations()) != 1 || list.GetOperations()[0].GetName() != "operations/"+j.ID {
			t.Errorf("running operations of %s = %v, %v", c.ID, list.GetOperations(), err)
		}
		finished, err := h.clients.ops.ListOperations(ctx, &longrunningpb.ListOperationsRequest{Filter: "done = true"})
		if err != nil || len(finished.GetOperations()) != 1 || !finished.GetOperations()[0].GetDone() {
			t.Errorf("done operations = %v, %v; want the finished create of %s", finished.GetOperations(), err, done.ID)
		}
		for _, f := range []string{"cluster = clusters/x", "done = maybe", "kind = create"} {
			_, err := h.clients.ops.ListOperations(ctx, &longrunningpb.ListOperationsRequest{Filter: f})
			if code, _, _ := errorInfo(t, err); code != codes.InvalidArgument {
				t.Errorf("filter %q: %v; want INVALID_ARGUMENT", f, code)
			}
		}

		// WaitOperation returns the latest state at its timeout...
		waited, err := h.clients.ops.WaitOperation(ctx, &longrunningpb.WaitOperationRequest{Name: "operations/" + j.ID, Timeout: durationpb.New(100 * time.Millisecond)})
		if err != nil || waited.GetDone() {
			t.Errorf("wait with a short timeout = done %v, %v; want not done", waited.GetDone(), err)
		}
		// ...and as soon as the operation ends, even on another server.
		result := make(chan *longrunningpb.Operation, 1)
		go func() {
			op, err := h.clients.ops.WaitOperation(ctx, &longrunningpb.WaitOperationRequest{Name: "operations/" + j.ID, Timeout: durationpb.New(30 * time.Second)})
			if err != nil {
				t.Errorf("WaitOperation: %v", err)
			}
			result <- op
		}()
		if _, err := h.clients.ops.CancelOperation(ctx, &longrunningpb.CancelOperationRequest{Name: "operations/" + j.ID}); err != nil {
			t.Fatal(err)
		}
		if got, _ := h.seed.GetJob(ctx, j.ID); !got.CancelRequested {
			t.Error("CancelOperation did not request cancellation")
		}
		if _, err := h.seed.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobCancelled, Error: `{"code":1,"message":"operation cancelled"}`}); err != nil {
			t.Fatal(err)
		}
		select {
		case op := <-result:
			if !op.GetDone() || op.GetError().GetCode() != int32(codes.Canceled) {
				t.Errorf("waited operation = %v; want done with CANCELLED", op)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("WaitOperation did not return after the operation ended")
		}

		_, err = h.clients.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: "operations/0192f0c1-7a3e-7000-8000-000000000000"})
		if code, reason, _ := errorInfo(t, err); code != codes.NotFound || reason != "NOT_FOUND" {
			t.Errorf("missing operation: %v %s", code, reason)
		}
	})
}

func TestREST(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		c := h.seedRunning(t, "web")
		get := func(path string) (int, map[string]any) {
			t.Helper()
			resp, err := http.Get(h.base + path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatalf("GET %s: body is not JSON: %v", path, err)
			}
			return resp.StatusCode, body
		}
		code, body := get("/v1/clusters")
		if cs, _ := body["clusters"].([]any); code != 200 || len(cs) != 1 {
			t.Errorf("GET /v1/clusters = %d %v", code, body)
		}
		code, body = get("/v1/clusters/" + c.ID)
		if code != 200 || body["state"] != "RUNNING" || body["displayName"] != "web" {
			t.Errorf("GET cluster = %d %v", code, body)
		}
		code, body = get("/v1/clusters/0192f0c1-7a3e-7000-8000-000000000000")
		if code != 404 || !strings.Contains(fmt.Sprint(body["details"]), "NOT_FOUND") {
			t.Errorf("GET missing cluster = %d %v; want 404 with ErrorInfo", code, body)
		}
		code, body = get("/v1/clusters/" + c.ID + "/events")
		if evs, _ := body["events"].([]any); code != 200 || len(evs) != 3 {
			t.Errorf("GET events = %d %v", code, body)
		}
		code, body = get("/v1/operations?filter=done%3Dtrue")
		if ops, _ := body["operations"].([]any); code != 200 || len(ops) != 1 {
			t.Errorf("GET /v1/operations = %d %v", code, body)
		}
		code, body = get("/v1/clusters?pageSize=-3")
		if code != 400 {
			t.Errorf("negative page size over REST = %d %v; want 400", code, body)
		}
		waitServing(tctx(t), t, h.conn, "")
		code, body = get("/healthz")
		if code != 200 || body["status"] != "SERVING" {
			t.Errorf("/healthz = %d %v", code, body)
		}
		code, body = get("/openapi.json")
		if paths, _ := body["paths"].(map[string]any); code != 200 || body["swagger"] != "2.0" || paths["/v1/clusters"] == nil {
			t.Errorf("/openapi.json = %d, swagger %v, paths %d", code, body["swagger"], len(paths))
		}
	})
}

func TestHealthFollowsTheDatabase(t *testing.T) {
	h := start(t, repotest.Backends(t)[0])
	ctx := tctx(t)
	watch, err := healthpb.NewHealthClient(h.conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "clusterlifecycle.v1.ClusterLifecycle"})
	if err != nil {
		t.Fatal(err)
	}
	next := func() healthpb.HealthCheckResponse_ServingStatus {
		resp, err := watch.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatus()
	}
	// New sets SERVING (it has just pinged the database and acquired the
	// lease); wait for it rather than assume it.
	for st := next(); st != healthpb.HealthCheckResponse_SERVING; st = next() {
	}
	// The database goes away under the running server.
	_ = h.srv.store.Close()
	if st := next(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health with the database gone = %v; want NOT_SERVING", st)
	}
}

func TestGracefulShutdown(t *testing.T) {
	h := start(t, repotest.Backends(t)[0])
	if _, err := h.clients.clusters.ListClusters(tctx(t), &clv1.ListClustersRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := h.stop(); err != nil {
		t.Fatalf("Serve after cancellation: %v", err)
	}
	if _, err := http.Get(h.base + "/healthz"); err == nil {
		t.Error("HTTP still answers after shutdown")
	}
}

func TestConfigIsValidated(t *testing.T) {
	ctx := tctx(t)
	for _, cfg := range []Config{
		{Database: "", ServerID: "s"},
		{Database: "postgres://x", ServerID: "s", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		{Database: "sqlite:" + t.TempDir() + "/x.db", ServerID: "s", Infra: "aws", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		{Database: "sqlite:" + t.TempDir() + "/x.db", ServerID: "", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
	} {
		if s, err := New(ctx, cfg); err == nil {
			_ = s.shutdown()
			t.Errorf("New(%+v) accepted an invalid config", cfg)
		}
	}
}
