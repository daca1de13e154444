package server

// The concurrency rules of SPEC §3, one test per rule, through a real gRPC
// client on every backend. Events are ordered with the simulator's held
// steps (WaitHeld/ReleaseHeld) and channel barriers, never with sleeps; the
// only polling is bounded sampling of a state.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// rig is a harness with the test it serves, so the rule tests read as the
// scenario they check. Its methods fail the test; call them from the test's
// goroutine only.
type rig struct {
	*harness
	t   *testing.T
	ctx context.Context
}

// newRig starts a server whose scanner makes its first pass at start and
// then keeps quiet, so that only the test orders events (a reconciliation
// could otherwise take an ALERT cluster between two steps of a test);
// mutate may turn it back on.
func newRig(t *testing.T, b repotest.Backend, mutate ...func(*Config)) *rig {
	quiet := func(c *Config) { c.ScanInterval, c.ReconcileInterval = time.Hour, time.Hour }
	h := start(t, b, append([]func(*Config){quiet}, mutate...)...)
	// Runs before the server stops (cleanups are LIFO): nothing stays held.
	t.Cleanup(h.srv.sim.ClearFaults)
	return &rig{harness: h, t: t, ctx: tctx(t)}
}

func clusterUUID(name string) string { return strings.TrimPrefix(name, "clusters/") }

func operationUUID(name string) string { return strings.TrimPrefix(name, "operations/") }

// --- faults: order events without sleeping ---

// hold makes the next step named step of cluster (every cluster when empty)
// block until let; it returns the fault's id.
func (r *rig) hold(step, cluster string) string {
	r.t.Helper()
	f, err := r.srv.sim.InjectFault(sim.Fault{Step: step, Mode: sim.ModeHold, ClusterID: clusterUUID(cluster), Count: 1})
	if err != nil {
		r.t.Fatal(err)
	}
	return f.ID
}

// fail makes the next step named step of cluster (every cluster when empty) fail.
func (r *rig) fail(step, cluster string) {
	r.t.Helper()
	if _, err := r.srv.sim.InjectFault(sim.Fault{Step: step, Mode: sim.ModeFail, ClusterID: clusterUUID(cluster), Count: 1}); err != nil {
		r.t.Fatal(err)
	}
}

// heldBy waits until the step of fault id is held and returns it.
func (r *rig) heldBy(id string) sim.Held {
	r.t.Helper()
	h, err := r.srv.sim.WaitHeld(r.ctx, func(h sim.Held) bool { return h.FaultID == id })
	if err != nil {
		r.t.Fatalf("no step held by fault %s: %v", id, err)
	}
	return h
}

// let releases the step fault id holds.
func (r *rig) let(id string) {
	r.t.Helper()
	if n, err := r.srv.sim.ReleaseHeld(id); err != nil || n != 1 {
		r.t.Fatalf("release fault %s: released %d, %v; want 1", id, n, err)
	}
}

// --- clusters and operations ---

func (r *rig) create(name string, workers int32) *clv1.Cluster {
	r.t.Helper()
	return r.harness.create(r.t, name, workers)
}

func (r *rig) cluster(name string) *clv1.Cluster {
	r.t.Helper()
	c, err := r.clients.clusters.GetCluster(r.ctx, &clv1.GetClusterRequest{Name: name})
	if err != nil {
		r.t.Fatalf("GetCluster(%s): %v", name, err)
	}
	return c
}

// accepted fails the test unless the RPC returned an operation.
func (r *rig) accepted(op *longrunningpb.Operation, err error) *longrunningpb.Operation {
	r.t.Helper()
	if err != nil {
		r.t.Fatalf("request refused: %v", err)
	}
	return op
}

// succeeded waits for op and fails the test unless it succeeded.
func (r *rig) succeeded(op *longrunningpb.Operation) *longrunningpb.Operation {
	r.t.Helper()
	done := r.wait(r.t, op)
	if done.GetError() != nil {
		r.t.Fatalf("operation %s (%s) failed: %v", op.GetName(), opMetadata(r.t, done).GetVerb(), done.GetError())
	}
	return done
}

// failed waits for op and returns its error, failing the test if it succeeded.
func (r *rig) failed(op *longrunningpb.Operation) *spb.Status {
	r.t.Helper()
	done := r.wait(r.t, op)
	if done.GetError() == nil {
		r.t.Fatalf("operation %s (%s) succeeded; want it to fail", op.GetName(), opMetadata(r.t, done).GetVerb())
	}
	opErrorInfo(r.t, done.GetError())
	return done.GetError()
}

func opMetadata(t *testing.T, op *longrunningpb.Operation) *clv1.OperationMetadata {
	t.Helper()
	md := &clv1.OperationMetadata{}
	if err := op.GetMetadata().UnmarshalTo(md); err != nil {
		t.Fatalf("metadata of %s: %v", op.GetName(), err)
	}
	return md
}

func (r *rig) scaleTo(name string, workers int32) (*longrunningpb.Operation, error) {
	return r.clients.clusters.ScaleCluster(r.ctx, &clv1.ScaleClusterRequest{Name: name, WorkerNodeCount: proto.Int32(workers)})
}

func (r *rig) stopCluster(name string) (*longrunningpb.Operation, error) {
	return r.clients.clusters.StopCluster(r.ctx, &clv1.StopClusterRequest{Name: name})
}

func (r *rig) startCluster(name string) (*longrunningpb.Operation, error) {
	return r.clients.clusters.StartCluster(r.ctx, &clv1.StartClusterRequest{Name: name})
}

func (r *rig) deleteCluster(name string) (*longrunningpb.Operation, error) {
	return r.clients.clusters.DeleteCluster(r.ctx, &clv1.DeleteClusterRequest{Name: name})
}

func (r *rig) upgrade(name, version string) (*longrunningpb.Operation, error) {
	return r.clients.clusters.UpgradeCluster(r.ctx, &clv1.UpgradeClusterRequest{Name: name, KubernetesVersion: version})
}

// stopped creates a cluster and stops it.
func (r *rig) stopped(name string, workers int32) *clv1.Cluster {
	r.t.Helper()
	c := r.create(name, workers)
	r.succeeded(r.accepted(r.stopCluster(c.GetName())))
	return r.cluster(c.GetName())
}

// broken creates a cluster whose create fails before it is up: ERROR.
func (r *rig) broken(name string) *clv1.Cluster {
	r.t.Helper()
	r.fail(infra.StepProvisionMachine, "")
	op := r.accepted(r.clients.clusters.CreateCluster(r.ctx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
		DisplayName: name, KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium",
	}}))
	r.failed(op)
	c := r.cluster(opMetadata(r.t, op).GetCluster())
	if c.GetState() != clv1.Cluster_ERROR || c.GetCurrentOperation() != "" {
		r.t.Fatalf("failed create left %s %s held by %q; want ERROR, unheld", c.GetName(), c.GetState(), c.GetCurrentOperation())
	}
	return c
}

// freeMachine makes a free EXTERNAL machine for AddNodes.
func (r *rig) freeMachine() *clv1.Machine {
	r.t.Helper()
	m, err := r.clients.sim.CreateMachine(r.ctx, &clv1.CreateMachineRequest{Role: clv1.Node_EXTERNAL})
	if err != nil {
		r.t.Fatal(err)
	}
	return m
}

// machine reads one machine from the simulator's full list.
func (r *rig) machine(name string) *clv1.Machine {
	r.t.Helper()
	all, err := r.clients.sim.ListMachines(r.ctx, &clv1.ListMachinesRequest{})
	if err != nil {
		r.t.Fatal(err)
	}
	for _, m := range all.GetMachines() {
		if m.GetName() == name {
			return m
		}
	}
	r.t.Fatalf("machine %s does not exist", name)
	return nil
}

// worker is the name of one worker node of c.
func worker(t *testing.T, c *clv1.Cluster) string {
	t.Helper()
	for _, n := range c.GetNodes() {
		if n.GetRole() == clv1.Node_WORKER {
			return n.GetName()
		}
	}
	t.Fatalf("%s has no worker", c.GetName())
	return ""
}

func (r *rig) jobs(cluster string) []repository.Job {
	r.t.Helper()
	js, err := r.seed.ListJobs(r.ctx, repository.JobQuery{Where: repository.Compare(repository.JobCluster, repository.Eq, clusterUUID(cluster)), Limit: 10000})
	if err != nil {
		r.t.Fatal(err)
	}
	return js
}

func (r *rig) jobsOfKind(cluster, kind string) []repository.Job {
	r.t.Helper()
	var out []repository.Job
	for _, j := range r.jobs(cluster) {
		if j.Kind == kind {
			out = append(out, j)
		}
	}
	return out
}

func (r *rig) history(cluster string) []repository.Event {
	r.t.Helper()
	var all []repository.Event
	var after int64
	for {
		evs, err := r.seed.ListEvents(r.ctx, clusterUUID(cluster), after, 1000)
		if err != nil {
			r.t.Fatal(err)
		}
		all = append(all, evs...)
		if len(evs) < 1000 {
			return all
		}
		after = evs[len(evs)-1].ID
	}
}

// historyOf is op's entries of the cluster's history as EVENT:FROM->TO,
// leaving out the REPAIR entries a failed operation records on its way out
// (they change no state).
func (r *rig) historyOf(cluster string, op *longrunningpb.Operation) []string {
	r.t.Helper()
	var out []string
	for _, e := range r.history(cluster) {
		if e.Operation == operationUUID(op.GetName()) && e.Name != repository.Repair {
			out = append(out, fmt.Sprintf("%s:%s->%s", e.Name, e.From, e.To))
		}
	}
	return out
}

// --- nothing changed ---

// frozen is everything a refused request must leave as it was (SPEC §3.3):
// the cluster as read (state, etag, holder, spec, nodes), its jobs, its
// history, and the simulator's machines and network rules.
type frozen struct {
	name     string
	cluster  *clv1.Cluster
	jobs     []string
	events   int
	machines []*clv1.Machine
	rules    []*clv1.NetworkRule
}

func (r *rig) freeze(name string) frozen {
	r.t.Helper()
	f := frozen{name: name, cluster: r.cluster(name), events: len(r.history(name))}
	for _, j := range r.jobs(name) {
		f.jobs = append(f.jobs, j.ID+"/"+j.Kind)
	}
	ms, err := r.clients.sim.ListMachines(r.ctx, &clv1.ListMachinesRequest{Cluster: name})
	if err != nil {
		r.t.Fatal(err)
	}
	f.machines = ms.GetMachines()
	rules, err := r.clients.sim.ListNetworkRules(r.ctx, &clv1.ListNetworkRulesRequest{Cluster: name})
	if err != nil {
		r.t.Fatal(err)
	}
	f.rules = rules.GetRules()
	return f
}

