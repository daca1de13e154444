package runner_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/runner"
)

// outage is the real store behind a connection that is down for the first
// `down` writes of a job's end: they fail as a database restart makes them
// fail (repository.ErrUnavailable) and write nothing. It fakes the network,
// not the database: every write that goes through is the real one.
type outage struct {
	*repository.Store
	down     atomic.Int64
	attempts atomic.Int64
}

func (o *outage) FinishJob(ctx context.Context, f repository.Finish) (repository.Job, error) {
	o.attempts.Add(1)
	if o.down.Add(-1) >= 0 {
		return repository.Job{}, fmt.Errorf("finish job %s: %w: connection refused", f.JobID, repository.ErrUnavailable)
	}
	return o.Store.FinishJob(ctx, f)
}

func newOutageRunner(t *testing.T, o *outage, finishTimeout time.Duration) (*runner.Runner, chan repository.Job) {
	done := make(chan repository.Job, 4)
	r := runner.New(runner.Config{
		Store:         o,
		Logger:        slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnDone:        func(j repository.Job) { done <- j },
		FinishTimeout: finishTimeout,
	})
	return r, done
}

// A job whose end cannot be written because the database is down (here,
// restarting) keeps trying within its finish budget, and its end, release
// included, is recorded once the database is back.
func TestEndRetriedThroughAnOutage(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		o := &outage{Store: e.s}
		o.down.Store(3)
		r, done := newOutageRunner(t, o, 30*time.Second)
		t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
		held, job := starting(t, e, "web", inAnHour())
		causes := make(chan error, 8)
		err := r.Start(runner.Task{
			Job: job,
			Run: func(context.Context, *runner.Progress) (runner.Outcome, error) {
				return runner.Outcome{}, errors.New("upgrade_node: database unavailable")
			},
			Release: failRelease(held, causes),
		})
		if err != nil {
			t.Fatal(err)
		}
		got := recv(t, done, "the job's end")
		if got.Status != repository.JobFailed {
			t.Errorf("job = %s; want FAILED", got.Status)
		}
		if n := o.attempts.Load(); n != 4 {
			t.Errorf("%d attempts to write the end; want 4 (3 during the outage, then the one that worked)", n)
		}
		wantCluster(t, e, held.ID, lifecycle.Alert, "")
	})
}

// A database that stays down past the budget: the runner gives up (the job
// stays IN_PROGRESS for recovery), and Abort lets a shutdown that ran out of
// time end the attempts at once: without it they would go on for their
// hour's budget, far past the shutdown's deadline.
func TestEndGivenUpAfterItsBudgetAndOnAbort(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		o := &outage{Store: e.s}
		o.down.Store(1 << 40)
		r, _ := newOutageRunner(t, o, 300*time.Millisecond)
		_, job := starting(t, e, "budget", inAnHour())
		fail := func(context.Context, *runner.Progress) (runner.Outcome, error) {
			return runner.Outcome{}, errors.New("boom")
		}
		if err := r.Start(runner.Task{Job: job, Run: fail}); err != nil {
			t.Fatal(err)
		}
		stopCtx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := r.Shutdown(stopCtx); err != nil {
			t.Fatalf("Shutdown: %v (the end should give up after its 300ms budget)", err)
		}
		if got, _ := e.s.GetJob(ctxT(t), job.ID); got.Status != repository.JobInProgress {
			t.Errorf("job = %s; want IN_PROGRESS (its end never reached the database)", got.Status)
		}

		r2, _ := newOutageRunner(t, o, time.Hour)
		_, job2 := starting(t, e, "abort", inAnHour())
		if err := r2.Start(runner.Task{Job: job2, Run: fail}); err != nil {
			t.Fatal(err)
		}
		short, cancelShort := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancelShort()
		if err := r2.Shutdown(short); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Shutdown while the end retries for an hour: %v; want DeadlineExceeded", err)
		}
		r2.Abort()
		if err := r2.Shutdown(stopCtx); err != nil {
			t.Fatalf("Shutdown after Abort: %v; want the job stopped at once", err)
		}
	})
}
