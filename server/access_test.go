package server

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// The test token file: two users in two accounts, and an admin.
const (
	tokenA     = "token-of-team-a"
	tokenB     = "token-of-team-b"
	tokenAdmin = "token-of-the-ops-admin"
)

func tokenLine(token, account, role string) string {
	sum := sha256.Sum256([]byte(token))
	return fmt.Sprintf("sha256:%s %s %s\n", hex.EncodeToString(sum[:]), account, role)
}

// withTokens serves with the test token file (team-a and team-b users, the
// ops admin).
func withTokens(t *testing.T) func(*Config) {
	path := filepath.Join(t.TempDir(), "tokens")
	file := "# test identities\n" + tokenLine(tokenA, "team-a", "user") + tokenLine(tokenB, "team-b", "user") + tokenLine(tokenAdmin, "ops", "admin")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	return func(c *Config) { c.AuthTokens = path }
}

// withBearer sends a token with every call that carries none of its own.
func withBearer(token string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(bearerContext(ctx, token), method, req, reply, cc, opts...)
	}
}

func withBearerStream(token string) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(bearerContext(ctx, token), desc, cc, method, opts...)
	}
}

func bearerContext(ctx context.Context, token string) context.Context {
	if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get("authorization")) > 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// who is a caller of the access matrix, by the headers it sends.
type who struct {
	name    string
	headers []string // pairs; gRPC metadata and HTTP headers alike
}

var (
	owner = who{"owner", []string{"authorization", "Bearer " + tokenA}}
	// other also names team-a in the account header: a user's header must
	// be ignored.
	other      = who{"other account", []string{"authorization", "Bearer " + tokenB, "x-clusterd-account", "team-a"}}
	anonymous  = who{"no credentials", []string{"x-clusterd-account", "team-a"}}
	wrongToken = who{"wrong token", []string{"authorization", "Bearer not-a-known-token"}}
	admin      = who{"admin", []string{"authorization", "Bearer " + tokenAdmin}}
	everyone   = []who{other, anonymous, wrongToken, owner, admin}
)

// fixture is a RUNNING cluster of team-a with what the calls name.
type fixture struct {
	cluster string // clusters/{uuid}
	op      string // its create operation
	worker  string // machines/{uuid} of a worker node
	free    string // machines/{uuid} of a free external machine
}

// grpcClients are clients of one bare connection (no default credentials).
type grpcClients struct {
	clusters clv1.ClusterLifecycleClient
	ops      longrunningpb.OperationsClient
	sim      clv1.SimulatorClient
}

// accessCase is one RPC of the matrix: how to call it over gRPC and REST,
// and what the owner and the admin get (see want for the others).
type accessCase struct {
	rpc string
	// mutates: an accepted call by the owner or the admin changes the
	// cluster, so each of them gets a fresh fixture.
	mutates bool
	grpc    func(ctx context.Context, c grpcClients, fx fixture, n int) (any, error)
	// rest is the REST request (method, path, JSON body); nil when the RPC
	// has no REST binding.
	rest          func(fx fixture, n int) (string, string, string)
	owner, admin  codes.Code
	listsClusters bool // the answer is a list that must show team-a only to whom may see it
	listsOps      bool
	simulator     bool
	// stream: a server-streaming RPC, read until it has said what the
	// caller may see (a watch until SYNCED, an operation's first message).
	stream bool
}