// unchanged fails the test if anything frozen in before changed.
func (r *rig) unchanged(before frozen, after string) {
	r.t.Helper()
	now := r.freeze(before.name)
	if !proto.Equal(before.cluster, now.cluster) {
		r.t.Errorf("%s changed the cluster:\nbefore %s\nafter  %s", after, prototext.Format(before.cluster), prototext.Format(now.cluster))
	}
	if !slices.Equal(before.jobs, now.jobs) {
		r.t.Errorf("%s changed the cluster's jobs: %v -> %v", after, before.jobs, now.jobs)
	}
	if before.events != now.events {
		r.t.Errorf("%s added %d entries to the cluster's history", after, now.events-before.events)
	}
	if !slices.EqualFunc(before.machines, now.machines, func(a, b *clv1.Machine) bool { return proto.Equal(a, b) }) {
		r.t.Errorf("%s changed the cluster's machines: %v -> %v", after, before.machines, now.machines)
	}
	if !slices.EqualFunc(before.rules, now.rules, func(a, b *clv1.NetworkRule) bool { return proto.Equal(a, b) }) {
		r.t.Errorf("%s changed the cluster's network rules: %v -> %v", after, before.rules, now.rules)
	}
}

// --- refusals ---

// refusal is a refused request as the client sees it.
type refusal struct {
	code   codes.Code
	reason string
	meta   map[string]string
	msg    string
	field  string // the first BadRequest violation's field, if any
}

func (f refusal) String() string { return fmt.Sprintf("%s %s %q", f.code, f.reason, f.msg) }

// refusalOf reads a refusal without touching t, so goroutines can use it.
func refusalOf(err error) (refusal, bool) {
	st, ok := status.FromError(err)
	if err == nil || !ok {
		return refusal{}, false
	}
	f := refusal{code: st.Code(), msg: st.Message()}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			f.reason, f.meta = d.GetReason(), d.GetMetadata()
		case *errdetails.BadRequest:
			if len(d.GetFieldViolations()) > 0 {
				f.field = d.GetFieldViolations()[0].GetField()
			}
		}
	}
	return f, f.reason != ""
}

func (r *rig) refused(err error) refusal {
	r.t.Helper()
	if err == nil {
		r.t.Fatal("request accepted; want it refused")
	}
	f, ok := refusalOf(err)
	if !ok {
		r.t.Fatalf("refusal %v is not a gRPC status with a google.rpc.ErrorInfo", err)
	}
	return f
}

// inProgress checks an ABORTED / OPERATION_IN_PROGRESS refusal naming holder.
func (r *rig) inProgress(what string, err error, holder string) {
	r.t.Helper()
	f := r.refused(err)
	if f.code != codes.Aborted || f.reason != "OPERATION_IN_PROGRESS" {
		r.t.Errorf("%s: %v; want ABORTED OPERATION_IN_PROGRESS", what, f)
		return
	}
	if f.meta["operation"] != holder || !strings.Contains(f.msg, holder) || !strings.HasSuffix(f.msg, "please retry once it has finished") {
		r.t.Errorf("%s: %v (operation %q); want it to name %s and end \"please retry once it has finished\"", what, f, f.meta["operation"], holder)
	}
}

// invalidTransition checks a FAILED_PRECONDITION / INVALID_STATE_TRANSITION
// refusal with the SPEC's message.
func (r *rig) invalidTransition(what string, err error, cluster string, state clv1.Cluster_State, event lifecycle.Event) {
	r.t.Helper()
	f := r.refused(err)
	want := fmt.Sprintf("cluster %s is in state %s, which does not allow %s", cluster, state, event)
	if f.code != codes.FailedPrecondition || f.reason != "INVALID_STATE_TRANSITION" || !strings.HasPrefix(f.msg, want) ||
		f.meta["state"] != state.String() || f.meta["event"] != event.String() {
		r.t.Errorf("%s: %v %v; want FAILED_PRECONDITION INVALID_STATE_TRANSITION %q", what, f, f.meta, want)
	}
}

// --- exactly one ---

// together runs n calls at once: each waits at a barrier that opens when
// all n goroutines are ready.
func together(n int, call func(i int) (*longrunningpb.Operation, error)) ([]*longrunningpb.Operation, []error) {
	ops, errs := make([]*longrunningpb.Operation, n), make([]error, n)
	var ready, done sync.WaitGroup
	gate := make(chan struct{})
	ready.Add(n)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			ready.Done()
			<-gate
			ops[i], errs[i] = call(i)
		}()
	}
	ready.Wait()
	close(gate)
	done.Wait()
	return ops, errs
}

// oneWinner checks that exactly one of simultaneous requests was accepted and
// every other one was refused as the loser of a race (SPEC §3.3).
func (r *rig) oneWinner(ops []*longrunningpb.Operation, errs []error) *longrunningpb.Operation {
	r.t.Helper()
	var won *longrunningpb.Operation
	for i, err := range errs {
		if err == nil {
			if won != nil {
				r.t.Fatalf("two simultaneous requests were both accepted: %s and %s", won.GetName(), ops[i].GetName())
			}
			won = ops[i]
		}
	}
	if won == nil {
		r.t.Fatalf("every simultaneous request was refused: %v", errs)
	}
	for _, err := range errs {
		if err == nil {
			continue
		}
		f := r.refused(err)
		switch {
		case f.code == codes.Aborted && f.reason == "OPERATION_IN_PROGRESS":
			if f.meta["operation"] != won.GetName() {
				r.t.Errorf("loser refused naming %q; the winner is %s", f.meta["operation"], won.GetName())
			}
		case f.code == codes.Aborted && f.reason == "CONCURRENT_MODIFICATION":
			if !strings.HasSuffix(f.msg, "please retry") {
				r.t.Errorf("CONCURRENT_MODIFICATION message %q does not end \"please retry\"", f.msg)
			}
		default:
			r.t.Errorf("loser of a simultaneous race: %v; want ABORTED OPERATION_IN_PROGRESS or CONCURRENT_MODIFICATION", f)
		}
	}
	return won
}

// --- SPEC §3.2 claim before change ---

func TestClaimBeforeChange_TwoScalesAtOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		name := r.create("two-scales", 1).GetName()
		const rounds = 3
		for round := range rounds {
			want := r.cluster(name).GetWorkerNodeCount() + 1
			// The winner stops at its first step, so the loser cannot
			// arrive after it has finished.
			f := r.hold(infra.StepProvisionMachine, name)
			won := r.oneWinner(together(2, func(int) (*longrunningpb.Operation, error) { return r.scaleTo(name, want) }))
			if h := r.heldBy(f); "operations/"+h.Operation != won.GetName() {
				t.Errorf("round %d: held step belongs to %s, not the winner %s", round, h.Operation, won.GetName())
			}
			r.let(f)
			r.succeeded(won)
			c := r.cluster(name)
			if c.GetState() != clv1.Cluster_RUNNING || c.GetWorkerNodeCount() != want || len(c.GetNodes()) != int(1+want) {
				t.Fatalf("round %d: %s with %d workers and %d nodes; want RUNNING with exactly one new worker (%d workers, %d nodes)",
					round, c.GetState(), c.GetWorkerNodeCount(), len(c.GetNodes()), want, 1+want)
			}
		}
		if got := len(r.jobsOfKind(name, "scale")); got != rounds {
			t.Errorf("%d scale jobs; want %d (one per winner, none for the losers)", got, rounds)
		}
		claims := 0
		for _, e := range r.history(name) {
			if e.Name == lifecycle.ScaleUpRequested.String() {
				claims++
			}
		}
		if claims != rounds {
			t.Errorf("history has %d SCALE_UP_REQUESTED; want %d", claims, rounds)
		}
	})
}

func TestClaimBeforeChange_StopScaleUpgradeAtOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		c := r.create("three-at-once", 1)
		name := c.GetName()
		// Hold the first step of each (power_off, provision_machine,
		// attach_iso), so the winner cannot finish before the others arrive.
		r.hold(infra.StepPowerOff, name)
		r.hold(infra.StepProvisionMachine, name)
		r.hold(infra.StepAttachISO, name)
		won := r.oneWinner(together(3, func(i int) (*longrunningpb.Operation, error) {
			switch i {
			case 0:
				return r.stopCluster(name)
			case 1:
				return r.scaleTo(name, 2)
			default:
				return r.upgrade(name, "1.30.5")
			}
		}))
		verb := opMetadata(t, won).GetVerb()
		if got := r.cluster(name).GetCurrentOperation(); got != won.GetName() {
			t.Errorf("cluster held by %q; want the winner %s (%s)", got, won.GetName(), verb)
		}
		r.srv.sim.ClearFaults()
		r.succeeded(won)
		if js := r.jobs(name); len(js) != 2 || js[1].Kind != verb {
			t.Errorf("jobs %v; want the create and the winner's %s only", js, verb)
		}
	})
}

func TestClaimBeforeChange_ScaleThenStop(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		name := r.create("scale-then-stop", 1).GetName()
		f := r.hold(infra.StepProvisionMachine, name)
		scale := r.accepted(r.scaleTo(name, 2))
		r.heldBy(f)
		before := r.freeze(name)
		if before.cluster.GetState() != clv1.Cluster_SCALING || before.cluster.GetCurrentOperation() != scale.GetName() {
			t.Fatalf("scaling cluster is %s held by %q; want SCALING held by %s", before.cluster.GetState(), before.cluster.GetCurrentOperation(), scale.GetName())
		}
		_, err := r.stopCluster(name)
		r.inProgress("stop while SCALING", err, scale.GetName())
		r.unchanged(before, "a stop refused while SCALING")

		r.let(f)
		r.succeeded(scale)
		c := r.cluster(name)
		if c.GetState() != clv1.Cluster_RUNNING || c.GetWorkerNodeCount() != 2 || len(c.GetNodes()) != 3 {
			t.Errorf("after the scale: %s, %d workers, %d nodes; want RUNNING, 2, 3", c.GetState(), c.GetWorkerNodeCount(), len(c.GetNodes()))
		}
		for _, n := range c.GetNodes() {
			if n.GetPower() != clv1.Node_RUNNING || !n.GetJoined() {
				t.Errorf("node %v is not running and joined: the refused stop touched it", n)
			}
		}
		if stops := r.jobsOfKind(name, "stop"); len(stops) != 0 {
			t.Errorf("refused stop left jobs %v", stops)
		}
	})
}

// --- SPEC §3.3 refusals ---

