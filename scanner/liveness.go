package scanner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/runner"
)

// liveness fails the IN_PROGRESS jobs of this server's earlier incarnations
// and of servers whose heartbeat is older than the peer timeout; with an
// Adopter, those that may still be adopted are adopted first, so only the
// others (out of attempts or time, or of no cluster) fail. It reads those
// jobs only when the owners of the jobs in progress say one may be among
// them (livenessDue).
func (s *Scanner) liveness(ctx context.Context, r *Report) {
	began := s.now()
	cutoff := s.cutoff(began)
	owners, err := s.cfg.Store.InProgressOwners(ctx)
	if err != nil {
		// The reads below are made as if an owner were dead: they report
		// their own errors if the database is what failed.
		r.fail(fmt.Errorf("liveness: %w", err))
	} else if !livenessDue(owners, s.cfg.Self, cutoff) {
		return
	}
	// With adoption, only the jobs that adoption will not take may fail in
	// this pass: a job that may still be adopted (created since the offer,
	// or whose owner died or restarted since) is offered next.
	var offer *repository.Offer
	if s.cfg.Adopter != nil {
		if offer = s.adopt(ctx, r, cutoff, began); offer == nil {
			return
		}
	}
	restarted, stopped, err := s.cfg.Store.FailJobsOfDeadServers(ctx, s.cfg.Self, cutoff, offer,
		s.encode(runner.ErrServerRestarted), s.encode(runner.ErrOwnerStopped))
	r.JobsFailed += int(restarted + stopped)
	if err != nil {
		r.fail(fmt.Errorf("liveness: %w", err))
	}
	if restarted+stopped > 0 {
		s.log.Info("failed the jobs of stopped servers", "server_restarted", restarted, "owner_stopped", stopped)
	}
}

// cutoff is the liveness cutoff of a pass that began at began
// (livenessCutoff), from this server's lease.
func (s *Scanner) cutoff(began time.Time) time.Time {
	var heldSince time.Time
	if s.cfg.Lease != nil {
		heldSince = s.cfg.Lease.HeldSince()
	}
	return livenessCutoff(began, s.cfg.PeerTimeout, heldSince)
}

// lostJobs fails this server's own IN_PROGRESS jobs that its runner no
// longer runs (decideLost): a job whose end could not be written (the
// database was unreachable as it finished, for longer than the runner's
// retries) would otherwise hold its cluster for as long as this server
// lives. It reads every job this server runs, so it runs with
// reconciliation (every ReconcileInterval), not every pass: such a job
// has already waited out the runner's retries, minutes at least.
func (s *Scanner) lostJobs(ctx context.Context, r *Report) {
	if s.cfg.Running == nil {
		return
	}
	running := s.cfg.Running() // before the query: see suspectJobs
	own, err := s.cfg.Store.OwnJobsInProgress(ctx, s.cfg.Self)
	if err != nil {
		r.fail(fmt.Errorf("lost jobs: %w", err))
		return
	}
	cur := suspectJobs(own, running)
	s.mu.Lock()
	prev := s.suspects
	s.suspects = cur
	s.mu.Unlock()
	for _, id := range decideLost(prev, cur) {
		err := s.cfg.Store.FailJobUnchanged(ctx, id, cur[id], s.encode(runner.ErrJobLost))
		switch {
		case err == nil:
			r.JobsFailed++
			s.log.Warn("failed a job this server no longer runs", "job", id)
		case errors.Is(err, repository.ErrConflict):
			r.LostRaces++
		default:
			r.fail(fmt.Errorf("lost jobs: %w", err))
		}
	}
}
