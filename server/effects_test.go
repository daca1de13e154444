package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// These tests check that each operation does what it says, through the real
// gRPC API on both backends: the cluster as GetCluster shows it, the
// simulated machines and network rules, and the cluster's history.

// fxDone waits for the operation an RPC returned and fails the test unless
// the RPC and the operation both succeeded and the operation reported all
// the steps it announced. It returns the finished operation.
func fxDone(t *testing.T, h *harness, op *longrunningpb.Operation, err error) *longrunningpb.Operation {
	t.Helper()
	if err != nil {
		t.Fatalf("RPC refused: %v", err)
	}
	done := h.wait(t, op)
	if done.GetError() != nil {
		t.Fatalf("operation %s failed: %v", done.GetName(), done.GetError())
	}
	md := fxMetadata(t, done)
	if md.GetStepsTotal() <= 0 || md.GetStepsDone() != md.GetStepsTotal() {
		t.Errorf("%s operation ended with steps %d/%d; want all of a positive total done", md.GetVerb(), md.GetStepsDone(), md.GetStepsTotal())
	}
	return done
}

// fxFailed waits for the operation an RPC returned and fails the test unless
// the operation failed. It returns the operation's error.
func fxFailed(t *testing.T, h *harness, op *longrunningpb.Operation, err error) *longrunningpb.Operation {
	t.Helper()
	if err != nil {
		t.Fatalf("RPC refused: %v", err)
	}
	done := h.wait(t, op)
	if done.GetError() == nil {
		t.Fatalf("operation %s succeeded; want it to fail", done.GetName())
	}
	opErrorInfo(t, done.GetError())
	return done
}

func fxMetadata(t *testing.T, op *longrunningpb.Operation) *clv1.OperationMetadata {
	t.Helper()
	md := &clv1.OperationMetadata{}
	if err := op.GetMetadata().UnmarshalTo(md); err != nil {
		t.Fatalf("operation %s metadata: %v", op.GetName(), err)
	}
	return md
}

// fxCreate creates cl through the API and waits for it to be RUNNING.
func fxCreate(t *testing.T, h *harness, cl *clv1.Cluster) *clv1.Cluster {
	t.Helper()
	op, err := h.clients.clusters.CreateCluster(tctx(t), &clv1.CreateClusterRequest{Cluster: cl})
	done := fxDone(t, h, op, err)
	c := &clv1.Cluster{}
	if err := done.GetResponse().UnmarshalTo(c); err != nil {
		t.Fatal(err)
	}
	return c
}

// fxTarget checks the worker count an operation's metadata says it leads to.
func fxTarget(t *testing.T, op *longrunningpb.Operation, want int32) {
	t.Helper()
	if got := fxMetadata(t, op).GetTargetWorkerNodeCount(); got != want {
		t.Errorf("%s: metadata target_worker_node_count = %d; want %d", op.GetName(), got, want)
	}
}

// fxNodeNames checks that every node of the cluster has a display name of
// the cluster's name, its role and the end of its machine id, and that no
// two are alike.
func fxNodeNames(t *testing.T, c *clv1.Cluster) {
	t.Helper()
	seen := map[string]bool{}
	for _, n := range c.GetNodes() {
		id := strings.ReplaceAll(strings.TrimPrefix(n.GetName(), "machines/"), "-", "")
		want := c.GetDisplayName() + "-" + strings.ToLower(n.GetRole().String()) + "-" + id[len(id)-8:]
		if n.GetDisplayName() != want {
			t.Errorf("node %s is displayed as %q; want %q", n.GetName(), n.GetDisplayName(), want)
		}
		if seen[n.GetDisplayName()] {
			t.Errorf("two nodes of %s are displayed as %q", c.GetName(), n.GetDisplayName())
		}
		seen[n.GetDisplayName()] = true
	}
}

func fxGet(t *testing.T, h *harness, name string) *clv1.Cluster {
	t.Helper()
	c, err := h.clients.clusters.GetCluster(tctx(t), &clv1.GetClusterRequest{Name: name})
	if err != nil {
		t.Fatalf("GetCluster(%s): %v", name, err)
	}
	return c
}

// fxMachines lists a cluster's machines through the Simulator API, or every
// machine (free ones too) when cluster is empty.
func fxMachines(t *testing.T, h *harness, cluster string) []*clv1.Machine {
	t.Helper()
	resp, err := h.clients.sim.ListMachines(tctx(t), &clv1.ListMachinesRequest{Cluster: cluster})
	if err != nil {
		t.Fatalf("ListMachines(%q): %v", cluster, err)
	}
	return resp.GetMachines()
}

func fxNames(ms []*clv1.Machine) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.GetName())
	}
	return out
}

func fxWithRole(ms []*clv1.Machine, role clv1.Node_Role) []*clv1.Machine {
	var out []*clv1.Machine
	for _, m := range ms {
		if m.GetRole() == role {
			out = append(out, m)
		}
	}
	return out
}