func TestRefusal_OperationInProgressNamesHolder(t *testing.T) {
	holders := []struct {
		verb  string
		state clv1.Cluster_State
		step  string
		send  func(r *rig, name string) (*longrunningpb.Operation, error)
	}{
		{"scale", clv1.Cluster_SCALING, infra.StepProvisionMachine, func(r *rig, name string) (*longrunningpb.Operation, error) { return r.scaleTo(name, 3) }},
		{"stop", clv1.Cluster_STOPPING, infra.StepPowerOff, func(r *rig, name string) (*longrunningpb.Operation, error) { return r.stopCluster(name) }},
		{"upgrade", clv1.Cluster_UPGRADING, infra.StepAttachISO, func(r *rig, name string) (*longrunningpb.Operation, error) { return r.upgrade(name, "1.30.5") }},
	}
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		for _, hc := range holders {
			c := r.cluster(r.create("held-by-"+hc.verb, 2).GetName())
			name, node, free := c.GetName(), worker(t, c), r.freeMachine().GetName()
			f := r.hold(hc.step, name)
			holder := r.accepted(hc.send(r, name))
			r.heldBy(f)
			before := r.freeze(name)
			if before.cluster.GetState() != hc.state || before.cluster.GetCurrentOperation() != holder.GetName() {
				t.Fatalf("%s: cluster %s held by %q; want %s held by %s", hc.verb, before.cluster.GetState(), before.cluster.GetCurrentOperation(), hc.state, holder.GetName())
			}
			requests := []struct {
				verb string
				send func() (*longrunningpb.Operation, error)
			}{
				{"start", func() (*longrunningpb.Operation, error) { return r.startCluster(name) }},
				{"stop", func() (*longrunningpb.Operation, error) { return r.stopCluster(name) }},
				{"scale up", func() (*longrunningpb.Operation, error) { return r.scaleTo(name, 4) }},
				{"scale down", func() (*longrunningpb.Operation, error) { return r.scaleTo(name, 1) }},
				{"offering", func() (*longrunningpb.Operation, error) {
					return r.clients.clusters.ScaleCluster(r.ctx, &clv1.ScaleClusterRequest{Name: name, ServiceOffering: "large"})
				}},
				{"upgrade", func() (*longrunningpb.Operation, error) { return r.upgrade(name, "1.31.1") }},
				{"delete", func() (*longrunningpb.Operation, error) { return r.deleteCluster(name) }},
				{"add nodes", func() (*longrunningpb.Operation, error) {
					return r.clients.clusters.AddNodes(r.ctx, &clv1.AddNodesRequest{Name: name, Machines: []string{free}})
				}},
				{"remove nodes", func() (*longrunningpb.Operation, error) {
					return r.clients.clusters.RemoveNodes(r.ctx, &clv1.RemoveNodesRequest{Name: name, Nodes: []string{node}})
				}},
			}
			for _, req := range requests {
				_, err := req.send()
				r.inProgress(fmt.Sprintf("%s while %s holds the cluster", req.verb, hc.verb), err, holder.GetName())
			}
			r.unchanged(before, "requests refused while "+hc.verb+" holds the cluster")
			if m := r.machine(free); m.GetCluster() != "" || m.GetRole() != clv1.Node_EXTERNAL {
				t.Errorf("refused add nodes touched machine %v", m)
			}
			r.srv.sim.ClearFaults()
			r.succeeded(holder)
		}
	})
}

func TestRefusal_InvalidStateTransition(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		running := r.create("running", 1)
		stopped := r.stopped("stopped", 2)
		broken := r.broken("broken")
		gone := r.create("gone", 1)
		r.succeeded(r.accepted(r.deleteCluster(gone.GetName())))
		free := r.freeMachine().GetName()

		type req struct {
			verb  string
			event lifecycle.Event
			send  func(name string, c *clv1.Cluster) (*longrunningpb.Operation, error)
		}
		start := req{"start", lifecycle.StartRequested, func(n string, _ *clv1.Cluster) (*longrunningpb.Operation, error) { return r.startCluster(n) }}
		stop := req{"stop", lifecycle.StopRequested, func(n string, _ *clv1.Cluster) (*longrunningpb.Operation, error) { return r.stopCluster(n) }}
		del := req{"delete", lifecycle.DestroyRequested, func(n string, _ *clv1.Cluster) (*longrunningpb.Operation, error) { return r.deleteCluster(n) }}
		upgrade := req{"upgrade", lifecycle.UpgradeRequested, func(n string, _ *clv1.Cluster) (*longrunningpb.Operation, error) { return r.upgrade(n, "1.30.5") }}
		scaleUp := req{"scale up", lifecycle.ScaleUpRequested, func(n string, c *clv1.Cluster) (*longrunningpb.Operation, error) {
			return r.scaleTo(n, c.GetWorkerNodeCount()+1)
		}}
		scaleDown := req{"scale down", lifecycle.ScaleDownRequested, func(n string, c *clv1.Cluster) (*longrunningpb.Operation, error) {
			return r.scaleTo(n, c.GetWorkerNodeCount()-1)
		}}
		autoscale := req{"autoscale", lifecycle.AutoscaleRequested, func(n string, _ *clv1.Cluster) (*longrunningpb.Operation, error) {
			return r.clients.clusters.ScaleCluster(r.ctx, &clv1.ScaleClusterRequest{Name: n, Autoscaling: &clv1.Autoscaling{Enabled: true, MinSize: 1, MaxSize: 3}})
		}}
		addNodes := req{"add nodes", lifecycle.AddNodeRequested, func(n string, _ *clv1.Cluster) (*longrunningpb.Operation, error) {
			return r.clients.clusters.AddNodes(r.ctx, &clv1.AddNodesRequest{Name: n, Machines: []string{free}})
		}}
		removeNodes := req{"remove nodes", lifecycle.RemoveNodeRequested, func(n string, c *clv1.Cluster) (*longrunningpb.Operation, error) {
			return r.clients.clusters.RemoveNodes(r.ctx, &clv1.RemoveNodesRequest{Name: n, Nodes: []string{worker(t, c)}})
		}}

		for _, tc := range []struct {
			cluster *clv1.Cluster
			state   clv1.Cluster_State
			reqs    []req
		}{
			{running, clv1.Cluster_RUNNING, []req{start}},
			{stopped, clv1.Cluster_STOPPED, []req{stop, upgrade, scaleDown, autoscale, addNodes, removeNodes}},
			{broken, clv1.Cluster_ERROR, []req{scaleUp, upgrade, addNodes}},
			{gone, clv1.Cluster_DESTROYED, []req{start, stop, del, scaleUp}},
		} {
			name := tc.cluster.GetName()
			before := r.freeze(name)
			if before.cluster.GetState() != tc.state || before.cluster.GetCurrentOperation() != "" {
				t.Fatalf("%s is %s held by %q; want %s, unheld", name, before.cluster.GetState(), before.cluster.GetCurrentOperation(), tc.state)
			}
			for _, q := range tc.reqs {
				_, err := q.send(name, before.cluster)
				r.invalidTransition(fmt.Sprintf("%s of a %s cluster", q.verb, tc.state), err, name, tc.state, q.event)
			}
			r.unchanged(before, fmt.Sprintf("requests refused on a %s cluster", tc.state))
		}
		if m := r.machine(free); m.GetCluster() != "" || m.GetRole() != clv1.Node_EXTERNAL || m.GetJoined() {
			t.Errorf("refused add nodes touched machine %v", m)
		}
	})
}

// --- SPEC §3.5 hold the state ---

// Since fencing (SPEC §6), an operation that lost its cluster cannot change
// the infrastructure any more, not even with the step it had in flight: the
// infrastructure refuses the call (the cluster names B, or A's job ended), so
// A fails at that step, touching neither the machines nor the cluster. (Before
// fencing, A's step in flight ran, and A could even "succeed" on B's cluster.)
func TestHoldTheState_FailureAfterAnotherTookTheCluster(t *testing.T) {
	cases := []struct {
		name string
		// takeAway ends A's hold on the cluster, as recovery on another
		// server would; jobEnded says whether it also ended A's job.
		jobEnded bool
		// failNext injects a failure of A's next step, which fencing
		// refuses first.
		failNext bool
	}{
		{name: "recovered job, then its step in flight", jobEnded: true},
		{name: "claim lost, then a failing step", failNext: true},
		{name: "claim lost, then its step in flight"},
	}
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				r := &rig{harness: r.harness, t: t, ctx: r.ctx}
				name := r.create(fmt.Sprintf("taken-%d", i), 1).GetName()
				// A: an upgrade, held at its first attach_iso.
				fa := r.hold(infra.StepAttachISO, name)
				a := r.accepted(r.upgrade(name, "1.30.5"))
				r.heldBy(fa)

				cur, err := r.seed.GetCluster(r.ctx, clusterUUID(name))
				if err != nil {
					t.Fatal(err)
				}
				release := repository.Transition{ClusterID: cur.ID, Expect: cur.Expect(), Event: lifecycle.OperationFailed, Message: "recovered by another server"}
				if tc.jobEnded {
					_, err = r.seed.FinishJob(r.ctx, repository.Finish{JobID: operationUUID(a.GetName()), Status: repository.JobFailed,
						Error: `{"code":14,"message":"server presumed dead"}`, Release: &release})
				} else {
					_, err = r.seed.Transition(r.ctx, release)
				}
				if err != nil {
					t.Fatal(err)
				}
				if c := r.cluster(name); c.GetState() != clv1.Cluster_ALERT || c.GetCurrentOperation() != "" {
					t.Fatalf("after recovery: %s held by %q; want ALERT, unheld", c.GetState(), c.GetCurrentOperation())
				}

				// B: a start from ALERT takes the cluster, held at wait_api.
				fb := r.hold(infra.StepWaitAPI, name)
				bOp := r.accepted(r.startCluster(name))
				r.heldBy(fb)
				if tc.failNext {
					r.fail(infra.StepAttachISO, name) // A's second attach_iso; B attaches nothing
				}
				mid := r.cluster(name)
				midEvents := len(r.history(name))
				if mid.GetState() != clv1.Cluster_STARTING || mid.GetCurrentOperation() != bOp.GetName() {
					t.Fatalf("B's cluster: %s held by %q; want STARTING held by %s", mid.GetState(), mid.GetCurrentOperation(), bOp.GetName())
				}

				// A goes on, and ends while B holds the cluster.
				r.let(fa)
				if !tc.jobEnded {
					done := r.wait(t, a)
					if done.GetError() == nil || !strings.Contains(done.GetError().GetMessage(), "job no longer holds the cluster") {
						t.Fatalf("A ended with %v; want it failed by the infrastructure's refusal (fenced)", done.GetError())
					}
					if reason, _ := opErrorInfo(t, done.GetError()); reason != service.ReasonLostClaim || done.GetError().GetCode() != int32(codes.Aborted) {
						t.Errorf("A's error %v; want ABORTED, reason LOST_CLAIM", done.GetError())
					}
				}
				r.untilJobStops(operationUUID(a.GetName()))
				// Its step in flight was refused, and no step ran after it.
				ms, err := r.clients.sim.ListMachines(r.ctx, &clv1.ListMachinesRequest{Cluster: name})
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range ms.GetMachines() {
					if m.GetAttachedIso() != "" || m.GetKubernetesVersion() != "1.30.2" || m.GetCordoned() {
						t.Errorf("A changed a machine after it lost the cluster: %v", m)
					}
				}

				now := r.cluster(name)
				mid.Nodes, now.Nodes = nil, nil
				if !proto.Equal(mid, now) {
					t.Errorf("A, ending after B took the cluster, moved it:\nwhile B held it %s\nafter A ended   %s", prototext.Format(mid), prototext.Format(now))
				}
				if n := len(r.history(name)); n != midEvents {
					t.Errorf("A wrote %d history entries after B took the cluster: %v", n-midEvents, r.history(name)[midEvents:])
				}
				if j, err := r.seed.GetJob(r.ctx, operationUUID(a.GetName())); err != nil || !j.Status.Done() {
					t.Errorf("A's job = %v, %v; want ended", j.Status, err)
				}

				r.let(fb)
				r.succeeded(bOp)
				c := r.cluster(name)
				if c.GetState() != clv1.Cluster_RUNNING || c.GetCurrentOperation() != "" || c.GetKubernetesVersion() != "1.30.2" {
					t.Errorf("after B: %s held by %q at %s; want RUNNING, unheld, still 1.30.2 (A's upgrade never committed)",
						c.GetState(), c.GetCurrentOperation(), c.GetKubernetesVersion())
				}
				want := []string{"START_REQUESTED:ALERT->STARTING", "OPERATION_SUCCEEDED:STARTING->RUNNING"}
				if got := r.historyOf(name, bOp); !slices.Equal(got, want) {
					t.Errorf("B's history = %v; want %v", got, want)
				}
				r.srv.sim.ClearFaults()
			})
		}
	})
}

