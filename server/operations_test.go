package server

import (
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/protobuf/types/known/durationpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository/repotest"
)

// wait blocks until the operation is done (bounded: 5 minutes, a deadline
// for a stuck operation that a loaded machine's slow ones stay far inside)
// and returns it.
func (h *harness) wait(t testing.TB, op *longrunningpb.Operation) *longrunningpb.Operation {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		got, err := h.clients.ops.WaitOperation(tctx(t), &longrunningpb.WaitOperationRequest{Name: op.GetName(), Timeout: durationpb.New(10 * time.Second)})
		if err != nil {
			t.Fatalf("WaitOperation(%s): %v", op.GetName(), err)
		}
		if got.GetDone() {
			return got
		}
	}
	t.Fatalf("operation %s not done after 5 minutes", op.GetName())
	return nil
}

// create creates a cluster through the API and waits for it to be RUNNING.
func (h *harness) create(t testing.TB, name string, workers int32) *clv1.Cluster {
	t.Helper()
	op, err := h.clients.clusters.CreateCluster(tctx(t), &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
		DisplayName: name, KubernetesVersion: "1.30.2", WorkerNodeCount: workers, ServiceOffering: "medium",
	}})
	if err != nil {
		t.Fatalf("CreateCluster(%s): %v", name, err)
	}
	done := h.wait(t, op)
	if done.GetError() != nil {
		t.Fatalf("create %s failed: %v", name, done.GetError())
	}
	c := &clv1.Cluster{}
	if err := done.GetResponse().UnmarshalTo(c); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCreateClusterEndToEnd(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		c := h.create(t, "web", 2)
		if c.GetState() != clv1.Cluster_RUNNING || c.GetCurrentOperation() != "" || c.GetEndpoint() == "" {
			t.Errorf("created cluster = %v", c)
		}
		got, err := h.clients.clusters.GetCluster(tctx(t), &clv1.GetClusterRequest{Name: c.GetName()})
		if err != nil {
			t.Fatal(err)
		}
		if got.GetState() != clv1.Cluster_RUNNING || len(got.GetNodes()) != 3 {
			t.Errorf("GetCluster = %s with %d nodes; want RUNNING with 3", got.GetState(), len(got.GetNodes()))
		}
		for _, n := range got.GetNodes() {
			if !n.GetJoined() || n.GetPower() != clv1.Node_RUNNING || n.GetKubernetesVersion() != "1.30.2" {
				t.Errorf("node %v; want joined, running, 1.30.2", n)
			}
		}
	})
}
