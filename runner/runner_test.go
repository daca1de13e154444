package runner_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/runner"
	"github.com/clusterd/clusterd/service"
)

// Every test runs against the real store on every backend: the runner's
// behaviour is what it writes, and a mock would only echo our assumptions
// about FinishJob and RecordProgress back at us.

// wait bounds every wait on a channel or the database, so a broken runner
// fails a test instead of hanging it.
const wait = 30 * time.Second

type env struct {
	s     *repository.Store
	r     *runner.Runner
	done  chan repository.Job // OnDone calls
	dones atomic.Int64
}

func forEachBackend(t *testing.T, fn func(t *testing.T, e *env)) {
	t.Helper()
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			fn(t, newEnv(t, repotest.Open(t, b)))
		})
	}
}

func newEnv(t *testing.T, s *repository.Store, mutate ...func(*runner.Config)) *env {
	e := &env{s: s, done: make(chan repository.Job, 64)}
	cfg := runner.Config{
		Store:  s,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
		// The server's encoding: the jobs' errors are what clients see.
		Encode: service.EncodeJobError,
		OnDone: func(j repository.Job) {
			e.dones.Add(1)
			e.done <- j
		},
	}
	for _, m := range mutate {
		m(&cfg)
	}
	e.r = runner.New(cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := e.r.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown at cleanup: %v", err)
		}
	})
	return e
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var spec = repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 2, ServiceOffering: "medium"}

// starting creates a cluster held by its create job and takes it to STARTING,
// as the create job's first step does (SPEC §3.6). It returns the cluster as
// the job holds it, and the job.
func starting(t *testing.T, e *env, name string, deadline time.Time) (repository.Cluster, repository.Job) {
	t.Helper()
	ctx := ctxT(t)
	c, j, err := e.s.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: name, Spec: spec},
		repository.NewJob{Kind: "create", ServerID: "s1", Deadline: deadline})
	if err != nil {
		t.Fatalf("CreateCluster(%s): %v", name, err)
	}
	c, err = e.s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.StartRequested, Operation: j.ID})
	if err != nil {
		t.Fatalf("CREATED -> STARTING: %v", err)
	}
	return c, j
}

func inAnHour() time.Time { return time.Now().Add(time.Hour) }

// succeed is the release of a start that worked: STARTING -> RUNNING.
func succeed(held repository.Cluster) *repository.Transition {
	return &repository.Transition{ClusterID: held.ID, Expect: held.Expect(), Event: lifecycle.OperationSucceeded}
}

// failRelease is the Release of a start: STARTING -> ALERT. It reports every
// cause it is given on causes.
func failRelease(held repository.Cluster, causes chan<- error) func(context.Context, error) (*repository.Transition, error) {
	return func(ctx context.Context, cause error) (*repository.Transition, error) {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("release called on a done context: %w", err)
		}
		causes <- cause
		return &repository.Transition{ClusterID: held.ID, Expect: held.Expect(), Event: lifecycle.OperationFailed, Message: cause.Error()}, nil
	}
}