// untilJobStops waits (bounded) until this server no longer runs job id.
func (r *rig) untilJobStops(id string) {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for slices.Contains(r.srv.runner.Running(), id) {
		if time.Now().After(deadline) {
			r.t.Fatalf("job %s still running after 30s", id)
		}
		<-tick.C
	}
}

// --- SPEC §3.4 in place ---

func TestInPlace_TwoDeletesOfDestroyingCluster(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		name := r.create("doomed", 1).GetName()
		r.fail(infra.StepDestroyMachine, name)
		first := r.accepted(r.deleteCluster(name))
		r.failed(first)
		if c := r.cluster(name); c.GetState() != clv1.Cluster_DESTROYING || c.GetCurrentOperation() != "" {
			t.Fatalf("after a failed destroy: %s held by %q; want DESTROYING, unheld", c.GetState(), c.GetCurrentOperation())
		}

		f := r.hold(infra.StepDestroyMachine, name)
		won := r.oneWinner(together(2, func(int) (*longrunningpb.Operation, error) { return r.deleteCluster(name) }))
		r.heldBy(f)
		before := r.freeze(name)
		if before.cluster.GetState() != clv1.Cluster_DESTROYING || before.cluster.GetCurrentOperation() != won.GetName() {
			t.Errorf("retried destroy: %s held by %q; want DESTROYING held by %s", before.cluster.GetState(), before.cluster.GetCurrentOperation(), won.GetName())
		}
		_, err := r.deleteCluster(name)
		r.inProgress("a third delete while the retried destroy runs", err, won.GetName())
		r.unchanged(before, "a refused delete of a DESTROYING cluster")

		r.let(f)
		r.succeeded(won)
		c := r.cluster(name)
		if c.GetState() != clv1.Cluster_DESTROYED || c.GetCurrentOperation() != "" || len(c.GetNodes()) != 0 {
			t.Errorf("after the retried destroy: %s held by %q with %d nodes; want DESTROYED, unheld, no nodes", c.GetState(), c.GetCurrentOperation(), len(c.GetNodes()))
		}
		if got := len(r.jobsOfKind(name, "delete")); got != 2 {
			t.Errorf("%d delete jobs; want 2 (the failed one and the winner)", got)
		}
		want := []string{"DESTROY_REQUESTED:DESTROYING->DESTROYING", "OPERATION_SUCCEEDED:DESTROYING->DESTROYED"}
		if got := r.historyOf(name, won); !slices.Equal(got, want) {
			t.Errorf("retried destroy's history = %v; want %v", got, want)
		}
	})
}

func TestInPlace_TwoStartsOfErrorCluster(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		name := r.broken("two-starts").GetName()
		f := r.hold(infra.StepProvisionMachine, name)
		won := r.oneWinner(together(2, func(int) (*longrunningpb.Operation, error) { return r.startCluster(name) }))
		r.heldBy(f)
		before := r.freeze(name)
		if before.cluster.GetState() != clv1.Cluster_ERROR || before.cluster.GetCurrentOperation() != won.GetName() {
			t.Errorf("start of an ERROR cluster: %s held by %q; want ERROR (no state change) held by %s",
				before.cluster.GetState(), before.cluster.GetCurrentOperation(), won.GetName())
		}
		_, err := r.startCluster(name)
		r.inProgress("a third start while one runs", err, won.GetName())
		r.unchanged(before, "a refused start of an ERROR cluster")

		r.let(f)
		r.succeeded(won)
		c := r.cluster(name)
		// SPEC §3.4: the in-place start leaves the state alone when it ends.
		if c.GetState() != clv1.Cluster_ERROR || c.GetCurrentOperation() != "" {
			t.Errorf("after the start: %s held by %q; want ERROR, unheld", c.GetState(), c.GetCurrentOperation())
		}
		if len(c.GetNodes()) != 2 {
			t.Errorf("%d machines after the start; want 2 (provisioned once, by one start)", len(c.GetNodes()))
		}
		if got := len(r.jobsOfKind(name, "start")); got != 1 {
			t.Errorf("%d start jobs; want 1", got)
		}
		want := []string{"START_REQUESTED:ERROR->ERROR", "OPERATION_ENDED:ERROR->ERROR"}
		if got := r.historyOf(name, won); !slices.Equal(got, want) {
			t.Errorf("start's history = %v; want %v", got, want)
		}
	})
}

// --- SPEC §3.6 scaling ---

func TestScaling_EnteredOnceWhateverTheSteps(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		name := r.create("scales", 1).GetName()
		once := func(op *longrunningpb.Operation, want ...string) {
			t.Helper()
			if got := r.historyOf(name, op); !slices.Equal(got, want) {
				t.Errorf("%s's history = %v; want %v", opMetadata(t, op).GetVerb(), got, want)
			}
		}

		// Offering and size at once: resize x2, provision x2, network,
		// attach x2, join x2, detach x2. Sample at the first and a late step.
		first, late := r.hold(infra.StepResizeMachine, name), r.hold(infra.StepJoinNode, name)
		op := r.accepted(r.clients.clusters.ScaleCluster(r.ctx, &clv1.ScaleClusterRequest{Name: name, WorkerNodeCount: proto.Int32(3), ServiceOffering: "large"}))
		for _, f := range []string{first, late} {
			h := r.heldBy(f)
			if c := r.cluster(name); c.GetState() != clv1.Cluster_SCALING || c.GetCurrentOperation() != op.GetName() {
				t.Errorf("at %s: %s held by %q; want SCALING held by %s", h.Step, c.GetState(), c.GetCurrentOperation(), op.GetName())
			}
			once(op, "SCALE_UP_REQUESTED:RUNNING->SCALING")
			r.let(f)
		}
		r.succeeded(op)
		once(op, "SCALE_UP_REQUESTED:RUNNING->SCALING", "OPERATION_SUCCEEDED:SCALING->RUNNING")
		if md := opMetadata(t, r.wait(t, op)); md.GetStepsDone() < 11 {
			t.Errorf("the scale took %d steps; the test wants many", md.GetStepsDone())
		}
		if c := r.cluster(name); c.GetWorkerNodeCount() != 3 || c.GetServiceOffering() != "large" || len(c.GetNodes()) != 4 {
			t.Errorf("after the scale: %d workers of %q, %d nodes; want 3 of large, 4 nodes", c.GetWorkerNodeCount(), c.GetServiceOffering(), len(c.GetNodes()))
		}

		down := r.succeeded(r.accepted(r.scaleTo(name, 1)))
		once(down, "SCALE_DOWN_REQUESTED:RUNNING->SCALING", "OPERATION_SUCCEEDED:SCALING->RUNNING")

		auto := r.succeeded(r.accepted(r.clients.clusters.ScaleCluster(r.ctx, &clv1.ScaleClusterRequest{Name: name, Autoscaling: &clv1.Autoscaling{Enabled: true, MinSize: 1, MaxSize: 3}})))
		once(auto, "AUTOSCALE_REQUESTED:RUNNING->SCALING", "OPERATION_SUCCEEDED:SCALING->RUNNING")

		// From ALERT (a scale that failed), in several steps.
		r.fail(infra.StepJoinNode, name)
		broken := r.accepted(r.scaleTo(name, 2))
		r.failed(broken)
		once(broken, "SCALE_UP_REQUESTED:RUNNING->SCALING", "OPERATION_FAILED:SCALING->ALERT")
		again := r.succeeded(r.accepted(r.scaleTo(name, 2)))
		once(again, "SCALE_UP_REQUESTED:ALERT->SCALING", "OPERATION_SUCCEEDED:SCALING->RUNNING")

		// A stopped cluster's offering: SCALING_STOPPED_CLUSTER, once.
		r.succeeded(r.accepted(r.stopCluster(name)))
		offer := r.succeeded(r.accepted(r.clients.clusters.ScaleCluster(r.ctx, &clv1.ScaleClusterRequest{Name: name, ServiceOffering: "xlarge"})))
		once(offer, "SCALE_UP_REQUESTED:STOPPED->SCALING_STOPPED_CLUSTER", "OPERATION_SUCCEEDED:SCALING_STOPPED_CLUSTER->STOPPED")
		if c := r.cluster(name); c.GetState() != clv1.Cluster_STOPPED || c.GetServiceOffering() != "xlarge" {
			t.Errorf("after the offering change: %s of %q; want STOPPED of xlarge", c.GetState(), c.GetServiceOffering())
		}
	})
}

func TestScaling_StoppedClusterCannotChangeSize(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		c := r.stopped("stopped-size", 2)
		name := c.GetName()
		before := r.freeze(name)
		for _, tc := range []struct {
			what  string
			req   *clv1.ScaleClusterRequest
			event lifecycle.Event
		}{
			{"more workers", &clv1.ScaleClusterRequest{Name: name, WorkerNodeCount: proto.Int32(3)}, lifecycle.ScaleUpRequested},
			{"fewer workers", &clv1.ScaleClusterRequest{Name: name, WorkerNodeCount: proto.Int32(1)}, lifecycle.ScaleDownRequested},
			{"a named node removed", &clv1.ScaleClusterRequest{Name: name, WorkerNodeCount: proto.Int32(1), RemoveNodes: []string{worker(t, c)}}, lifecycle.ScaleDownRequested},
			{"more workers of a larger offering", &clv1.ScaleClusterRequest{Name: name, WorkerNodeCount: proto.Int32(3), ServiceOffering: "large"}, lifecycle.ScaleUpRequested},
		} {
			_, err := r.clients.clusters.ScaleCluster(r.ctx, tc.req)
			r.invalidTransition("a stopped cluster scaled to "+tc.what, err, name, clv1.Cluster_STOPPED, tc.event)
		}
		r.unchanged(before, "size changes refused on a STOPPED cluster")

		// Its offering alone may change, and it stays the same size.
		f := r.hold(infra.StepResizeMachine, name)
		op := r.accepted(r.clients.clusters.ScaleCluster(r.ctx, &clv1.ScaleClusterRequest{Name: name, ServiceOffering: "large"}))
		r.heldBy(f)
		if got := r.cluster(name); got.GetState() != clv1.Cluster_SCALING_STOPPED_CLUSTER || got.GetCurrentOperation() != op.GetName() {
			t.Errorf("offering change: %s held by %q; want SCALING_STOPPED_CLUSTER held by %s", got.GetState(), got.GetCurrentOperation(), op.GetName())
		}
		r.let(f)
		r.succeeded(op)
		got := r.cluster(name)
		if got.GetState() != clv1.Cluster_STOPPED || got.GetServiceOffering() != "large" || got.GetWorkerNodeCount() != 2 || len(got.GetNodes()) != 3 {
			t.Errorf("after the offering change: %s, %q, %d workers, %d nodes; want STOPPED, large, 2, 3",
				got.GetState(), got.GetServiceOffering(), got.GetWorkerNodeCount(), len(got.GetNodes()))
		}
		for _, n := range got.GetNodes() {
			if n.GetPower() != clv1.Node_STOPPED {
				t.Errorf("node %s powered %s by an offering change of a stopped cluster", n.GetName(), n.GetPower())
			}
		}
	})
}

