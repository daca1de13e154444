package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/clusterd/clusterd/repository"
)

// Progress is a running job's handle on its own row. Cancellation is a flag
// on that row because CancelOperation may be served by another server than
// the one running the job; the job learns of it when it records its next
// step, in the same round trip, and, sooner, when its runner cancels the
// job's context on seeing the flag (Runner.Cancel, Config.WatchCancels), which
// ends a step in flight. It is safe for concurrent use.
type Progress struct {
	store   Store
	jobID   string
	attempt int32
	lease   Lease
	log     *slog.Logger
	// base is the steps an earlier attempt finished (an adopted job): this
	// attempt's steps count on from there.
	base int32

	mu      sync.Mutex
	step    string // the step started last
	started int32  // steps started so far by this attempt
	total   int32  // steps this attempt expects
	// claimed is the progress the job's claim wrote, when it named the
	// step the job starts with (repository.NewJob.Step), until the first
	// Step: a first Step that records just that reads the row instead of
	// writing it again.
	claimed repository.Progress
}

// newProgress is the progress of job j's attempt: it writes at j's attempt
// (so it stops once another server adopts the job) and counts on from the
// steps j had finished when this attempt began.
func newProgress(store Store, j repository.Job, lease Lease, log *slog.Logger) *Progress {
	p := &Progress{store: store, jobID: j.ID, attempt: j.Attempt, lease: lease, log: log, base: j.StepsDone, total: max(0, j.StepsTotal-j.StepsDone)}
	if j.Attempt <= 1 && j.StepsDone == 0 {
		p.claimed = repository.Progress{Step: j.Step, StepsTotal: j.StepsTotal, Attempt: j.Attempt}
	}
	return p
}

// Step records that the job starts step name (e.g. "power_on"): the previous
// step is done, so steps done becomes the number of steps started before
// this one, and the step, steps done and total are written to the job row.
// It returns
//
//   - ErrCancelled if the job has CancelRequested (SPEC §4), or its context
//     was cancelled for it: stop and return it; the job ends CANCELLED;
//   - an error wrapping ErrJobEnded (and the store's error) if the job is no
//     longer IN_PROGRESS (recovery ended it) or another server adopted it
//     (a later attempt runs it): stop; the runner writes nothing more;
//   - an error wrapping ctx's error if ctx is done (deadline or shutdown);
//   - an error wrapping ErrLeaseLost if this server's lease has lapsed (its
//     heartbeat is older than the peer timeout): peers may have failed the
//     job already and be recovering its cluster, so it must not go on;
//   - any other error when the row could not be written: stop, since
//     neither cancellation nor recovery can be seen.
//
// A database that does not answer (repository.ErrUnavailable: a restart, a
// failover) does not stop the job: the write is made again, with backoff,
// while this server holds its lease and the job's context (its deadline) is
// alive, and the job goes on once it is written. The write is conditioned on
// the job's attempt, so if a peer adopted the job meanwhile it is refused
// (ErrJobEnded) and this run stops before its step. Once the lease lapses
// (the outage outlasted the peer timeout) Step returns ErrLeaseLost: the
// runner then hands the job off (Config.HandOff) as soon as the database
// answers, for this server or a peer to adopt and run on from this step.
//
// A first step that the job's claim recorded already (repository.NewJob.Step,
// with the same steps expected) is not written again but read, with the
// same outcomes.
func (p *Progress) Step(ctx context.Context, name string) error {
	if ctx.Err() != nil {
		// Why: ErrCancelled, or the deadline's or Shutdown's error.
		return fmt.Errorf("job %s: before step %s: %w", p.jobID, name, context.Cause(ctx))
	}
	if p.lease != nil {
		if err := p.lease.Check(); err != nil {
			return fmt.Errorf("job %s: before step %s: %w: %w", p.jobID, name, ErrLeaseLost, err)
		}
	}
	p.mu.Lock()
	rec := repository.Progress{Step: name, StepsDone: p.base + p.started, StepsTotal: p.base + p.total, Attempt: p.attempt}
	claimed := p.claimed
	p.claimed = repository.Progress{}
	p.started++
	p.step = name
	p.mu.Unlock()
	// A step the claim wrote already would be written again unchanged: it
	// is read instead, which learns the same (a cancellation, the job's
	// end, an adoption) without a write transaction.
	written := claimed.Step != "" && rec == claimed

	job, err := p.record(ctx, name, rec, written)
	var ended *repository.JobConflictError
	switch {
	case errors.Is(err, ErrLeaseLost):
		return err
	case errors.As(err, &ended):
		return fmt.Errorf("job %s: step %s: %w: %w", p.jobID, name, ErrJobEnded, err)
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("job %s: step %s: %w", p.jobID, name, context.Cause(ctx))
	case err != nil:
		return fmt.Errorf("job %s: step %s: %w", p.jobID, name, err)
	case job.Status.Done():
		return fmt.Errorf("job %s: step %s: %w (status %s)", p.jobID, name, ErrJobEnded, job.Status)
	case p.attempt > 0 && job.Attempt != p.attempt:
		return fmt.Errorf("job %s: step %s: %w (adopted: attempt %d on server %s)", p.jobID, name, ErrJobEnded, job.Attempt, job.ServerID)
	case job.CancelRequested:
		return fmt.Errorf("job %s: at step %s: %w", p.jobID, name, ErrCancelled)
	}
	return nil
}