func accessCases() []accessCase {
	name := func(n int) string { return fmt.Sprintf("acc-%d", n) }
	createBody := func(n int) string {
		return fmt.Sprintf(`{"displayName":%q,"kubernetesVersion":"1.30.2","workerNodeCount":1,"serviceOffering":"medium"}`, name(n))
	}
	return []accessCase{
		{rpc: "CreateCluster", owner: codes.OK, admin: codes.OK,
			grpc: func(ctx context.Context, c grpcClients, _ fixture, n int) (any, error) {
				return c.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
					DisplayName: name(n), KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium"}})
			},
			rest: func(_ fixture, n int) (string, string, string) { return "POST", "/v1/clusters", createBody(n) }},
		{rpc: "GetCluster", owner: codes.OK, admin: codes.OK,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.clusters.GetCluster(ctx, &clv1.GetClusterRequest{Name: fx.cluster})
			},
			rest: func(fx fixture, _ int) (string, string, string) { return "GET", "/v1/" + fx.cluster, "" }},
		{rpc: "ListClusters", owner: codes.OK, admin: codes.OK, listsClusters: true,
			grpc: func(ctx context.Context, c grpcClients, _ fixture, _ int) (any, error) {
				return c.clusters.ListClusters(ctx, &clv1.ListClustersRequest{PageSize: 1000})
			},
			rest: func(fixture, int) (string, string, string) { return "GET", "/v1/clusters?pageSize=1000", "" }},
		{rpc: "ListClusters filtered on team-a", owner: codes.OK, admin: codes.OK, listsClusters: true,
			grpc: func(ctx context.Context, c grpcClients, _ fixture, _ int) (any, error) {
				return c.clusters.ListClusters(ctx, &clv1.ListClustersRequest{PageSize: 1000, Filter: `account = "team-a"`})
			},
			rest: func(fixture, int) (string, string, string) {
				return "GET", "/v1/clusters?pageSize=1000&filter=account%20%3D%20%22team-a%22", ""
			}},
		// The fixture is RUNNING: the owner and the admin get past the
		// account check to the state machine's refusal.
		{rpc: "StartCluster", owner: codes.FailedPrecondition, admin: codes.FailedPrecondition,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: fx.cluster})
			},
			rest: func(fx fixture, _ int) (string, string, string) { return "POST", "/v1/" + fx.cluster + ":start", "{}" }},
		{rpc: "StopCluster", mutates: true, owner: codes.OK, admin: codes.OK,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: fx.cluster})
			},
			rest: func(fx fixture, _ int) (string, string, string) { return "POST", "/v1/" + fx.cluster + ":stop", "{}" }},
		{rpc: "ScaleCluster", mutates: true, owner: codes.OK, admin: codes.OK,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.clusters.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: fx.cluster, WorkerNodeCount: new(int32(3))})
			},
			rest: func(fx fixture, _ int) (string, string, string) {
				return "POST", "/v1/" + fx.cluster + ":scale", `{"workerNodeCount":3}`
			}},
		{rpc: "UpgradeCluster", mutates: true, owner: codes.OK, admin: codes.OK,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.clusters.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: fx.cluster, KubernetesVersion: "1.30.5"})
			},
			rest: func(fx fixture, _ int) (string, string, string) {
				return "POST", "/v1/" + fx.cluster + ":upgrade", `{"kubernetesVersion":"1.30.5"}`
			}},
		{rpc: "AddNodes", mutates: true, owner: codes.OK, admin: codes.OK,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.clusters.AddNodes(ctx, &clv1.AddNodesRequest{Name: fx.cluster, Machines: []string{fx.free}})
			},
			rest: func(fx fixture, _ int) (string, string, string) {
				return "POST", "/v1/" + fx.cluster + ":addNodes", fmt.Sprintf(`{"machines":[%q]}`, fx.free)
			}},
		{rpc: "RemoveNodes", mutates: true, owner: codes.OK, admin: codes.OK,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.clusters.RemoveNodes(ctx, &clv1.RemoveNodesRequest{Name: fx.cluster, Nodes: []string{fx.worker}})
			},
			rest: func(fx fixture, _ int) (string, string, string) {
				return "POST", "/v1/" + fx.cluster + ":removeNodes", fmt.Sprintf(`{"nodes":[%q]}`, fx.worker)
			}},
		{rpc: "DeleteCluster", mutates: true, owner: codes.OK, admin: codes.OK,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.clusters.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: fx.cluster})
			},
			rest: func(fx fixture, _ int) (string, string, string) { return "DELETE", "/v1/" + fx.cluster, "" }},
		{rpc: "ListClusterEvents", owner: codes.OK, admin: codes.OK,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.clusters.ListClusterEvents(ctx, &clv1.ListClusterEventsRequest{Parent: fx.cluster})
			},
			rest: func(fx fixture, _ int) (string, string, string) { return "GET", "/v1/" + fx.cluster + "/events", "" }},
		{rpc: "GetKubeconfig", owner: codes.OK, admin: codes.OK,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.clusters.GetKubeconfig(ctx, &clv1.GetKubeconfigRequest{Name: fx.cluster})
			},
			rest: func(fx fixture, _ int) (string, string, string) {
				return "GET", "/v1/" + fx.cluster + ":kubeconfig", ""
			}},
		{rpc: "WatchClusters", owner: codes.OK, admin: codes.OK, listsClusters: true, stream: true,
			grpc: func(ctx context.Context, c grpcClients, _ fixture, _ int) (any, error) {
				return watchExisting(ctx, c, &clv1.WatchClustersRequest{})
			},
			rest: func(fixture, int) (string, string, string) { return "GET", "/v1/clusters:watch", "" }},
		{rpc: "WatchClusters of the cluster", owner: codes.OK, admin: codes.OK, stream: true,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return watchExisting(ctx, c, &clv1.WatchClustersRequest{Name: fx.cluster})
			},
			rest: func(fx fixture, _ int) (string, string, string) {
				return "GET", "/v1/clusters:watch?name=" + fx.cluster, ""
			}},
		{rpc: "WatchOperation", owner: codes.OK, admin: codes.OK, stream: true,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				s, err := c.clusters.WatchOperation(ctx, &clv1.WatchOperationRequest{Name: fx.op})
				if err != nil {
					return nil, err
				}
				return s.Recv()
			},
			rest: func(fx fixture, _ int) (string, string, string) { return "GET", "/v1/" + fx.op + ":watch", "" }},
		{rpc: "GetOperation", owner: codes.OK, admin: codes.OK,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: fx.op})
			},
			rest: func(fx fixture, _ int) (string, string, string) { return "GET", "/v1/" + fx.op, "" }},
		{rpc: "ListOperations", owner: codes.OK, admin: codes.OK, listsOps: true,
			grpc: func(ctx context.Context, c grpcClients, _ fixture, _ int) (any, error) {
				return c.ops.ListOperations(ctx, &longrunningpb.ListOperationsRequest{PageSize: 1000})
			},
			rest: func(fixture, int) (string, string, string) { return "GET", "/v1/operations?pageSize=1000", "" }},
		{rpc: "ListOperations of the cluster", owner: codes.OK, admin: codes.OK, listsOps: true,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.ops.ListOperations(ctx, &longrunningpb.ListOperationsRequest{PageSize: 1000, Filter: fmt.Sprintf("cluster = %q", fx.cluster)})
			},
			rest: func(fx fixture, _ int) (string, string, string) {
				return "GET", "/v1/operations?pageSize=1000&filter=" + strings.ReplaceAll(fmt.Sprintf("cluster = %q", fx.cluster), " ", "%20"), ""
			}},
		{rpc: "WaitOperation", owner: codes.OK, admin: codes.OK,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.ops.WaitOperation(ctx, &longrunningpb.WaitOperationRequest{Name: fx.op, Timeout: durationpb.New(time.Second)})
			},
			rest: func(fx fixture, _ int) (string, string, string) {
				return "POST", "/v1/" + fx.op + ":wait", `{"timeout":"1s"}`
			}},
		{rpc: "CancelOperation", owner: codes.OK, admin: codes.OK,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.ops.CancelOperation(ctx, &longrunningpb.CancelOperationRequest{Name: fx.op})
			},
			rest: func(fx fixture, _ int) (string, string, string) { return "POST", "/v1/" + fx.op + ":cancel", "{}" }},
		{rpc: "DeleteOperation", owner: codes.Unimplemented, admin: codes.Unimplemented,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.ops.DeleteOperation(ctx, &longrunningpb.DeleteOperationRequest{Name: fx.op})
			},
			rest: func(fx fixture, _ int) (string, string, string) { return "DELETE", "/v1/" + fx.op, "" }},
		{rpc: "Simulator/ListMachines", simulator: true,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.sim.ListMachines(ctx, &clv1.ListMachinesRequest{Cluster: fx.cluster})
			},
			rest: func(fx fixture, _ int) (string, string, string) {
				return "GET", "/v1/simulator/machines?cluster=" + fx.cluster, ""
			}},
		{rpc: "Simulator/CreateMachine", simulator: true,
			grpc: func(ctx context.Context, c grpcClients, _ fixture, _ int) (any, error) {
				return c.sim.CreateMachine(ctx, &clv1.CreateMachineRequest{Role: clv1.Node_EXTERNAL})
			},
			rest: func(fixture, int) (string, string, string) {
				return "POST", "/v1/simulator/machines", `{"role":"EXTERNAL"}`
			}},
		{rpc: "Simulator/SetMachinePower", simulator: true,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.sim.SetMachinePower(ctx, &clv1.SetMachinePowerRequest{Name: fx.worker, Power: clv1.Node_RUNNING})
			},
			rest: func(fx fixture, _ int) (string, string, string) {
				return "POST", "/v1/simulator/" + fx.worker + ":setPower", `{"power":"RUNNING"}`
			}},
		{rpc: "Simulator/InjectFault", simulator: true,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.sim.InjectFault(ctx, &clv1.InjectFaultRequest{Fault: &clv1.Fault{Step: "wait_api", Mode: clv1.Fault_DELAY,
					Delay: durationpb.New(time.Millisecond), Cluster: fx.cluster, Count: 1}})
			},
			rest: func(fx fixture, _ int) (string, string, string) {
				return "POST", "/v1/simulator/faults", fmt.Sprintf(`{"step":"wait_api","mode":"DELAY","delay":"0.001s","cluster":%q,"count":1}`, fx.cluster)
			}},
		{rpc: "Simulator/ListHeld", simulator: true,
			grpc: func(ctx context.Context, c grpcClients, _ fixture, _ int) (any, error) {
				return c.sim.ListHeld(ctx, &clv1.ListHeldRequest{})
			},
			rest: func(fixture, int) (string, string, string) { return "GET", "/v1/simulator/held", "" }},
		{rpc: "Simulator/ReleaseHeld", simulator: true,
			grpc: func(ctx context.Context, c grpcClients, _ fixture, _ int) (any, error) {
				return c.sim.ReleaseHeld(ctx, &clv1.ReleaseHeldRequest{All: true})
			},
			rest: func(fixture, int) (string, string, string) {
				return "POST", "/v1/simulator/held:release", `{"all":true}`
			}},
		{rpc: "Simulator/ClearFaults", simulator: true,
			grpc: func(ctx context.Context, c grpcClients, _ fixture, _ int) (any, error) {
				return c.sim.ClearFaults(ctx, &clv1.ClearFaultsRequest{})
			},
			rest: func(fixture, int) (string, string, string) { return "POST", "/v1/simulator/faults:clear", "{}" }},
		{rpc: "Simulator/ListNetworkRules", simulator: true,
			grpc: func(ctx context.Context, c grpcClients, fx fixture, _ int) (any, error) {
				return c.sim.ListNetworkRules(ctx, &clv1.ListNetworkRulesRequest{Cluster: fx.cluster})
			},
			rest: func(fx fixture, _ int) (string, string, string) {
				return "GET", "/v1/simulator/networkRules?cluster=" + fx.cluster, ""
			}},
	}
}