// fxRules lists a cluster's network rules as sorted "machine kind:port".
func fxRules(t *testing.T, h *harness, cluster string) []string {
	t.Helper()
	resp, err := h.clients.sim.ListNetworkRules(tctx(t), &clv1.ListNetworkRulesRequest{Cluster: cluster})
	if err != nil {
		t.Fatalf("ListNetworkRules(%s): %v", cluster, err)
	}
	var out []string
	for _, r := range resp.GetRules() {
		out = append(out, fmt.Sprintf("%s %s:%d", r.GetMachine(), r.GetKind(), r.GetPort()))
	}
	slices.Sort(out)
	return out
}

// fxWantRules is the rules a set of nodes needs: ssh:22 on every node,
// api:6443 on control nodes.
func fxWantRules(ms []*clv1.Machine) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.GetName()+" ssh:22")
		if m.GetRole() == clv1.Node_CONTROL {
			out = append(out, m.GetName()+" api:6443")
		}
	}
	slices.Sort(out)
	return out
}

// fxHistory returns a cluster's events, oldest first.
func fxHistory(t *testing.T, h *harness, cluster string) []*clv1.ClusterEvent {
	t.Helper()
	var out []*clv1.ClusterEvent
	token := ""
	for range 100 {
		resp, err := h.clients.clusters.ListClusterEvents(tctx(t), &clv1.ListClusterEventsRequest{Parent: cluster, PageToken: token})
		if err != nil {
			t.Fatalf("ListClusterEvents(%s): %v", cluster, err)
		}
		out = append(out, resp.GetEvents()...)
		if token = resp.GetNextPageToken(); token == "" {
			return out
		}
	}
	t.Fatalf("events of %s do not end", cluster)
	return nil
}

// fxMoves renders the events that move (or claim) the cluster as
// "EVENT:FROM->TO", leaving out REPAIR entries.
func fxMoves(evs []*clv1.ClusterEvent) []string {
	var out []string
	for _, e := range evs {
		if e.GetEvent() == "REPAIR" {
			continue // repairs change no state
		}
		out = append(out, fmt.Sprintf("%s:%s->%s", e.GetEvent(), e.GetFromState(), e.GetToState()))
	}
	return out
}

// fxTail is the last n moves of a cluster's history.
func fxTail(t *testing.T, h *harness, cluster string, n int) []string {
	t.Helper()
	moves := fxMoves(fxHistory(t, h, cluster))
	return moves[max(0, len(moves)-n):]
}

func fxFault(t *testing.T, h *harness, step string, mode clv1.Fault_Mode, cluster string, count int32) *clv1.Fault {
	t.Helper()
	f, err := h.clients.sim.InjectFault(tctx(t), &clv1.InjectFaultRequest{Fault: &clv1.Fault{Step: step, Mode: mode, Cluster: cluster, Count: count}})
	if err != nil {
		t.Fatalf("InjectFault(%s %s): %v", mode, step, err)
	}
	return f
}

// fxWaitHeld blocks until a step of cluster is held at step.
func fxWaitHeld(t *testing.T, h *harness, cluster, step string) sim.Held {
	t.Helper()
	id := strings.TrimPrefix(cluster, "clusters/")
	held, err := h.srv.sim.WaitHeld(tctx(t), func(hd sim.Held) bool { return hd.Step == step && hd.ClusterID == id })
	if err != nil {
		t.Fatalf("no %s step of %s held: %v", step, cluster, err)
	}
	return held
}

func fxExternal(t *testing.T, h *harness) *clv1.Machine {
	t.Helper()
	m, err := h.clients.sim.CreateMachine(tctx(t), &clv1.CreateMachineRequest{Role: clv1.Node_EXTERNAL})
	if err != nil {
		t.Fatalf("CreateMachine: %v", err)
	}
	return m
}

// fxCheckNodes fails the test unless the cluster's machines are exactly
// control control nodes and workers workers, all running, joined,
// uncordoned, at version (unless it is empty) and without an ISO attached,
// with exactly the network rules they need.
func fxCheckNodes(t *testing.T, h *harness, cluster string, control, workers int, version string) []*clv1.Machine {
	t.Helper()
	ms := fxMachines(t, h, cluster)
	if got := len(fxWithRole(ms, clv1.Node_CONTROL)); got != control {
		t.Errorf("%s has %d control machines; want %d", cluster, got, control)
	}
	if got := len(fxWithRole(ms, clv1.Node_WORKER)); got != workers {
		t.Errorf("%s has %d worker machines; want %d", cluster, got, workers)
	}
	if len(ms) != control+workers {
		t.Errorf("%s has %d machines; want %d", cluster, len(ms), control+workers)
	}
	for _, m := range ms {
		if m.GetCluster() != cluster || m.GetPower() != clv1.Node_RUNNING || !m.GetJoined() || m.GetCordoned() || m.GetAttachedIso() != "" {
			t.Errorf("machine %v; want a running, joined, uncordoned node of %s with no ISO", m, cluster)
		}
		if version != "" && m.GetKubernetesVersion() != version {
			t.Errorf("machine %s is at Kubernetes %q; want %s", m.GetName(), m.GetKubernetesVersion(), version)
		}
	}
	if got, want := fxRules(t, h, cluster), fxWantRules(ms); !slices.Equal(got, want) {
		t.Errorf("network rules of %s = %v; want %v", cluster, got, want)
	}
	return ms
}

