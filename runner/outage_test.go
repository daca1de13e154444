package runner_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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

// A database that stays down past the budget (the job's deadline, at least
// FinishTimeout): the runner gives up (the job stays IN_PROGRESS for
// recovery), and Abort lets a shutdown that ran out of time end the attempts
// at once: without it they would go on for their hour's budget, far past
// the shutdown's deadline.
func TestEndGivenUpAfterItsBudgetAndOnAbort(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		o := &outage{Store: e.s}
		o.down.Store(1 << 40)
		r, _ := newOutageRunner(t, o, 300*time.Millisecond)
		_, job := starting(t, e, "budget", time.Now().Add(time.Second))
		fail := func(context.Context, *runner.Progress) (runner.Outcome, error) {
			return runner.Outcome{}, errors.New("boom")
		}
		if err := r.Start(runner.Task{Job: job, Run: fail}); err != nil {
			t.Fatal(err)
		}
		stopCtx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := r.Shutdown(stopCtx); err != nil {
			t.Fatalf("Shutdown: %v (the end should give up at the job's deadline, a second away)", err)
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

// stepOutage is the real store behind a connection that is down for a job's
// steps (RecordProgress) and hand-off (HandOffJob) until the test brings it
// back: while down they fail as a database restart makes them fail
// (repository.ErrUnavailable) and write nothing. tried is closed at the
// first refused step, handOffs counts the refused hand-offs.
type stepOutage struct {
	*repository.Store
	down      atomic.Bool
	steps     atomic.Int64
	tried     chan struct{}
	triedOnce atomic.Bool
	handOffs  atomic.Int64
	// handOffTried gets a value at each refused hand-off, if set.
	handOffTried chan int64
}

func newStepOutage(s *repository.Store) *stepOutage {
	o := &stepOutage{Store: s, tried: make(chan struct{}), handOffTried: make(chan int64, 64)}
	o.down.Store(true)
	return o
}

func (o *stepOutage) RecordProgress(ctx context.Context, jobID string, p repository.Progress) (repository.Job, error) {
	o.steps.Add(1)
	if o.down.Load() {
		if !o.triedOnce.Swap(true) {
			close(o.tried)
		}
		return repository.Job{}, fmt.Errorf("record progress of job %s: %w: connection refused", jobID, repository.ErrUnavailable)
	}
	return o.Store.RecordProgress(ctx, jobID, p)
}

func (o *stepOutage) HandOffJob(ctx context.Context, h repository.HandOff) (repository.Job, error) {
	if o.down.Load() {
		o.handOffTried <- o.handOffs.Add(1)
		return repository.Job{}, fmt.Errorf("hand off job %s: %w: connection refused", h.Job.ID, repository.ErrUnavailable)
	}
	return o.Store.HandOffJob(ctx, h)
}

// lapsable is a lease the test lets lapse.
type lapsable struct{ lapsed atomic.Bool }

func (l *lapsable) Check() error {
	if l.lapsed.Load() {
		return errors.New("the last heartbeat the database accepted is older than the peer timeout")
	}
	return nil
}

// A step whose progress write meets a database that is down waits for it
// and goes on once it answers: the job succeeds, with every step recorded,
// instead of failing with UNAVAILABLE (as it did when only the end was
// retried).
func TestStepWaitsForTheDatabase(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		o := newStepOutage(e.s)
		done := make(chan repository.Job, 1)
		r := runner.New(runner.Config{
			Store:  o,
			Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
			OnDone: func(j repository.Job) { done <- j },
			Lease:  &lapsable{},
		})
		t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
		held, job := starting(t, e, "web", inAnHour())
		err := r.Start(runner.Task{
			Job: job,
			Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
				p.SetTotal(2)
				for _, step := range []string{"provision_machine", "join_node"} {
					if err := p.Step(ctx, step); err != nil {
						return runner.Outcome{}, err
					}
				}
				return runner.Outcome{Result: `{}`, Release: succeed(held)}, nil
			},
			Release: failRelease(held, make(chan error, 4)),
		})
		if err != nil {
			t.Fatal(err)
		}
		recv(t, o.tried, "a step refused by the database")
		o.down.Store(false)
		got := recv(t, done, "the job's end")
		if got.Status != repository.JobSucceeded || got.StepsDone != 2 || got.Error != "" {
			t.Errorf("job = %s with %d steps done, error %q; want SUCCEEDED with 2 done", got.Status, got.StepsDone, got.Error)
		}
		if n := o.steps.Load(); n < 3 {
			t.Errorf("%d progress writes; want at least 3 (a refused one, then both steps)", n)
		}
		wantCluster(t, e, held.ID, lifecycle.Running, "")
	})
}