// want is what a caller gets from an RPC of the matrix.
// watchExisting opens a watch and returns the clusters it starts with (the
// EXISTING messages before SYNCED), as a list the matrix checks.
func watchExisting(ctx context.Context, c grpcClients, req *clv1.WatchClustersRequest) (*clv1.ListClustersResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.clusters.WatchClusters(ctx, req)
	if err != nil {
		return nil, err
	}
	list := &clv1.ListClustersResponse{}
	for {
		m, err := s.Recv()
		if err != nil {
			return nil, err
		}
		switch m.GetKind() {
		case clv1.WatchClustersResponse_EXISTING:
			list.Clusters = append(list.Clusters, m.GetCluster())
		case clv1.WatchClustersResponse_SYNCED:
			return list, nil
		}
	}
}

// TestAccess_MatrixCoversEveryRPC fails when an RPC of a service the matrix
// checks has no case in it.
func TestAccess_MatrixCoversEveryRPC(t *testing.T) {
	covered := map[string]bool{}
	for _, tc := range accessCases() {
		rpc, _, _ := strings.Cut(tc.rpc, " ")
		covered[rpc] = true
	}
	for _, sd := range []grpc.ServiceDesc{clv1.ClusterLifecycle_ServiceDesc, longrunningpb.Operations_ServiceDesc, clv1.Simulator_ServiceDesc} {
		prefix := ""
		if sd.ServiceName == clv1.Simulator_ServiceDesc.ServiceName {
			prefix = "Simulator/"
		}
		var names []string
		for _, m := range sd.Methods {
			names = append(names, m.MethodName)
		}
		for _, st := range sd.Streams {
			names = append(names, st.StreamName)
		}
		for _, n := range names {
			if !covered[prefix+n] {
				t.Errorf("%s/%s has no case in the access matrix", sd.ServiceName, n)
			}
		}
	}
}

