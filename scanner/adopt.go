package scanner

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
// left) to the Adopter. It returns the offer, which tells the failing that
// follows which jobs adoption will not take (repository.Offer), or nil when
// no job of a dead server may be failed in this pass: when an adoption met
// an error other than a lost race or a job it cannot resume, or when more
// jobs wait than a pass adopts.
func (s *Scanner) adopt(ctx context.Context, r *Report, cutoff, began time.Time) *repository.Offer {
	offer := &repository.Offer{Before: began, Now: s.now(), MaxAttempts: s.cfg.MaxAttempts}
	jobs, err := s.cfg.Store.AdoptableJobs(ctx, repository.AdoptableQuery{
		Cutoff: cutoff, Now: offer.Now, MaxAttempts: offer.MaxAttempts, Limit: adoptLimit, Self: s.cfg.Self,
	})
	if err != nil {
		r.fail(fmt.Errorf("adoption: %w", err))
		return nil
	}
	mayFail := len(jobs) < adoptLimit
	errs := s.adoptAll(ctx, jobs, cutoff)
	for i, j := range jobs {
		reason, err := errs[i].reason, errs[i].err
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
			offer.NotAdopted = append(offer.NotAdopted, j.ID)
		default:
			mayFail = false
			r.fail(fmt.Errorf("adopt job %s: %w", j.ID, err))
		}
	}
	if !mayFail {
		return nil
	}
	return offer
}

// adoptWorkers bounds the adoptions one pass runs at once. A dead server's
// jobs are adopted side by side, so the last of them moves again about one
// adoption after the first, not one adoption per job later.
const adoptWorkers = 8

// adoption is what offering one job to the Adopter gave.
type adoption struct {
	reason string
	err    error
}

// adoptAll offers each job to the Adopter, up to adoptWorkers at once, and
// returns each outcome at its job's index. Every offer has returned when it
// does.
func (s *Scanner) adoptAll(ctx context.Context, jobs []repository.Job, cutoff time.Time) []adoption {
	out := make([]adoption, len(jobs))
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < min(adoptWorkers, len(jobs)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				reason := s.ownerLoss(jobs[i])
				out[i] = adoption{reason: reason, err: s.cfg.Adopter.Adopt(ctx, jobs[i], cutoff, reason)}
			}
		}()
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
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