func fxCluster(name string, workers int32) *clv1.Cluster {
	return &clv1.Cluster{DisplayName: name, KubernetesVersion: "1.30.2", WorkerNodeCount: workers, ServiceOffering: "medium"}
}

func TestEffect_Create(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		cl := fxCluster("web", 2)
		cl.ControlNodeCount = 3
		op, err := h.clients.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: cl})
		done := fxDone(t, h, op, err)
		c := &clv1.Cluster{}
		if err := done.GetResponse().UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		if c.GetState() != clv1.Cluster_RUNNING || c.GetEndpoint() == "" || c.GetControlNodeCount() != 3 || c.GetWorkerNodeCount() != 2 {
			t.Errorf("create response = %v; want RUNNING, 3 control + 2 workers, with an endpoint", c)
		}
		fxCheckNodes(t, h, c.GetName(), 3, 2, "1.30.2")
		machines, err := h.srv.sim.Machines(ctx, strings.TrimPrefix(c.GetName(), "clusters/"))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range machines {
			if m.Offering != "medium" {
				t.Errorf("machine %s has offering %q; want medium", m.ID, m.Offering)
			}
		}

		evs := fxHistory(t, h, c.GetName())
		want := []string{"CLUSTER_CREATED:STATE_UNSPECIFIED->CREATED", "START_REQUESTED:CREATED->STARTING", "OPERATION_SUCCEEDED:STARTING->RUNNING"}
		if got := fxMoves(evs); !slices.Equal(got, want) {
			t.Errorf("history = %v; want %v", got, want)
		}
		for _, e := range evs {
			if e.GetOperation() != op.GetName() || e.GetServer() != "test-server" {
				t.Errorf("event %v; want operation %s on test-server", e, op.GetName())
			}
		}
	})
}

func TestEffect_CreateFailure(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		for _, tt := range []struct {
			step string
			want clv1.Cluster_State
			last string
		}{
			// Before the cluster is up: the create failed.
			{"join_node", clv1.Cluster_ERROR, "CREATE_FAILED:STARTING->ERROR"},
			// After: a cluster that exists but is not healthy.
			{"deploy_provider", clv1.Cluster_ALERT, "OPERATION_FAILED:STARTING->ALERT"},
		} {
			t.Run(tt.step, func(t *testing.T) {
				h := start(t, b)
				fxFault(t, h, tt.step, clv1.Fault_FAIL, "", 1)
				op, err := h.clients.clusters.CreateCluster(tctx(t), &clv1.CreateClusterRequest{Cluster: fxCluster("web", 2)})
				done := fxFailed(t, h, op, err)
				reason, meta := opErrorInfo(t, done.GetError())
				if !strings.Contains(done.GetError().GetMessage(), tt.step) || reason != service.ReasonStepFailed || meta["step"] != tt.step ||
					done.GetError().GetCode() != int32(codes.Unavailable) {
					t.Errorf("operation error %v; want UNAVAILABLE, reason STEP_FAILED naming the failed step %s", done.GetError(), tt.step)
				}
				name := fxMetadata(t, done).GetCluster()
				c := fxGet(t, h, name)
				if c.GetState() != tt.want || c.GetCurrentOperation() != "" {
					t.Errorf("cluster after a failed %s = %s held by %q; want %s, released", tt.step, c.GetState(), c.GetCurrentOperation(), tt.want)
				}
				if got := fxTail(t, h, name, 1); !slices.Equal(got, []string{tt.last}) {
					t.Errorf("last event = %v; want %s", got, tt.last)
				}
			})
		}
	})
}

func TestEffect_StopStart(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		c := h.create(t, "web", 2)

		op, err := h.clients.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: c.GetName()})
		fxDone(t, h, op, err)
		if got := fxGet(t, h, c.GetName()); got.GetState() != clv1.Cluster_STOPPED || got.GetCurrentOperation() != "" {
			t.Errorf("after stop: %s held by %q; want STOPPED, released", got.GetState(), got.GetCurrentOperation())
		}
		ms := fxMachines(t, h, c.GetName())
		if len(ms) != 3 {
			t.Errorf("a stopped cluster has %d machines; want its 3 kept", len(ms))
		}
		for _, m := range ms {
			if m.GetPower() != clv1.Node_STOPPED {
				t.Errorf("after stop, machine %s is %s; want STOPPED", m.GetName(), m.GetPower())
			}
		}

		op, err = h.clients.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: c.GetName()})
		fxDone(t, h, op, err)
		if got := fxGet(t, h, c.GetName()); got.GetState() != clv1.Cluster_RUNNING || got.GetCurrentOperation() != "" {
			t.Errorf("after start: %s held by %q; want RUNNING, released", got.GetState(), got.GetCurrentOperation())
		}
		if got := fxNames(fxCheckNodes(t, h, c.GetName(), 1, 2, "1.30.2")); !slices.Equal(got, fxNames(ms)) {
			t.Errorf("start changed the machines: %v; want the same %v", got, fxNames(ms))
		}
		want := []string{"STOP_REQUESTED:RUNNING->STOPPING", "OPERATION_SUCCEEDED:STOPPING->STOPPED",
			"START_REQUESTED:STOPPED->STARTING", "OPERATION_SUCCEEDED:STARTING->RUNNING"}
		if got := fxTail(t, h, c.GetName(), 4); !slices.Equal(got, want) {
			t.Errorf("history ends %v; want %v", got, want)
		}
	})
}

