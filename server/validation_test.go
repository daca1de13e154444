package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	vmetadata "google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/clusterd/clusterd/auth"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// These tests check that every input is validated: a bad request is
// INVALID_ARGUMENT with reason INVALID_ARGUMENT and a google.rpc.BadRequest
// naming exactly the bad fields, in the request's own field paths, and it
// changes nothing (no cluster, no job, no machine, no rule, no etag).

// vCatalog is the default catalog with a small maximum cluster size, so the
// bound is reachable, and "mini", an offering smaller than medium that is
// still big enough for a node.
func vCatalog(c *Config) {
	cat := service.DefaultCatalog()
	cat.MaxClusterSize = 5
	cat.Offerings["mini"] = service.Offering{Name: "mini", CPUs: 2, MemoryMB: 2048}
	c.Catalog = &cat
}

// vWorld is everything a refused request must leave as it was.
type vWorld struct {
	clusters *clv1.ListClustersResponse
	machines *clv1.ListMachinesResponse
	ops      *longrunningpb.ListOperationsResponse
	rules    map[string][]string
}

func vSnapshot(t *testing.T, h *harness) vWorld {
	t.Helper()
	ctx := tctx(t)
	var w vWorld
	var err error
	if w.clusters, err = h.clients.clusters.ListClusters(ctx, &clv1.ListClustersRequest{PageSize: 1000}); err != nil {
		t.Fatal(err)
	}
	if w.machines, err = h.clients.sim.ListMachines(ctx, &clv1.ListMachinesRequest{}); err != nil {
		t.Fatal(err)
	}
	if w.ops, err = h.clients.ops.ListOperations(ctx, &longrunningpb.ListOperationsRequest{PageSize: 1000}); err != nil {
		t.Fatal(err)
	}
	w.rules = map[string][]string{}
	for _, c := range w.clusters.GetClusters() {
		w.rules[c.GetName()] = fxRules(t, h, c.GetName())
	}
	return w
}

// vDiff says what differs between two worlds ("" when nothing does).
func vDiff(before, after vWorld) string {
	var diffs []string
	if !proto.Equal(before.clusters, after.clusters) {
		diffs = append(diffs, fmt.Sprintf("clusters changed:\n  before %v\n  after  %v", before.clusters, after.clusters))
	}
	if !proto.Equal(before.machines, after.machines) {
		diffs = append(diffs, fmt.Sprintf("machines changed:\n  before %v\n  after  %v", before.machines, after.machines))
	}
	if !proto.Equal(before.ops, after.ops) {
		diffs = append(diffs, fmt.Sprintf("operations changed: %d before, %d after", len(before.ops.GetOperations()), len(after.ops.GetOperations())))
	}
	for c, rs := range before.rules {
		if !slices.Equal(rs, after.rules[c]) {
			diffs = append(diffs, fmt.Sprintf("rules of %s changed: %v -> %v", c, rs, after.rules[c]))
		}
	}
	return strings.Join(diffs, "\n")
}

// vFields returns the field paths of a BadRequest, in order.
func vFields(t *testing.T, err error) (codes.Code, string, []string) {
	t.Helper()
	code, reason, br := errorInfo(t, err)
	var fields []string
	for _, v := range br.GetFieldViolations() {
		fields = append(fields, v.GetField())
	}
	return code, reason, fields
}

// vCase is one request that must be refused as invalid.
type vCase struct {
	name string
	call func(ctx context.Context) (*longrunningpb.Operation, error)
	// fields are the BadRequest field paths the refusal must name, in order.
	fields []string
}

// vKnownBugs explains, by case name, the defects some cases catch, so that
// their failure says where to look.
var vKnownBugs = map[string]string{
	"the worker count it has": "\nBUG: service/scale.go checkScale refuses \"nothing to change\" only when service_offering equals the current one; " +
		"a request that leaves service_offering empty and asks for the current worker_node_count runs an empty SCALING operation",
	"autoscaling max plus control nodes beyond max cluster size": "\nBUG: service/scale.go ScaleCluster calls checkAutoscaling with control = 0, so max_size is not checked against the " +
		"cluster's control nodes (create counts them); checkScale should check it with c.Spec.ControlNodeCount",
}

