package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/clusterd/clusterd/repository"
)

// handOffJob lets go of a job that Shutdown, the loss of the lease or a
// database outage interrupted (Config.HandOff, interrupted): the job stays IN_PROGRESS and holds its
// cluster, marked handed off with its history saying where it stopped, so a
// live server adopts it at its next scan and runs it on from its last
// recorded step. Like an end, the write survives the job's cancellation and
// is retried through a transient database outage within the job's budget
// (its deadline, at least FinishTimeout).
// It reports whether the job is settled: handed off, already ended or
// adopted elsewhere, or left IN_PROGRESS after the budget (its server's
// peers adopt it once this server is gone). false means the job no longer
// holds its cluster, and the caller ends it as a failure instead.
func (r *Runner) handOffJob(log *slog.Logger, t Task, p *Progress, cause error) bool {
	ctx, cancel := context.WithTimeout(r.finishCtx, r.budget(t.Job))
	defer cancel()
	msg := fmt.Sprintf("handed off before its first step: %v", cause)
	if step := p.current(); step != "" {
		msg = fmt.Sprintf("handed off at step %s: %v", step, cause)
	}
	backoff := firstRetryPause
	for attempt := 1; ; attempt++ {
		_, err := r.store.HandOffJob(ctx, repository.HandOff{Job: t.Job, Message: msg})
		var ended *repository.JobConflictError
		switch {
		case err == nil:
			log.Info("job handed off for adoption", "step", p.current(), "attempt", t.Job.Attempt, "cause", cause)
			return true
		case errors.As(err, &ended):
			log.Debug("job ended or adopted elsewhere; not handing it off", "err", err)
			return true
		case errors.Is(err, repository.ErrNotHeld) || errors.Is(err, repository.ErrNotFound):
			log.Warn("job cannot be handed off: it no longer holds its cluster; ending it", "err", err)
			return false
		case transient(err) && ctx.Err() == nil:
			log.Warn("could not hand the job off; retrying", "attempt", attempt, "err", err)
			timer := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				timer.Stop()
			case <-timer.C:
			}
			backoff = min(2*backoff, maxRetryPause)
			continue
		}
		// Still IN_PROGRESS and owned by this server: its peers adopt it
		// once this server's row says it stopped, or its heartbeat is a peer
		// timeout old.
		log.Error("hand off job: gave up", "attempts", attempt, "err", err, "budget", r.budget(t.Job))
		return true
	}
}