func TestEffect_ScaleSize(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		c := h.create(t, "web", 2)
		original := fxWithRole(fxMachines(t, h, c.GetName()), clv1.Node_WORKER)

		op, err := h.clients.clusters.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: c.GetName(), WorkerNodeCount: new(int32(4))})
		fxTarget(t, fxDone(t, h, op, err), 4)
		got := fxGet(t, h, c.GetName())
		if got.GetState() != clv1.Cluster_RUNNING || got.GetWorkerNodeCount() != 4 || got.GetCurrentOperation() != "" {
			t.Errorf("after scale up: %s, %d workers, held by %q; want RUNNING with 4, released", got.GetState(), got.GetWorkerNodeCount(), got.GetCurrentOperation())
		}
		if len(got.GetNodes()) != 5 {
			t.Errorf("after scale up: %d nodes; want 5", len(got.GetNodes()))
		}
		fxNodeNames(t, got)
		up := fxWithRole(fxCheckNodes(t, h, c.GetName(), 1, 4, "1.30.2"), clv1.Node_WORKER)
		var added []string
		for _, m := range up {
			if !slices.Contains(fxNames(original), m.GetName()) {
				added = append(added, m.GetName())
			}
		}
		if len(added) != 2 {
			t.Fatalf("scale up 2->4 added %v; want 2 new workers next to %v", added, fxNames(original))
		}

		// Down without naming nodes: the newest workers go.
		op, err = h.clients.clusters.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: c.GetName(), WorkerNodeCount: new(int32(2))})
		fxTarget(t, fxDone(t, h, op, err), 2)
		if got := fxGet(t, h, c.GetName()); got.GetState() != clv1.Cluster_RUNNING || got.GetWorkerNodeCount() != 2 {
			t.Errorf("after scale down: %s with %d workers; want RUNNING with 2", got.GetState(), got.GetWorkerNodeCount())
		}
		down := fxWithRole(fxCheckNodes(t, h, c.GetName(), 1, 2, "1.30.2"), clv1.Node_WORKER)
		if got := fxNames(down); !slices.Equal(got, fxNames(original)) {
			t.Errorf("scale down 4->2 kept workers %v; want the oldest %v (removing the newest %v)", got, fxNames(original), added)
		}
		all := fxNames(fxMachines(t, h, ""))
		for _, gone := range added {
			if slices.Contains(all, gone) {
				t.Errorf("removed worker %s still exists", gone)
			}
		}

		// Down naming the node: exactly that one goes.
		victim, survivor := original[0].GetName(), original[1].GetName()
		op, err = h.clients.clusters.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: c.GetName(), WorkerNodeCount: new(int32(1)), RemoveNodes: []string{victim}})
		fxTarget(t, fxDone(t, h, op, err), 1)
		if got := fxGet(t, h, c.GetName()); got.GetWorkerNodeCount() != 1 {
			t.Errorf("after removing %s: %d workers; want 1", victim, got.GetWorkerNodeCount())
		}
		if got := fxNames(fxWithRole(fxCheckNodes(t, h, c.GetName(), 1, 1, "1.30.2"), clv1.Node_WORKER)); !slices.Equal(got, []string{survivor}) {
			t.Errorf("scale down naming %s kept workers %v; want [%s]", victim, got, survivor)
		}
		if slices.Contains(fxNames(fxMachines(t, h, "")), victim) {
			t.Errorf("removed worker %s still exists", victim)
		}
		want := []string{"SCALE_UP_REQUESTED:RUNNING->SCALING", "OPERATION_SUCCEEDED:SCALING->RUNNING",
			"SCALE_DOWN_REQUESTED:RUNNING->SCALING", "OPERATION_SUCCEEDED:SCALING->RUNNING",
			"SCALE_DOWN_REQUESTED:RUNNING->SCALING", "OPERATION_SUCCEEDED:SCALING->RUNNING"}
		if got := fxTail(t, h, c.GetName(), 6); !slices.Equal(got, want) {
			t.Errorf("history ends %v; want %v", got, want)
		}
	})
}

// fxOfferings returns the service offering of each of a cluster's machines.
func fxOfferings(t *testing.T, h *harness, cluster string) []string {
	t.Helper()
	ms, err := h.srv.sim.Machines(tctx(t), strings.TrimPrefix(cluster, "clusters/"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.Offering)
	}
	return out
}