// vRun runs each case against h and checks that it is refused with exactly
// its fields and that the world did not change. A request that is wrongly
// accepted is waited for, so its operation ends before the next case, and
// the world is read again so that later cases are judged on their own.
func vRun(t *testing.T, h *harness, cases []vCase) {
	t.Helper()
	before := vSnapshot(t, h)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			op, err := tc.call(tctx(t))
			if err == nil {
				if op != nil {
					op = h.wait(t, op)
				}
				t.Errorf("accepted (operation %s, error %v); want INVALID_ARGUMENT on %v%s", op.GetName(), op.GetError(), tc.fields, vKnownBugs[tc.name])
				before = vSnapshot(t, h)
				return
			}
			code, reason, fields := vFields(t, err)
			if code != codes.InvalidArgument || reason != service.ReasonInvalidArgument || !slices.Equal(fields, tc.fields) {
				t.Errorf("got %v %s with field violations %q (%v); want INVALID_ARGUMENT INVALID_ARGUMENT on %q%s", code, reason, fields, err, tc.fields, vKnownBugs[tc.name])
			}
			if after := vSnapshot(t, h); vDiff(before, after) != "" {
				t.Errorf("a refused request changed the world:\n%s", vDiff(before, after))
				before = after
			}
		})
	}
}

// vCreateReq is a valid create request changed by mod.
func vCreateReq(mod func(c *clv1.Cluster)) *clv1.CreateClusterRequest {
	c := &clv1.Cluster{DisplayName: "web", KubernetesVersion: "1.30.2", WorkerNodeCount: 2, ServiceOffering: "medium"}
	if mod != nil {
		mod(c)
	}
	return &clv1.CreateClusterRequest{Cluster: c}
}

func vAsAccount(ctx context.Context, account string) context.Context {
	return vmetadata.AppendToOutgoingContext(ctx, auth.AccountHeader, account)
}

