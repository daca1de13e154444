package server

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// The scanner's recovery of an ALERT cluster checks the machines again
// before it brings the cluster back; when they changed since the scanner
// looked (a machine stopped, every node on another Kubernetes version), the
// recovery fails FAILED_PRECONDITION with reason MACHINES_CHANGED and a
// message naming what changed, the cluster stays ALERT, and its history says
// the same. Before, the operation's error was INTERNAL "internal error" while
// only the history said why.
func TestRecoveryOfAlertWhoseMachinesChangedSaysWhy(t *testing.T) {
	var recover stepKind
	for _, k := range stepKinds() {
		if k.name == "recover" {
			recover = k
		}
	}
	if recover.run == nil {
		t.Fatal(`no "recover" kind in stepKinds`)
	}
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		t.Cleanup(h.srv.sim.ClearFaults)
		for _, tc := range []struct {
			name string
			// change changes the machines of cluster out of band and
			// returns what the error must say no longer matches.
			change func(t *testing.T, cluster string) string
		}{
			{"stopped", func(t *testing.T, cluster string) string {
				worker := fxWithRole(fxMachines(t, h, cluster), clv1.Node_WORKER)[0].GetName()
				if _, err := h.clients.sim.SetMachinePower(tctx(t), &clv1.SetMachinePowerRequest{Name: worker, Power: clv1.Node_STOPPED}); err != nil {
					t.Fatal(err)
				}
				return "machine " + strings.TrimPrefix(worker, "machines/") + " is STOPPED"
			}},
			{"other-version", func(t *testing.T, cluster string) string {
				ms := fxMachines(t, h, cluster)
				for _, m := range ms {
					if _, err := h.seed.UpdateMachine(tctx(t), strings.TrimPrefix(m.GetName(), "machines/"), repository.MachineCondition{},
						repository.MachineChanges{KubernetesVersion: new("1.30.5")}); err != nil {
						t.Fatal(err)
					}
				}
				return fmt.Sprintf("nodes run 1.30.5 on %d nodes, not the recorded 1.30.2", len(ms))
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cluster := recover.setup(t, h, "mc-"+tc.name)
				what := tc.change(t, cluster)
				op := recover.run(t, h, "", cluster)
				done := h.wait(t, op)
				e := done.GetError()
				if e == nil {
					t.Fatalf("recovery %s succeeded; want it to fail: %s", op.GetName(), what)
				}
				want := "machines changed during recovery: " + what
				reason, meta := opErrorInfo(t, e)
				if codes.Code(e.GetCode()) != codes.FailedPrecondition || reason != service.ReasonMachinesChanged ||
					meta["cluster"] != cluster || e.GetMessage() != want {
					t.Errorf("recovery error: %s %s cluster %q: %q\nwant: FAILED_PRECONDITION %s cluster %q: %q",
						codes.Code(e.GetCode()), reason, meta["cluster"], e.GetMessage(), service.ReasonMachinesChanged, cluster, want)
				}
				got, err := h.clients.ops.GetOperation(tctx(t), &longrunningpb.GetOperationRequest{Name: op.GetName()})
				if err != nil {
					t.Fatalf("GetOperation: %v", err)
				}
				if !proto.Equal(got.GetError(), e) {
					t.Errorf("GetOperation error = %v; WaitOperation said %v", got.GetError(), e)
				}
				if c := fxGet(t, h, cluster); c.GetState() != clv1.Cluster_ALERT || c.GetCurrentOperation() != "" {
					t.Errorf("after the recovery failed, %s is %s held by %q; want ALERT, released", cluster, c.GetState(), c.GetCurrentOperation())
				}
				var msgs []string
				for _, ev := range fxHistory(t, h, cluster) {
					if ev.GetOperation() == op.GetName() {
						msgs = append(msgs, ev.GetMessage())
					}
				}
				if !slices.ContainsFunc(msgs, func(m string) bool { return strings.HasPrefix(m, "operation failed: "+want) }) {
					t.Errorf("history of %s by %s = %q; want an entry saying the operation failed: %s", cluster, op.GetName(), msgs, want)
				}
			})
		}
		noInternalJobs(t, h)
	})
}

// noInternalJobs fails the test if any job in h's database ended with
// reason INTERNAL: an operation that fails for a reason clusterd knows
// (a step, a cancellation, a change of the machines, ...) must say which,
// not "internal error" with the cause only in the history and the log. It
// guards the tests that drive operations into every failure they know: an
// error those paths return that service.Status does not map shows up here,
// whichever operation (setup ones too) met it.
func noInternalJobs(t *testing.T, h *harness) {
	t.Helper()
	var jobs []repository.Job
	after := ""
	for {
		page, err := h.seed.ListJobs(tctx(t), repository.JobQuery{After: after, Limit: 500})
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, page...)
		if len(page) < 500 {
			break
		}
		after = page[len(page)-1].ID
	}
	failed := 0
	for _, j := range jobs {
		if j.Error == "" {
			continue
		}
		failed++
		var st spb.Status
		if err := protojson.Unmarshal([]byte(j.Error), &st); err != nil {
			t.Errorf("job %s (%s of %s): stored error %q does not decode: %v", j.ID, j.Kind, j.ResourceID, j.Error, err)
			continue
		}
		if reason, _ := opErrorInfo(t, &st); reason == service.ReasonInternal || codes.Code(st.GetCode()) == codes.Internal {
			t.Errorf("job %s (%s of %s) ended %s %s %q: map its cause in service.Status (the history of %s says what it was)",
				j.ID, j.Kind, j.ResourceID, codes.Code(st.GetCode()), reason, st.GetMessage(), j.ResourceID)
		}
	}
	if failed == 0 {
		t.Errorf("none of %d jobs failed: the guard checked nothing", len(jobs))
	}
}