func TestEffect_ScaleOffering(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		c := h.create(t, "web", 2)

		op, err := h.clients.clusters.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: c.GetName(), ServiceOffering: "large"})
		fxTarget(t, fxDone(t, h, op, err), 0)
		if got := fxGet(t, h, c.GetName()); got.GetState() != clv1.Cluster_RUNNING || got.GetServiceOffering() != "large" || got.GetWorkerNodeCount() != 2 {
			t.Errorf("after a running offering change: %s, %q, %d workers; want RUNNING, large, 2", got.GetState(), got.GetServiceOffering(), got.GetWorkerNodeCount())
		}
		if got := fxOfferings(t, h, c.GetName()); !slices.Equal(got, []string{"large", "large", "large"}) {
			t.Errorf("machine offerings = %v; want every one large", got)
		}
		fxCheckNodes(t, h, c.GetName(), 1, 2, "1.30.2")

		op, err = h.clients.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: c.GetName()})
		fxDone(t, h, op, err)
		op, err = h.clients.clusters.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: c.GetName(), ServiceOffering: "xlarge"})
		fxDone(t, h, op, err)
		if got := fxGet(t, h, c.GetName()); got.GetState() != clv1.Cluster_STOPPED || got.GetServiceOffering() != "xlarge" {
			t.Errorf("after a stopped offering change: %s, %q; want STOPPED, xlarge", got.GetState(), got.GetServiceOffering())
		}
		if got := fxOfferings(t, h, c.GetName()); !slices.Equal(got, []string{"xlarge", "xlarge", "xlarge"}) {
			t.Errorf("machine offerings = %v; want every one xlarge", got)
		}
		for _, m := range fxMachines(t, h, c.GetName()) {
			if m.GetPower() != clv1.Node_STOPPED {
				t.Errorf("a stopped cluster's offering change powered %s to %s", m.GetName(), m.GetPower())
			}
		}
		want := []string{"SCALE_UP_REQUESTED:RUNNING->SCALING", "OPERATION_SUCCEEDED:SCALING->RUNNING",
			"STOP_REQUESTED:RUNNING->STOPPING", "OPERATION_SUCCEEDED:STOPPING->STOPPED",
			"SCALE_UP_REQUESTED:STOPPED->SCALING_STOPPED_CLUSTER", "OPERATION_SUCCEEDED:SCALING_STOPPED_CLUSTER->STOPPED"}
		if got := fxTail(t, h, c.GetName(), 6); !slices.Equal(got, want) {
			t.Errorf("history ends %v; want %v", got, want)
		}
	})
}

func TestEffect_Autoscaling(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		c := h.create(t, "web", 2)
		want := &clv1.Autoscaling{Enabled: true, MinSize: 1, MaxSize: 4}
		op, err := h.clients.clusters.ScaleCluster(tctx(t), &clv1.ScaleClusterRequest{Name: c.GetName(), Autoscaling: want})
		fxDone(t, h, op, err)
		got := fxGet(t, h, c.GetName())
		if a := got.GetAutoscaling(); got.GetState() != clv1.Cluster_RUNNING || a.GetEnabled() != want.GetEnabled() ||
			a.GetMinSize() != want.GetMinSize() || a.GetMaxSize() != want.GetMaxSize() {
			t.Errorf("after enabling the autoscaler: %s with autoscaling %v; want RUNNING with %v", got.GetState(), a, want)
		}
		if moves := fxTail(t, h, c.GetName(), 2); !slices.Equal(moves, []string{"AUTOSCALE_REQUESTED:RUNNING->SCALING", "OPERATION_SUCCEEDED:SCALING->RUNNING"}) {
			t.Errorf("history ends %v", moves)
		}
	})
}

func TestEffect_Upgrade(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		c := h.create(t, "web", 2)
		for _, target := range []string{"1.30.5", "1.31.1"} { // a later patch, then the next minor
			op, err := h.clients.clusters.UpgradeCluster(tctx(t), &clv1.UpgradeClusterRequest{Name: c.GetName(), KubernetesVersion: target})
			fxDone(t, h, op, err)
			if got := fxGet(t, h, c.GetName()); got.GetState() != clv1.Cluster_RUNNING || got.GetKubernetesVersion() != target || got.GetCurrentOperation() != "" {
				t.Errorf("after upgrade to %s: %s at %s held by %q; want RUNNING at %s, released", target, got.GetState(), got.GetKubernetesVersion(), got.GetCurrentOperation(), target)
			}
			fxCheckNodes(t, h, c.GetName(), 1, 2, target)
			if moves := fxTail(t, h, c.GetName(), 2); !slices.Equal(moves, []string{"UPGRADE_REQUESTED:RUNNING->UPGRADING", "OPERATION_SUCCEEDED:UPGRADING->RUNNING"}) {
				t.Errorf("history ends %v", moves)
			}
		}
	})
}