func TestValidation_CreateCluster(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, vCatalog)
		h.create(t, "existing", 1)
		create := func(mod func(c *clv1.Cluster)) func(ctx context.Context) (*longrunningpb.Operation, error) {
			return func(ctx context.Context) (*longrunningpb.Operation, error) {
				return h.clients.clusters.CreateCluster(ctx, vCreateReq(mod))
			}
		}
		name := func(n string) func(ctx context.Context) (*longrunningpb.Operation, error) {
			return create(func(c *clv1.Cluster) { c.DisplayName = n })
		}
		autoscaling := func(workers, min, max int32, enabled bool) func(ctx context.Context) (*longrunningpb.Operation, error) {
			return create(func(c *clv1.Cluster) {
				c.WorkerNodeCount = workers
				c.Autoscaling = &clv1.Autoscaling{Enabled: enabled, MinSize: min, MaxSize: max}
			})
		}
		vRun(t, h, []vCase{
			{"upper case name", name("Web"), []string{"cluster.display_name"}},
			{"underscore in name", name("my_web"), []string{"cluster.display_name"}},
			{"64 character name", name(strings.Repeat("a", 64)), []string{"cluster.display_name"}},
			{"leading dash", name("-web"), []string{"cluster.display_name"}},
			{"trailing dash", name("web-"), []string{"cluster.display_name"}},
			{"dot in name", name("web.prod"), []string{"cluster.display_name"}},
			{"empty name", name(""), []string{"cluster.display_name"}},
			{"missing cluster", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return h.clients.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{})
			}, []string{"cluster"}},
			{"description too long", create(func(c *clv1.Cluster) { c.Description = strings.Repeat("x", 1025) }), []string{"cluster.description"}},
			{"no workers", create(func(c *clv1.Cluster) { c.WorkerNodeCount = 0 }), []string{"cluster.worker_node_count"}},
			{"negative workers", create(func(c *clv1.Cluster) { c.WorkerNodeCount = -1 }), []string{"cluster.worker_node_count"}},
			{"negative control count", create(func(c *clv1.Cluster) { c.ControlNodeCount = -1 }), []string{"cluster.control_node_count"}},
			{"even control count", create(func(c *clv1.Cluster) { c.ControlNodeCount = 2 }), []string{"cluster.control_node_count"}},
			{"beyond max cluster size", create(func(c *clv1.Cluster) { c.WorkerNodeCount = 5 }), []string{"cluster.worker_node_count"}},
			{"beyond max cluster size with 3 control", create(func(c *clv1.Cluster) { c.ControlNodeCount, c.WorkerNodeCount = 3, 3 }), []string{"cluster.worker_node_count"}},
			{"version not in catalog", create(func(c *clv1.Cluster) { c.KubernetesVersion = "1.27.1" }), []string{"cluster.kubernetes_version"}},
			{"version with v prefix", create(func(c *clv1.Cluster) { c.KubernetesVersion = "v1.30.2" }), []string{"cluster.kubernetes_version"}},
			{"no version", create(func(c *clv1.Cluster) { c.KubernetesVersion = "" }), []string{"cluster.kubernetes_version"}},
			{"unknown offering", create(func(c *clv1.Cluster) { c.ServiceOffering = "huge" }), []string{"cluster.service_offering"}},
			{"offering below 2 vCPU / 2048 MB", create(func(c *clv1.Cluster) { c.ServiceOffering = "small" }), []string{"cluster.service_offering"}},
			{"no offering", create(func(c *clv1.Cluster) { c.ServiceOffering = "" }), []string{"cluster.service_offering"}},
			{"autoscaling min 0", autoscaling(2, 0, 3, true), []string{"cluster.autoscaling.min_size"}},
			{"autoscaling max below min", autoscaling(2, 3, 2, true), []string{"cluster.autoscaling.max_size"}},
			{"autoscaling max beyond max cluster size", autoscaling(2, 1, 5, true), []string{"cluster.autoscaling.max_size"}},
			{"workers below autoscaling min", autoscaling(1, 2, 4, true), []string{"cluster.autoscaling"}},
			{"workers above autoscaling max", autoscaling(4, 1, 3, true), []string{"cluster.autoscaling"}},
			{"autoscaling sizes while disabled", autoscaling(2, 1, 3, false), []string{"cluster.autoscaling"}},
			{"every bad field at once", create(func(c *clv1.Cluster) {
				c.DisplayName, c.KubernetesVersion, c.WorkerNodeCount, c.ServiceOffering = "Bad_Name", "9.9.9", 0, "small"
			}), []string{"cluster.display_name", "cluster.kubernetes_version", "cluster.worker_node_count", "cluster.service_offering"}},
			{"request_id not a UUID", func(ctx context.Context) (*longrunningpb.Operation, error) {
				req := vCreateReq(nil)
				req.RequestId = "retry-1"
				return h.clients.clusters.CreateCluster(ctx, req)
			}, []string{"request_id"}},
			{"account header with upper case", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return h.clients.clusters.CreateCluster(vAsAccount(ctx, "Team_B"), vCreateReq(nil))
			}, []string{auth.AccountHeader}},
			{"account header of 64 characters", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return h.clients.clusters.CreateCluster(vAsAccount(ctx, strings.Repeat("b", 64)), vCreateReq(nil))
			}, []string{auth.AccountHeader}},
		})
		// The base request of every case is valid: only its change is refused.
		op, err := h.clients.clusters.CreateCluster(tctx(t), vCreateReq(func(c *clv1.Cluster) { c.DisplayName = "valid" }))
		fxDone(t, h, op, err)
	})
}

func TestValidation_DisplayNameUniquePerAccount(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		first := h.create(t, "web", 1)
		if first.GetAccount() != auth.DefaultAccount {
			t.Errorf("cluster created without the account header is in account %q; want %q", first.GetAccount(), auth.DefaultAccount)
		}
		before := vSnapshot(t, h)
		_, err := h.clients.clusters.CreateCluster(ctx, vCreateReq(nil))
		if code, reason, _ := errorInfo(t, err); code != codes.AlreadyExists || reason != service.ReasonAlreadyExists {
			t.Errorf("same name twice in one account: %v %s (%v); want ALREADY_EXISTS ALREADY_EXISTS", code, reason, err)
		}
		if d := vDiff(before, vSnapshot(t, h)); d != "" {
			t.Errorf("a refused duplicate changed the world:\n%s", d)
		}

		other := vAsAccount(ctx, "team-b")
		op, err := h.clients.clusters.CreateCluster(other, vCreateReq(nil))
		done := fxDone(t, h, op, err)
		c := &clv1.Cluster{}
		if err := done.GetResponse().UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		if c.GetAccount() != "team-b" || c.GetDisplayName() != "web" || c.GetName() == first.GetName() {
			t.Errorf("same name in another account = %v; want a second cluster web in team-b", c)
		}
		_, err = h.clients.clusters.CreateCluster(other, vCreateReq(nil))
		if code, reason, _ := errorInfo(t, err); code != codes.AlreadyExists || reason != service.ReasonAlreadyExists {
			t.Errorf("same name twice in team-b: %v %s; want ALREADY_EXISTS ALREADY_EXISTS", code, reason)
		}
	})
}

