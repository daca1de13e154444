package repository

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// History entries of adoption (SPEC §5 step 4): written like RECOVERY_STARTED,
// through the cluster's compare-and-set with no state change, so the cluster
// keeps its state and its current operation and only its version moves.
const (
	// OperationAdopted: a live server took over a job whose server was gone
	// (or had handed it off), and runs it on from its last recorded step.
	OperationAdopted = "OPERATION_ADOPTED"
	// OperationHandedOff: a stopping server let go of a running job at a
	// step boundary, for a live server to adopt at once.
	OperationHandedOff = "OPERATION_HANDED_OFF"
)

// AdoptableQuery selects the jobs a live server may adopt.
type AdoptableQuery struct {
	// Cutoff: a server whose last heartbeat is older is dead.
	Cutoff time.Time
	// Now: jobs whose deadline has passed are not adoptable (they fail).
	Now time.Time
	// MaxAttempts: jobs already run this many times are not adoptable.
	MaxAttempts int32
	// Limit bounds the page; it must be positive.
	Limit int
	// Self is the server asking. Its own incarnation is alive whatever its
	// heartbeat's age: a server acts only while it holds its lease, and a
	// pass that began as the lease was about to lapse may hold a Cutoff
	// later than its last heartbeat. Only its handed-off jobs are listed.
	Self Server
}

// AdoptableJobs lists, oldest first, up to q.Limit IN_PROGRESS jobs that a
// live server may adopt: they act on a cluster, have attempts and time left,
// and either were handed off or belong to a server that is not alive (its
// row missing, another incarnation, or a heartbeat older than q.Cutoff), the
// same liveness FailJobsOfDeadServers applies.
func (s *Store) AdoptableJobs(ctx context.Context, q AdoptableQuery) ([]Job, error) {
	if q.Limit <= 0 {
		return nil, fmt.Errorf("list adoptable jobs: limit %d must be positive", q.Limit)
	}
	var rows []jobRow
	err := s.db.WithContext(ctx).Model(&jobRow{}).
		Where("status = ? AND resource_id IS NOT NULL AND resource_id <> '' AND attempt < ? AND deadline > ?",
			string(JobInProgress), q.MaxAttempts, q.Now.UTC()).
		Where("handed_off OR (NOT EXISTS (?) AND NOT (server_id = ? AND server_incarnation = ?))", s.liveOwner(q.Cutoff), q.Self.ID, q.Self.Incarnation).
		Order("id").Limit(q.Limit).Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("list adoptable jobs: %w", classify(err))
	}
	return toJobs(rows), nil
}

// liveOwner is the subquery that finds a job's server alive: its row, with
// the job's incarnation (any, for rows of servers that predate
// incarnations), heartbeating since cutoff.
func (s *Store) liveOwner(cutoff time.Time) *gorm.DB {
	return s.db.Model(&serverRow{}).Select("1").
		Where("servers.id = jobs.server_id AND (jobs.server_incarnation = '' OR servers.incarnation = jobs.server_incarnation) AND servers.heartbeat_time >= ?", cutoff.UTC())
}

// Adoption is a live server taking over a job (SPEC §5 step 4).
type Adoption struct {
	// Job is the job as the adopter read it: its id, cluster and attempt.
	Job Job
	// Server is the adopter.
	Server Server
	// Cutoff is the liveness cutoff the adopter judged the owner by.
	Cutoff time.Time
	// Message goes to the history entry.
	Message string
}

