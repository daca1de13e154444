package server

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// stepKind is one kind of operation, as TestEveryStepFailureIsStepFailed
// runs it: setup brings a new cluster to where the operation applies (""
// for a create, which makes its own), run starts the operation on it.
type stepKind struct {
	name  string
	setup func(t *testing.T, h *harness, name string) string
	run   func(t *testing.T, h *harness, name, cluster string) *longrunningpb.Operation
}

// stepKinds are every kind of operation clusterd runs, each on a cluster
// where it has work at every phase (a create with its autoscaler, a scale
// that adds workers, ...).
func stepKinds() []stepKind {
	running := func(workers int32) func(*testing.T, *harness, string) string {
		return func(t *testing.T, h *harness, name string) string { return h.create(t, name, workers).GetName() }
	}
	started := func(t *testing.T, op *longrunningpb.Operation, err error) *longrunningpb.Operation {
		t.Helper()
		if err != nil {
			t.Fatalf("RPC refused: %v", err)
		}
		return op
	}
	scale := func(req *clv1.ScaleClusterRequest) func(*testing.T, *harness, string, string) *longrunningpb.Operation {
		return func(t *testing.T, h *harness, _, cluster string) *longrunningpb.Operation {
			req := proto.Clone(req).(*clv1.ScaleClusterRequest)
			req.Name = cluster
			op, err := h.clients.clusters.ScaleCluster(tctx(t), req)
			return started(t, op, err)
		}
	}
	return []stepKind{
		{name: "create", run: func(t *testing.T, h *harness, name, _ string) *longrunningpb.Operation {
			cl := fxCluster(name, 2)
			cl.Autoscaling = &clv1.Autoscaling{Enabled: true, MinSize: 1, MaxSize: 4}
			op, err := h.clients.clusters.CreateCluster(tctx(t), &clv1.CreateClusterRequest{Cluster: cl})
			return started(t, op, err)
		}},
		{name: "start", setup: func(t *testing.T, h *harness, name string) string {
			c := h.create(t, name, 2)
			op, err := h.clients.clusters.StopCluster(tctx(t), &clv1.StopClusterRequest{Name: c.GetName()})
			fxDone(t, h, op, err)
			return c.GetName()
		}, run: func(t *testing.T, h *harness, _, cluster string) *longrunningpb.Operation {
			op, err := h.clients.clusters.StartCluster(tctx(t), &clv1.StartClusterRequest{Name: cluster})
			return started(t, op, err)
		}},
		{name: "stop", setup: running(2), run: func(t *testing.T, h *harness, _, cluster string) *longrunningpb.Operation {
			op, err := h.clients.clusters.StopCluster(tctx(t), &clv1.StopClusterRequest{Name: cluster})
			return started(t, op, err)
		}},
		{name: "scale up", setup: running(1), run: scale(&clv1.ScaleClusterRequest{WorkerNodeCount: proto.Int32(3)})},
		{name: "scale down", setup: running(3), run: scale(&clv1.ScaleClusterRequest{WorkerNodeCount: proto.Int32(1)})},
		{name: "scale offering", setup: running(2), run: scale(&clv1.ScaleClusterRequest{ServiceOffering: "large"})},
		{name: "autoscale", setup: running(2), run: scale(&clv1.ScaleClusterRequest{Autoscaling: &clv1.Autoscaling{Enabled: true, MinSize: 1, MaxSize: 4}})},
		{name: "add nodes", setup: running(1), run: func(t *testing.T, h *harness, _, cluster string) *longrunningpb.Operation {
			op, err := h.clients.clusters.AddNodes(tctx(t), &clv1.AddNodesRequest{Name: cluster, Machines: []string{fxExternal(t, h).GetName()}})
			return started(t, op, err)
		}},
		{name: "remove nodes", setup: running(2), run: func(t *testing.T, h *harness, _, cluster string) *longrunningpb.Operation {
			worker := fxWithRole(fxMachines(t, h, cluster), clv1.Node_WORKER)[0]
			op, err := h.clients.clusters.RemoveNodes(tctx(t), &clv1.RemoveNodesRequest{Name: cluster, Nodes: []string{worker.GetName()}})
			return started(t, op, err)
		}},
		{name: "upgrade", setup: running(2), run: func(t *testing.T, h *harness, _, cluster string) *longrunningpb.Operation {
			op, err := h.clients.clusters.UpgradeCluster(tctx(t), &clv1.UpgradeClusterRequest{Name: cluster, KubernetesVersion: "1.30.5"})
			return started(t, op, err)
		}},
		{name: "delete", setup: running(2), run: func(t *testing.T, h *harness, _, cluster string) *longrunningpb.Operation {
			op, err := h.clients.clusters.DeleteCluster(tctx(t), &clv1.DeleteClusterRequest{Name: cluster})
			return started(t, op, err)
		}},
		// The scanner's recovery of an ALERT cluster whose create failed
		// after its nodes joined: it finishes the cluster (API, kubeconfig,
		// provider). Started as the scanner starts it.
		{name: "recover", setup: func(t *testing.T, h *harness, name string) string {
			fxFault(t, h, infra.StepDeployProvider, clv1.Fault_FAIL, "", 1)
			op, err := h.clients.clusters.CreateCluster(tctx(t), &clv1.CreateClusterRequest{Cluster: fxCluster(name, 2)})
			cluster := fxMetadata(t, fxFailed(t, h, op, err)).GetCluster()
			if c := fxGet(t, h, cluster); c.GetState() != clv1.Cluster_ALERT || c.GetCurrentOperation() != "" {
				t.Fatalf("after a create failed at deploy_provider: %s held by %q; want ALERT, released", c.GetState(), c.GetCurrentOperation())
			}
			return cluster
		}, run: func(t *testing.T, h *harness, _, cluster string) *longrunningpb.Operation {
			c, err := h.seed.GetCluster(tctx(t), clusterUUID(cluster))
			if err != nil {
				t.Fatal(err)
			}
			if err := h.srv.clusters.RecoverAlert(tctx(t), c); err != nil {
				t.Fatalf("RecoverAlert: %v", err)
			}
			for _, e := range fxHistory(t, h, cluster) {
				if e.GetEvent() == lifecycle.RecoveryRequested.String() {
					return &longrunningpb.Operation{Name: e.GetOperation()}
				}
			}
			t.Fatalf("no %s event in the history of %s", lifecycle.RecoveryRequested, cluster)
			return nil
		}},
	}
}