// vWorkers returns the names of a cluster's control and worker machines.
func vNodes(t *testing.T, h *harness, cluster string) (control, workers []string) {
	t.Helper()
	ms := fxMachines(t, h, cluster)
	return fxNames(fxWithRole(ms, clv1.Node_CONTROL)), fxNames(fxWithRole(ms, clv1.Node_WORKER))
}

func TestValidation_ScaleCluster(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, vCatalog)
		c := h.create(t, "web", 2)
		other := h.create(t, "other", 1)
		big := fxCreate(t, h, &clv1.Cluster{DisplayName: "big", KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "large"})
		control, workers := vNodes(t, h, c.GetName())
		_, otherWorkers := vNodes(t, h, other.GetName())
		missing := "machines/" + uuid.NewString()

		scale := func(req *clv1.ScaleClusterRequest) func(ctx context.Context) (*longrunningpb.Operation, error) {
			if req.Name == "" {
				req.Name = c.GetName()
			}
			return func(ctx context.Context) (*longrunningpb.Operation, error) {
				return h.clients.clusters.ScaleCluster(ctx, req)
			}
		}
		vRun(t, h, []vCase{
			{"nothing asked", scale(&clv1.ScaleClusterRequest{}), []string{"worker_node_count"}},
			{"the offering it has", scale(&clv1.ScaleClusterRequest{ServiceOffering: "medium"}), []string{"service_offering"}},
			{"no workers", scale(&clv1.ScaleClusterRequest{WorkerNodeCount: new(int32(0))}), []string{"worker_node_count"}},
			{"negative workers", scale(&clv1.ScaleClusterRequest{WorkerNodeCount: new(int32(-2))}), []string{"worker_node_count"}},
			{"beyond max cluster size", scale(&clv1.ScaleClusterRequest{WorkerNodeCount: new(int32(5))}), []string{"worker_node_count"}},
			{"unknown offering", scale(&clv1.ScaleClusterRequest{ServiceOffering: "huge"}), []string{"service_offering"}},
			{"offering too small for a node", scale(&clv1.ScaleClusterRequest{ServiceOffering: "small"}), []string{"service_offering"}},
			{"autoscaling with a size change", scale(&clv1.ScaleClusterRequest{WorkerNodeCount: new(int32(3)),
				Autoscaling: &clv1.Autoscaling{Enabled: true, MinSize: 1, MaxSize: 3}}), []string{"autoscaling"}},
			{"autoscaling with an offering change", scale(&clv1.ScaleClusterRequest{ServiceOffering: "large",
				Autoscaling: &clv1.Autoscaling{Enabled: true, MinSize: 1, MaxSize: 3}}), []string{"autoscaling"}},
			{"autoscaling min 0", scale(&clv1.ScaleClusterRequest{Autoscaling: &clv1.Autoscaling{Enabled: true, MinSize: 0, MaxSize: 3}}), []string{"autoscaling.min_size"}},
			{"autoscaling max below min", scale(&clv1.ScaleClusterRequest{Autoscaling: &clv1.Autoscaling{Enabled: true, MinSize: 3, MaxSize: 2}}), []string{"autoscaling.max_size"}},
			{"autoscaling sizes while disabled", scale(&clv1.ScaleClusterRequest{Autoscaling: &clv1.Autoscaling{MinSize: 1, MaxSize: 3}}), []string{"autoscaling"}},
			{"remove a node of another cluster", scale(&clv1.ScaleClusterRequest{WorkerNodeCount: new(int32(1)), RemoveNodes: otherWorkers[:1]}), []string{"remove_nodes[0]"}},
			{"remove a control node", scale(&clv1.ScaleClusterRequest{WorkerNodeCount: new(int32(1)), RemoveNodes: control}), []string{"remove_nodes[0]"}},
			{"remove a machine that does not exist", scale(&clv1.ScaleClusterRequest{WorkerNodeCount: new(int32(1)), RemoveNodes: []string{missing}}), []string{"remove_nodes[0]"}},
			{"remove a malformed name", scale(&clv1.ScaleClusterRequest{WorkerNodeCount: new(int32(1)), RemoveNodes: []string{"machines/abc"}}), []string{"remove_nodes[0]"}},
			{"remove a node twice", scale(&clv1.ScaleClusterRequest{RemoveNodes: []string{workers[0], workers[0]}}), []string{"remove_nodes[1]"}},
			{"remove more nodes than the new count drops", scale(&clv1.ScaleClusterRequest{WorkerNodeCount: new(int32(1)), RemoveNodes: workers}), []string{"remove_nodes"}},
			{"remove nodes without shrinking", scale(&clv1.ScaleClusterRequest{WorkerNodeCount: new(int32(2)), RemoveNodes: workers[:1]}), []string{"remove_nodes"}},
			{"remove every worker", scale(&clv1.ScaleClusterRequest{RemoveNodes: workers}), []string{"worker_node_count"}},
			{"running cluster to a smaller valid offering", scale(&clv1.ScaleClusterRequest{Name: big.GetName(), ServiceOffering: "mini"}), []string{"service_offering"}},
			{"running cluster to medium from large", scale(&clv1.ScaleClusterRequest{Name: big.GetName(), ServiceOffering: "medium"}), []string{"service_offering"}},
			{"request_id not a UUID", scale(&clv1.ScaleClusterRequest{WorkerNodeCount: new(int32(3)), RequestId: "0192f0c17a3e70008000000000000000"}), []string{"request_id"}},
			// The size the cluster already has is nothing to change either.
			{"the worker count it has", scale(&clv1.ScaleClusterRequest{WorkerNodeCount: new(int32(2))}), []string{"worker_node_count"}},
			// The autoscaler's max counts the control nodes too, as on create
			// (1 control + 5 workers > 5).
			{"autoscaling max plus control nodes beyond max cluster size", scale(&clv1.ScaleClusterRequest{Autoscaling: &clv1.Autoscaling{Enabled: true, MinSize: 1, MaxSize: 5}}), []string{"autoscaling.max_size"}},
		})
	})
}