func TestScaling_FailedAutoscalerFailsScaling(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		name := r.create("autoscaler", 1).GetName()
		r.fail(infra.StepDeployAutoscaler, name)
		op := r.accepted(r.clients.clusters.ScaleCluster(r.ctx, &clv1.ScaleClusterRequest{Name: name, Autoscaling: &clv1.Autoscaling{Enabled: true, MinSize: 1, MaxSize: 3}}))
		r.failed(op)
		c := r.cluster(name)
		if c.GetState() != clv1.Cluster_ALERT || c.GetCurrentOperation() != "" || c.GetAutoscaling().GetEnabled() {
			t.Errorf("after a failed autoscaler deployment: %s held by %q, autoscaling %v; want ALERT, unheld, autoscaler not recorded",
				c.GetState(), c.GetCurrentOperation(), c.GetAutoscaling())
		}
		want := []string{"AUTOSCALE_REQUESTED:RUNNING->SCALING", "OPERATION_FAILED:SCALING->ALERT"}
		if got := r.historyOf(name, op); !slices.Equal(got, want) {
			t.Errorf("history = %v; want %v", got, want)
		}
	})
}

func TestScaling_StoppedClusterOfferingFailureGoesToAlert(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		name := r.stopped("stopped-offering", 1).GetName()
		r.fail(infra.StepResizeMachine, name)
		op := r.accepted(r.clients.clusters.ScaleCluster(r.ctx, &clv1.ScaleClusterRequest{Name: name, ServiceOffering: "large"}))
		r.failed(op)
		c := r.cluster(name)
		if c.GetState() != clv1.Cluster_ALERT || c.GetCurrentOperation() != "" || c.GetServiceOffering() != "medium" {
			t.Errorf("after a failed offering change: %s held by %q of %q; want ALERT, unheld, still medium", c.GetState(), c.GetCurrentOperation(), c.GetServiceOffering())
		}
		want := []string{"SCALE_UP_REQUESTED:STOPPED->SCALING_STOPPED_CLUSTER", "OPERATION_FAILED:SCALING_STOPPED_CLUSTER->ALERT"}
		if got := r.historyOf(name, op); !slices.Equal(got, want) {
			t.Errorf("history = %v; want %v", got, want)
		}
	})
}

// --- SPEC §3.6 born held ---

func TestBornHeld_ScaleOrStopOfClusterBeingCreatedRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		refuseAll := func(name, holder string, why string) {
			t.Helper()
			before := r.freeze(name)
			c := before.cluster
			_, err := r.scaleTo(name, c.GetWorkerNodeCount()+1)
			r.inProgress("scale of a cluster "+why, err, holder)
			_, err = r.stopCluster(name)
			r.inProgress("stop of a cluster "+why, err, holder)
			_, err = r.deleteCluster(name)
			r.inProgress("delete of a cluster "+why, err, holder)
			r.unchanged(before, "requests refused on a cluster "+why)
		}

		// CREATED, before the create job's first step: the row, the job
		// and the holder are written together, so this state exists only
		// held (a CREATED cluster would otherwise let a stop through in
		// place, and a delete to DESTROYING).
		c, j, err := r.seed.CreateCluster(r.ctx, repository.NewCluster{Account: "default", DisplayName: "being-created",
			Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium"}},
			repository.NewJob{Kind: "create", ServerID: "test-server", ServerIncarnation: r.srv.self.Incarnation, Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.cluster("clusters/" + c.ID); got.GetState() != clv1.Cluster_CREATED || got.GetCurrentOperation() != "operations/"+j.ID {
			t.Fatalf("new cluster is %s held by %q; want CREATED held by its create job", got.GetState(), got.GetCurrentOperation())
		}
		refuseAll("clusters/"+c.ID, "operations/"+j.ID, "just created")

		// STARTING, while the create job provisions its machines.
		f := r.hold(infra.StepProvisionMachine, "")
		create := r.accepted(r.clients.clusters.CreateCluster(r.ctx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
			DisplayName: "provisioning", KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium",
		}}))
		r.heldBy(f)
		name := opMetadata(t, create).GetCluster()
		if got := r.cluster(name); got.GetState() != clv1.Cluster_STARTING || got.GetCurrentOperation() != create.GetName() {
			t.Fatalf("provisioning cluster is %s held by %q; want STARTING held by %s", got.GetState(), got.GetCurrentOperation(), create.GetName())
		}
		refuseAll(name, create.GetName(), "being provisioned")
		r.let(f)
		r.succeeded(create)
		got := r.cluster(name)
		if got.GetState() != clv1.Cluster_RUNNING || got.GetWorkerNodeCount() != 1 || len(got.GetNodes()) != 2 {
			t.Errorf("created cluster: %s with %d workers, %d nodes; want RUNNING, 1, 2", got.GetState(), got.GetWorkerNodeCount(), len(got.GetNodes()))
		}
		if js := r.jobs(name); len(js) != 1 {
			t.Errorf("jobs of the created cluster: %v; want its create only", js)
		}
	})
}

// --- SPEC §3.7 adding nodes ---

func TestAddNodes_ClaimsBeforeAttaching(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		stopped := r.stopped("add-to-stopped", 1).GetName()
		running := r.create("add-to-running", 1).GetName()
		m := r.freeMachine()
		untouched := func(why string) {
			t.Helper()
			got := r.machine(m.GetName())
			if !proto.Equal(got, m) {
				t.Errorf("%s: candidate machine %v; want it untouched %v", why, got, m)
			}
			for _, c := range []string{stopped, running} {
				rules, err := r.clients.sim.ListNetworkRules(r.ctx, &clv1.ListNetworkRulesRequest{Cluster: c})
				if err != nil {
					t.Fatal(err)
				}
				for _, rule := range rules.GetRules() {
					if rule.GetMachine() == m.GetName() {
						t.Errorf("%s: %s has a rule for the candidate machine: %v", why, c, rule)
					}
				}
			}
		}
		add := func(name string) (*longrunningpb.Operation, error) {
			return r.clients.clusters.AddNodes(r.ctx, &clv1.AddNodesRequest{Name: name, Machines: []string{m.GetName()}})
		}

		before := r.freeze(stopped)
		_, err := add(stopped)
		r.invalidTransition("add nodes to a STOPPED cluster", err, stopped, clv1.Cluster_STOPPED, lifecycle.AddNodeRequested)
		r.unchanged(before, "a refused add to a STOPPED cluster")
		untouched("add refused on a STOPPED cluster")

		f := r.hold(infra.StepProvisionMachine, running)
		scale := r.accepted(r.scaleTo(running, 2))
		r.heldBy(f)
		before = r.freeze(running)
		_, err = add(running)
		r.inProgress("add nodes while a scale holds the cluster", err, scale.GetName())
		r.unchanged(before, "a refused add to a SCALING cluster")
		untouched("add refused while the cluster is held")
		r.let(f)
		r.succeeded(scale)

		// Accepted: IMPORTING is claimed before the first step touches the machine.
		f = r.hold(infra.StepValidateNode, running)
		op := r.accepted(add(running))
		if h := r.heldBy(f); "machines/"+h.MachineID != m.GetName() {
			t.Errorf("held validate_node is on machine %s; want %s", h.MachineID, m.GetName())
		}
		if c := r.cluster(running); c.GetState() != clv1.Cluster_IMPORTING || c.GetCurrentOperation() != op.GetName() {
			t.Errorf("at the first step of add nodes: %s held by %q; want IMPORTING held by %s", c.GetState(), c.GetCurrentOperation(), op.GetName())
		}
		untouched("before the add's first step")
		r.let(f)
		r.succeeded(op)
		got := r.machine(m.GetName())
		if got.GetCluster() != running || got.GetRole() != clv1.Node_WORKER || !got.GetJoined() {
			t.Errorf("added machine = %v; want a joined worker of %s", got, running)
		}
		if c := r.cluster(running); c.GetState() != clv1.Cluster_RUNNING || c.GetWorkerNodeCount() != 3 {
			t.Errorf("after the add: %s with %d workers; want RUNNING with 3", c.GetState(), c.GetWorkerNodeCount())
		}

		// A failed add leaves the cluster RUNNING, unheld, and the machine free.
		m = r.freeMachine()
		r.fail(infra.StepValidateNode, running)
		failed := r.accepted(add(running))
		r.failed(failed)
		if c := r.cluster(running); c.GetState() != clv1.Cluster_RUNNING || c.GetCurrentOperation() != "" || c.GetWorkerNodeCount() != 3 {
			t.Errorf("after a failed add: %s held by %q with %d workers; want RUNNING, unheld, 3", c.GetState(), c.GetCurrentOperation(), c.GetWorkerNodeCount())
		}
		untouched("after a failed add")
	})
}

// --- SPEC §3.8 start from ALERT ---