func (c accessCase) want(w who) codes.Code {
	switch {
	case w.name == anonymous.name || w.name == wrongToken.name:
		return codes.Unauthenticated
	case c.simulator && w.name == admin.name:
		return codes.OK
	case c.simulator:
		return codes.PermissionDenied
	case w.name == owner.name:
		return c.owner
	case w.name == admin.name:
		return c.admin
	case c.listsClusters || c.listsOps || c.rpc == "CreateCluster":
		return codes.OK // another account's lists (without team-a's) and clusters
	}
	return codes.NotFound
}

// reasons are the ErrorInfo reasons the matrix's refusals must carry.
var accessReasons = map[codes.Code]string{
	codes.NotFound:           service.ReasonNotFound,
	codes.Unauthenticated:    "", // missing or invalid, checked per caller
	codes.PermissionDenied:   service.ReasonAdminRequired,
	codes.FailedPrecondition: service.ReasonInvalidStateTransition,
	codes.Unimplemented:      service.ReasonNotImplemented,
}

// newFixture creates a RUNNING cluster of team-a (two workers) through the
// API, and a free external machine.
func (h *harness) newFixture(t *testing.T, n int) fixture {
	t.Helper()
	ctx := bearerContext(tctx(t), tokenA)
	op, err := h.clients.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
		DisplayName: fmt.Sprintf("fixture-%d", n), KubernetesVersion: "1.30.2", WorkerNodeCount: 2, ServiceOffering: "medium"}})
	done := fxDone(t, h, op, err)
	c := &clv1.Cluster{}
	if err := done.GetResponse().UnmarshalTo(c); err != nil {
		t.Fatal(err)
	}
	if c.GetAccount() != "team-a" {
		t.Fatalf("fixture created with team-a's token is in account %q", c.GetAccount())
	}
	fx := fixture{cluster: c.GetName(), op: op.GetName(), free: fxExternal(t, h).GetName()}
	for _, m := range fxWithRole(fxMachines(t, h, c.GetName()), clv1.Node_WORKER) {
		fx.worker = m.GetName()
	}
	return fx
}

