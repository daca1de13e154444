package server

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/scanner"
)

// busyScanner makes the scanner pass often, so recovery shows within a test.
func busyScanner(c *Config) {
	c.ScanInterval, c.ReconcileInterval = 50*time.Millisecond, 100*time.Millisecond
}

// waitState polls (bounded) until the cluster is in state and held by
// nothing, and returns the states it went through.
func (h *harness) waitState(t *testing.T, name string, want clv1.Cluster_State) []clv1.Cluster_State {
	t.Helper()
	var seen []clv1.Cluster_State
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		c, err := h.clients.clusters.GetCluster(tctx(t), &clv1.GetClusterRequest{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		if len(seen) == 0 || seen[len(seen)-1] != c.GetState() {
			seen = append(seen, c.GetState())
		}
		if c.GetState() == want && c.GetCurrentOperation() == "" {
			return seen
		}
		time.Sleep(10 * time.Millisecond) // sampling a state, not synchronising
	}
	t.Fatalf("%s never reached %s unheld; states seen %v", name, want, seen)
	return nil
}

func (h *harness) historyNames(t *testing.T, name string) []string {
	t.Helper()
	resp, err := h.clients.clusters.ListClusterEvents(tctx(t), &clv1.ListClusterEventsRequest{Parent: name, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range resp.GetEvents() {
		out = append(out, e.GetEvent())
	}
	return out
}

// failOnOwnerLoss runs a server that fails the jobs of dead servers rather
// than adopting them (--on-owner-loss=fail).
func failOnOwnerLoss(c *Config) { c.OnOwnerLoss = OnOwnerLossFail }

func TestRecovery_CreatedClusterOfADeadServerGoesToError(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, busyScanner, failOnOwnerLoss)
		// A server that never heartbeat here created it and died before its
		// create job's first step: CREATED, held by a job nobody runs.
		c, j, err := h.seed.CreateCluster(tctx(t), repository.NewCluster{Account: "acme", DisplayName: "orphan",
			Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium"}},
			repository.NewJob{Kind: "create", ServerID: "ghost", ServerIncarnation: "gone", Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		name := "clusters/" + c.ID
		h.waitState(t, name, clv1.Cluster_ERROR)
		if e := fxGet(t, h, name); e.GetStatusMessage() == "" || !strings.HasSuffix(e.GetNextStep(), "you can delete it.") {
			t.Errorf("ERROR cluster: status %q, next step %q; want why, and that it can only be deleted", e.GetStatusMessage(), e.GetNextStep())
		}
		if job, _ := h.seed.GetJob(tctx(t), j.ID); job.Status != repository.JobFailed {
			t.Errorf("the dead server's create job is %s; want FAILED", job.Status)
		}
		hist := h.historyNames(t, name)
		if !slices.Contains(hist, repository.RecoveryStarted) || !slices.Contains(hist, "CREATE_FAILED") {
			t.Errorf("history %v; want RECOVERY_STARTED then CREATE_FAILED", hist)
		}
	})
}

func TestRecovery_ReconciliationFollowsTheMachines(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, busyScanner)
		c := h.create(t, "web", 1)
		nodes, err := h.clients.clusters.GetCluster(tctx(t), &clv1.GetClusterRequest{Name: c.GetName()})
		if err != nil {
			t.Fatal(err)
		}
		worker := nodes.GetNodes()[1].GetName()
		// A machine stops out of band: RUNNING -> ALERT.
		if _, err := h.clients.sim.SetMachinePower(tctx(t), &clv1.SetMachinePowerRequest{Name: worker, Power: clv1.Node_STOPPED}); err != nil {
			t.Fatal(err)
		}
		h.waitState(t, c.GetName(), clv1.Cluster_ALERT)
		// The cluster says why, and what to do.
		alert := fxGet(t, h, c.GetName())
		machineID := strings.TrimPrefix(worker, "machines/")
		if msg := alert.GetStatusMessage(); !strings.Contains(msg, "machine "+machineID+" is STOPPED") || alert.GetStatusTime() == nil {
			t.Errorf("ALERT cluster: status %q at %v; want it to name machine %s STOPPED, with a time", msg, alert.GetStatusTime(), machineID)
		}
		if !strings.Contains(alert.GetNextStep(), "back to RUNNING by itself") || !strings.Contains(alert.GetNextStep(), "delete") {
			t.Errorf("ALERT cluster: next step %q; want what clusterd does and what the owner can do", alert.GetNextStep())
		}
		// It comes back: ALERT -> RECOVERING -> RUNNING.
		if _, err := h.clients.sim.SetMachinePower(tctx(t), &clv1.SetMachinePowerRequest{Name: worker, Power: clv1.Node_RUNNING}); err != nil {
			t.Fatal(err)
		}
		h.waitState(t, c.GetName(), clv1.Cluster_RUNNING)
		if back := fxGet(t, h, c.GetName()); back.GetStatusMessage() != "" || back.GetStatusTime() != nil || back.GetNextStep() != "" {
			t.Errorf("RUNNING again: status %q at %v, next step %q; want none", back.GetStatusMessage(), back.GetStatusTime(), back.GetNextStep())
		}
		hist := h.historyNames(t, c.GetName())
		want := []string{"FAULTS_DETECTED", "RECOVERY_REQUESTED", "OPERATION_SUCCEEDED"}
		if got := hist[len(hist)-3:]; !slices.Equal(got, want) {
			t.Errorf("history ends %v; want %v", got, want)
		}
		// Every machine stops: ALERT, then STOPPING -> STOPPED by the scanner.
		for _, n := range nodes.GetNodes() {
			if _, err := h.clients.sim.SetMachinePower(tctx(t), &clv1.SetMachinePowerRequest{Name: n.GetName(), Power: clv1.Node_STOPPED}); err != nil {
				t.Fatal(err)
			}
		}
		h.waitState(t, c.GetName(), clv1.Cluster_STOPPED)
	})
}