func TestValidation_UpgradeCluster(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, vCatalog)
		c := h.create(t, "web", 1)
		old := fxCreate(t, h, &clv1.Cluster{DisplayName: "old", KubernetesVersion: "1.29.4", WorkerNodeCount: 1, ServiceOffering: "medium"})
		upgrade := func(cluster *clv1.Cluster, version string) func(ctx context.Context) (*longrunningpb.Operation, error) {
			return func(ctx context.Context) (*longrunningpb.Operation, error) {
				return h.clients.clusters.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: cluster.GetName(), KubernetesVersion: version})
			}
		}
		vRun(t, h, []vCase{
			{"skipping a minor", upgrade(old, "1.31.1"), []string{"kubernetes_version"}},
			{"downgrade", upgrade(c, "1.29.6"), []string{"kubernetes_version"}},
			{"downgrade of a patch", upgrade(old, "1.28.9"), []string{"kubernetes_version"}},
			{"same version", upgrade(c, "1.30.2"), []string{"kubernetes_version"}},
			{"unknown version", upgrade(c, "1.30.9"), []string{"kubernetes_version"}},
			{"no version", upgrade(c, ""), []string{"kubernetes_version"}},
			{"request_id not a UUID", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return h.clients.clusters.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: c.GetName(), KubernetesVersion: "1.30.5", RequestId: "x"})
			}, []string{"request_id"}},
		})
	})
}