// TestAccess_Matrix calls every RPC of ClusterLifecycle, Operations and
// Simulator, over gRPC and REST, as the owner of a cluster, a user of
// another account (who also names the owner's account in the header),
// callers without credentials or with a wrong token, and an admin, and
// checks the answer's code and reason, what a list shows, and that a
// refused call changed nothing.
func TestAccess_Matrix(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, withTokens(t))
		conn := bareConn(t, h)
		bare := grpcClients{clv1.NewClusterLifecycleClient(conn), longrunningpb.NewOperationsClient(conn), clv1.NewSimulatorClient(conn)}
		var seq atomic.Int64
		shared := h.newFixture(t, int(seq.Add(1)))
		for _, transport := range []string{"grpc", "rest"} {
			for _, tc := range accessCases() {
				if transport == "rest" && tc.rest == nil {
					continue
				}
				for _, w := range everyone {
					t.Run(fmt.Sprintf("%s/%s/%s", transport, tc.rpc, w.name), func(t *testing.T) {
						want := tc.want(w)
						fx := shared
						if tc.mutates && (w.name == owner.name || w.name == admin.name) {
							fx = h.newFixture(t, int(seq.Add(1)))
						}
						before := vSnapshot(t, h)
						var (
							code   codes.Code
							reason string
							names  []string
						)
						n := int(seq.Add(1))
						if transport == "grpc" {
							code, reason, names = callGRPC(t, h, bare, tc, fx, w, n)
						} else {
							code, reason, names = callREST(t, h, tc, fx, w, n)
						}
						if code != want {
							t.Fatalf("%s as %s over %s: code %v (reason %s); want %v", tc.rpc, w.name, transport, code, reason, want)
						}
						if wantReason, ok := accessReasons[code]; ok && code != codes.Unauthenticated && reason != wantReason {
							t.Errorf("reason %q; want %q", reason, wantReason)
						}
						if code == codes.Unauthenticated {
							wantReason := service.ReasonCredentialsInvalid
							if w.name == anonymous.name {
								wantReason = service.ReasonCredentialsMissing
							}
							if reason != wantReason {
								t.Errorf("reason %q; want %q", reason, wantReason)
							}
						}
						if tc.listsClusters || tc.listsOps {
							target := fx.cluster
							if tc.listsOps {
								target = fx.op
							}
							shown := slices.Contains(names, target)
							if shouldSee := w.name == owner.name || w.name == admin.name; code == codes.OK && shown != shouldSee {
								t.Errorf("%s as %s lists %v; want team-a's %s shown: %v", tc.rpc, w.name, names, target, shouldSee)
							}
						}
						if tc.simulator && w.name == admin.name {
							if _, err := h.clients.sim.ClearFaults(tctx(t), &clv1.ClearFaultsRequest{}); err != nil {
								t.Fatal(err)
							}
						}
						if w.name != owner.name && w.name != admin.name && !(tc.rpc == "CreateCluster" && code == codes.OK) {
							if d := vDiff(before, vSnapshot(t, h)); d != "" {
								t.Errorf("%s as %s changed the world:\n%s", tc.rpc, w.name, d)
							}
						}
					})
				}
			}
		}
	})
}