// hold blocks a job's work until the test opens ch, or until the job's
// context is done, so that a failing test's cleanup (Shutdown) never hangs.
func hold(ctx context.Context, ch <-chan struct{}) {
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// recv receives from ch or fails the test after the bound.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// ended waits for OnDone of job id and returns the job as stored.
func ended(t *testing.T, e *env, id string) repository.Job {
	t.Helper()
	got := recv(t, e.done, "OnDone of job "+id)
	if got.ID != id {
		t.Fatalf("OnDone(%s); want job %s", got.ID, id)
	}
	stored, err := e.s.GetJob(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Status.Done() || got.Status != stored.Status || got.Error != stored.Error || got.Result != stored.Result {
		t.Errorf("OnDone got %s %q, but the row says %s %q: OnDone must see the final row", got.Status, got.Error, stored.Status, stored.Error)
	}
	return stored
}

// stop shuts the runner down, which waits for every job goroutine.
func stop(t *testing.T, e *env) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := e.r.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

func decode(t *testing.T, s string) *spb.Status {
	t.Helper()
	var st spb.Status
	if err := protojson.Unmarshal([]byte(s), &st); err != nil {
		t.Fatalf("job error %q is not a protojson google.rpc.Status: %v", s, err)
	}
	return &st
}

func wantCluster(t *testing.T, e *env, id string, state lifecycle.State, op string) repository.Cluster {
	t.Helper()
	c, err := e.s.GetCluster(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if c.State != state || c.CurrentOperation != op {
		t.Errorf("cluster = %s held by %q; want %s held by %q", c.State, c.CurrentOperation, state, op)
	}
	return c
}

func TestSuccess(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		held, job := starting(t, e, "web", inAnHour())
		midway := make(chan repository.Job, 1)
		err := e.r.Start(runner.Task{
			Job: job,
			Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
				p.SetTotal(2)
				if err := p.Step(ctx, "provision_machine"); err != nil {
					return runner.Outcome{}, err
				}
				if err := p.Step(ctx, "power_on"); err != nil {
					return runner.Outcome{}, err
				}
				j, err := e.s.GetJob(ctx, job.ID)
				if err != nil {
					return runner.Outcome{}, err
				}
				midway <- j
				return runner.Outcome{Result: `{"name":"clusters/web"}`, Release: succeed(held)}, nil
			},
			Release: func(context.Context, error) (*repository.Transition, error) {
				return nil, errors.New("Release called for a job that succeeded")
			},
		})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		m := recv(t, midway, "the job's second step")
		if m.Step != "power_on" || m.StepsDone != 1 || m.StepsTotal != 2 || m.Status != repository.JobInProgress {
			t.Errorf("during step 2 the row says %s step %q %d/%d; want IN_PROGRESS step power_on 1/2", m.Status, m.Step, m.StepsDone, m.StepsTotal)
		}
		got := ended(t, e, job.ID)
		if got.Status != repository.JobSucceeded || got.Result != `{"name":"clusters/web"}` || got.Error != "" || got.EndTime == nil {
			t.Errorf("job = %s result %q error %q end %v; want SUCCEEDED with the result, no error, an end time", got.Status, got.Result, got.Error, got.EndTime)
		}
		if got.Step != "power_on" || got.StepsDone != 2 || got.StepsTotal != 2 {
			t.Errorf("final progress = step %q %d/%d; want power_on 2/2", got.Step, got.StepsDone, got.StepsTotal)
		}
		wantCluster(t, e, held.ID, lifecycle.Running, "")
		stop(t, e)
		if n := e.dones.Load(); n != 1 {
			t.Errorf("OnDone called %d times; want 1", n)
		}
	})
}

func TestJobOutlivesItsCaller(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		held, job := starting(t, e, "web", inAnHour())
		gate := make(chan struct{})
		alive := make(chan error, 1)
		task := runner.Task{
			Job: job,
			Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
				select {
				case <-gate:
				case <-ctx.Done():
					return runner.Outcome{}, ctx.Err()
				}
				alive <- ctx.Err()
				if err := p.Step(ctx, "power_on"); err != nil {
					return runner.Outcome{}, err
				}
				return runner.Outcome{Release: succeed(held)}, nil
			},
		}
		// A goroutine stands in for the RPC handler: it starts the job and
		// returns, and gRPC then cancels its context.
		rpcCtx, rpcDone := context.WithCancel(context.Background())
		started := make(chan error, 1)
		go func() {
			defer rpcDone()
			started <- e.r.Start(task)
		}()
		select {
		case err := <-started:
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
		case <-time.After(wait):
			t.Fatal("Start did not return while the job waits: the job runs on its caller")
		}
		<-rpcCtx.Done()
		close(gate)
		if err := recv(t, alive, "the job to run after its caller returned"); err != nil {
			t.Errorf("job context after the caller returned: %v; want alive", err)
		}
		if got := ended(t, e, job.ID); got.Status != repository.JobSucceeded {
			t.Errorf("job = %s %s; want SUCCEEDED", got.Status, got.Error)
		}
		wantCluster(t, e, held.ID, lifecycle.Running, "")
	})
}

// A cancel recorded on the job's row alone (a runner that does not watch
// for cancellations, and no Cancel) is seen at the job's next step.
func TestCooperativeCancel(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		held, job := starting(t, e, "web", inAnHour())
		inStep, proceed := make(chan struct{}), make(chan struct{})
		ctxDuringStep, stepErr := make(chan error, 1), make(chan error, 1)
		causes := make(chan error, 1)
		err := e.r.Start(runner.Task{
			Job: job,
			Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
				if err := p.Step(ctx, "provision_machine"); err != nil {
					return runner.Outcome{}, err
				}
				close(inStep)
				hold(ctx, proceed) // the step's work, during which the cancel arrives
				ctxDuringStep <- ctx.Err()
				err := p.Step(ctx, "power_on")
				stepErr <- err
				if err != nil {
					return runner.Outcome{}, err
				}
				return runner.Outcome{Release: succeed(held)}, nil
			},
			Release: failRelease(held, causes),
		})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		recv(t, inStep, "the first step")
		if _, err := e.s.RequestCancel(ctxT(t), job.ID); err != nil {
			t.Fatal(err)
		}
		close(proceed)
		if err := recv(t, ctxDuringStep, "the step's end"); err != nil {
			t.Errorf("the running step was interrupted by the cancel: ctx %v; want it to finish", err)
		}
		if err := recv(t, stepErr, "the next Step"); !errors.Is(err, runner.ErrCancelled) {
			t.Errorf("next Step = %v; want ErrCancelled", err)
		}
		got := ended(t, e, job.ID)
		if got.Status != repository.JobCancelled {
			t.Errorf("job status = %s; want CANCELLED", got.Status)
		}
		if st := decode(t, got.Error); codes.Code(st.Code) != codes.Canceled || st.Message != "operation cancelled" {
			t.Errorf("job error = %v %q; want CANCELLED \"operation cancelled\"", codes.Code(st.Code), st.Message)
		}
		if cause := recv(t, causes, "Release"); !errors.Is(cause, runner.ErrCancelled) {
			t.Errorf("Release cause = %v; want ErrCancelled", cause)
		}
		wantCluster(t, e, held.ID, lifecycle.Alert, "")
	})
}