func TestRecovery_FailedDestroyIsRetried(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, busyScanner)
		c := h.create(t, "doomed", 1)
		if _, err := h.clients.sim.InjectFault(tctx(t), &clv1.InjectFaultRequest{Fault: &clv1.Fault{
			Step: "destroy_machine", Mode: clv1.Fault_FAIL, Cluster: c.GetName(), Count: 1}}); err != nil {
			t.Fatal(err)
		}
		op, err := h.clients.clusters.DeleteCluster(tctx(t), &clv1.DeleteClusterRequest{Name: c.GetName()})
		if err != nil {
			t.Fatal(err)
		}
		if done := h.wait(t, op); done.GetError() == nil {
			t.Fatal("the delete with a FAIL fault succeeded")
		}
		// DESTROYING, held by nobody: garbage collection destroys it again.
		h.waitState(t, c.GetName(), clv1.Cluster_DESTROYED)
		machines, err := h.clients.sim.ListMachines(tctx(t), &clv1.ListMachinesRequest{Cluster: c.GetName()})
		if err != nil || len(machines.GetMachines()) != 0 {
			t.Errorf("machines of the destroyed cluster = %v, %v; want none", machines.GetMachines(), err)
		}
	})
}

// candidatesThenJobs is a store that hands orphan recovery every cluster it
// might have to look at, held or not, with the job each names, running or
// not (the two-query read: the candidates, then their jobs): whether a job
// is alive is then the scanner's own judgment, not the query's filter.
type candidatesThenJobs struct{ *repository.Store }

func (s candidatesThenJobs) Orphans(ctx context.Context, limit int) ([]repository.Cluster, map[string]repository.Job, error) {
	cs, err := s.OrphanCandidates(ctx)
	if err != nil {
		return nil, nil, err
	}
	cs = cs[:min(limit, len(cs))]
	var ops []string
	for _, c := range cs {
		if c.CurrentOperation != "" {
			ops = append(ops, c.CurrentOperation)
		}
	}
	jobs, err := s.JobsByID(ctx, ops)
	return cs, jobs, err
}