// callGRPC makes one matrix call over gRPC and returns its code, ErrorInfo
// reason and, for lists, the names listed. An accepted operation is waited
// for, so that the next case starts from a world at rest.
func callGRPC(t *testing.T, h *harness, c grpcClients, tc accessCase, fx fixture, w who, n int) (codes.Code, string, []string) {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(tctx(t), w.headers...)
	resp, err := tc.grpc(ctx, c, fx, n)
	if err != nil {
		code, reason, _ := errorInfo(t, err)
		return code, reason, nil
	}
	var names []string
	switch r := resp.(type) {
	case *longrunningpb.Operation:
		if !r.GetDone() {
			h.wait(t, r)
		}
	case *clv1.ListClustersResponse:
		for _, c := range r.GetClusters() {
			names = append(names, c.GetName())
		}
	case *longrunningpb.ListOperationsResponse:
		for _, o := range r.GetOperations() {
			names = append(names, o.GetName())
		}
	}
	return codes.OK, "", names
}

// restStatus is the HTTP status of an answer with the code.
func restStatus(code codes.Code) int {
	return map[codes.Code]int{codes.OK: 200, codes.InvalidArgument: 400, codes.NotFound: 404, codes.Unauthenticated: 401, codes.PermissionDenied: 403,
		codes.FailedPrecondition: 400, codes.Unimplemented: 501}[code]
}

