package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/clusterd/clusterd/repository"
)

// panicError is what a panic in Task.Run becomes.
type panicError struct{ value any }

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v", e.value) }

// ending is how a job that did not succeed ends: its status, and why (its
// work's error, or one of the runner's Err* causes), which Config.Encode
// turns into the stored error and Task.Release is given.
type ending struct {
	status repository.JobStatus
	cause  error
}

// classify decides how a job whose Run returned err ends. The order matters:
// a cancellation (seen by Step, or the cause of the job context's end, whose
// step in flight then returns ctx's error or whatever its interruption
// made) and the job's own word (lease lost, panicked) come before the state
// of its context, which explains any other error returned once the context
// is done.
func classify(jobCtx context.Context, deadline time.Time, err error) ending {
	var pe *panicError
	switch {
	case errors.Is(err, ErrCancelled), errors.Is(context.Cause(jobCtx), ErrCancelled):
		return ending{repository.JobCancelled, ErrCancelled}
	case errors.Is(err, ErrLeaseLost):
		return ending{repository.JobFailed, ErrLeaseLost}
	case errors.As(err, &pe):
		return ending{repository.JobFailed, err}
	case errors.Is(jobCtx.Err(), context.DeadlineExceeded),
		errors.Is(err, context.DeadlineExceeded) && !time.Now().Before(deadline):
		return ending{repository.JobFailed, ErrDeadline}
	case jobCtx.Err() != nil:
		// The job's context has no other canceller than Shutdown and
		// Cancel (above).
		return ending{repository.JobFailed, ErrShutdown}
	}
	return ending{repository.JobFailed, err}
}

// EncodePlain is the stored error of a job when Config.Encode is nil: the
// code a gRPC status error carries (UNKNOWN otherwise) and its message,
// without details.
func EncodePlain(cause error) string {
	st := &spb.Status{Code: int32(codes.Unknown), Message: cause.Error()}
	if s, ok := status.FromError(cause); ok {
		st.Code = int32(s.Code())
	}
	b, _ := protojson.Marshal(st)
	return string(b)
}

// interrupted reports whether a job that did not succeed was stopped by
// something other than its own work, and so is handed off (Config.HandOff)
// to run on rather than failed: Shutdown, the loss of the lease, or a
// database that did not answer one of its steps' writes (a restart, a
// failover; the job's deadline had not passed, or classify would say so).
// The database is back by the time the hand-off is written, and whichever
// server adopts the job first runs it on from its last recorded step.
func interrupted(cause error) bool {
	return errors.Is(cause, ErrShutdown) || errors.Is(cause, ErrLeaseLost) || errors.Is(cause, repository.ErrUnavailable)
}

// budget is how long a job may take to record its end or its hand-off
// through a database outage: until its deadline, since the operation was
// accepted for that long, and at least FinishTimeout, so a job past its
// deadline still records why it ended. Abort cuts it short.
func (r *Runner) budget(j repository.Job) time.Duration {
	return max(r.finishTimeout, time.Until(j.Deadline))
}

// finish is the one place a job ends. It writes the job's end and the
// cluster's release in one FinishJob, on a context that survives the job's
// cancellation, and returns the final row and whether this runner wrote it.
// A transient database failure (repository.ErrUnavailable) does not end it:
// the release is worked out and the end written again, with backoff, until
// the job's budget (its deadline, at least FinishTimeout) is spent or Abort
// is called.
func (r *Runner) finish(jobCtx context.Context, log *slog.Logger, t Task, p *Progress, out Outcome, runErr error) (repository.Job, bool) {
	if errors.Is(runErr, ErrJobEnded) {
		log.Debug("job ended elsewhere; not finishing it again", "err", runErr)
		return repository.Job{}, false
	}
	ctx, cancel := context.WithTimeout(r.finishCtx, r.budget(t.Job))
	defer cancel()

	// The job as this runner knows it, which FinishJob returns as ended
	// without reading it back.
	known := t.Job
	f := repository.Finish{JobID: t.Job.ID, Attempt: t.Job.Attempt, Job: &known}
	var cause error
	if runErr == nil {
		f.Status, f.Result, f.Release = repository.JobSucceeded, out.Result, out.Release
	} else {
		e := classify(jobCtx, t.Job.Deadline, runErr)
		if r.handOff && interrupted(e.cause) && r.handOffJob(log, t, p, e.cause) {
			return repository.Job{}, false
		}
		f.Status, f.Error, cause = e.status, r.encode(e.cause), e.cause
		log.Info("job did not succeed", "status", e.status, "cause", e.cause, "err", runErr)
	}
	// A success's last step finished with Run: its steps done are written
	// with the job's end, as is a first step the claim named and the job
	// never started.
	if rec, ok := p.final(runErr == nil); ok {
		f.Progress = &rec
	}

	backoff := firstRetryPause
	for attempt := 1; ; attempt++ {
		var err error
		if cause != nil {
			var relErr error
			f.Release, relErr = r.release(ctx, log, t, cause)
			if relErr != nil {
				err = fmt.Errorf("release: %w", relErr)
			}
		}
		var job repository.Job
		if err == nil {
			job, err = r.store.FinishJob(ctx, f)
		}
		var ended *repository.JobConflictError
		switch {
		case err == nil:
			log.Info("job ended", "status", job.Status, "attempts", attempt)
			return job, true
		case errors.Is(err, repository.ErrNotHeld):
			log.Info("job ended; its cluster was taken since and left alone", "status", job.Status, "err", err)
			return job, true
		case errors.As(err, &ended):
			log.Debug("job ended elsewhere; not finishing it again", "err", err)
			return repository.Job{}, false
		case transient(err) && ctx.Err() == nil:
			log.Warn("could not record the end of the job; retrying", "status", f.Status, "attempt", attempt, "err", err)
			timer := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				timer.Stop()
			case <-timer.C:
			}
			backoff = min(2*backoff, maxRetryPause)
			continue
		}
		// The job may stay IN_PROGRESS, owned by this live server, holding its
		// cluster: the scanner fails a job its runner no longer runs (SPEC
		// §5), and peers fail it once this server is gone; logged as an
		// error for an operator.
		log.Error("finish job: gave up", "status", f.Status, "attempts", attempt, "err", err, "budget", r.budget(t.Job))
		return repository.Job{}, false
	}
}

// transient reports whether a failed write may succeed if made again: the
// database did not answer (down, restarting, a lost connection) or could not
// do it just now (a lock conflict past its retries), or the attempt timed out.
func transient(err error) bool {
	return errors.Is(err, repository.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// release asks the task how the cluster moves after a failure. A Release that
// panics, or fails other than transiently, leaves the cluster alone: the job
// still ends, and orphan recovery fails the operation that the cluster still
// names. A transient failure is returned, so that finish tries again.
func (r *Runner) release(ctx context.Context, log *slog.Logger, t Task, cause error) (tr *repository.Transition, err error) {
	if t.Release == nil {
		return nil, nil
	}
	defer func() {
		if v := recover(); v != nil {
			log.Error("job release panicked; leaving the cluster to recovery", "panic", v, "stack", string(debug.Stack()))
			tr, err = nil, nil
		}
	}()
	tr, err = t.Release(ctx, cause)
	if err != nil && transient(err) && ctx.Err() == nil {
		return nil, err
	}
	if err != nil {
		log.Error("job release failed; leaving the cluster to recovery", "err", err)
		return nil, nil
	}
	return tr, nil
}