// blockedStep is a job whose one step blocks until its context ends (a
// held or slow infrastructure step), reporting the step's error on stepErr.
func blockedStep(held repository.Cluster, job repository.Job, inStep chan<- struct{}, stepErr chan<- error, causes chan<- error) runner.Task {
	return runner.Task{
		Job: job,
		Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
			if err := p.Step(ctx, "join_node"); err != nil {
				return runner.Outcome{}, err
			}
			close(inStep)
			<-ctx.Done()
			stepErr <- ctx.Err()
			return runner.Outcome{}, fmt.Errorf("join_node: %w", ctx.Err())
		},
		Release: failRelease(held, causes),
	}
}

// wantCancelled checks that job ended CANCELLED, with the cancellation as
// its Release's cause and the cluster released to its failure state.
func wantCancelled(t *testing.T, e *env, held repository.Cluster, job repository.Job, causes <-chan error) {
	t.Helper()
	got := ended(t, e, job.ID)
	if st := decode(t, got.Error); got.Status != repository.JobCancelled || codes.Code(st.Code) != codes.Canceled {
		t.Errorf("job = %s %v; want CANCELLED with code CANCELLED", got.Status, st)
	}
	if cause := recv(t, causes, "Release"); !errors.Is(cause, runner.ErrCancelled) {
		t.Errorf("Release cause = %v; want ErrCancelled", cause)
	}
	wantCluster(t, e, held.ID, lifecycle.Alert, "")
}

// Cancel, as CancelOperation calls it on the job's server, ends the step in
// flight through its context: a step that would never end on its own.
func TestCancelInterruptsTheStepInFlight(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		held, job := starting(t, e, "web", inAnHour())
		inStep, stepErr, causes := make(chan struct{}), make(chan error, 1), make(chan error, 1)
		if err := e.r.Start(blockedStep(held, job, inStep, stepErr, causes)); err != nil {
			t.Fatal(err)
		}
		recv(t, inStep, "the step")
		if _, err := e.s.RequestCancel(ctxT(t), job.ID); err != nil {
			t.Fatal(err)
		}
		if !e.r.Cancel(job.ID) {
			t.Fatal("Cancel of a running job = false; want true")
		}
		if err := recv(t, stepErr, "the interrupted step"); !errors.Is(err, context.Canceled) {
			t.Errorf("step's ctx = %v; want cancelled", err)
		}
		wantCancelled(t, e, held, job, causes)
		if e.r.Cancel(job.ID) || e.r.Cancel("no-such-job") {
			t.Error("Cancel of a job not running here = true; want false")
		}
	})
}

// A cancel served by another server is only a flag on the job's row: a
// runner that watches for cancellations (Config.WatchCancels) finds it and
// ends the step in flight, without waiting for the job's next step.
func TestWatchCancelsInterruptsTheStepOfACancelFromElsewhere(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			e := newEnv(t, repotest.Open(t, b), func(c *runner.Config) { c.WatchCancels = 20 * time.Millisecond })
			held, job := starting(t, e, "web", inAnHour())
			inStep, stepErr, causes := make(chan struct{}), make(chan error, 1), make(chan error, 1)
			if err := e.r.Start(blockedStep(held, job, inStep, stepErr, causes)); err != nil {
				t.Fatal(err)
			}
			recv(t, inStep, "the step")
			if _, err := e.s.RequestCancel(ctxT(t), job.ID); err != nil {
				t.Fatal(err)
			}
			if err := recv(t, stepErr, "the interrupted step"); !errors.Is(err, context.Canceled) {
				t.Errorf("step's ctx = %v; want cancelled", err)
			}
			wantCancelled(t, e, held, job, causes)
		})
	}
}

