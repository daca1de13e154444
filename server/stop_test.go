package server

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// A graceful stop while a client waits on an operation whose step is held
// (with --on-owner-loss=fail): the wait is answered at once with the
// operation as it stands, the job stops at its held step and records its end
// (cluster released to the failure state), and Serve returns without error,
// which it does only inside the budget, having given the server id up. How
// long the stop took is logged, not asserted: the machine may be busy. (With
// resume, the default, the job is handed off instead:
// TestGracefulStopHandsOffToAPeer.)
func TestGracefulStopAnswersWaitsAndEndsJobs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b, failOnOwnerLoss)
		name := r.create("graceful", 2).GetName()
		f := r.hold(infra.StepJoinNode, name)
		op := r.accepted(r.scaleTo(name, 3))
		r.heldBy(f)

		type answer struct {
			op  *longrunningpb.Operation
			err error
			at  time.Time
		}
		answered := make(chan answer, 1)
		go func() {
			got, err := r.clients.ops.WaitOperation(context.Background(), &longrunningpb.WaitOperationRequest{Name: op.GetName(), Timeout: durationpb.New(time.Minute)})
			answered <- answer{got, err, time.Now()}
		}()
		for r.srv.ops.Waiting() == 0 {
			select {
			case a := <-answered:
				t.Fatalf("WaitOperation returned before the stop: %v, %v", a.op, a.err)
			case <-time.After(5 * time.Millisecond): // observing, not synchronising
			}
		}

		began := time.Now()
		if err := r.stop(); err != nil {
			t.Fatalf("Serve after a graceful stop: %v; want nil (exit 0)", err)
		}
		took := time.Since(began)
		select {
		case a := <-answered:
			if a.err != nil {
				t.Errorf("WaitOperation open during the stop: %v; want the operation as it stood", a.err)
			} else if a.op.GetName() != op.GetName() {
				t.Errorf("WaitOperation answered %s; want %s", a.op.GetName(), op.GetName())
			}
			if wait := a.at.Sub(began); wait > took {
				t.Errorf("WaitOperation answered %s after the stop began, after Serve returned", wait)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("WaitOperation still open after the server stopped")
		}
		t.Logf("graceful stop with a held step and an open wait: %s", took.Round(time.Millisecond))

		ctx := tctx(t)
		job, err := r.seed.GetJob(ctx, operationUUID(op.GetName()))
		if err != nil {
			t.Fatal(err)
		}
		if job.Status != repository.JobFailed || !strings.Contains(job.Error, "server shutting down") {
			t.Errorf("the held job after the stop: %s %s; want FAILED, server shutting down", job.Status, job.Error)
		}
		c, err := r.seed.GetCluster(ctx, clusterUUID(name))
		if err != nil {
			t.Fatal(err)
		}
		if c.CurrentOperation != "" || c.State.IsOperation() {
			t.Errorf("cluster after the stop: %v; want released", c.Expect())
		}
		if srv, err := r.seed.GetServer(ctx, "test-server"); err != nil || !srv.HeartbeatTime.Equal(repository.Stopped) {
			t.Errorf("server row after the stop: %+v, %v; want it marked stopped", srv, err)
		}
	})
}

// A server whose lease is gone (here another process took its server id)
// reports NOT_SERVING and claims nothing.
func TestLostLeaseIsNotServing(t *testing.T) {
	b := repotest.Backends(t)[0]
	h := start(t, b, func(c *Config) { c.HeartbeatInterval, c.PeerTimeout = 50*time.Millisecond, 2*time.Second })
	ctx := tctx(t)
	row, err := h.seed.GetServer(ctx, "test-server")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err = h.seed.TakeOverServer(ctx, "test-server", &row, repository.Registrant{Incarnation: repository.NewIncarnation(), Host: "elsewhere", PID: 1}); !errors.Is(err, repository.ErrConflict) {
			break
		}
		row, _ = h.seed.GetServer(ctx, "test-server") // it heartbeat in between
	}
	if err != nil {
		t.Fatal(err)
	}
	health := healthpb.NewHealthClient(h.conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health of a superseded server: %v, %v; want NOT_SERVING", resp.GetStatus(), err)
		}
		time.Sleep(20 * time.Millisecond) // observing, not synchronising
	}
	_, err = h.clients.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
		DisplayName: "late", KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium"}})
	if code, reason, _ := errorInfo(t, err); code != codes.Unavailable || reason != "SERVER_UNAVAILABLE" {
		t.Errorf("create on a superseded server: %v %s; want UNAVAILABLE SERVER_UNAVAILABLE", code, reason)
	}
}