// restStream reads a streaming REST answer (newline-delimited JSON, one
// {"result": ...} or {"error": ...} per line): a watch until SYNCED, with
// the clusters it started with; an operation's first message.
func restStream(t *testing.T, method, path string, body io.Reader) (codes.Code, string, []string) {
	t.Helper()
	lines := bufio.NewScanner(body)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	var names []string
	for lines.Scan() {
		type status struct {
			Code    codes.Code `json:"code"`
			Details []struct {
				Type   string `json:"@type"`
				Reason string `json:"reason"`
			} `json:"details"`
		}
		var line struct {
			status // refused before the stream began
			Result struct {
				Kind    string `json:"kind"`
				Cluster struct {
					Name string `json:"name"`
				} `json:"cluster"`
				Name string `json:"name"`
			} `json:"result"`
			Error *status `json:"error"`
		}
		if err := json.Unmarshal(lines.Bytes(), &line); err != nil {
			t.Fatalf("%s %s: line %q is not JSON: %v", method, path, lines.Text(), err)
		}
		if line.Error == nil && line.Code != codes.OK {
			line.Error = &line.status
		}
		if e := line.Error; e != nil {
			for _, d := range e.Details {
				if d.Type == "type.googleapis.com/google.rpc.ErrorInfo" {
					return e.Code, d.Reason, nil
				}
			}
			t.Errorf("%s %s: error %s carries no ErrorInfo", method, path, lines.Text())
			return e.Code, "", nil
		}
		switch r := line.Result; {
		case strings.HasPrefix(r.Name, "operations/"):
			return codes.OK, "", nil
		case r.Kind == "EXISTING":
			names = append(names, r.Cluster.Name)
		case r.Kind == "SYNCED":
			return codes.OK, "", names
		}
	}
	t.Fatalf("%s %s: the stream ended (%v) before it said anything", method, path, lines.Err())
	return 0, "", nil
}

// callREST makes one matrix call over REST.
func callREST(t *testing.T, h *harness, tc accessCase, fx fixture, w who, n int) (codes.Code, string, []string) {
	t.Helper()
	method, path, body := tc.rest(fx, n)
	req, err := http.NewRequestWithContext(tctx(t), method, h.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(w.headers); i += 2 {
		req.Header.Add(w.headers[i], w.headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if tc.stream {
		code, reason, names := restStream(t, method, path, resp.Body)
		if wantHTTP := restStatus(code); resp.StatusCode != wantHTTP {
			t.Errorf("%s %s: HTTP %d for %v; want %d", method, path, resp.StatusCode, code, wantHTTP)
		}
		return code, reason, names
	}
	raw, _ := io.ReadAll(resp.Body)
	var out struct {
		Code    codes.Code `json:"code"`
		Details []struct {
			Type   string `json:"@type"`
			Reason string `json:"reason"`
		} `json:"details"`
		Clusters   []struct{ Name string } `json:"clusters"`
		Operations []struct {
			Name string `json:"name"`
			Done bool   `json:"done"`
		} `json:"operations"`
		Name string `json:"name"`
		Done bool   `json:"done"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %d, body is not JSON: %q", method, path, resp.StatusCode, raw)
	}
	if resp.StatusCode != http.StatusOK {
		if wantHTTP := restStatus(out.Code); resp.StatusCode != wantHTTP {
			t.Errorf("%s %s: HTTP %d for %v; want %d", method, path, resp.StatusCode, out.Code, wantHTTP)
		}
		if out.Code == codes.Unauthenticated && resp.Header.Get("WWW-Authenticate") != `Bearer realm="clusterd"` {
			t.Errorf("401 without a bearer challenge: WWW-Authenticate %q", resp.Header.Get("WWW-Authenticate"))
		}
		for _, d := range out.Details {
			if d.Type == "type.googleapis.com/google.rpc.ErrorInfo" {
				return out.Code, d.Reason, nil
			}
		}
		t.Errorf("%s %s: error %s carries no ErrorInfo", method, path, raw)
		return out.Code, "", nil
	}
	if strings.HasPrefix(out.Name, "operations/") && !out.Done {
		h.wait(t, &longrunningpb.Operation{Name: out.Name})
	}
	var names []string
	for _, c := range out.Clusters {
		names = append(names, c.Name)
	}
	for _, o := range out.Operations {
		names = append(names, o.Name)
	}
	return codes.OK, "", names
}