func TestDeadline(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		held, job := starting(t, e, "web", time.Now().Add(200*time.Millisecond))
		causes := make(chan error, 1)
		err := e.r.Start(runner.Task{
			Job: job,
			Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
				if err := p.Step(ctx, "provision_machine"); err != nil {
					return runner.Outcome{}, err
				}
				<-ctx.Done() // a step that never ends on its own
				return runner.Outcome{}, fmt.Errorf("provision machine: %w", ctx.Err())
			},
			Release: failRelease(held, causes),
		})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		got := ended(t, e, job.ID)
		if got.Status != repository.JobFailed {
			t.Errorf("job status = %s; want FAILED", got.Status)
		}
		if st := decode(t, got.Error); codes.Code(st.Code) != codes.DeadlineExceeded || st.Message != "operation deadline exceeded" {
			t.Errorf("job error = %v %q; want DEADLINE_EXCEEDED \"operation deadline exceeded\"", codes.Code(st.Code), st.Message)
		}
		if got.EndTime == nil || got.EndTime.Before(job.Deadline) {
			t.Errorf("job ended at %v, before its deadline %v", got.EndTime, job.Deadline)
		}
		if cause := recv(t, causes, "Release"); !errors.Is(cause, runner.ErrDeadline) {
			t.Errorf("Release cause = %v; want ErrDeadline", cause)
		}
		wantCluster(t, e, held.ID, lifecycle.Alert, "")
	})
}

func TestFailureCodes(t *testing.T) {
	withInfo, err := status.New(codes.Aborted, "cluster taken").WithDetails(&errdetails.ErrorInfo{Reason: "OPERATION_IN_PROGRESS", Domain: "clusterd"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		err      error
		wantCode codes.Code
		wantMsg  string
		wantInfo string // reason of a google.rpc.ErrorInfo detail, if any
	}{
		// Every error gets an ErrorInfo; a status without one, its code's.
		{"grpc status", status.Error(codes.FailedPrecondition, "x"), codes.FailedPrecondition, "x", "FAILED_PRECONDITION"},
		{"wrapped grpc status", fmt.Errorf("power on: %w", status.Error(codes.ResourceExhausted, "no capacity")), codes.ResourceExhausted,
			"power on: rpc error: code = ResourceExhausted desc = no capacity", "RESOURCE_EXHAUSTED"},
		{"grpc status with details", withInfo.Err(), codes.Aborted, "cluster taken", "OPERATION_IN_PROGRESS"},
		// What nothing explains is internal; its text is in the log only.
		{"plain error", errors.New("boom"), codes.Internal, "internal error", "INTERNAL"},
		{"context canceled, not by the runner", fmt.Errorf("infra call: %w", context.Canceled), codes.Internal, "internal error", "INTERNAL"},
	}
	forEachBackend(t, func(t *testing.T, e *env) {
		for i, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				e := newEnv(t, e.s) // a runner of its own, on the backend's store
				held, job := starting(t, e, fmt.Sprintf("c%d", i), inAnHour())
				causes := make(chan error, 1)
				err := e.r.Start(runner.Task{
					Job: job,
					Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
						if err := p.Step(ctx, "provision_machine"); err != nil {
							return runner.Outcome{}, err
						}
						return runner.Outcome{}, tc.err
					},
					Release: failRelease(held, causes),
				})
				if err != nil {
					t.Fatalf("Start: %v", err)
				}
				got := ended(t, e, job.ID)
				if got.Status != repository.JobFailed {
					t.Errorf("job status = %s; want FAILED", got.Status)
				}
				st := decode(t, got.Error)
				if codes.Code(st.Code) != tc.wantCode || st.Message != tc.wantMsg {
					t.Errorf("job error = %v %q; want %v %q", codes.Code(st.Code), st.Message, tc.wantCode, tc.wantMsg)
				}
				var reasons []string
				for _, d := range status.FromProto(st).Details() {
					if info, ok := d.(*errdetails.ErrorInfo); ok {
						reasons = append(reasons, info.Reason)
					}
				}
				if want := slices.DeleteFunc([]string{tc.wantInfo}, func(s string) bool { return s == "" }); !slices.Equal(reasons, want) {
					t.Errorf("ErrorInfo reasons = %q; want %q", reasons, want)
				}
				if cause := recv(t, causes, "Release"); !errors.Is(cause, tc.err) {
					t.Errorf("Release cause = %v; want the job's error %v", cause, tc.err)
				}
				wantCluster(t, e, held.ID, lifecycle.Alert, "")
			})
		}
	})
}