// TestRecovery_LeavesARunningOperation: orphan recovery takes over a
// cluster whose job has ended, never one whose job still runs, even when
// the store hands it over (the scanner skips a job that is IN_PROGRESS
// itself, rather than trusting its query to leave it out): the operation
// keeps its cluster and ends as if no pass had run.
func TestRecovery_LeavesARunningOperation(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		name := r.create("alive", 1).GetName()
		// The orphan beside it: CREATED, held by the failed create job of a
		// server that died before releasing it.
		orphan, j, err := r.seed.CreateCluster(r.ctx, repository.NewCluster{Account: "acme", DisplayName: "orphan",
			Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium"}},
			repository.NewJob{Kind: "create", ServerID: "ghost", ServerIncarnation: "gone", Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.seed.FinishJob(r.ctx, repository.Finish{JobID: j.ID, Status: repository.JobFailed}); err != nil {
			t.Fatal(err)
		}

		f := r.hold(infra.StepProvisionMachine, name)
		op := r.accepted(r.scaleTo(name, 2))
		r.heldBy(f)
		before := r.freeze(name)
		pass := scanner.New(scanner.Config{
			Store: candidatesThenJobs{r.srv.store}, Recoverer: r.srv.clusters, Infra: r.srv.sim, Self: r.srv.self,
			PeerTimeout: time.Hour, Logger: slog.New(slog.DiscardHandler),
		}).Pass(r.ctx)
		if len(pass.Errors) > 0 {
			t.Errorf("a pass met errors %v; want none", pass.Errors)
		}
		r.unchanged(before, "a scanner pass while its operation runs")
		r.let(f)
		r.succeeded(op)
		if c := r.cluster(name); c.GetState() != clv1.Cluster_RUNNING || c.GetWorkerNodeCount() != 2 {
			t.Errorf("after the scale: %s with %d workers; want RUNNING with 2", c.GetState(), c.GetWorkerNodeCount())
		}
		// The orphan beside it was recovered (by this pass, or by the
		// server's own first pass if that ran late).
		r.waitState(t, "clusters/"+orphan.ID, clv1.Cluster_ERROR)
	})
}

// An event source that sees a machine change asks the scanner to reconcile
// its cluster (Scanner.Observe): the next pass finds what changed although
// reconciliation is not due for an hour, and the pass after a machine comes
// back brings the cluster back.
func TestRecovery_ObservedClusterIsReconciledAtTheNextPass(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b) // a pass at start, then one an hour
		c := r.create("web", 1)
		id := clusterUUID(c.GetName())
		worker := r.cluster(c.GetName()).GetNodes()[1].GetName()
		power := func(p clv1.Node_Power) {
			t.Helper()
			if _, err := r.clients.sim.SetMachinePower(r.ctx, &clv1.SetMachinePowerRequest{Name: worker, Power: p}); err != nil {
				t.Fatal(err)
			}
		}
		pass := func() scanner.Report {
			t.Helper()
			rep := r.srv.scanner.Pass(r.ctx)
			if len(rep.Errors) > 0 || rep.Skipped != "" {
				t.Fatalf("pass: errors %v, skipped %q", rep.Errors, rep.Skipped)
			}
			return rep
		}

		power(clv1.Node_STOPPED)
		pass()
		if got := r.cluster(c.GetName()).GetState(); got != clv1.Cluster_RUNNING {
			t.Fatalf("after a pass with reconciliation not due and nothing observed: %s; want RUNNING still", got)
		}
		r.srv.scanner.Observe(id)
		if rep := pass(); rep.Reconciled != 1 {
			t.Errorf("the pass after Observe reconciled %d clusters; want 1", rep.Reconciled)
		}
		if got := r.cluster(c.GetName()).GetState(); got != clv1.Cluster_ALERT {
			t.Fatalf("after the pass that followed Observe: %s; want ALERT", got)
		}

		power(clv1.Node_RUNNING)
		r.srv.scanner.Observe(id)
		pass()
		r.waitState(t, c.GetName(), clv1.Cluster_RUNNING)
		hist := r.historyNames(t, c.GetName())
		want := []string{"FAULTS_DETECTED", "RECOVERY_REQUESTED", "OPERATION_SUCCEEDED"}
		if got := hist[max(0, len(hist)-3):]; !slices.Equal(got, want) {
			t.Errorf("history ends %v; want %v", got, want)
		}
	})
}