func TestEffect_UpgradeFailure(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		c := h.create(t, "web", 2)
		// Let the first node's upgrade through, then fail the second's.
		hold := fxFault(t, h, "upgrade_node", clv1.Fault_HOLD, c.GetName(), 1)
		op, err := h.clients.clusters.UpgradeCluster(tctx(t), &clv1.UpgradeClusterRequest{Name: c.GetName(), KubernetesVersion: "1.31.1"})
		if err != nil {
			t.Fatal(err)
		}
		first := fxWaitHeld(t, h, c.GetName(), "upgrade_node")
		fxFault(t, h, "upgrade_node", clv1.Fault_FAIL, c.GetName(), 1)
		if _, err := h.clients.sim.ReleaseHeld(tctx(t), &clv1.ReleaseHeldRequest{Fault: hold.GetName()}); err != nil {
			t.Fatal(err)
		}
		fxFailed(t, h, op, nil)

		got := fxGet(t, h, c.GetName())
		if got.GetState() != clv1.Cluster_ALERT || got.GetCurrentOperation() != "" || got.GetKubernetesVersion() != "1.30.2" {
			t.Errorf("after a failed upgrade: %s at %s held by %q; want ALERT, still 1.30.2, released", got.GetState(), got.GetKubernetesVersion(), got.GetCurrentOperation())
		}
		upgraded := 0
		for _, m := range fxMachines(t, h, c.GetName()) {
			want := "1.30.2"
			if m.GetName() == "machines/"+first.MachineID {
				want = "1.31.1"
			}
			if m.GetKubernetesVersion() != want {
				t.Errorf("machine %s is at %s; want %s", m.GetName(), m.GetKubernetesVersion(), want)
			}
			if m.GetKubernetesVersion() == "1.31.1" {
				upgraded++
			}
		}
		if upgraded != 1 {
			t.Errorf("%d nodes upgraded; want exactly the first", upgraded)
		}
		if moves := fxTail(t, h, c.GetName(), 2); !slices.Equal(moves, []string{"UPGRADE_REQUESTED:RUNNING->UPGRADING", "OPERATION_FAILED:UPGRADING->ALERT"}) {
			t.Errorf("history ends %v", moves)
		}
	})
}

func TestEffect_AddRemoveNodes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		c := h.create(t, "web", 2)
		ext := []*clv1.Machine{fxExternal(t, h), fxExternal(t, h)}

		op, err := h.clients.clusters.AddNodes(ctx, &clv1.AddNodesRequest{Name: c.GetName(), Machines: fxNames(ext)})
		fxTarget(t, fxDone(t, h, op, err), 4)
		if got := fxGet(t, h, c.GetName()); got.GetState() != clv1.Cluster_RUNNING || got.GetWorkerNodeCount() != 4 || got.GetCurrentOperation() != "" {
			t.Errorf("after adding 2 nodes: %s, %d workers, held by %q; want RUNNING, 4, released", got.GetState(), got.GetWorkerNodeCount(), got.GetCurrentOperation())
		}
		ms := fxMachines(t, h, c.GetName())
		for _, e := range ext {
			i := slices.IndexFunc(ms, func(m *clv1.Machine) bool { return m.GetName() == e.GetName() })
			if i < 0 {
				t.Fatalf("added machine %s is not a machine of %s", e.GetName(), c.GetName())
			}
			if m := ms[i]; m.GetRole() != clv1.Node_WORKER || !m.GetJoined() {
				t.Errorf("added machine = %v; want a joined WORKER of %s", m, c.GetName())
			}
			// A joined node runs the cluster's Kubernetes: adding a node
			// installs it (the model attaches the cluster's ISO to each
			// added machine before it joins).
			if v := ms[i].GetKubernetesVersion(); v != "1.30.2" {
				t.Errorf("AddNodes joined %s without installing Kubernetes: its version is %q; want the cluster's 1.30.2", e.GetName(), v)
			}
		}
		// Everything else a node of the cluster must be, added ones too:
		// running, joined, no ISO left, its rules.
		fxCheckNodes(t, h, c.GetName(), 1, 4, "")
		if moves := fxTail(t, h, c.GetName(), 2); !slices.Equal(moves, []string{"ADD_NODE_REQUESTED:RUNNING->IMPORTING", "OPERATION_SUCCEEDED:IMPORTING->RUNNING"}) {
			t.Errorf("history ends %v", moves)
		}

		gone := ext[0].GetName()
		op, err = h.clients.clusters.RemoveNodes(ctx, &clv1.RemoveNodesRequest{Name: c.GetName(), Nodes: []string{gone}})
		fxTarget(t, fxDone(t, h, op, err), 0)
		if got := fxGet(t, h, c.GetName()); got.GetState() != clv1.Cluster_RUNNING || got.GetWorkerNodeCount() != 3 {
			t.Errorf("after removing a node: %s with %d workers; want RUNNING with 3", got.GetState(), got.GetWorkerNodeCount())
		}
		all := fxMachines(t, h, "")
		i := slices.IndexFunc(all, func(m *clv1.Machine) bool { return m.GetName() == gone })
		if i < 0 {
			t.Fatalf("removed node %s no longer exists; want it back in the free pool", gone)
		}
		if m := all[i]; m.GetCluster() != "" || m.GetRole() != clv1.Node_EXTERNAL || m.GetJoined() || m.GetCordoned() {
			t.Errorf("removed node = %v; want a free, unjoined, uncordoned EXTERNAL machine", m)
		}
		for _, r := range fxRules(t, h, c.GetName()) {
			if strings.HasPrefix(r, gone+" ") {
				t.Errorf("rule %q of the removed node is still there", r)
			}
		}
		if moves := fxTail(t, h, c.GetName(), 2); !slices.Equal(moves, []string{"REMOVE_NODE_REQUESTED:RUNNING->REMOVING_NODES", "OPERATION_SUCCEEDED:REMOVING_NODES->RUNNING"}) {
			t.Errorf("history ends %v", moves)
		}
	})
}

