package service

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	"github.com/clusterd/clusterd/repository"
)

// Adopt takes over job j, whose server is gone (dead, or an earlier
// incarnation of a restarted one) or handed it off on a graceful stop, and
// runs it on here (SPEC §5 step 4). The compare-and-set on the job row
// (repository.Store.AdoptJob) moves it to this server and bumps its
// attempt, which fences the old owner; the cluster keeps its state and
// current operation, and its history records OPERATION_ADOPTED with both
// servers. The job keeps its id, so clients following the operation see it
// go on. Its work is rebuilt from its kind and stored parameters and run
// from the start of its plan: each step whose effect the infrastructure
// already shows is skipped and the interrupted step is run again (every
// step is idempotent), and its progress counts on from the steps recorded
// as done. cutoff is the liveness cutoff the caller judged the owner by
// (checked again in the write); reason goes to the history. Losing the
// compare-and-set is an error wrapping repository.ErrConflict; a job whose
// kind this server cannot resume is a *CannotResumeError, and is left to
// fail.
func (s *Clusters) Adopt(ctx context.Context, j repository.Job, cutoff time.Time, reason string) error {
	if err := s.mayClaim(); err != nil {
		return err
	}
	work, err := s.workFor(j)
	if err != nil {
		return err
	}
	from := "its first step"
	if j.Step != "" {
		from = "step " + j.Step
	}
	msg := fmt.Sprintf("%s adopted by server %s from server %s (%s): attempt %d goes on from %s",
		j.Kind, s.serverID, j.ServerID, reason, j.Attempt+1, from)
	// Listed as this server's before the write commits, as a claim is, so
	// this server's scanner never takes the adopted job for one it lost.
	// A job the runner lists already is this server's own, alive: it runs
	// here (a pass that began as the lease was about to lapse judges this
	// server by a cutoff later than its last heartbeat), or its attempt,
	// handed off, is still letting go of it. Adopting it would fence the
	// running attempt, fail to start the new one and hand it off again, an
	// attempt spent; the last one, handed off, this server's scanner would
	// fail as lost. It is a lost race: nothing is written, and a handed-off
	// job is offered again at the next pass.
	release, err := s.runner.Reserve(j.ID)
	if err != nil {
		return fmt.Errorf("adopt job %s: %w: %w", j.ID, err, repository.ErrConflict)
	}
	defer release()
	adopted, err := s.store.AdoptJob(ctx, repository.Adoption{
		Job: j, Server: repository.Server{ID: s.serverID, Incarnation: s.incarnation}, Cutoff: cutoff, Message: msg,
	})
	if err != nil {
		return err
	}
	s.log.Info("operation adopted", "job", j.ID, "kind", j.Kind, "cluster", j.ResourceID, "from", j.ServerID,
		"attempt", adopted.Attempt, "step", j.Step, "reason", reason)
	// The operation goes on from the cluster as the adoption wrote it.
	c, err := s.store.GetCluster(ctx, adopted.ResourceID)
	if err != nil {
		s.handOffAgain(ctx, adopted, "handed off again at once: the adopting server could not read the cluster")
		return fmt.Errorf("run adopted job %s: %w", j.ID, err)
	}
	_, task := s.task(c, adopted, work)
	if err := s.runner.Start(task); err != nil {
		// This server began stopping in between: let the job go again, for
		// another server (or this one's next incarnation) to adopt.
		s.handOffAgain(ctx, adopted, "handed off again at once: the adopting server is stopping")
		return fmt.Errorf("run adopted job %s: %w", j.ID, errShuttingDown)
	}
	return nil
}

// handOffAgain lets an adopted job that this server cannot run go again, for
// another server (or this one's next incarnation) to adopt.
func (s *Clusters) handOffAgain(ctx context.Context, j repository.Job, msg string) {
	if _, err := s.store.HandOffJob(context.WithoutCancel(ctx), repository.HandOff{Job: j, Server: s.serverID, Message: msg}); err != nil {
		s.log.Warn("could not hand off an adopted job it cannot run; peers adopt it once this server is gone", "job", j.ID, "error", err)
	}
}

// handOffUnstarted hands off a job whose claim committed just as this
// server began stopping (the runner refused to start it): a live server
// adopts it at its next scan and runs it, so the request is answered with
// its operation instead of being refused. An error means the job could not
// be handed off, and the caller fails it.
func (s *Clusters) handOffUnstarted(ctx context.Context, job repository.Job) (*longrunningpb.Operation, error) {
	j, err := s.store.HandOffJob(context.WithoutCancel(ctx), repository.HandOff{
		Job: job, Server: s.serverID, Message: "handed off before its first step: server " + s.serverID + " began stopping",
	})
	if err != nil {
		s.log.Warn("could not hand off a job claimed while stopping; failing it", "job", job.ID, "error", err)
		return nil, err
	}
	s.log.Info("job claimed while stopping handed off for adoption", "job", job.ID, "cluster", job.ResourceID)
	return toOperation(j)
}

// CannotResumeError: a job's kind or parameters are not ones this server
// can rebuild the work of (a newer server's job, say). Such a job is not
// adopted; recovery fails it as it would without adoption.
type CannotResumeError struct {
	JobID string
	Kind  string
	Why   string
}

// Error names the job and what could not be read.
func (e *CannotResumeError) Error() string {
	return fmt.Sprintf("operation %s (%s) cannot be resumed by this server: %s", operationName(e.JobID), Clip(e.Kind), e.Why)
}

// CannotResume tells the scanner to fail the job rather than wait for an
// adoption that cannot happen.
func (e *CannotResumeError) CannotResume() bool { return true }

// workFor rebuilds a job's work from its kind and stored parameters, as the
// RPC that claimed it built it.
func (s *Clusters) workFor(j repository.Job) (workFunc, error) {
	decode := func(v any) error {
		if err := json.Unmarshal([]byte(j.Params), v); err != nil {
			return &CannotResumeError{JobID: j.ID, Kind: j.Kind, Why: fmt.Sprintf("parameters %q: %v", Clip(j.Params), err)}
		}
		return nil
	}
	switch j.Kind {
	case VerbCreate:
		return s.createWork, nil
	case VerbStart:
		return s.startWork, nil
	case VerbStop:
		return s.stopWork, nil
	case VerbDelete:
		return s.deleteWork, nil
	case VerbScale:
		var p scalePlan
		if err := decode(&p); err != nil {
			return nil, err
		}
		return func(ctx context.Context, o *op) (repository.Changes, error) { return s.scaleWork(ctx, o, p) }, nil
	case VerbUpgrade:
		var p upgradePlan
		if err := decode(&p); err != nil {
			return nil, err
		}
		return func(ctx context.Context, o *op) (repository.Changes, error) { return s.upgradeWork(ctx, o, p) }, nil
	case VerbAddNodes, VerbRemoveNodes:
		var p nodesPlan
		if err := decode(&p); err != nil {
			return nil, err
		}
		if j.Kind == VerbAddNodes {
			return func(ctx context.Context, o *op) (repository.Changes, error) { return s.addWork(ctx, o, p) }, nil
		}
		return func(ctx context.Context, o *op) (repository.Changes, error) { return s.removeWork(ctx, o, p) }, nil
	case VerbRecover:
		var p recoverPlan
		if err := decode(&p); err != nil {
			return nil, err
		}
		if p.Orphan != "" {
			return s.orphanWork(p), nil
		}
		return s.recoverAlertWork, nil
	}
	return nil, &CannotResumeError{JobID: j.ID, Kind: j.Kind, Why: "unknown kind"}
}