// stepsOf runs kind once without faults and returns the steps its operation
// made, in order of first call, as the simulator's call log recorded them:
// the steps to fail are derived from what the code does, not listed by hand.
func stepsOf(t *testing.T, h *harness, kind stepKind, name string) []string {
	t.Helper()
	var cluster string
	if kind.setup != nil {
		cluster = kind.setup(t, h, name)
	}
	op := kind.run(t, h, name, cluster)
	done := h.wait(t, op)
	if done.GetError() != nil {
		t.Fatalf("%s without faults failed: %v", kind.name, done.GetError())
	}
	calls, err := sim.Calls(tctx(t), h.seed, clusterUUID(fxMetadata(t, done).GetCluster()))
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, c := range calls {
		if c.Fence.JobID == operationUUID(op.GetName()) && !slices.Contains(steps, c.Fence.Step) {
			steps = append(steps, c.Fence.Step)
		}
	}
	if len(steps) == 0 {
		t.Fatalf("%s made no infrastructure call", kind.name)
	}
	return steps
}

// TestEveryStepFailureIsStepFailed fails each step of each kind of
// operation with the simulator (FAIL, once) and checks that the operation
// ends UNAVAILABLE with reason STEP_FAILED, the step in its metadata and the
// fault's whole text in its message, the same over GetOperation,
// WaitOperation and REST, and that the cluster's history says why.
func TestEveryStepFailureIsStepFailed(t *testing.T) {
	// The mapping does not depend on the database: one backend keeps this
	// (several dozen operations) quick.
	h := start(t, repotest.Backends(t)[0])
	t.Cleanup(h.srv.sim.ClearFaults)
	n := 0
	newName := func() string { n++; return fmt.Sprintf("sf-%d", n) }
	covered := map[string]bool{}
	for _, kind := range stepKinds() {
		steps := stepsOf(t, h, kind, newName())
		for _, step := range steps {
			covered[step] = true
			t.Run(strings.ReplaceAll(kind.name, " ", "_")+"/"+step, func(t *testing.T) {
				name := newName()
				var cluster string
				if kind.setup != nil {
					cluster = kind.setup(t, h, name)
				}
				f := fxFault(t, h, step, clv1.Fault_FAIL, cluster, 1)
				op := kind.run(t, h, name, cluster)
				checkStepFailure(t, h, op, step, fmt.Sprintf("%s: %v (fault %s)", step, sim.ErrInjected, strings.TrimPrefix(f.GetName(), "faults/")))
			})
		}
	}
	// Every step some operation makes is failed above; uncordon_node is
	// only a repair's (of a drain an interrupted operation left).
	for _, step := range infra.Steps() {
		if !covered[step] && step != infra.StepUncordonNode {
			t.Errorf("no operation kind above runs step %s: add the kind that does", step)
		}
	}
	// No operation above, setups and repairs on the way out included,
	// ended INTERNAL: an error no mapping names fails here too.
	noInternalJobs(t, h)
}