func TestEffect_Delete(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		c := h.create(t, "web", 2)
		keep := h.create(t, "other", 1)

		op, err := h.clients.clusters.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: c.GetName()})
		done := fxDone(t, h, op, err)
		if !done.GetResponse().MessageIs(&emptypb.Empty{}) {
			t.Errorf("delete response is a %s; want google.protobuf.Empty", done.GetResponse().GetTypeUrl())
		}
		if got := fxGet(t, h, c.GetName()); got.GetState() != clv1.Cluster_DESTROYED || got.GetCurrentOperation() != "" {
			t.Errorf("deleted cluster = %s held by %q; want DESTROYED, released", got.GetState(), got.GetCurrentOperation())
		}
		list, err := h.clients.clusters.ListClusters(ctx, &clv1.ListClustersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if got := len(list.GetClusters()); got != 1 || list.GetClusters()[0].GetName() != keep.GetName() {
			t.Errorf("ListClusters after the delete = %d clusters; want only %s", got, keep.GetName())
		}
		if ms := fxMachines(t, h, c.GetName()); len(ms) != 0 {
			t.Errorf("deleted cluster still has machines %v", fxNames(ms))
		}
		if rs := fxRules(t, h, c.GetName()); len(rs) != 0 {
			t.Errorf("deleted cluster still has rules %v", rs)
		}
		fxCheckNodes(t, h, keep.GetName(), 1, 1, "1.30.2")
		if moves := fxTail(t, h, c.GetName(), 2); !slices.Equal(moves, []string{"DESTROY_REQUESTED:RUNNING->DESTROYING", "OPERATION_SUCCEEDED:DESTROYING->DESTROYED"}) {
			t.Errorf("history ends %v", moves)
		}
		if again := h.create(t, "web", 1); again.GetName() == c.GetName() {
			t.Errorf("the reused display name got the deleted cluster's name %s", again.GetName())
		}
	})
}

func TestEffect_DeleteFailureIsRetried(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		c := h.create(t, "web", 2)
		fxFault(t, h, "destroy_machine", clv1.Fault_FAIL, c.GetName(), 1)
		op, err := h.clients.clusters.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: c.GetName()})
		fxFailed(t, h, op, err)
		if got := fxGet(t, h, c.GetName()); got.GetState() != clv1.Cluster_DESTROYING || got.GetCurrentOperation() != "" {
			t.Fatalf("after a failed destroy: %s held by %q; want DESTROYING with no holder", got.GetState(), got.GetCurrentOperation())
		}

		op, err = h.clients.clusters.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: c.GetName()})
		fxDone(t, h, op, err)
		if got := fxGet(t, h, c.GetName()); got.GetState() != clv1.Cluster_DESTROYED || got.GetCurrentOperation() != "" {
			t.Errorf("after the retried destroy: %s held by %q; want DESTROYED", got.GetState(), got.GetCurrentOperation())
		}
		if ms := fxMachines(t, h, c.GetName()); len(ms) != 0 {
			t.Errorf("destroyed cluster still has machines %v", fxNames(ms))
		}
		if rs := fxRules(t, h, c.GetName()); len(rs) != 0 {
			t.Errorf("destroyed cluster still has rules %v", rs)
		}
		if moves := fxMoves(fxHistory(t, h, c.GetName())); !slices.Contains(moves, "DESTROY_REQUESTED:RUNNING->DESTROYING") ||
			moves[len(moves)-1] != "OPERATION_SUCCEEDED:DESTROYING->DESTROYED" {
			t.Errorf("history = %v; want DESTROY_REQUESTED:RUNNING->DESTROYING and, last, OPERATION_SUCCEEDED:DESTROYING->DESTROYED", moves)
		}
	})
}