func TestValidation_AddNodes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, vCatalog)
		c := h.create(t, "web", 2) // 3 of at most 5 nodes
		other := h.create(t, "other", 1)
		_, otherWorkers := vNodes(t, h, other.GetName())
		_, workers := vNodes(t, h, c.GetName())
		free := []string{fxExternal(t, h).GetName(), fxExternal(t, h).GetName(), fxExternal(t, h).GetName()}
		off := fxExternal(t, h).GetName()
		if _, err := h.clients.sim.SetMachinePower(tctx(t), &clv1.SetMachinePowerRequest{Name: off, Power: clv1.Node_STOPPED}); err != nil {
			t.Fatal(err)
		}
		missing := "machines/" + uuid.NewString()
		add := func(machines ...string) func(ctx context.Context) (*longrunningpb.Operation, error) {
			return func(ctx context.Context) (*longrunningpb.Operation, error) {
				return h.clients.clusters.AddNodes(ctx, &clv1.AddNodesRequest{Name: c.GetName(), Machines: machines})
			}
		}
		vRun(t, h, []vCase{
			{"no machines", add(), []string{"machines"}},
			{"a node of another cluster", add(otherWorkers[0]), []string{"machines[0]"}},
			{"a node of this cluster", add(workers[0]), []string{"machines[0]"}},
			{"a powered-off external machine", add(off), []string{"machines[0]"}},
			{"a machine that does not exist", add(missing), []string{"machines[0]"}},
			{"a malformed name", add("machines/abc"), []string{"machines[0]"}},
			{"a cluster name", add(c.GetName()), []string{"machines[0]"}},
			{"the same machine twice", add(free[0], free[0]), []string{"machines[1]"}},
			{"beyond max cluster size", add(free...), []string{"machines"}},
			{"a good one and a bad one", add(free[0], missing), []string{"machines[1]"}},
			{"two bad ones", add(off, missing), []string{"machines[0]", "machines[1]"}},
		})
	})
}

func TestValidation_RemoveNodes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, vCatalog)
		c := h.create(t, "web", 2)
		other := h.create(t, "other", 1)
		control, workers := vNodes(t, h, c.GetName())
		_, otherWorkers := vNodes(t, h, other.GetName())
		free := fxExternal(t, h).GetName()
		remove := func(nodes ...string) func(ctx context.Context) (*longrunningpb.Operation, error) {
			return func(ctx context.Context) (*longrunningpb.Operation, error) {
				return h.clients.clusters.RemoveNodes(ctx, &clv1.RemoveNodesRequest{Name: c.GetName(), Nodes: nodes})
			}
		}
		vRun(t, h, []vCase{
			{"no nodes", remove(), []string{"nodes"}},
			{"every control node", remove(control...), []string{"nodes"}},
			{"every worker", remove(workers...), []string{"nodes"}},
			{"a node of another cluster", remove(otherWorkers[0]), []string{"nodes[0]"}},
			{"a free machine", remove(free), []string{"nodes[0]"}},
			{"a machine that does not exist", remove("machines/" + uuid.NewString()), []string{"nodes[0]"}},
			{"a malformed name", remove("machines/abc"), []string{"nodes[0]"}},
			{"the same node twice", remove(workers[0], workers[0]), []string{"nodes[1]"}},
		})
	})
}

func TestValidation_ResourceNames(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		c := h.create(t, "web", 2)
		_, workers := vNodes(t, h, c.GetName())
		free := fxExternal(t, h).GetName()
		var cases []vCase
		for _, bad := range []string{"", "clusters/abc", "clusters/" + uuid.NewString() + "0", "machines/" + uuid.NewString(), strings.TrimPrefix(c.GetName(), "clusters/")} {
			cs := h.clients.clusters
			for _, rpc := range []struct {
				name string
				call func(ctx context.Context) (*longrunningpb.Operation, error)
			}{
				{"StartCluster", func(ctx context.Context) (*longrunningpb.Operation, error) {
					return cs.StartCluster(ctx, &clv1.StartClusterRequest{Name: bad})
				}},
				{"StopCluster", func(ctx context.Context) (*longrunningpb.Operation, error) {
					return cs.StopCluster(ctx, &clv1.StopClusterRequest{Name: bad})
				}},
				{"ScaleCluster", func(ctx context.Context) (*longrunningpb.Operation, error) {
					return cs.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: bad, WorkerNodeCount: new(int32(3))})
				}},
				{"UpgradeCluster", func(ctx context.Context) (*longrunningpb.Operation, error) {
					return cs.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: bad, KubernetesVersion: "1.30.5"})
				}},
				{"AddNodes", func(ctx context.Context) (*longrunningpb.Operation, error) {
					return cs.AddNodes(ctx, &clv1.AddNodesRequest{Name: bad, Machines: []string{free}})
				}},
				{"RemoveNodes", func(ctx context.Context) (*longrunningpb.Operation, error) {
					return cs.RemoveNodes(ctx, &clv1.RemoveNodesRequest{Name: bad, Nodes: workers[:1]})
				}},
				{"DeleteCluster", func(ctx context.Context) (*longrunningpb.Operation, error) {
					return cs.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: bad})
				}},
				{"GetCluster", func(ctx context.Context) (*longrunningpb.Operation, error) {
					_, err := cs.GetCluster(ctx, &clv1.GetClusterRequest{Name: bad})
					return nil, err
				}},
			} {
				cases = append(cases, vCase{fmt.Sprintf("%s %q", rpc.name, bad), rpc.call, []string{"name"}})
			}
			cases = append(cases, vCase{fmt.Sprintf("ListClusterEvents %q", bad), func(ctx context.Context) (*longrunningpb.Operation, error) {
				_, err := cs.ListClusterEvents(ctx, &clv1.ListClusterEventsRequest{Parent: bad})
				return nil, err
			}, []string{"parent"}})
		}
		for _, bad := range []string{"machines/abc", "", c.GetName(), "machines/" + uuid.NewString() + "/x"} {
			cases = append(cases, vCase{fmt.Sprintf("SetMachinePower %q", bad), func(ctx context.Context) (*longrunningpb.Operation, error) {
				_, err := h.clients.sim.SetMachinePower(ctx, &clv1.SetMachinePowerRequest{Name: bad, Power: clv1.Node_STOPPED})
				return nil, err
			}, []string{"name"}})
		}
		vRun(t, h, cases)
	})
}

