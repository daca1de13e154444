package e2e

import (
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// TestRealVMFencing: two clusterd servers on one database and one libvirtd
// (qemu:///system). Server a is SIGSTOPped in the middle of a create while
// it is at a libvirt step (provisioning domains or configuring the
// network, found by watching the operation's step), for longer than the
// peer timeout; server b adopts the create and finishes it on real guests.
// Then a is SIGCONTed with its step still in flight: it must change no
// domain. Every domain's XML (live and persistent, clusterd's metadata
// with its fencing token among it) is the same before a resumes and once
// a's attempt has ended, and each records b's attempt. Then an upgrade
// through a, whose guests' agents b spoke to last, succeeds.
func TestRealVMFencing(t *testing.T) {
	e := newVMEnv(t, systemURI)
	flags := append(e.flags(), "--peer-timeout", "10s", "--heartbeat-interval", "1s", "--scan-interval", "1s",
		"--reconcile-interval", "1h", "--log-level", "DEBUG")
	a := startServer(t, e.dsn, "vm-a", flags...)
	b := startServer(t, e.dsn, "vm-b", flags...)

	// The steps before the first that talks to a node agent: a server
	// stopped in one of them holds no agent's channel, which a guest
	// serves to one host connection at a time.
	libvirtSteps := map[string]bool{"provision_machine": true, "configure_network": true}
	var op, cluster, step string
	for try := 1; op == ""; try++ {
		ctx, cancel := rpcCtx()
		resp, err := a.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: vmSpec("fence", 1)})
		cancel()
		name := started(t, "create fence", resp, err)
		mid, _ := a.waitVMOp(t, name, func(md *clv1.OperationMetadata) bool { return md.GetStep() != "claim_starting" })
		md := metadata(t, mid)
		if libvirtSteps[md.GetStep()] {
			if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatalf("SIGSTOP vm-a: %v", err)
			}
			// vm-a ran on between the poll and the signal: where it
			// stopped is the step it recorded last (a step is recorded
			// before it runs, so one recorded at attach_iso has not
			// dialled an agent yet).
			ctx, cancel := rpcCtx()
			now, err := b.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: name})
			cancel()
			if err != nil {
				t.Fatalf("GetOperation %s through vm-b: %v", name, err)
			}
			if at := metadata(t, now).GetStep(); libvirtSteps[at] || at == "attach_iso" {
				op, cluster, step = name, md.GetCluster(), at
				break
			}
			md = metadata(t, now)
			if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatalf("SIGCONT vm-a: %v", err)
			}
		}
		// The first poll came too late (a loaded machine), or vm-a ran on
		// past the libvirt steps before the signal: start over.
		t.Logf("try %d: the create was at %s, past the libvirt steps, when vm-a was stopped; deleting it and trying again", try, md.GetStep())
		a.vmSucceed(t, "create fence (missed)", &longrunningpb.Operation{Name: name}, nil)
		ctx, cancel = rpcCtx()
		resp, err = a.clusters.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: md.GetCluster()})
		cancel()
		a.vmSucceed(t, "delete fence (missed)", resp, err)
		if try == 3 {
			t.Fatalf("the create passed its libvirt steps before any poll saw it, %d times", try)
		}
	}
	stopped := time.Now()
	t.Logf("SIGSTOPped vm-a at %s of %s", step, op)

	done, _ := b.vmSucceed(t, "the create adopted by vm-b", &longrunningpb.Operation{Name: op}, nil)
	if md := metadata(t, done); md.GetAttempt() != 2 || md.GetServer() != "vm-b" {
		t.Errorf("operation metadata: attempt %d on %q; want attempt 2 on vm-b", md.GetAttempt(), md.GetServer())
	}
	adoption(t, b, cluster, op)
	nodes := e.wantNodes(t, b, cluster, clv1.Cluster_RUNNING, 1, 1, clv1.Node_RUNNING, "1.30.2")
	if t.Failed() {
		t.FailNow()
	}

	before := e.snapshot(t, cluster)
	logged := logSize(t, a.logPath)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT vm-a: %v", err)
	}
	t.Logf("SIGCONTed vm-a after %s", time.Since(stopped).Round(100*time.Millisecond))
	// a's attempt has ended once a's log names the job after the resume
	// (its step's refusal, or the runner's giving the job up), or a exited.
	job := strings.TrimPrefix(op, "operations/")
	deadline := time.Now().Add(vmStateTimeout)
	var resumed string
	for {
		resumed = logSince(t, a.logPath, logged)
		if ended(resumed, job) {
			break
		}
		select {
		case <-a.exited:
		default:
			if time.Now().Before(deadline) {
				time.Sleep(vmPollEvery)
				continue
			}
			t.Fatalf("vm-a's attempt of %s shows no end in its log within %s of SIGCONT:\n%s", op, vmStateTimeout, resumed)
		}
		break
	}
	for _, l := range strings.Split(resumed, "\n") {
		if strings.Contains(l, job) || strings.Contains(l, "refused") {
			t.Logf("vm-a after SIGCONT: %s", l)
		}
	}
	after := e.snapshot(t, cluster)
	for dom, x := range before {
		if after[dom] != x {
			t.Errorf("domain %s changed after vm-a resumed:\nbefore:\n%s\nafter:\n%s", dom, x, after[dom])
		}
	}
	if len(after) != len(before) {
		t.Errorf("%d domains of %s before vm-a resumed, %d after", len(before), cluster, len(after))
	}
	for _, n := range nodes {
		if m := e.domMeta(t, n.GetName()); m.Job != job || m.Attempt != 2 {
			t.Errorf("fencing token on the domain of %s: job %s attempt %d; want %s attempt 2", n.GetName(), m.Job, m.Attempt, job)
		}
	}

	// The next operation through the resumed server: its node agents were
	// last spoken to by vm-b, and each guest serves one host connection at
	// a time.
	ctx, cancel := rpcCtx()
	up, err := a.clusters.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: cluster, KubernetesVersion: "1.30.5"})
	cancel()
	a.vmSucceed(t, "upgrade through vm-a", up, err)
	e.wantNodes(t, a, cluster, clv1.Cluster_RUNNING, 1, 1, clv1.Node_RUNNING, "1.30.5")

	ctx, cancel = rpcCtx()
	resp, err := b.clusters.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: cluster})
	cancel()
	b.vmSucceed(t, "delete fence", resp, err)
	if left := e.leftovers(t); len(left) > 0 {
		t.Errorf("after delete, left on libvirt: %v", left)
	}
}

// ended says whether a log shows the end of job's attempt on its server:
// a refused step, or the runner giving the job up.
func ended(log, job string) bool {
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, job) {
			continue
		}
		for _, s := range []string{"refused", "ended", "did not succeed", "handed off", "not handing", "no longer holds"} {
			if strings.Contains(l, s) {
				return true
			}
		}
	}
	return false
}

// snapshot is every domain of cluster's XML, live and persistent, without
// the live state of the agent channel's guest end (whether the guest's
// agent has its port open at that instant: the guest's, not a change).
func (e *vmEnv) snapshot(t *testing.T, cluster string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, d := range e.domainsOf(t, cluster) {
		live := channelState.ReplaceAllString(e.mustVirsh(t, "dumpxml", d), "")
		out[d] = live + "\n---- persistent ----\n" + e.mustVirsh(t, "dumpxml", "--inactive", d)
	}
	return out
}

// channelState is the guest end's state in a live channel's target.
var channelState = regexp.MustCompile(` state='(dis)?connected'`)

func logSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// logSince is what a log gained after offset.
func logSince(t *testing.T, path string, offset int64) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) < offset {
		return ""
	}
	return string(b[offset:])
}
