package scanner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/clusterd/clusterd/repository"
)

// Adopter takes a running job over from a server that is gone, or that
// handed it off, and runs it on (the service, so the work is a job like any
// other). Losing the race to another adopter returns an error wrapping
// repository.ErrConflict; a job it cannot resume, an error with a method
// CannotResume() bool that says so (the job is then failed as it would be
// without adoption).
type Adopter interface {
	Adopt(ctx context.Context, j repository.Job, cutoff time.Time, reason string) error
}

// DefaultMaxAttempts is how many times a job may run (the attempt that
// claimed it, and adoptions) when Config leaves MaxAttempts zero.
const DefaultMaxAttempts = 3

// adoptLimit bounds the jobs one pass adopts.
const adoptLimit = 100

// cannotResume is how an Adopter's error says the job cannot be resumed.
type cannotResume interface{ CannotResume() bool }

// adopt offers every adoptable job (SPEC §5 step 4: IN_PROGRESS, of a dead
// server, an earlier incarnation, or handed off, with attempts and time
// left) to the Adopter. It reports whether the jobs of dead servers may now
// be failed: not when an adoption met an error other than a lost race or a
// job it cannot resume, nor when more jobs wait than a pass adopts, since
// failing would then take a job that adoption has not been offered yet.
// Which jobs are adoptable is decided by the same cutoff the failing uses,
// so no job that may still be adopted is failed in a pass that did not
// offer it first; those out of attempts or time are failed without offer.
func (s *Scanner) adopt(ctx context.Context, r *Report, cutoff time.Time) bool {
	jobs, err := s.cfg.Store.AdoptableJobs(ctx, repository.AdoptableQuery{
		Cutoff: cutoff, Now: s.now(), MaxAttempts: s.cfg.MaxAttempts, Limit: adoptLimit,
	})
	if err != nil {
		r.fail(fmt.Errorf("adoption: %w", err))
		return false
	}
	mayFail := len(jobs) < adoptLimit
	for _, j := range jobs {
		reason := s.ownerLoss(j)
		err := s.cfg.Adopter.Adopt(ctx, j, cutoff, reason)
		var cr cannotResume
		switch {
		case err == nil:
			r.Adopted++
			s.log.Info("adopted an operation", "job", j.ID, "kind", j.Kind, "cluster", j.ResourceID, "from", j.ServerID,
				"attempt", j.Attempt+1, "step", j.Step, "because", reason)
		case errors.Is(err, repository.ErrConflict) || errors.Is(err, repository.ErrNotFound):
			r.LostRaces++
			s.log.Debug("scanner lost an adoption race", "job", j.ID, "error", err)
		case errors.As(err, &cr) && cr.CannotResume(), errors.Is(err, repository.ErrNotHeld):
			// Failed below, as without adoption (a job that no longer holds
			// its cluster has nothing to run on).
			s.log.Warn("operation cannot be adopted; it fails as its owner is gone", "job", j.ID, "kind", j.Kind, "error", err)
		default:
			mayFail = false
			r.fail(fmt.Errorf("adopt job %s: %w", j.ID, err))
		}
	}
	return mayFail
}

// ownerLoss says, for the history, why a job is adopted.
func (s *Scanner) ownerLoss(j repository.Job) string {
	switch {
	case j.HandedOff:
		return fmt.Sprintf("server %s handed it off", j.ServerID)
	case j.ServerID == s.cfg.Self.ID:
		return "server restarted"
	}
	return fmt.Sprintf("owner server %s stopped (no heartbeat for the peer timeout %s)", j.ServerID, s.cfg.PeerTimeout)
}