// A job adopted by a peer while its step waited for the database stops once
// the database answers: the write at its old attempt is refused, the step
// returns ErrJobEnded, and this run writes nothing more (fencing).
func TestStepWaitingForTheDatabaseStopsIfAdopted(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		o := newStepOutage(e.s)
		r := runner.New(runner.Config{
			Store:  o,
			Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
			OnDone: func(j repository.Job) { t.Errorf("OnDone(%s %s) for a job adopted elsewhere", j.ID, j.Status) },
		})
		t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
		held, job := starting(t, e, "web", inAnHour())
		stepErr := make(chan error, 1)
		err := r.Start(runner.Task{
			Job: job,
			Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
				err := p.Step(ctx, "provision_machine")
				stepErr <- err
				if err != nil {
					return runner.Outcome{}, err
				}
				return runner.Outcome{Result: `{}`, Release: succeed(held)}, nil
			},
			Release: func(context.Context, error) (*repository.Transition, error) {
				return nil, errors.New("an adopted job's old runner must not release")
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		recv(t, o.tried, "a step refused by the database")
		ctx := ctxT(t)
		adopter, err := e.s.RegisterServer(ctx, "s2")
		if err != nil {
			t.Fatal(err)
		}
		seen, err := e.s.GetJob(ctx, job.ID)
		if err != nil {
			t.Fatal(err)
		}
		adopted, err := e.s.AdoptJob(ctx, repository.Adoption{Job: seen, Server: adopter, Cutoff: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		o.down.Store(false)
		if err := recv(t, stepErr, "the step"); !errors.Is(err, runner.ErrJobEnded) || !strings.Contains(err.Error(), "adopted") {
			t.Errorf("Step after an adoption during the outage = %v; want ErrJobEnded saying it was adopted", err)
		}
		stopCtx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := r.Shutdown(stopCtx); err != nil {
			t.Fatal(err)
		}
		got, err := e.s.GetJob(ctx, job.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != repository.JobInProgress || got.Attempt != 2 || !got.UpdateTime.Equal(adopted.UpdateTime) {
			t.Errorf("job = %s attempt %d updated %v; want the adoption's row untouched (IN_PROGRESS, attempt 2, %v)",
				got.Status, got.Attempt, got.UpdateTime, adopted.UpdateTime)
		}
		wantCluster(t, e, held.ID, lifecycle.Starting, job.ID)
	})
}

// An outage longer than the lease (the peer timeout): the step stops waiting
// once the lease lapses, and the job is handed off as soon as the database
// answers, at the step it was at, for this server or a peer to run on. The
// hand-off is bounded by the job's deadline, not by FinishTimeout: here the
// database stays down well past a 50ms FinishTimeout. A job whose work met
// the outage (the infrastructure's own writes) is handed off alike.
func TestOutageOutlivingTheLeaseHandsOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		work func(ctx context.Context, p *runner.Progress, lease *lapsable, o *stepOutage) error
	}{
		{"progress write", func(ctx context.Context, p *runner.Progress, lease *lapsable, o *stepOutage) error {
			go func() {
				<-o.tried
				lease.lapsed.Store(true)
			}()
			return p.Step(ctx, "join_node")
		}},
		{"step's own write", func(ctx context.Context, p *runner.Progress, lease *lapsable, o *stepOutage) error {
			return fmt.Errorf("join_node: fence: %w: connection refused", repository.ErrUnavailable)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, e *env) {
				o := newStepOutage(e.s)
				o.down.Store(false)
				lease := &lapsable{}
				r := runner.New(runner.Config{
					Store:         o,
					Logger:        slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
					OnDone:        func(j repository.Job) { t.Errorf("OnDone(%s %s) for a job handed off", j.ID, j.Status) },
					Lease:         lease,
					HandOff:       true,
					FinishTimeout: 50 * time.Millisecond,
				})
				t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
				held, job := starting(t, e, "web", inAnHour())
				err := r.Start(runner.Task{
					Job: job,
					Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
						p.SetTotal(3)
						if err := p.Step(ctx, "provision_machine"); err != nil {
							return runner.Outcome{}, err
						}
						o.down.Store(true)
						return runner.Outcome{}, tc.work(ctx, p, lease, o)
					},
					Release: func(context.Context, error) (*repository.Transition, error) {
						return nil, errors.New("a job interrupted by an outage must not be released")
					},
				})
				if err != nil {
					t.Fatal(err)
				}
				// Three refused hand-offs take at least 100+200ms of backoff:
				// past FinishTimeout.
				for recv(t, o.handOffTried, "a refused hand-off") < 3 {
				}
				o.down.Store(false)
				stopCtx, cancel := context.WithTimeout(context.Background(), wait)
				defer cancel()
				if err := r.Shutdown(stopCtx); err != nil {
					t.Fatal(err)
				}
				got, err := e.s.GetJob(ctxT(t), job.ID)
				if err != nil {
					t.Fatal(err)
				}
				if got.Status != repository.JobInProgress || !got.HandedOff || got.Attempt != 1 || got.Error != "" {
					t.Errorf("job = %s handed off %t attempt %d error %q; want IN_PROGRESS, handed off, attempt 1, no error",
						got.Status, got.HandedOff, got.Attempt, got.Error)
				}
				wantCluster(t, e, held.ID, lifecycle.Starting, job.ID)
			})
		})
	}
}