func TestStartFromAlert_HoldsStartingUntilRunning(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		c := r.cluster(r.create("alert", 2).GetName())
		name := c.GetName()
		r.fail(infra.StepProvisionMachine, name)
		r.failed(r.accepted(r.scaleTo(name, 3)))
		// A worker went down out of band, so the start has a machine to power on.
		if _, err := r.clients.sim.SetMachinePower(r.ctx, &clv1.SetMachinePowerRequest{Name: worker(t, c), Power: clv1.Node_STOPPED}); err != nil {
			t.Fatal(err)
		}
		if got := r.cluster(name); got.GetState() != clv1.Cluster_ALERT || got.GetCurrentOperation() != "" {
			t.Fatalf("cluster is %s held by %q; want ALERT, unheld", got.GetState(), got.GetCurrentOperation())
		}
		free := r.freeMachine().GetName()

		// Sample the state from before the start until RUNNING.
		var mu sync.Mutex
		var seen []clv1.Cluster_State
		states := func() []clv1.Cluster_State { mu.Lock(); defer mu.Unlock(); return slices.Clone(seen) }
		sampling := make(chan error, 1)
		first, starting := make(chan struct{}), make(chan struct{})
		go func() {
			for i := 0; ; i++ {
				got, err := r.clients.clusters.GetCluster(r.ctx, &clv1.GetClusterRequest{Name: name})
				if err != nil {
					sampling <- err
					return
				}
				mu.Lock()
				if len(seen) == 0 || seen[len(seen)-1] != got.GetState() {
					seen = append(seen, got.GetState())
					if got.GetState() == clv1.Cluster_STARTING && len(seen) == 2 {
						close(starting)
					}
				}
				mu.Unlock()
				if i == 0 {
					close(first)
				}
				if got.GetState() == clv1.Cluster_RUNNING {
					sampling <- nil
					return
				}
			}
		}()
		<-first
		sampledStarting := func() {
			t.Helper()
			select {
			case <-starting:
			case err := <-sampling:
				t.Fatalf("sampler ended (%v) without seeing STARTING; saw %v", err, states())
			}
		}

		powerOn, waitAPI := r.hold(infra.StepPowerOn, name), r.hold(infra.StepWaitAPI, name)
		start := r.accepted(r.startCluster(name))
		for _, f := range []string{powerOn, waitAPI} {
			h := r.heldBy(f)
			before := r.freeze(name)
			if before.cluster.GetState() != clv1.Cluster_STARTING || before.cluster.GetCurrentOperation() != start.GetName() {
				t.Errorf("at %s: %s held by %q; want STARTING held by %s", h.Step, before.cluster.GetState(), before.cluster.GetCurrentOperation(), start.GetName())
			}
			_, err := r.stopCluster(name)
			r.inProgress("stop while STARTING at "+h.Step, err, start.GetName())
			_, err = r.scaleTo(name, 3)
			r.inProgress("scale while STARTING at "+h.Step, err, start.GetName())
			_, err = r.clients.clusters.AddNodes(r.ctx, &clv1.AddNodesRequest{Name: name, Machines: []string{free}})
			r.inProgress("add nodes while STARTING at "+h.Step, err, start.GetName())
			_, err = r.clients.clusters.RemoveNodes(r.ctx, &clv1.RemoveNodesRequest{Name: name, Nodes: []string{worker(t, c)}})
			r.inProgress("remove nodes while STARTING at "+h.Step, err, start.GetName())
			r.unchanged(before, "requests refused while STARTING")
			sampledStarting()
			r.let(f)
		}
		r.succeeded(start)
		if err := <-sampling; err != nil {
			t.Fatal(err)
		}
		want := []clv1.Cluster_State{clv1.Cluster_ALERT, clv1.Cluster_STARTING, clv1.Cluster_RUNNING}
		if got := states(); !slices.Equal(got, want) {
			t.Errorf("sampled states %v; want %v", got, want)
		}
		wantHistory := []string{"START_REQUESTED:ALERT->STARTING", "OPERATION_SUCCEEDED:STARTING->RUNNING"}
		if got := r.historyOf(name, start); !slices.Equal(got, wantHistory) {
			t.Errorf("start's history = %v; want %v", got, wantHistory)
		}
		for _, n := range r.cluster(name).GetNodes() {
			if n.GetPower() != clv1.Node_RUNNING || !n.GetJoined() {
				t.Errorf("after the start node %v is not running and joined", n)
			}
		}
	})
}

// --- AIP-155 request ids ---

func TestRequestID_Idempotent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		name := r.create("idempotent", 1).GetName()
		other := r.create("other", 1).GetName()

		// Twice in a row, then again once the operation is done.
		id := uuid.NewString()
		stop := func() (*longrunningpb.Operation, error) {
			return r.clients.clusters.StopCluster(r.ctx, &clv1.StopClusterRequest{Name: name, RequestId: id})
		}
		first := r.accepted(stop())
		second := r.accepted(stop())
		done := r.succeeded(first)
		third := r.accepted(stop())
		if second.GetName() != first.GetName() || third.GetName() != first.GetName() || !third.GetDone() || !proto.Equal(third.GetResponse(), done.GetResponse()) {
			t.Errorf("same request_id answered %s, %s, %s (done %v); want %s each time, done with its response the third",
				first.GetName(), second.GetName(), third.GetName(), third.GetDone(), first.GetName())
		}
		if got := len(r.jobsOfKind(name, "stop")); got != 1 {
			t.Errorf("%d stop jobs for one request_id; want 1", got)
		}

		// Concurrently: every copy gets the one operation. The cluster is
		// STOPPED; rounds alternate start and stop, each held at its first
		// step so that late copies find the operation still running.
		verbs := []struct {
			kind, step string
			send       func(id string) (*longrunningpb.Operation, error)
		}{
			{"start", infra.StepPowerOn, func(id string) (*longrunningpb.Operation, error) {
				return r.clients.clusters.StartCluster(r.ctx, &clv1.StartClusterRequest{Name: name, RequestId: id})
			}},
			{"stop", infra.StepPowerOff, func(id string) (*longrunningpb.Operation, error) {
				return r.clients.clusters.StopCluster(r.ctx, &clv1.StopClusterRequest{Name: name, RequestId: id})
			}},
		}
		const rounds, copies = 4, 16
		var refusals []string
		for round := range rounds {
			v, rid := verbs[round%2], uuid.NewString()
			f := r.hold(v.step, name)
			ops, errs := together(copies, func(int) (*longrunningpb.Operation, error) { return v.send(rid) })
			var names []string
			for i := range copies {
				if errs[i] != nil {
					f, _ := refusalOf(errs[i])
					refusals = append(refusals, f.code.String()+" "+f.reason)
					continue
				}
				names = append(names, ops[i].GetName())
			}
			slices.Sort(names)
			if names = slices.Compact(names); len(names) > 1 {
				t.Errorf("round %d: concurrent copies of one %s got operations %v; want one", round, v.kind, names)
			}
			r.heldBy(f)
			r.let(f)
			var jobs []repository.Job
			for _, j := range r.jobsOfKind(name, v.kind) {
				if j.RequestID == rid {
					jobs = append(jobs, j)
				}
			}
			if len(jobs) != 1 {
				t.Fatalf("round %d: %d %s jobs for one request_id sent %d times at once; want 1", round, len(jobs), v.kind, copies)
			}
			r.succeeded(&longrunningpb.Operation{Name: "operations/" + jobs[0].ID})
		}
		if len(refusals) > 0 {
			// service/claim.go run(): the request_id is looked up once, before
			// the cluster is read; a copy that read the cluster after another
			// copy's claim is refused by admit (OPERATION_IN_PROGRESS) or loses
			// the CAS (CONCURRENT_MODIFICATION), and only ErrAlreadyExists is
			// looked up again.
			t.Errorf("%d of %d concurrent copies of requests with one request_id each were refused %v; "+
				"want every copy answered with the operation the first one started (AIP-155)", len(refusals), rounds*copies, refusals)
		}
		// The same id for a different request is refused and changes nothing.
		beforeName, beforeOther := r.freeze(name), r.freeze(other)
		for _, tc := range []struct {
			what string
			send func() (*longrunningpb.Operation, error)
		}{
			{"a start reusing a stop's request_id", func() (*longrunningpb.Operation, error) {
				return r.clients.clusters.StartCluster(r.ctx, &clv1.StartClusterRequest{Name: name, RequestId: id})
			}},
			{"a scale reusing a stop's request_id", func() (*longrunningpb.Operation, error) {
				return r.clients.clusters.ScaleCluster(r.ctx, &clv1.ScaleClusterRequest{Name: name, WorkerNodeCount: proto.Int32(2), RequestId: id})
			}},
			{"a stop of another cluster reusing the request_id", func() (*longrunningpb.Operation, error) {
				return r.clients.clusters.StopCluster(r.ctx, &clv1.StopClusterRequest{Name: other, RequestId: id})
			}},
		} {
			_, err := tc.send()
			if f := r.refused(err); f.code != codes.InvalidArgument || f.reason != "INVALID_ARGUMENT" || f.field != "request_id" || f.meta["operation"] != first.GetName() {
				t.Errorf("%s: %v (field %q, operation %q); want INVALID_ARGUMENT on request_id naming %s", tc.what, f, f.field, f.meta["operation"], first.GetName())
			}
		}
		r.unchanged(beforeName, "requests reusing a request_id")
		r.unchanged(beforeOther, "a request reusing another cluster's request_id")

		// A create, twice: one cluster.
		cid := uuid.NewString()
		create := func() (*longrunningpb.Operation, error) {
			return r.clients.clusters.CreateCluster(r.ctx, &clv1.CreateClusterRequest{RequestId: cid, Cluster: &clv1.Cluster{
				DisplayName: "created-once", KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium",
			}})
		}
		c1 := r.accepted(create())
		c2 := r.accepted(create())
		if c1.GetName() != c2.GetName() {
			t.Errorf("create sent twice with one request_id: %s and %s", c1.GetName(), c2.GetName())
		}
		r.succeeded(c1)
		list, err := r.clients.clusters.ListClusters(r.ctx, &clv1.ListClustersRequest{Filter: `display_name = "created-once"`})
		if err != nil || len(list.GetClusters()) != 1 {
			t.Errorf("clusters named created-once: %v, %v; want 1", list.GetClusters(), err)
		}
	})
}

