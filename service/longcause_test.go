package service_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/runner"
	"github.com/clusterd/clusterd/service"
)

// wordyInfra is the simulator with an upgrade_node that fails with a long
// error, as a real driver's may (a hypervisor's whole answer).
type wordyInfra struct {
	*sim.Simulator
	cause string
}

func (w wordyInfra) UpgradeNode(context.Context, infra.Call, string) error {
	return errors.New(w.cause)
}

// An infrastructure error longer than a quoted client value reaches the
// operation's error and the cluster's history whole; one longer than the
// bound (2 KiB) reaches them cut on a rune boundary, saying it was cut.
func TestALongInfrastructureErrorReachesTheOperation(t *testing.T) {
	long := "upgrade_node: " + strings.Repeat("hyperviseur répond: non; ", 200) // ~5 KB, with two-byte runes
	for _, tt := range []struct {
		name  string
		cause string
		whole bool
	}{
		{"longer than a quoted value", "upgrade_node: the hypervisor refused: " + strings.Repeat("quota exceeded on host h-17; ", 3), true},
		{"longer than the bound", long, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := repotest.Backends(t)[0]
			store := repotest.Open(t, b, repository.WithServerID("s1"))
			self, err := store.RegisterServer(context.Background(), "s1")
			if err != nil {
				t.Fatal(err)
			}
			log := slog.New(slog.DiscardHandler)
			done := make(chan repository.Job, 4)
			r := runner.New(runner.Config{Store: store, Logger: log, Encode: service.EncodeJobError,
				OnDone: func(j repository.Job) { done <- j }})
			t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
			simulator, err := sim.Open(context.Background(), store, sim.Config{})
			if err != nil {
				t.Fatal(err)
			}
			clusters := service.NewClusters(service.ClustersConfig{
				Store: store, Runner: r, Infra: wordyInfra{Simulator: simulator, cause: tt.cause},
				ServerID: "s1", Incarnation: self.Incarnation, Logger: log,
			})
			wait := func(op *longrunningpb.Operation) repository.Job {
				t.Helper()
				select {
				case j := <-done:
					if "operations/"+j.ID != op.GetName() {
						t.Fatalf("job %s ended; want %s", j.ID, op.GetName())
					}
					return j
				case <-time.After(time.Minute):
					t.Fatalf("%s did not end", op.GetName())
					return repository.Job{}
				}
			}
			op, err := clusters.CreateCluster(rpcCtx(t), &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
				DisplayName: "web", KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium",
			}, RequestId: uuid.NewString()})
			if err != nil {
				t.Fatal(err)
			}
			if j := wait(op); j.Status != repository.JobSucceeded {
				t.Fatalf("create ended %s: %s", j.Status, j.Error)
			}
			cluster := clusterOf(t, op)
			op, err = clusters.UpgradeCluster(rpcCtx(t), &clv1.UpgradeClusterRequest{Name: cluster, KubernetesVersion: "1.30.5"})
			if err != nil {
				t.Fatal(err)
			}
			wait(op)

			got, err := service.NewOperations(store, nil).GetOperation(rpcCtx(t), &longrunningpb.GetOperationRequest{Name: op.GetName()})
			if err != nil {
				t.Fatal(err)
			}
			st := status.FromProto(got.GetError())
			var info *errdetails.ErrorInfo
			for _, d := range st.Details() {
				if i, ok := d.(*errdetails.ErrorInfo); ok {
					info = i
				}
			}
			if st.Code() != codes.Unavailable || info.GetReason() != service.ReasonStepFailed || info.GetMetadata()["step"] != infra.StepUpgradeNode {
				t.Errorf("operation error %s %v; want UNAVAILABLE, STEP_FAILED at upgrade_node", st.Code(), info)
			}
			want := "step upgrade_node failed: " + tt.cause
			checkCause(t, "operation error", st.Message(), want, tt.whole)

			evs, err := clusters.ListClusterEvents(rpcCtx(t), &clv1.ListClusterEventsRequest{Parent: cluster, PageSize: 1000})
			if err != nil {
				t.Fatal(err)
			}
			last := evs.GetEvents()[len(evs.GetEvents())-1]
			if last.GetOperation() != op.GetName() || !strings.HasPrefix(last.GetMessage(), "operation failed: ") {
				t.Fatalf("last event %v; want the upgrade's failure", last)
			}
			checkCause(t, "history entry", strings.TrimPrefix(last.GetMessage(), "operation failed: "), tt.cause, tt.whole)
		})
	}
}

// checkCause checks that got is want whole, or (when want is longer than
// the bound) want cut on a rune boundary to fit 2 KiB with a note saying so.
func checkCause(t *testing.T, what, got, want string, whole bool) {
	t.Helper()
	const bound = 2 * 1024
	if whole {
		if got != want {
			t.Errorf("%s = %q; want the whole cause %q", what, got, want)
		}
		return
	}
	suffix := fmt.Sprintf("…(cut: %d bytes in all)", len(want))
	switch {
	case len(got) > bound || len(got) < bound-utf8.UTFMax:
		t.Errorf("%s is %d bytes; want it cut to the bound %d", what, len(got), bound)
	case !utf8.ValidString(got):
		t.Errorf("%s is not valid UTF-8: cut inside a rune", what)
	case !strings.HasSuffix(got, suffix) || !strings.HasPrefix(want, strings.TrimSuffix(got, suffix)):
		t.Errorf("%s = %q; want a prefix of the cause ending %q", what, got, suffix)
	}
}