func TestValidation_RequestID(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		c := h.create(t, "web", 2)
		_, workers := vNodes(t, h, c.GetName())
		free := fxExternal(t, h).GetName()
		cs := h.clients.clusters
		var cases []vCase
		// Not UUIDs, or UUIDs in forms other than the canonical 36 characters.
		for _, id := range []string{"retry-1", "0192f0c17a3e70008000000000000000", "{0192f0c1-7a3e-7000-8000-000000000000}", "urn:uuid:0192f0c1-7a3e-7000-8000-000000000000"} {
			for _, rpc := range []struct {
				name string
				call func(ctx context.Context) (*longrunningpb.Operation, error)
			}{
				{"CreateCluster", func(ctx context.Context) (*longrunningpb.Operation, error) {
					req := vCreateReq(func(cl *clv1.Cluster) { cl.DisplayName = "new" })
					req.RequestId = id
					return cs.CreateCluster(ctx, req)
				}},
				{"StopCluster", func(ctx context.Context) (*longrunningpb.Operation, error) {
					return cs.StopCluster(ctx, &clv1.StopClusterRequest{Name: c.GetName(), RequestId: id})
				}},
				{"StartCluster", func(ctx context.Context) (*longrunningpb.Operation, error) {
					return cs.StartCluster(ctx, &clv1.StartClusterRequest{Name: c.GetName(), RequestId: id})
				}},
				{"AddNodes", func(ctx context.Context) (*longrunningpb.Operation, error) {
					return cs.AddNodes(ctx, &clv1.AddNodesRequest{Name: c.GetName(), Machines: []string{free}, RequestId: id})
				}},
				{"RemoveNodes", func(ctx context.Context) (*longrunningpb.Operation, error) {
					return cs.RemoveNodes(ctx, &clv1.RemoveNodesRequest{Name: c.GetName(), Nodes: workers[:1], RequestId: id})
				}},
				{"DeleteCluster", func(ctx context.Context) (*longrunningpb.Operation, error) {
					return cs.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: c.GetName(), RequestId: id})
				}},
			} {
				cases = append(cases, vCase{fmt.Sprintf("%s %q", rpc.name, id), rpc.call, []string{"request_id"}})
			}
		}
		vRun(t, h, cases)
	})
}

// vEtagBefore is an etag the cluster had before its current one.
func vEtagBefore(t *testing.T, c *clv1.Cluster) string {
	t.Helper()
	n, err := strconv.ParseInt(c.GetEtag(), 10, 64)
	if err != nil || n < 2 {
		t.Fatalf("etag %q is not a version after 1", c.GetEtag())
	}
	return strconv.FormatInt(n-1, 10)
}