// TestRequestID_BoundToParameters: a request_id names one request, so on
// every verb that acts on an existing cluster, the same id sent with the
// same verb to the same cluster but other parameters is refused
// (INVALID_ARGUMENT on request_id, naming the first operation) and changes
// nothing, both while the first operation runs and after it has ended;
// sent with the same parameters, it is answered with the first operation.
func TestRequestID_BoundToParameters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		name := r.create("bound", 2).GetName()
		var workers []string
		for _, n := range r.cluster(name).GetNodes() {
			if n.GetRole() == clv1.Node_WORKER {
				workers = append(workers, n.GetName())
			}
		}
		if len(workers) != 2 {
			t.Fatalf("%s has workers %v; want 2", name, workers)
		}
		m1, m2 := r.freeMachine().GetName(), r.freeMachine().GetName()
		cs := r.clients.clusters
		for _, tc := range []struct {
			verb  string
			step  string // held, so that the first operation is still running
			send  func(id string) (*longrunningpb.Operation, error)
			other func(id string) (*longrunningpb.Operation, error)
		}{
			{"scale", infra.StepProvisionMachine,
				func(id string) (*longrunningpb.Operation, error) {
					return cs.ScaleCluster(r.ctx, &clv1.ScaleClusterRequest{Name: name, WorkerNodeCount: proto.Int32(3), RequestId: id})
				},
				func(id string) (*longrunningpb.Operation, error) {
					return cs.ScaleCluster(r.ctx, &clv1.ScaleClusterRequest{Name: name, WorkerNodeCount: proto.Int32(4), RequestId: id})
				}},
			{"upgrade", infra.StepUpgradeNode,
				func(id string) (*longrunningpb.Operation, error) {
					return cs.UpgradeCluster(r.ctx, &clv1.UpgradeClusterRequest{Name: name, KubernetesVersion: "1.30.5", RequestId: id})
				},
				func(id string) (*longrunningpb.Operation, error) {
					return cs.UpgradeCluster(r.ctx, &clv1.UpgradeClusterRequest{Name: name, KubernetesVersion: "1.31.1", RequestId: id})
				}},
			{"add nodes", infra.StepValidateNode,
				func(id string) (*longrunningpb.Operation, error) {
					return cs.AddNodes(r.ctx, &clv1.AddNodesRequest{Name: name, Machines: []string{m1}, RequestId: id})
				},
				func(id string) (*longrunningpb.Operation, error) {
					return cs.AddNodes(r.ctx, &clv1.AddNodesRequest{Name: name, Machines: []string{m2}, RequestId: id})
				}},
			{"remove nodes", infra.StepDeleteNode,
				func(id string) (*longrunningpb.Operation, error) {
					return cs.RemoveNodes(r.ctx, &clv1.RemoveNodesRequest{Name: name, Nodes: []string{workers[0]}, RequestId: id})
				},
				func(id string) (*longrunningpb.Operation, error) {
					return cs.RemoveNodes(r.ctx, &clv1.RemoveNodesRequest{Name: name, Nodes: []string{workers[1]}, RequestId: id})
				}},
		} {
			id := uuid.NewString()
			refused := func(when string, first *longrunningpb.Operation) {
				t.Helper()
				before := r.freeze(name)
				op, err := tc.other(id)
				if err == nil {
					t.Errorf("%s with other parameters reusing the request_id of %s %s was answered with %s; want INVALID_ARGUMENT on request_id",
						tc.verb, first.GetName(), when, op.GetName())
					return
				}
				if f := r.refused(err); f.code != codes.InvalidArgument || f.reason != "INVALID_ARGUMENT" || f.field != "request_id" || f.meta["operation"] != first.GetName() {
					t.Errorf("%s with other parameters reusing the request_id of %s %s: %v (field %q, operation %q); want INVALID_ARGUMENT on request_id naming it",
						tc.verb, first.GetName(), when, f, f.field, f.meta["operation"])
				}
				r.unchanged(before, fmt.Sprintf("a refused %s reusing a request_id %s", tc.verb, when))
			}
			f := r.hold(tc.step, name)
			first := r.accepted(tc.send(id))
			r.heldBy(f)
			if again := r.accepted(tc.send(id)); again.GetName() != first.GetName() {
				t.Errorf("%s sent again with its request_id while it runs: %s; want %s", tc.verb, again.GetName(), first.GetName())
			}
			refused("while it runs", first)
			r.let(f)
			r.succeeded(first)
			// The cluster is free again and would take the other request.
			refused("once it has ended", first)
			if again := r.accepted(tc.send(id)); again.GetName() != first.GetName() || !again.GetDone() {
				t.Errorf("%s sent again with its request_id once it has ended: %s (done %v); want %s, done",
					tc.verb, again.GetName(), again.GetDone(), first.GetName())
			}
			if got := len(r.jobsOfKind(name, opMetadata(t, first).GetVerb())); got != 1 {
				t.Errorf("%d %s jobs; want 1 for one request_id", got, tc.verb)
			}
		}
	})
}

// --- SPEC §4 cancel ---

// A cancel ends the step in flight through its context, however long that
// step would take: a scale held at join_node (a HOLD nobody releases) or in
// an hour-long DELAY ends CANCELLED, the cluster follows SCALING's failure
// transition, and the machine the scale added but never joined is removed.
func TestCancel_EndsTheStepInFlight(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		for _, mode := range []sim.Mode{sim.ModeHold, sim.ModeDelay} {
			t.Run(string(mode), func(t *testing.T) {
				r := newRig(t, b)
				name := r.create("cancelled", 1).GetName()
				op := r.inFlight(name, mode)
				if _, err := r.clients.ops.CancelOperation(r.ctx, &longrunningpb.CancelOperationRequest{Name: op.GetName()}); err != nil {
					t.Fatal(err)
				}
				r.cancelled(name, op)
				if held := r.srv.sim.ListHeld(); len(held) != 0 {
					t.Errorf("held after the cancel: %v; want none (the cancel let the held step go)", held)
				}

				// Cancelling a finished operation changes nothing.
				done := r.wait(t, op)
				if _, err := r.clients.ops.CancelOperation(r.ctx, &longrunningpb.CancelOperationRequest{Name: op.GetName()}); err != nil {
					t.Errorf("cancel of a done operation: %v", err)
				}
				if again := r.wait(t, op); !proto.Equal(again, done) {
					t.Errorf("cancel of a done operation changed it: %v -> %v", done, again)
				}
			})
		}
	})
}

// The same, cancelled through another server than the one running the
// scale: the request is a flag on the job's row, which the owner's runner
// watches while the step is in flight.
func TestCancel_ThroughAnotherServerEndsTheStepInFlight(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		dsn := b.NewDSN(t)
		owner := peerServer(t, dsn, "owner", time.Hour)
		other := peerServer(t, dsn, "other", time.Hour)
		name := owner.create("cancelled", 1).GetName()
		op := owner.inFlight(name, sim.ModeHold)
		if _, err := other.clients.ops.CancelOperation(other.ctx, &longrunningpb.CancelOperationRequest{Name: op.GetName()}); err != nil {
			t.Fatal(err)
		}
		owner.cancelled(name, op)
		if md := opMetadata(t, owner.wait(t, op)); md.GetServer() != "owner" || md.GetAttempt() != 1 {
			t.Errorf("cancelled operation ran on %q, attempt %d; want the owner, attempt 1", md.GetServer(), md.GetAttempt())
		}
	})
}

// inFlight starts a scale of cluster name from 1 to 2 workers and returns
// it once its join_node is under way and would not end by itself: held
// (HOLD, never released) or sleeping for an hour (DELAY).
func (r *rig) inFlight(name string, mode sim.Mode) *longrunningpb.Operation {
	r.t.Helper()
	fault := sim.Fault{Step: infra.StepJoinNode, Mode: mode, ClusterID: clusterUUID(name), Count: 1}
	if mode == sim.ModeDelay {
		fault.Delay = time.Hour
	}
	f, err := r.srv.sim.InjectFault(fault)
	if err != nil {
		r.t.Fatal(err)
	}
	op := r.accepted(r.scaleTo(name, 2))
	if mode == sim.ModeHold {
		r.heldBy(f.ID)
		return op
	}
	// A DELAY is not listed: sample the operation until its step is
	// join_node (recorded just before the call that sleeps).
	deadline := time.Now().Add(30 * time.Second)
	for opMetadata(r.t, r.operation(op)).GetStep() != infra.StepJoinNode {
		if time.Now().After(deadline) {
			r.t.Fatalf("scale %s not at join_node after 30s", op.GetName())
		}
		time.Sleep(5 * time.Millisecond) // sampling a state, not synchronising
	}
	return op
}

// operation reads op as it stands.
func (r *rig) operation(op *longrunningpb.Operation) *longrunningpb.Operation {
	r.t.Helper()
	got, err := r.clients.ops.GetOperation(r.ctx, &longrunningpb.GetOperationRequest{Name: op.GetName()})
	if err != nil {
		r.t.Fatal(err)
	}
	return got
}

// cancelled checks that op, a scale of cluster name from 1 to 2 workers
// cancelled at join_node, ended CANCELLED (SPEC §4) and left the cluster
// ALERT (SCALING's failure transition), unheld, with its one worker and no
// trace of the machine it was joining.
func (r *rig) cancelled(name string, op *longrunningpb.Operation) {
	t := r.t
	t.Helper()
	st := r.failed(op)
	if reason, _ := opErrorInfo(t, st); st.GetCode() != int32(codes.Canceled) || reason != service.ReasonCancelled {
		t.Errorf("cancelled operation's error = %v; want code 1 CANCELLED, reason CANCELLED", st)
	}
	if md := opMetadata(t, r.wait(t, op)); !md.GetRequestedCancellation() || md.GetEndTime() == nil || md.GetStep() != infra.StepJoinNode {
		t.Errorf("cancelled operation metadata = %v; want requested_cancellation, an end time, step join_node", md)
	}
	if j, err := r.seed.GetJob(r.ctx, operationUUID(op.GetName())); err != nil || j.Status != repository.JobCancelled {
		t.Errorf("job = %v, %v; want CANCELLED", j.Status, err)
	}
	c := r.cluster(name)
	if c.GetState() != clv1.Cluster_ALERT || c.GetCurrentOperation() != "" || c.GetWorkerNodeCount() != 1 {
		t.Errorf("after the cancel: %s held by %q with %d workers; want ALERT (SCALING's failure transition), unheld, 1 worker",
			c.GetState(), c.GetCurrentOperation(), c.GetWorkerNodeCount())
	}
	want := []string{"SCALE_UP_REQUESTED:RUNNING->SCALING", "OPERATION_FAILED:SCALING->ALERT"}
	if got := r.historyOf(name, op); !slices.Equal(got, want) {
		t.Errorf("history = %v; want %v", got, want)
	}
	// The machine being joined was never joined: the cancelled scale's way
	// out destroyed it and converged the rules to the old nodes.
	rules, err := r.clients.sim.ListNetworkRules(r.ctx, &clv1.ListNetworkRulesRequest{Cluster: name})
	if err != nil {
		t.Fatal(err)
	}
	joined := 0
	for _, n := range c.GetNodes() {
		if n.GetJoined() {
			joined++
		}
	}
	if joined != 2 || len(c.GetNodes()) != 2 || len(rules.GetRules()) != 3 {
		t.Errorf("after the cancel: %d nodes, %d joined, %d rules; want the 2 old nodes, joined, and their 3 rules", len(c.GetNodes()), joined, len(rules.GetRules()))
	}
}

// --- everything at once ---

func TestRace_RandomOperations(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		// Steps take a little time so that operations overlap.
		r := newRig(t, b, func(c *Config) { c.SimStepDelay = 2 * time.Millisecond })
		r.race(5 * time.Second)
	})
}

// The same, with the scanner passing every 50ms: its liveness, orphan and
// reconciliation passes race the operations and must find nothing to do.
func TestRace_RandomOperationsWithScanner(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b, func(c *Config) {
			c.SimStepDelay = 2 * time.Millisecond
			c.ScanInterval, c.ReconcileInterval = 50*time.Millisecond, 100*time.Millisecond
		})
		r.race(5 * time.Second)
	})
}