// SetTotal sets the expected number of steps, for clients showing progress.
// It is written with the next Step (or the job's last progress write), so it
// costs no round trip of its own.
func (p *Progress) SetTotal(n int32) {
	p.mu.Lock()
	p.total = n
	p.mu.Unlock()
}

// current is the step started last ("" before the first).
func (p *Progress) current() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.step
}

// final is the progress a job's end writes, ok false when there is none to
// write. For a job whose work succeeded, every step started is done; a job
// that did not succeed keeps the progress its last Step recorded. Either
// way, a first step that the claim named and the job never started is taken
// back.
func (p *Progress) final(succeeded bool) (rec repository.Progress, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rec = repository.Progress{Step: p.step, StepsDone: p.base + p.started, StepsTotal: p.base + p.total, Attempt: p.attempt}
	return rec, (succeeded && p.started > 0) || p.claimed.Step != ""
}

// Backoff of a write retried through a database outage: the first retry
// soon (most outages are a dropped connection), then no more often than
// every maxRetryPause.
const (
	firstRetryPause = 100 * time.Millisecond
	maxRetryPause   = 2 * time.Second
)

// record writes the step's progress (reads the job, when the row holds it
// already), again and again while the database does not answer, this server
// holds its lease and ctx is alive (see Step).
func (p *Progress) record(ctx context.Context, name string, rec repository.Progress, written bool) (repository.Job, error) {
	pause := firstRetryPause
	for attempt := 1; ; attempt++ {
		var (
			job repository.Job
			err error
		)
		if written {
			job, err = p.store.GetJob(ctx, p.jobID)
		} else {
			job, err = p.store.RecordProgress(ctx, p.jobID, rec)
		}
		if err == nil || !errors.Is(err, repository.ErrUnavailable) || ctx.Err() != nil {
			return job, err
		}
		if attempt == 1 {
			p.log.Warn("could not record the job's step: the database is unavailable; waiting for it", "step", name, "err", err)
		}
		if err := pauseFor(ctx, pause); err != nil {
			return job, err
		}
		pause = min(2*pause, maxRetryPause)
		if p.lease != nil {
			if lerr := p.lease.Check(); lerr != nil {
				return job, fmt.Errorf("job %s: step %s: the database did not answer for %d attempts: %w: %w", p.jobID, name, attempt, ErrLeaseLost, lerr)
			}
		}
	}
}

// pauseFor waits d, or returns ctx's error as soon as ctx is done.
func pauseFor(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