func TestPanicFailsOnlyItsJob(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		badHeld, bad := starting(t, e, "bad", inAnHour())
		goodHeld, good := starting(t, e, "good", inAnHour())
		gate := make(chan struct{})
		err := e.r.Start(runner.Task{
			Job: good,
			Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
				if err := p.Step(ctx, "provision_machine"); err != nil {
					return runner.Outcome{}, err
				}
				hold(ctx, gate)
				if err := p.Step(ctx, "power_on"); err != nil {
					return runner.Outcome{}, err
				}
				return runner.Outcome{Release: succeed(goodHeld)}, nil
			},
		})
		if err != nil {
			t.Fatalf("Start good: %v", err)
		}
		causes := make(chan error, 1)
		err = e.r.Start(runner.Task{
			Job: bad,
			Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
				if err := p.Step(ctx, "provision_machine"); err != nil {
					return runner.Outcome{}, err
				}
				var m map[string]int
				m["kaboom"]++ // assignment to entry in nil map
				return runner.Outcome{}, nil
			},
			Release: failRelease(badHeld, causes),
		})
		if err != nil {
			t.Fatalf("Start bad: %v", err)
		}
		got := ended(t, e, bad.ID)
		st := decode(t, got.Error)
		// The panic's text is in the log, not in what clients see.
		if got.Status != repository.JobFailed || codes.Code(st.Code) != codes.Internal || st.Message != "internal error" || strings.Contains(got.Error, "nil map") {
			t.Errorf("panicked job = %s %v %q; want FAILED INTERNAL \"internal error\"", got.Status, codes.Code(st.Code), st.Message)
		}
		recv(t, causes, "Release of the panicked job")
		wantCluster(t, e, badHeld.ID, lifecycle.Alert, "")

		if ids := e.r.Running(); !slices.Equal(ids, []string{good.ID}) {
			t.Errorf("Running() = %v; want only the other job %s", ids, good.ID)
		}
		close(gate)
		if got := ended(t, e, good.ID); got.Status != repository.JobSucceeded {
			t.Errorf("other job = %s %s; want SUCCEEDED", got.Status, got.Error)
		}
		wantCluster(t, e, goodHeld.ID, lifecycle.Running, "")
	})
}

func TestJobEndedElsewhere(t *testing.T) {
	// Recovery (here, its FinishJob without a release) ends the job while its
	// work is between steps. However the work then goes on, the runner writes
	// nothing: not the job, not the cluster.
	tests := []struct {
		name string
		// after runs once the job was ended elsewhere; its result is Run's.
		after func(ctx context.Context, p *runner.Progress, held repository.Cluster) (runner.Outcome, error)
		// wantStepErr: the Step it makes must report ErrJobEnded.
		wantStepErr bool
	}{
		{"seen at the next step", func(ctx context.Context, p *runner.Progress, _ repository.Cluster) (runner.Outcome, error) {
			return runner.Outcome{}, p.Step(ctx, "power_on")
		}, true},
		{"success after the last step", func(_ context.Context, _ *runner.Progress, held repository.Cluster) (runner.Outcome, error) {
			return runner.Outcome{Result: `{}`, Release: succeed(held)}, nil
		}, false},
		{"failure after the last step", func(context.Context, *runner.Progress, repository.Cluster) (runner.Outcome, error) {
			return runner.Outcome{}, errors.New("power on failed")
		}, false},
	}
	forEachBackend(t, func(t *testing.T, e *env) {
		for i, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				e := newEnv(t, e.s) // a runner of its own, on the backend's store
				ctx := ctxT(t)
				held, job := starting(t, e, fmt.Sprintf("c%d", i), inAnHour())
				inStep, proceed := make(chan struct{}), make(chan struct{})
				runErr := make(chan error, 1)
				var releases atomic.Int64
				err := e.r.Start(runner.Task{
					Job: job,
					Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
						if err := p.Step(ctx, "provision_machine"); err != nil {
							return runner.Outcome{}, err
						}
						close(inStep)
						hold(ctx, proceed)
						out, err := tc.after(ctx, p, held)
						runErr <- err
						return out, err
					},
					Release: func(ctx context.Context, cause error) (*repository.Transition, error) {
						releases.Add(1)
						return failRelease(held, make(chan error, 1))(ctx, cause)
					},
				})
				if err != nil {
					t.Fatalf("Start: %v", err)
				}
				recv(t, inStep, "the first step")
				recovered, err := e.s.FinishJob(ctx, repository.Finish{JobID: job.ID, Status: repository.JobFailed, Error: "server restarted"})
				if err != nil {
					t.Fatalf("recovery's FinishJob: %v", err)
				}
				close(proceed)
				err = recv(t, runErr, "the work after the job ended")
				if tc.wantStepErr {
					var conflict *repository.JobConflictError
					if !errors.Is(err, runner.ErrJobEnded) || !errors.As(err, &conflict) || conflict.Status != repository.JobFailed {
						t.Errorf("Step after the job ended = %v; want ErrJobEnded wrapping the store's JobConflictError(FAILED)", err)
					}
				}
				stop(t, e) // waits for the job's goroutine, so whatever it wrote is written

				got, err := e.s.GetJob(ctx, job.ID)
				if err != nil {
					t.Fatal(err)
				}
				if got.Status != recovered.Status || got.Error != recovered.Error || got.Result != recovered.Result ||
					got.Step != recovered.Step || got.StepsDone != recovered.StepsDone || !got.UpdateTime.Equal(recovered.UpdateTime) {
					t.Errorf("job after the runner = %s %q %q step %q %d at %v; want recovery's %s %q %q step %q %d at %v, untouched",
						got.Status, got.Error, got.Result, got.Step, got.StepsDone, got.UpdateTime,
						recovered.Status, recovered.Error, recovered.Result, recovered.Step, recovered.StepsDone, recovered.UpdateTime)
				}
				if c := wantCluster(t, e, held.ID, lifecycle.Starting, job.ID); c.Version != held.Version {
					t.Errorf("cluster version = %d; want %d (the runner must not move it)", c.Version, held.Version)
				}
				if tc.wantStepErr && releases.Load() != 0 {
					t.Errorf("Release called %d times for a job ended elsewhere; want 0", releases.Load())
				}
				if n := e.dones.Load(); n != 0 {
					t.Errorf("OnDone called %d times for a job this runner did not end; want 0", n)
				}
			})
		}
	})
}