// checkStepFailure checks that op failed at step with cause as its
// infrastructure error, as every client sees it.
func checkStepFailure(t *testing.T, h *harness, op *longrunningpb.Operation, step, cause string) {
	t.Helper()
	done := h.wait(t, op)
	if done.GetError() == nil {
		t.Fatalf("operation %s succeeded; want it to fail at %s", op.GetName(), step)
	}
	want := fmt.Sprintf("step %s failed: %s", step, cause)
	e := done.GetError()
	reason, meta := opErrorInfo(t, e)
	if codes.Code(e.GetCode()) != codes.Unavailable || reason != service.ReasonStepFailed || meta["step"] != step || e.GetMessage() != want {
		t.Errorf("operation error: %s %s step %q: %q\nwant: UNAVAILABLE %s step %q: %q",
			codes.Code(e.GetCode()), reason, meta["step"], e.GetMessage(), service.ReasonStepFailed, step, want)
	}
	got, err := h.clients.ops.GetOperation(tctx(t), &longrunningpb.GetOperationRequest{Name: op.GetName()})
	if err != nil {
		t.Fatalf("GetOperation: %v", err)
	}
	if !proto.Equal(got.GetError(), e) {
		t.Errorf("GetOperation error = %v; WaitOperation said %v", got.GetError(), e)
	}
	code, rest := h.restCall(t, "GET", "/v1/"+op.GetName(), nil)
	restErr, _ := rest["error"].(map[string]any)
	details, _ := restErr["details"].([]any)
	var restReason any
	if len(details) > 0 {
		d, _ := details[0].(map[string]any)
		restReason = d["reason"]
	}
	if code != 200 || restErr["code"] != float64(codes.Unavailable) || restErr["message"] != want || restReason != service.ReasonStepFailed {
		t.Errorf("GET /v1/%s: %d %v; want the error UNAVAILABLE %s %q", op.GetName(), code, rest["error"], service.ReasonStepFailed, want)
	}
	cluster := fxMetadata(t, done).GetCluster()
	var msgs []string
	for _, ev := range fxHistory(t, h, cluster) {
		if ev.GetOperation() == op.GetName() {
			msgs = append(msgs, ev.GetMessage())
		}
	}
	if !slices.ContainsFunc(msgs, func(m string) bool { return strings.HasPrefix(m, "operation failed: "+cause) }) {
		t.Errorf("history of %s by %s = %q; want an entry saying the operation failed: %s", cluster, op.GetName(), msgs, cause)
	}
}