// race has 32 clients send random operations to 5 clusters for d, then
// checks that every accepted operation ended (and, with no fault injected,
// succeeded), that every refusal was ABORTED or FAILED_PRECONDITION, that no
// cluster ever had two holders, and that every cluster converged to its spec.
func (r *rig) race(d time.Duration) {
	t := r.t
	var names []string
	for i := range 4 {
		names = append(names, r.create(fmt.Sprintf("race-%d", i), 1+int32(i%2)).GetName())
	}
	// And one whose create failed: its starts and stops run in place
	// (SPEC §3.4), holding the cluster without changing its state.
	names = append(names, r.broken("race-error").GetName())
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)

	type acceptedOp struct{ op, cluster, verb string }
	var (
		mu       sync.Mutex
		accepted []acceptedOp
		refused  = map[string]int{}
		problems []string
	)
	problem := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	const clients, perClient = 32, 200
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			var last struct {
				send func() (*longrunningpb.Operation, error)
				op   string
			}
			for i := 0; i < perClient && time.Now().Before(deadline); i++ {
				if last.send != nil && rng.IntN(10) == 0 {
					// A retry of the last accepted request: the same operation.
					op, err := last.send()
					if err != nil || op.GetName() != last.op {
						problem("retried request: %v, %v; want %s", op.GetName(), err, last.op)
					}
					continue
				}
				name := names[rng.IntN(len(names))]
				c, err := r.clients.clusters.GetCluster(r.ctx, &clv1.GetClusterRequest{Name: name})
				if err != nil {
					problem("GetCluster: %v", err)
					continue
				}
				verb, send := randomRequest(r, rng, c)
				op, err := send()
				if err == nil {
					mu.Lock()
					accepted = append(accepted, acceptedOp{op.GetName(), name, verb})
					mu.Unlock()
					last.send, last.op = send, op.GetName()
					continue
				}
				f, ok := refusalOf(err)
				switch {
				case !ok:
					problem("%s: %v carries no ErrorInfo", verb, err)
				case f.code == codes.Aborted && slices.Contains([]string{"OPERATION_IN_PROGRESS", "CONCURRENT_MODIFICATION", "ETAG_MISMATCH"}, f.reason),
					f.code == codes.FailedPrecondition && f.reason == "INVALID_STATE_TRANSITION":
					mu.Lock()
					refused[f.reason]++
					mu.Unlock()
				default:
					problem("%s of %s (%s, etag %s): refused with %v; want ABORTED or FAILED_PRECONDITION", verb, name, c.GetState(), c.GetEtag(), f)
				}
				if holder := f.meta["operation"]; f.reason == "OPERATION_IN_PROGRESS" && rng.IntN(4) != 0 {
					// Do as the message says: retry once the holder has
					// finished. The clients it wakes together race again.
					if _, err := r.clients.ops.WaitOperation(r.ctx, &longrunningpb.WaitOperationRequest{Name: holder, Timeout: durationpb.New(10 * time.Second)}); err != nil {
						problem("WaitOperation(%s): %v", holder, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, p := range problems {
		t.Error(p)
	}

	byStatus := map[string]int{}
	byVerb := map[string]int{}
	for _, a := range accepted {
		done := r.wait(t, &longrunningpb.Operation{Name: a.op})
		byVerb[a.verb]++
		switch {
		case !done.GetDone():
			t.Errorf("operation %s (%s) not done", a.op, a.verb)
		case done.GetError() == nil:
			byStatus["succeeded"]++
		case strings.Contains(done.GetError().GetMessage(), "could not be recorded by its server"):
			byStatus["failed"]++
			// the scanner's lost-job check failed a job its runner
			// was running.
			t.Errorf("operation %s (%s of %s) was failed by the scanner as lost while this server ran it: %v",
				a.op, a.verb, a.cluster, done.GetError())
		default:
			byStatus["failed"]++
			t.Errorf("operation %s (%s of %s) failed with no fault injected: %v", a.op, a.verb, a.cluster, done.GetError())
		}
	}
	t.Logf("%d accepted %v, refused %v, ended %v", len(accepted), byVerb, refused, byStatus)
	// A sanity floor, not a performance figure: on a loaded 2-core machine
	// with -race a few operations a cluster is all one can count on.
	if len(accepted) < len(names) || refused["OPERATION_IN_PROGRESS"] == 0 {
		t.Errorf("%d accepted, refused %v: the race did not exercise both sides", len(accepted), refused)
	}

	opsOf := map[string][]string{}
	for _, a := range accepted {
		opsOf[a.cluster] = append(opsOf[a.cluster], operationUUID(a.op))
	}
	for _, name := range names {
		r.checkHolders(name, opsOf[name])
		r.checkConverged(name)
	}
}

// randomRequest picks a request for cluster c as just read. Scales and
// upgrades carry the etag read, so a stale read is refused with
// ETAG_MISMATCH rather than judged against a size or version that has
// changed since.
func randomRequest(r *rig, rng *rand.Rand, c *clv1.Cluster) (string, func() (*longrunningpb.Operation, error)) {
	name, id := c.GetName(), uuid.NewString()
	etag := ""
	if rng.IntN(2) == 0 {
		etag = c.GetEtag()
	}
	next := map[string][]string{"1.30.2": {"1.30.5", "1.31.1"}, "1.30.5": {"1.31.1"}}[c.GetKubernetesVersion()]
	switch n := rng.IntN(10); {
	case n < 3:
		return "start", func() (*longrunningpb.Operation, error) {
			return r.clients.clusters.StartCluster(r.ctx, &clv1.StartClusterRequest{Name: name, RequestId: id, Etag: etag})
		}
	case n < 5:
		return "stop", func() (*longrunningpb.Operation, error) {
			return r.clients.clusters.StopCluster(r.ctx, &clv1.StopClusterRequest{Name: name, RequestId: id, Etag: etag})
		}
	case n < 9 || len(next) == 0:
		w := c.GetWorkerNodeCount()
		switch {
		case w >= 4:
			w--
		case w <= 1:
			w++
		case rng.IntN(2) == 0:
			w--
		default:
			w++
		}
		return "scale", func() (*longrunningpb.Operation, error) {
			return r.clients.clusters.ScaleCluster(r.ctx, &clv1.ScaleClusterRequest{Name: name, WorkerNodeCount: proto.Int32(w), RequestId: id, Etag: c.GetEtag()})
		}
	default:
		v := next[rng.IntN(len(next))]
		return "upgrade", func() (*longrunningpb.Operation, error) {
			return r.clients.clusters.UpgradeCluster(r.ctx, &clv1.UpgradeClusterRequest{Name: name, KubernetesVersion: v, RequestId: id, Etag: c.GetEtag()})
		}
	}
}

// endEvents end an operation in a cluster's history.
var endEvents = []string{
	lifecycle.OperationSucceeded.String(), lifecycle.OperationFailed.String(), lifecycle.CreateFailed.String(), repository.OperationEnded,
}

// checkHolders replays a cluster's history and checks that no two
// operations ever held it at once: every claim (a *_REQUESTED entry) finds
// the cluster unheld, except the create job moving its own cluster out of
// CREATED, and every end is written by the holder. Each accepted operation
// claimed the cluster exactly once. The jobs' lifetimes never overlap either.
func (r *rig) checkHolders(name string, accepted []string) {
	r.t.Helper()
	holder := ""
	claims := map[string]int{}
	for _, e := range r.history(name) {
		switch {
		case e.Name == repository.ClusterCreated:
			holder = e.Operation
			claims[e.Operation]++
		case strings.HasSuffix(e.Name, "_REQUESTED"):
			if holder == e.Operation && e.Name == lifecycle.StartRequested.String() && e.From == lifecycle.Created {
				continue // the create job's own first step
			}
			if holder != "" {
				r.t.Errorf("%s: entry %d %s by %s while %s held the cluster", name, e.ID, e.Name, e.Operation, holder)
			}
			holder = e.Operation
			claims[e.Operation]++
		case slices.Contains(endEvents, e.Name):
			if holder != e.Operation {
				r.t.Errorf("%s: entry %d %s by %s while %q held the cluster", name, e.ID, e.Name, e.Operation, holder)
			}
			holder = ""
		case e.Name == lifecycle.FaultsDetected.String() && e.Operation != "":
			// An operation's end that found its machines not matching the
			// record (lifecycle.Settle): written by the holder, it ends the hold.
			if holder != e.Operation {
				r.t.Errorf("%s: entry %d %s by %s while %q held the cluster", name, e.ID, e.Name, e.Operation, holder)
			}
			holder = ""
		case e.Name == lifecycle.FaultsDetected.String():
			// The scanner's reconciliation, which only writes unheld clusters.
			if holder != "" {
				r.t.Errorf("%s: entry %d %s while %s held the cluster", name, e.ID, e.Name, holder)
			}
		case e.Name == repository.Repair:
			if holder != e.Operation {
				r.t.Errorf("%s: entry %d %s by %s while %q held the cluster", name, e.ID, e.Name, e.Operation, holder)
			}
		case e.Name == repository.RecoveryStarted:
			// Every job here runs on this live server: none is an orphan.
			r.t.Errorf("%s: entry %d: recovery %s took the cluster over from %q, an operation this live server was running", name, e.ID, e.Operation, holder)
			holder = e.Operation
			claims[e.Operation]++
		default:
			r.t.Errorf("%s: unexpected history entry %d %s", name, e.ID, e.Name)
		}
	}
	if holder != "" {
		r.t.Errorf("%s: still held by %s after every operation ended", name, holder)
	}
	for _, op := range accepted {
		if claims[op] != 1 {
			r.t.Errorf("%s: accepted operation %s claimed the cluster %d times; want once", name, op, claims[op])
		}
	}

	jobs := r.jobs(name)
	sort.Slice(jobs, func(i, j int) bool { return jobs[i].CreateTime.Before(jobs[j].CreateTime) })
	for i, j := range jobs {
		if !j.Status.Done() || j.EndTime == nil {
			r.t.Errorf("%s: job %s (%s) is %s", name, j.ID, j.Kind, j.Status)
			continue
		}
		if claims[j.ID] != 1 {
			r.t.Errorf("%s: job %s (%s) claimed the cluster %d times; want once", name, j.ID, j.Kind, claims[j.ID])
		}
		if i > 0 && jobs[i-1].EndTime != nil && j.CreateTime.Before(*jobs[i-1].EndTime) {
			r.t.Errorf("%s: job %s (%s) started at %s, before job %s (%s) ended at %s: two jobs in progress at once",
				name, j.ID, j.Kind, j.CreateTime, jobs[i-1].ID, jobs[i-1].Kind, *jobs[i-1].EndTime)
		}
	}
}

// checkConverged checks that a cluster every operation of which succeeded
// is what its spec says: resting, unheld, its workers all there, joined, at
// its version, powered as its state says.
func (r *rig) checkConverged(name string) {
	r.t.Helper()
	c := r.cluster(name)
	if c.GetState() == clv1.Cluster_ERROR && c.GetCurrentOperation() == "" {
		return // in-place starts and stops leave ERROR as it was
	}
	power := map[clv1.Cluster_State]clv1.Node_Power{clv1.Cluster_RUNNING: clv1.Node_RUNNING, clv1.Cluster_STOPPED: clv1.Node_STOPPED}[c.GetState()]
	if power == clv1.Node_POWER_UNSPECIFIED || c.GetCurrentOperation() != "" {
		r.t.Errorf("%s ended %s held by %q; want RUNNING or STOPPED, unheld", name, c.GetState(), c.GetCurrentOperation())
		return
	}
	workers := 0
	for _, n := range c.GetNodes() {
		if n.GetRole() == clv1.Node_WORKER {
			workers++
		}
		if !n.GetJoined() || n.GetPower() != power || n.GetKubernetesVersion() != c.GetKubernetesVersion() {
			r.t.Errorf("%s (%s at %s): node %v", name, c.GetState(), c.GetKubernetesVersion(), n)
		}
	}
	if int32(workers) != c.GetWorkerNodeCount() || c.GetWorkerNodeCount() < 1 || c.GetWorkerNodeCount() > 4 {
		r.t.Errorf("%s has %d worker machines for worker_node_count %d", name, workers, c.GetWorkerNodeCount())
	}
}