func TestClusterTakenSince(t *testing.T) {
	// The job still holds its row but lost the cluster (SPEC §3.5): its end is
	// written, the cluster is left to its new holder.
	forEachBackend(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		held, job := starting(t, e, "web", inAnHour())
		inStep, proceed := make(chan struct{}), make(chan struct{})
		err := e.r.Start(runner.Task{
			Job: job,
			Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
				if err := p.Step(ctx, "provision_machine"); err != nil {
					return runner.Outcome{}, err
				}
				close(inStep)
				hold(ctx, proceed)
				return runner.Outcome{Result: `{}`, Release: succeed(held)}, nil
			},
		})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		recv(t, inStep, "the first step")
		alert, err := e.s.Transition(ctx, repository.Transition{ClusterID: held.ID, Expect: held.Expect(), Event: lifecycle.OperationFailed})
		if err != nil {
			t.Fatal(err)
		}
		taken, _, err := e.s.Claim(ctx, repository.Transition{ClusterID: held.ID, Expect: alert.Expect(), Event: lifecycle.StopRequested},
			repository.NewJob{Kind: "stop", ServerID: "s2", Deadline: inAnHour()})
		if err != nil {
			t.Fatal(err)
		}
		close(proceed)
		if got := ended(t, e, job.ID); got.Status != repository.JobSucceeded {
			t.Errorf("job = %s; want SUCCEEDED (its row is still its own)", got.Status)
		}
		if c := wantCluster(t, e, held.ID, lifecycle.Stopping, taken.CurrentOperation); c.Version != taken.Version {
			t.Errorf("cluster version = %d; want %d (left to the stop)", c.Version, taken.Version)
		}
	})
}