// A scale held in a step past its deadline ends DEADLINE_EXCEEDED, its
// step released, the cluster in ALERT. The deadline must outlast the way
// to the held step on a loaded machine (300 ms did not, under -race beside
// two make test runs: the scale ended before it reached the hold, which
// the test then waited for in vain), so it is 5 s; the wait for the hold
// ends with the operation.
func TestEffect_OperationDeadline(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, func(c *Config) {
			c.Deadlines = service.Deadlines{Default: time.Hour, ByKind: map[string]time.Duration{"scale": 5 * time.Second}}
		})
		c := h.create(t, "web", 2)
		fxFault(t, h, "provision_machine", clv1.Fault_HOLD, c.GetName(), 0)
		op, err := h.clients.clusters.ScaleCluster(tctx(t), &clv1.ScaleClusterRequest{Name: c.GetName(), WorkerNodeCount: new(int32(3))})
		if err != nil {
			t.Fatal(err)
		}
		heldCtx, cancel := context.WithCancel(tctx(t))
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			defer cancel()
			for heldCtx.Err() == nil {
				got, err := h.clients.ops.WaitOperation(heldCtx, &longrunningpb.WaitOperationRequest{Name: op.GetName(), Timeout: durationpb.New(10 * time.Second)})
				if err != nil || got.GetDone() {
					return
				}
			}
		}()
		id := strings.TrimPrefix(c.GetName(), "clusters/")
		_, err = h.srv.sim.WaitHeld(heldCtx, func(hd sim.Held) bool { return hd.Step == "provision_machine" && hd.ClusterID == id })
		cancel()
		<-ended
		if err != nil {
			t.Fatalf("the scale's provision_machine step was never held (the scale ended first, or 5 min passed): %v", err)
		}
		// Not released: only the deadline can end it.
		done := fxFailed(t, h, op, nil)
		if reason, _ := opErrorInfo(t, done.GetError()); done.GetError().GetCode() != int32(codes.DeadlineExceeded) || reason != service.ReasonDeadlineExceeded {
			t.Errorf("operation error = %v; want code %d DEADLINE_EXCEEDED, reason DEADLINE_EXCEEDED", done.GetError(), codes.DeadlineExceeded)
		}
		if got := fxGet(t, h, c.GetName()); got.GetState() != clv1.Cluster_ALERT || got.GetCurrentOperation() != "" || got.GetWorkerNodeCount() != 2 {
			t.Errorf("after the deadline: %s with %d workers held by %q; want ALERT, still 2, released", got.GetState(), got.GetWorkerNodeCount(), got.GetCurrentOperation())
		}
		if held := h.srv.sim.ListHeld(); len(held) != 0 {
			t.Errorf("steps still held after the deadline: %v", held)
		}
		if moves := fxTail(t, h, c.GetName(), 2); !slices.Equal(moves, []string{"SCALE_UP_REQUESTED:RUNNING->SCALING", "OPERATION_FAILED:SCALING->ALERT"}) {
			t.Errorf("history ends %v", moves)
		}
	})
}

func TestEffect_ListOperationsByClusterAndDone(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		a, other := h.create(t, "a", 1), h.create(t, "b", 1)
		stop, err := h.clients.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: a.GetName()})
		fxDone(t, h, stop, err)
		// A start of a held in power_on: a's running operation.
		fxFault(t, h, "power_on", clv1.Fault_HOLD, a.GetName(), 0)
		running, err := h.clients.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: a.GetName()})
		if err != nil {
			t.Fatal(err)
		}
		fxWaitHeld(t, h, a.GetName(), "power_on")

		list := func(filter string) []string {
			t.Helper()
			resp, err := h.clients.ops.ListOperations(ctx, &longrunningpb.ListOperationsRequest{Name: "operations", Filter: filter})
			if err != nil {
				t.Fatalf("ListOperations(%s): %v", filter, err)
			}
			var out []string
			for _, op := range resp.GetOperations() {
				out = append(out, fmt.Sprintf("%s %s done=%v", fxMetadata(t, op).GetVerb(), op.GetName(), op.GetDone()))
			}
			return out
		}
		createOf := func(c *clv1.Cluster) string {
			t.Helper()
			ops, err := h.clients.ops.ListOperations(ctx, &longrunningpb.ListOperationsRequest{Filter: `cluster = "` + c.GetName() + `"`})
			if err != nil || len(ops.GetOperations()) == 0 {
				t.Fatalf("operations of %s: %v, %v", c.GetName(), ops, err)
			}
			return ops.GetOperations()[0].GetName()
		}
		for _, tt := range []struct {
			filter string
			want   []string
		}{
			{`cluster = "` + a.GetName() + `" AND done = true`, []string{"create " + createOf(a) + " done=true", "stop " + stop.GetName() + " done=true"}},
			{`cluster = "` + a.GetName() + `" AND done = false`, []string{"start " + running.GetName() + " done=false"}},
			{`cluster = "` + other.GetName() + `" AND done = true`, []string{"create " + createOf(other) + " done=true"}},
		} {
			if got := list(tt.filter); !slices.Equal(got, tt.want) {
				t.Errorf("ListOperations(%s) = %v; want %v", tt.filter, got, tt.want)
			}
		}
		// Remove the fault and let the start go on.
		if _, err := h.clients.sim.ClearFaults(ctx, &clv1.ClearFaultsRequest{}); err != nil {
			t.Fatal(err)
		}
		fxDone(t, h, running, nil)
	})
}