// AdoptJob moves a job to a live server: one compare-and-set on the job row,
// conditioned on the attempt the adopter read, on the job still being
// IN_PROGRESS, and on its owner being gone (dead, another incarnation) or the
// job handed off, that sets the new owner and bumps the attempt, which
// fences the old owner from that instant (Fence.Attempt, Progress.Attempt,
// Finish.Attempt). In the same transaction, after the guard (which locks
// the cluster's row, then the job's, as every writer does), the
// cluster gets an OPERATION_ADOPTED history entry naming both servers, by
// its own compare-and-set with no state change: it keeps its state and its
// current operation, the job its id. A job that no longer holds its cluster
// is ErrNotHeld; any other miss is ErrConflict (someone else adopted or
// ended it, or its owner is alive again, or it is the adopter's own
// incarnation's and not handed off: see AdoptableQuery.Self). It returns
// the job as adopted.
func (s *Store) AdoptJob(ctx context.Context, a Adoption) (Job, error) {
	j := a.Job
	if j.ResourceID == "" {
		return Job{}, fmt.Errorf("adopt job %s: it names no cluster: %w", j.ID, ErrNotHeld)
	}
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		c, err := s.guardJob(tx, j, "adopt")
		if err != nil {
			return err
		}
		if _, err := s.casCluster(tx, Transition{
			ClusterID: c.ID, Expect: c.Expect(), Operation: j.ID, History: OperationAdopted,
			Server: a.Server.ID, Message: a.Message,
		}); err != nil {
			return err
		}
		res := whereHeld(tx.Model(&jobRow{}), j.ID, j.Attempt).
			Where("handed_off OR (NOT EXISTS (?) AND NOT (server_id = ? AND server_incarnation = ?))",
				s.liveOwner(a.Cutoff), a.Server.ID, a.Server.Incarnation).
			Updates(map[string]any{
				"server_id": a.Server.ID, "server_incarnation": a.Server.Incarnation,
				"attempt": j.Attempt + 1, "handed_off": false, "update_time": s.stamp(),
			})
		if res.Error != nil {
			return fmt.Errorf("update job: %w", classify(res.Error))
		}
		if res.RowsAffected != 1 {
			return errMissed
		}
		return nil
	})
	switch {
	case errors.Is(err, errMissed):
		return Job{}, fmt.Errorf("adopt job %s at attempt %d: it was adopted, ended or its owner is alive: %w", j.ID, j.Attempt, ErrConflict)
	case err != nil:
		return Job{}, fmt.Errorf("adopt job %s: %w", j.ID, err)
	}
	return s.GetJob(ctx, j.ID)
}

// HandOff is a stopping server letting go of a job it runs.
type HandOff struct {
	// Job is the job as its runner knows it: id, cluster, attempt.
	Job Job
	// Server (default: the Store's WithServerID) and Message go to the
	// history entry.
	Server  string
	Message string
}

// HandOffJob marks a running job handed off, so that any live server adopts
// it at its next scan without waiting for the peer timeout: a
// compare-and-set on the job row, conditioned on IN_PROGRESS at h.Job's
// attempt, with an OPERATION_HANDED_OFF history entry written first by the
// cluster's compare-and-set (no state change; the cluster stays held by the
// job). A job that no longer holds its cluster is ErrNotHeld, one that ended
// or was adopted since a *JobConflictError; nothing is written either way.
func (s *Store) HandOffJob(ctx context.Context, h HandOff) (Job, error) {
	j := h.Job
	if j.ResourceID == "" {
		return Job{}, fmt.Errorf("hand off job %s: it names no cluster: %w", j.ID, ErrNotHeld)
	}
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		c, err := s.guardJob(tx, j, "hand-off")
		if err != nil {
			return err
		}
		if _, err := s.casCluster(tx, Transition{
			ClusterID: c.ID, Expect: c.Expect(), Operation: j.ID, History: OperationHandedOff,
			Server: h.Server, Message: h.Message,
		}); err != nil {
			return err
		}
		return updateHeld(tx, j.ID, j.Attempt, "handed_off = ?, update_time = ?", true, s.stamp())
	})
	if errors.Is(err, errMissed) {
		return s.jobMissed(ctx, j.ID)
	}
	if err != nil {
		return Job{}, fmt.Errorf("hand off job %s: %w", j.ID, err)
	}
	return s.GetJob(ctx, j.ID)
}

// guardJob passes the guard for a write of job j's own (its hand-off or
// adoption) at j's attempt and returns the cluster as locked. A cluster that
// does not exist is ErrNotFound, one that no longer names j as its current
// operation ErrNotHeld, and a job that ended or was adopted since j was
// read errMissed (each caller says what that means to it).
func (s *Store) guardJob(tx *gorm.DB, j Job, step string) (Cluster, error) {
	f := Fence{ClusterID: j.ResourceID, JobID: j.ID, Attempt: j.Attempt, Step: step}
	h, err := s.guard(tx, f, true)
	var fenced *FencedError
	switch {
	case errors.As(err, &fenced) && !h.clusterFound:
		return Cluster{}, fmt.Errorf("cluster %s: %w", j.ResourceID, ErrNotFound)
	case errors.As(err, &fenced) && !h.clusterHeld(f):
		return Cluster{}, fmt.Errorf("cluster %s is held by %q, not job %s: %w", j.ResourceID, h.clusterOp, j.ID, ErrNotHeld)
	case errors.As(err, &fenced):
		return Cluster{}, errMissed
	case err != nil:
		return Cluster{}, err
	}
	return h.cluster.toCluster()
}