// vHTTP sends a REST request and decodes its JSON answer.
func vHTTP(t *testing.T, h *harness, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(tctx(t), method, h.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s %s: body is not JSON: %v", method, path, err)
	}
	return resp.StatusCode, out
}

// vDetail returns the error detail of the given type from a REST error body.
func vDetail(body map[string]any, typ string) map[string]any {
	details, _ := body["details"].([]any)
	for _, d := range details {
		if m, ok := d.(map[string]any); ok && m["@type"] == "type.googleapis.com/"+typ {
			return m
		}
	}
	return nil
}

func TestValidation_REST(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		before := vSnapshot(t, h)
		code, body := vHTTP(t, h, http.MethodPost, "/v1/clusters",
			`{"displayName":"Bad_Name","kubernetesVersion":"1.30.2","workerNodeCount":0,"serviceOffering":"medium"}`)
		var fields []string
		if br := vDetail(body, "google.rpc.BadRequest"); br != nil {
			vs, _ := br["fieldViolations"].([]any)
			for _, v := range vs {
				m, _ := v.(map[string]any)
				f, _ := m["field"].(string)
				fields = append(fields, f)
			}
		}
		info := vDetail(body, "google.rpc.ErrorInfo")
		if code != http.StatusBadRequest || info["reason"] != service.ReasonInvalidArgument ||
			!slices.Equal(fields, []string{"cluster.display_name", "cluster.worker_node_count"}) {
			t.Errorf("POST /v1/clusters with a bad cluster = %d %v; want 400 with ErrorInfo INVALID_ARGUMENT and a BadRequest on cluster.display_name and cluster.worker_node_count", code, body)
		}
		if d := vDiff(before, vSnapshot(t, h)); d != "" {
			t.Errorf("a refused REST create changed the world:\n%s", d)
		}
	})
}

func TestValidation_EtagMismatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		c := fxGet(t, h, h.create(t, "web", 2).GetName())
		stale := vEtagBefore(t, c)
		before := vSnapshot(t, h)

		cs := h.clients.clusters
		for _, rpc := range []struct {
			name string
			call func() (*longrunningpb.Operation, error)
		}{
			{"StopCluster", func() (*longrunningpb.Operation, error) {
				return cs.StopCluster(ctx, &clv1.StopClusterRequest{Name: c.GetName(), Etag: stale})
			}},
			{"ScaleCluster", func() (*longrunningpb.Operation, error) {
				return cs.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: c.GetName(), WorkerNodeCount: new(int32(3)), Etag: stale})
			}},
			{"UpgradeCluster", func() (*longrunningpb.Operation, error) {
				return cs.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: c.GetName(), KubernetesVersion: "1.30.5", Etag: stale})
			}},
			{"DeleteCluster", func() (*longrunningpb.Operation, error) {
				return cs.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: c.GetName(), Etag: stale})
			}},
			{"StartCluster", func() (*longrunningpb.Operation, error) {
				return cs.StartCluster(ctx, &clv1.StartClusterRequest{Name: c.GetName(), Etag: "not-an-etag"})
			}},
		} {
			op, err := rpc.call()
			if err == nil {
				h.wait(t, op)
				t.Fatalf("%s with a stale etag was accepted", rpc.name)
			}
			if code, reason, _ := errorInfo(t, err); code != codes.Aborted || reason != service.ReasonEtagMismatch {
				t.Errorf("%s with a stale etag: %v %s (%v); want ABORTED ETAG_MISMATCH", rpc.name, code, reason, err)
			}
		}

		code, body := vHTTP(t, h, http.MethodPost, "/v1/"+c.GetName()+":stop", `{"etag":"`+stale+`"}`)
		if info := vDetail(body, "google.rpc.ErrorInfo"); code != http.StatusConflict || info["reason"] != service.ReasonEtagMismatch {
			t.Errorf("POST :stop with a stale etag over REST = %d %v; want 409 with ErrorInfo ETAG_MISMATCH", code, body)
		}
		if d := vDiff(before, vSnapshot(t, h)); d != "" {
			t.Errorf("requests with a stale etag changed the world:\n%s", d)
		}

		// The current etag is accepted: the refusals were about the etag.
		op, err := cs.StopCluster(ctx, &clv1.StopClusterRequest{Name: c.GetName(), Etag: c.GetEtag()})
		fxDone(t, h, op, err)
	})
}
