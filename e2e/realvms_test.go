package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// vmLiveness: a restarted server adopts its dead incarnation's operations
// within seconds, and the periodic reconciliation sees a domain destroyed
// out of band within 2s. The peer timeout is not shorter: guests booting
// under TCG load the machine, and heartbeats of a few hundred milliseconds
// then miss their deadlines.
var vmLiveness = []string{"--peer-timeout", "10s", "--heartbeat-interval", "1s", "--scan-interval", "1s", "--reconcile-interval", "2s"}

// vmSpec is a cluster of one control node and workers workers, each a
// 192 MiB, 1 vCPU guest (the driver's default "medium").
func vmSpec(name string, workers int32) *clv1.Cluster {
	return &clv1.Cluster{DisplayName: name, KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: workers, ServiceOffering: "medium"}
}

// TestRealVMs drives clusterd (the binary, over gRPC) with --infra libvirt
// on qemu:///system, every node a QEMU guest booted from the node image,
// through a cluster's life, checking each step through the API and through
// virsh: create (1 control + 1 worker), scale to 2 workers, stop, start,
// upgrade (the version's ISO swapped in, each node's agent reports the new
// version), a domain destroyed with virsh (reconciliation takes the
// cluster to ALERT; StartCluster brings it back to RUNNING), delete. Then
// clusterd is killed (-9) in the middle of a second cluster's create, once
// the create has provisioned domains; restarted, it adopts the create and
// finishes it on those domains; deleted, nothing of clusterd's is left on
// libvirt: no domain, volume or network filter. At most 3 guests run at
// once (the first cluster is deleted before the second is made).
func TestRealVMs(t *testing.T) {
	e := newVMEnv(t, systemURI)
	flags := append(e.flags(), vmLiveness...)
	s := startServer(t, e.dsn, "vm-a", flags...)

	ctx, cancel := rpcCtx()
	op, err := s.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: vmSpec("vms", 1)})
	cancel()
	done, _ := s.vmSucceed(t, "create 1+1", op, err)
	c := metadata(t, done).GetCluster()
	e.wantNodes(t, s, c, clv1.Cluster_RUNNING, 1, 1, clv1.Node_RUNNING, "1.30.2")
	if t.Failed() {
		t.FailNow()
	}

	ctx, cancel = rpcCtx()
	op, err = s.clusters.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: c, WorkerNodeCount: proto.Int32(2)})
	cancel()
	s.vmSucceed(t, "scale to 2 workers", op, err)
	e.wantNodes(t, s, c, clv1.Cluster_RUNNING, 1, 2, clv1.Node_RUNNING, "1.30.2")

	ctx, cancel = rpcCtx()
	op, err = s.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: c})
	cancel()
	s.vmSucceed(t, "stop", op, err)
	e.wantNodes(t, s, c, clv1.Cluster_STOPPED, 1, 2, clv1.Node_STOPPED, "1.30.2")

	ctx, cancel = rpcCtx()
	op, err = s.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: c})
	cancel()
	s.vmSucceed(t, "start", op, err)
	e.wantNodes(t, s, c, clv1.Cluster_RUNNING, 1, 2, clv1.Node_RUNNING, "1.30.2")

	ctx, cancel = rpcCtx()
	op, err = s.clusters.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: c, KubernetesVersion: "1.30.5"})
	cancel()
	s.vmSucceed(t, "upgrade to 1.30.5", op, err)
	if got := s.cluster(t, c).GetKubernetesVersion(); got != "1.30.5" {
		t.Errorf("%s is at %s after the upgrade; want 1.30.5", c, got)
	}
	nodes := e.wantNodes(t, s, c, clv1.Cluster_RUNNING, 1, 2, clv1.Node_RUNNING, "1.30.5")
	if t.Failed() {
		t.FailNow()
	}

	// A worker's guest pulled out from under clusterd.
	var victim string
	for _, n := range nodes {
		if n.GetRole() == clv1.Node_WORKER {
			victim = n.GetName()
		}
	}
	e.mustVirsh(t, "destroy", "clusterd-"+machineID(victim))
	destroyed := time.Now()
	s.waitCluster(t, c, "ALERT after virsh destroy", vmStateTimeout, func(c *clv1.Cluster) bool { return c.GetState() == clv1.Cluster_ALERT })
	t.Logf("virsh destroy to ALERT: %s", time.Since(destroyed).Round(100*time.Millisecond))
	s.vmStartFromAlert(t, c)
	e.wantNodes(t, s, c, clv1.Cluster_RUNNING, 1, 2, clv1.Node_RUNNING, "1.30.5")

	ctx, cancel = rpcCtx()
	op, err = s.clusters.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: c})
	cancel()
	s.vmSucceed(t, "delete", op, err)
	if got := s.cluster(t, c).GetState(); got != clv1.Cluster_DESTROYED {
		t.Errorf("%s is %s after delete; want DESTROYED", c, got)
	}
	if left := e.leftovers(t); len(left) > 0 {
		t.Fatalf("after deleting %s, left on libvirt: %v", c, left)
	}

	// kill -9 in the middle of a create, once it has made domains.
	ctx, cancel = rpcCtx()
	op, err = s.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: vmSpec("vms-kill", 1)})
	cancel()
	name := started(t, "create vms-kill", op, err)
	pastProvision := map[string]bool{"configure_network": true, "attach_iso": true, "wait_api": true}
	mid, _ := s.waitVMOp(t, name, func(md *clv1.OperationMetadata) bool { return pastProvision[md.GetStep()] })
	if mid.GetDone() {
		t.Fatalf("create %s ended before the kill: %v", name, mid.GetError())
	}
	c2 := metadata(t, mid).GetCluster()
	s.kill9()
	step := metadata(t, mid).GetStep()
	made := e.domainsOf(t, c2)
	if len(made) == 0 {
		t.Fatalf("killed at %s, %s has no domain", step, c2)
	}
	t.Logf("killed clusterd at %s; %s has domains %v", step, c2, made)

	s = startServer(t, e.dsn, "vm-a", flags...)
	restarted := time.Now()
	done, _ = s.vmSucceed(t, "the adopted create", &longrunningpb.Operation{Name: name}, nil)
	t.Logf("restart to the adopted create's end: %s", time.Since(restarted).Round(100*time.Millisecond))
	if md := metadata(t, done); md.GetAttempt() != 2 || md.GetServer() != "vm-a" {
		t.Errorf("operation metadata: attempt %d on %q; want attempt 2 on vm-a", md.GetAttempt(), md.GetServer())
	}
	adoption(t, s, c2, name)
	nodes = e.wantNodes(t, s, c2, clv1.Cluster_RUNNING, 1, 1, clv1.Node_RUNNING, "1.30.2")
	after := e.domainsOf(t, c2)
	if len(after) != 2 || !subset(made, after) {
		t.Errorf("domains of %s before the kill %v, after the adopted create %v: the create did not go on with the domains it had made", c2, made, after)
	}
	for _, n := range nodes {
		// The adopted attempt joined each node: its token is on each domain.
		if m := e.domMeta(t, n.GetName()); m.Job != strings.TrimPrefix(name, "operations/") || m.Attempt != 2 {
			t.Errorf("fencing token on the domain of %s: job %s attempt %d; want %s attempt 2", n.GetName(), m.Job, m.Attempt, name)
		}
	}

	ctx, cancel = rpcCtx()
	op, err = s.clusters.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: c2})
	cancel()
	s.vmSucceed(t, "delete vms-kill", op, err)
	if left := e.leftovers(t); len(left) > 0 {
		t.Errorf("after deleting both clusters, left on libvirt: %v", left)
	}
}

// subset reports whether every element of a is in b.
func subset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// vmStartFromAlert starts an ALERT cluster, as startFromAlert does with the
// real VMs' deadlines: a start refused because reconciliation is taking
// the cluster back itself is waited out.
func (s *server) vmStartFromAlert(t *testing.T, name string) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		ctx, cancel := rpcCtx()
		op, err := s.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: name})
		cancel()
		if err == nil {
			s.vmSucceed(t, "start from ALERT", op, nil)
			return
		}
		if code, _ := refusal(err); code != codes.Aborted && code != codes.FailedPrecondition {
			t.Fatalf("start %s: %v", name, err)
		}
		c, _ := s.waitCluster(t, name, "released", vmOpTimeout, released)
		if c.GetState() == clv1.Cluster_RUNNING {
			t.Logf("start %s refused (%v): reconciliation brought it back to RUNNING first", name, err)
			return
		}
		if attempt == 3 {
			t.Fatalf("start %s: %v, and the cluster is %s", name, err, c.GetState())
		}
	}
}