func TestShutdown(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		held, job := starting(t, e, "web", inAnHour())
		inStep := make(chan struct{})
		causes := make(chan error, 1)
		err := e.r.Start(runner.Task{
			Job: job,
			Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
				if err := p.Step(ctx, "provision_machine"); err != nil {
					return runner.Outcome{}, err
				}
				close(inStep)
				<-ctx.Done()
				return runner.Outcome{}, fmt.Errorf("provision machine: %w", ctx.Err())
			},
			Release: failRelease(held, causes),
		})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		recv(t, inStep, "the first step")
		if ids := e.r.Running(); !slices.Equal(ids, []string{job.ID}) {
			t.Errorf("Running() = %v; want [%s]", ids, job.ID)
		}
		stop(t, e)

		// No waiting from here on: Shutdown returned, so the job has ended.
		got, err := e.s.GetJob(ctxT(t), job.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != repository.JobFailed {
			t.Errorf("job status after Shutdown = %s; want FAILED", got.Status)
		} else if st := decode(t, got.Error); codes.Code(st.Code) != codes.Unavailable || !strings.HasPrefix(st.Message, "server shutting down") {
			t.Errorf("job error = %v %q; want UNAVAILABLE \"server shutting down...\"", codes.Code(st.Code), st.Message)
		}
		select {
		case cause := <-causes:
			if !errors.Is(cause, runner.ErrShutdown) {
				t.Errorf("Release cause = %v; want ErrShutdown", cause)
			}
		default:
			t.Error("Release was not called before Shutdown returned")
		}
		wantCluster(t, e, held.ID, lifecycle.Alert, "")
		if n := e.dones.Load(); n != 1 {
			t.Errorf("OnDone called %d times; want 1", n)
		}
		if ids := e.r.Running(); len(ids) != 0 {
			t.Errorf("Running() after Shutdown = %v; want none", ids)
		}

		_, next := starting(t, e, "late", inAnHour())
		err = e.r.Start(runner.Task{Job: next, Run: func(context.Context, *runner.Progress) (runner.Outcome, error) {
			t.Error("a task started after Shutdown ran")
			return runner.Outcome{}, nil
		}})
		if !errors.Is(err, runner.ErrStopped) {
			t.Errorf("Start after Shutdown = %v; want ErrStopped", err)
		}
	})
}

func TestShutdownTimesOut(t *testing.T) {
	// A job that ignores its context keeps Shutdown waiting; Shutdown gives
	// up when its own context is done and says so.
	forEachBackend(t, func(t *testing.T, e *env) {
		held, job := starting(t, e, "web", inAnHour())
		inStep, gate := make(chan struct{}), make(chan struct{})
		openGate := sync.OnceFunc(func() { close(gate) })
		defer openGate() // a failing test must not leave the job, and cleanup's Shutdown, hanging
		err := e.r.Start(runner.Task{
			Job: job,
			Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
				close(inStep)
				<-gate // ignores ctx
				return runner.Outcome{Release: succeed(held)}, nil
			},
		})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		recv(t, inStep, "the job")
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		shutdown := make(chan error, 1)
		go func() { shutdown <- e.r.Shutdown(ctx) }()
		if err := recv(t, shutdown, "Shutdown to give up"); !errors.Is(err, context.Canceled) {
			t.Errorf("Shutdown with a job still running and a done context = %v; want context.Canceled", err)
		}
		openGate()
		stop(t, e)
		got, err := e.s.GetJob(ctxT(t), job.ID)
		if err != nil || got.Status != repository.JobSucceeded {
			t.Errorf("job = %s, %v; want SUCCEEDED (Run succeeded despite the shutdown)", got.Status, err)
		}
	})
}

func TestReleaseNilLeavesTheCluster(t *testing.T) {
	// However a job ends without a release, its row ends and the cluster stays
	// as the job held it (orphan recovery will fail that operation).
	fail := func(context.Context, *runner.Progress) (runner.Outcome, error) {
		return runner.Outcome{}, errors.New("power on failed")
	}
	tests := []struct {
		name       string
		run        func(context.Context, *runner.Progress) (runner.Outcome, error)
		release    func(context.Context, error) (*repository.Transition, error)
		wantStatus repository.JobStatus
	}{
		{"Release returns nil", fail, func(context.Context, error) (*repository.Transition, error) { return nil, nil }, repository.JobFailed},
		{"no Release", fail, nil, repository.JobFailed},
		{"Release fails", fail, func(context.Context, error) (*repository.Transition, error) {
			return nil, errors.New("cannot read the cluster")
		}, repository.JobFailed},
		{"Release panics", fail, func(context.Context, error) (*repository.Transition, error) { panic("release bug") }, repository.JobFailed},
		{"success without a release", func(context.Context, *runner.Progress) (runner.Outcome, error) {
			return runner.Outcome{Result: `{}`}, nil
		}, nil, repository.JobSucceeded},
	}
	forEachBackend(t, func(t *testing.T, e *env) {
		for i, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				e := newEnv(t, e.s) // a runner of its own, on the backend's store
				held, job := starting(t, e, fmt.Sprintf("c%d", i), inAnHour())
				if err := e.r.Start(runner.Task{Job: job, Run: tc.run, Release: tc.release}); err != nil {
					t.Fatalf("Start: %v", err)
				}
				if got := ended(t, e, job.ID); got.Status != tc.wantStatus {
					t.Errorf("job = %s %s; want %s", got.Status, got.Error, tc.wantStatus)
				}
				if c := wantCluster(t, e, held.ID, lifecycle.Starting, job.ID); c.Version != held.Version {
					t.Errorf("cluster version = %d; want %d (left alone)", c.Version, held.Version)
				}
			})
		}
	})
}