// TestRecovery_AJobItsRunnerLostIsFailed: a job of this server's that its
// runner does not run (as when the runner gave up writing its end) is
// failed by the second search for lost jobs that finds it unchanged. The
// search runs with reconciliation, so a pass between two due ones leaves
// the job alone; once it is failed, the cluster it held is recovered in the
// same pass.
func TestRecovery_AJobItsRunnerLostIsFailed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		id := clusterUUID(r.create("lost", 1).GetName())
		c, err := r.seed.GetCluster(r.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		self := r.srv.self
		_, j, err := r.seed.Claim(r.ctx, repository.Transition{ClusterID: id, Expect: c.Expect(), Event: lifecycle.StopRequested},
			repository.NewJob{Kind: "stop", ServerID: self.ID, ServerIncarnation: self.Incarnation, Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		scan := scanner.New(scanner.Config{
			Store: r.srv.store, Recoverer: r.srv.clusters, Infra: r.srv.sim, Self: self, Running: r.srv.runner.Running,
			PeerTimeout: time.Hour, ReconcileInterval: time.Minute, Clock: func() time.Time { return now },
			Logger: slog.New(slog.DiscardHandler),
		})
		job := func() repository.Job {
			t.Helper()
			got, err := r.seed.GetJob(r.ctx, j.ID)
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		for _, step := range []time.Duration{0, 30 * time.Second} {
			now = now.Add(step)
			if rep := scan.Pass(r.ctx); len(rep.Errors) > 0 || job().Status != repository.JobInProgress {
				t.Fatalf("pass at +%s: %+v, job %s; want it left IN_PROGRESS (suspected, then not searched)", step, rep, job().Status)
			}
		}
		now = now.Add(31 * time.Second)
		rep := scan.Pass(r.ctx)
		if got := job(); rep.JobsFailed != 1 || got.Status != repository.JobFailed || !strings.Contains(got.Error, "lost track of it") {
			t.Fatalf("the next due pass: %+v, job %s %q; want it failed as lost", rep, got.Status, got.Error)
		}
		if c, err := r.seed.GetCluster(r.ctx, id); err != nil || c.CurrentOperation == j.ID || rep.Recovered != 1 {
			t.Errorf("after it failed: cluster %s held by %q, %v, %d recovered; want it recovered in the same pass", c.State, c.CurrentOperation, err, rep.Recovered)
		}
	})
}

// Between two due passes, orphan recovery reads only the clusters held by
// jobs that ended since its last read: a cluster whose job ended is
// recovered at the next pass, and one that names an operation with no job
// row (which no job's end announces) at the next due pass, not before.
func TestRecovery_OrphansBetweenDuePasses(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		self := r.srv.self
		claim := func(name string) (string, repository.Job) {
			t.Helper()
			id := clusterUUID(r.create(name, 1).GetName())
			c, err := r.seed.GetCluster(r.ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			_, j, err := r.seed.Claim(r.ctx, repository.Transition{ClusterID: id, Expect: c.Expect(), Event: lifecycle.StopRequested},
				repository.NewJob{Kind: "stop", ServerID: self.ID, ServerIncarnation: self.Incarnation, Deadline: time.Now().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			return id, j
		}
		now := time.Now()
		scan := scanner.New(scanner.Config{
			Store: r.srv.store, Recoverer: r.srv.clusters, Infra: r.srv.sim, Self: self, Running: r.srv.runner.Running,
			PeerTimeout: time.Hour, ReconcileInterval: time.Minute, Clock: func() time.Time { return now },
			Logger: slog.New(slog.DiscardHandler),
		})
		if rep := scan.Pass(r.ctx); len(rep.Errors) > 0 || rep.Recovered != 0 {
			t.Fatalf("the first (due) pass: %+v; want nothing recovered", rep)
		}
		ended, j := claim("ended")
		if _, err := r.seed.FinishJob(r.ctx, repository.Finish{JobID: j.ID, Status: repository.JobFailed, Error: `{"code":13}`}); err != nil {
			t.Fatal(err)
		}
		missing, mj := claim("missing")
		repotest.Exec(t, r.srv.cfg.Database, "DELETE FROM jobs WHERE id = ?", mj.ID)
		holder := func(id string) string {
			t.Helper()
			c, err := r.seed.GetCluster(r.ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			return c.CurrentOperation
		}
		now = now.Add(time.Second)
		rep := scan.Pass(r.ctx)
		if len(rep.Errors) > 0 || rep.Recovered != 1 || holder(ended) == j.ID || holder(missing) != mj.ID {
			t.Fatalf("a pass between due ones: %+v; ended held by %q (was %s), missing by %q; want the first recovered, the second left",
				rep, holder(ended), j.ID, holder(missing))
		}
		now = now.Add(time.Minute)
		// (The pass also reconciles the first, ALERT after its recovery.)
		if rep := scan.Pass(r.ctx); len(rep.Errors) > 0 || holder(missing) == mj.ID {
			t.Fatalf("the next due pass: %+v, missing held by %q; want it recovered", rep, holder(missing))
		}
	})
}