func TestStartRefusesBadTasks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		held, job := starting(t, e, "web", inAnHour())
		gate := make(chan struct{})
		run := func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
			hold(ctx, gate)
			return runner.Outcome{Release: succeed(held)}, nil
		}
		if err := e.r.Start(runner.Task{Job: job, Run: run}); err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := e.r.Start(runner.Task{Job: job, Run: run}); err == nil {
			t.Error("Start of a job already running here: no error")
		}
		noDeadline := job
		noDeadline.ID, noDeadline.Deadline = "other", time.Time{}
		if err := e.r.Start(runner.Task{Job: noDeadline, Run: run}); err == nil {
			t.Error("Start of a job without a deadline: no error")
		}
		if err := e.r.Start(runner.Task{Job: repository.Job{ID: "x", Deadline: inAnHour()}}); err == nil {
			t.Error("Start of a task without Run: no error")
		}
		close(gate)
		if got := ended(t, e, job.ID); got.Status != repository.JobSucceeded {
			t.Errorf("job = %s; want SUCCEEDED, once", got.Status)
		}
		stop(t, e)
		if n := e.dones.Load(); n != 1 {
			t.Errorf("OnDone called %d times; want 1 (the refused starts ran nothing)", n)
		}
	})
}

func TestReserveListsAJobBeforeItsClaimCommits(t *testing.T) {
	r := runner.New(runner.Config{})
	release, err := r.Reserve("job-1")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Running(); len(got) != 1 || got[0] != "job-1" {
		t.Fatalf("Running() after Reserve = %v; want [job-1]", got)
	}
	again, err := r.Reserve("job-1")
	if !errors.Is(err, runner.ErrListed) {
		t.Errorf("second Reserve of a reserved job: %v; want ErrListed", err)
	}
	again() // the refused reservation lets go of nothing
	if got := r.Running(); len(got) != 1 || got[0] != "job-1" {
		t.Fatalf("Running() after the refused reservation's release = %v; want [job-1]", got)
	}
	release() // the claim failed
	if got := r.Running(); len(got) != 0 {
		t.Errorf("Running() after release = %v; want none", got)
	}
	if err := r.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A job that runs here, until its end is written, is refused a reservation
// (the adoption of a job its own server runs, SPEC §5 step 4): the
// adoption would fence the running attempt and start none. Once the job
// has ended it may be reserved again.
func TestReserveRefusesAJobThatRunsHere(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		held, job := starting(t, e, "web", inAnHour())
		gate := make(chan struct{})
		run := func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
			hold(ctx, gate)
			return runner.Outcome{Release: succeed(held)}, nil
		}
		if err := e.r.Start(runner.Task{Job: job, Run: run}); err != nil {
			t.Fatalf("Start: %v", err)
		}
		release, err := e.r.Reserve(job.ID)
		if !errors.Is(err, runner.ErrListed) {
			t.Errorf("Reserve of a job running here: %v; want ErrListed", err)
		}
		release()
		if got := e.r.Running(); !slices.Contains(got, job.ID) {
			t.Errorf("Running() after the refused reservation's release = %v; want the running job listed", got)
		}
		close(gate)
		if got := ended(t, e, job.ID); got.Status != repository.JobSucceeded {
			t.Errorf("job = %s; want SUCCEEDED", got.Status)
		}
		// OnDone (ended) follows the job's removal from the list.
		release, err = e.r.Reserve(job.ID)
		if err != nil {
			t.Errorf("Reserve of a job that ended here: %v", err)
		}
		release()
		stop(t, e)
	})
}

// A job runs on a worker that, once the job has ended, waits for the next
// one; Shutdown does not wait for those workers' wait to run out. Here they
// would wait an hour.
func TestShutdownStopsTheWorkersWaitingForJobs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		runner.SetWorkerIdle(e.r, time.Hour)
		for _, name := range []string{"first", "second"} {
			held, job := starting(t, e, name, inAnHour())
			err := e.r.Start(runner.Task{
				Job: job,
				Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
					if err := p.Step(ctx, "power_on"); err != nil {
						return runner.Outcome{}, err
					}
					return runner.Outcome{Release: succeed(held)}, nil
				},
			})
			if err != nil {
				t.Fatalf("Start(%s): %v", name, err)
			}
			// The second job starts once the first has ended: on the
			// first one's worker, which waits for it.
			if got := ended(t, e, job.ID); got.Status != repository.JobSucceeded {
				t.Errorf("job %s = %s; want SUCCEEDED", name, got.Status)
			}
			wantCluster(t, e, held.ID, lifecycle.Running, "")
		}
		stop(t, e)
	})
}
