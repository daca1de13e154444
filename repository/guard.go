package repository

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Fence is the fencing token of a change a job makes (SPEC §6): the job
// making it, its attempt, and the cluster it acts on. A change is let
// through only while the job still holds the cluster: the cluster names it
// as its current operation, the job is IN_PROGRESS, and (when Attempt is
// set) the job is still at that attempt, so a server whose job another
// server adopted is refused (SPEC §5 step 4). Step and MachineID only go to
// messages and logs.
type Fence struct {
	ClusterID string
	JobID     string
	Attempt   int32
	Step      string
	MachineID string
}

// ErrFenced: a change was refused because its job no longer holds the
// cluster (recovery failed the job, another operation took the cluster,
// another server adopted the job). Nothing was written.
var ErrFenced = errors.New("job no longer holds the cluster")

// FencedError says why a change was refused.
type FencedError struct {
	Fence
	// Reason is what was found instead: the holder, or the job's status
	// or attempt.
	Reason string
}

// Error names the change, the job and what was found.
func (e *FencedError) Error() string {
	step := e.Step
	if step == "" {
		step = "change"
	}
	return fmt.Sprintf("%s by job %s on cluster %s refused: %s", step, e.JobID, e.ClusterID, e.Reason)
}

// Unwrap makes errors.Is(err, ErrFenced) true.
func (e *FencedError) Unwrap() error { return ErrFenced }

// held is what the guard found under its locks: the columns its check
// reads (a row not found leaves them zero), and the cluster's whole row when
// the caller asked for it (guardJob).
type held struct {
	clusterOp  string // the cluster's current operation
	jobStatus  string
	jobAttempt int32
	jobServer  string
	cluster    clusterRow
	// clusterFound and jobFound say whether the rows exist.
	clusterFound, jobFound bool
}

// clusterHeld says whether the cluster exists and names the job as its
// current operation, whatever the job's own row says.
func (h held) clusterHeld(f Fence) bool {
	return h.clusterFound && h.clusterOp == f.JobID
}

// guard is the one check that a job holds its cluster. A job's end
// (FinishJob, when it releases the cluster), its hand-off and adoption, and
// a driver's fenced changes (Guarded, CheckHolder) pass it; progress, which
// writes only the job's row, carries its job half (whereHeld). It must run
// inside a transaction. It locks the cluster's row, then the job's
// (SELECT ... FOR UPDATE on MySQL; a SQLite transaction holds the database's
// write lock already), always in that order: every transaction that locks
// both rows does it here, so none of them waits for another's second lock
// while holding a lock that one wants; the other writes that take a cluster
// from a job (a claim's or a recovery's compare-and-set, recovery failing a
// job) lock one of the two rows only. With both rows locked it checks that the
// cluster's current operation is f.JobID, that the job is IN_PROGRESS and,
// when f.Attempt is set, that the job is at that attempt. If not, the error
// is a *FencedError saying what was found; the rows found are returned
// either way, so a caller can tell "the cluster is no longer held" from
// "the job ended or was adopted" and keep its own typed errors.
//
// The reads are written out and read only what the check needs: every
// step of every job passes the guard (a driver's fenced change, the job's
// end), so both rows are read in one statement, an outer join from the
// cluster's row to the job's, which MariaDB reads, and locks, in that
// order. With whole set, the cluster's row is read whole (held.cluster),
// then the job's.
func (s *Store) guard(tx *gorm.DB, f Fence, whole bool) (held, error) {
	var h held
	lock := ""
	if s.backend == MySQL {
		lock = " FOR UPDATE"
	}
	if !whole {
		// One statement: the outer join reads (and locks) the cluster's row
		// first and the job's with it; a cluster that does not exist reads
		// no row, and the job is read alone below.
		var (
			status, server sql.NullString
			attempt        sql.NullInt32
		)
		err := rowDirect(tx, "SELECT c.current_operation, j.status, j.attempt, j.server_id FROM clusters c"+
			" LEFT JOIN jobs j ON j.id = ? WHERE c.id = ?"+lock, f.JobID, f.ClusterID).Scan(&h.clusterOp, &status, &attempt, &server)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if err := s.lockJob(tx, f, lock, &h); err != nil {
				return h, err
			}
		case err != nil:
			return h, fmt.Errorf("lock cluster %s and job %s: %w", f.ClusterID, f.JobID, classify(err))
		default:
			h.clusterFound = true
			h.jobFound = status.Valid
			h.jobStatus, h.jobAttempt, h.jobServer = status.String, attempt.Int32, server.String
		}
	} else {
		db := tx.Where("id = ?", f.ClusterID)
		if lock != "" {
			db = db.Clauses(clause.Locking{Strength: "UPDATE"})
		}
		err := db.Take(&h.cluster).Error
		switch {
		case errors.Is(err, gorm.ErrRecordNotFound):
		case err != nil:
			return h, fmt.Errorf("lock cluster %s: %w", f.ClusterID, classify(err))
		default:
			h.clusterFound = true
			h.clusterOp = h.cluster.CurrentOperation
		}
		if err := s.lockJob(tx, f, lock, &h); err != nil {
			return h, err
		}
	}
	if reason := h.refusal(f); reason != "" {
		return h, &FencedError{Fence: f, Reason: reason}
	}
	return h, nil
}

// lockJob reads (and locks) the guard's job row alone, into h.
func (s *Store) lockJob(tx *gorm.DB, f Fence, lock string, h *held) error {
	err := rowDirect(tx, "SELECT status, attempt, server_id FROM jobs WHERE id = ?"+lock, f.JobID).Scan(&h.jobStatus, &h.jobAttempt, &h.jobServer)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return fmt.Errorf("lock job %s: %w", f.JobID, classify(err))
	default:
		h.jobFound = true
	}
	return nil
}

// refusal says why the rows found do not let f's job change f's cluster, or
// "" if they do.
func (h held) refusal(f Fence) string {
	switch {
	case !h.clusterFound:
		return "the cluster does not exist"
	case !h.jobFound:
		return "the job does not exist"
	case h.clusterOp == "":
		return "no operation holds the cluster"
	case h.clusterOp != f.JobID:
		return "the cluster is held by operation " + h.clusterOp
	case h.jobStatus != string(JobInProgress):
		return "the job is " + h.jobStatus
	case f.Attempt > 0 && h.jobAttempt != f.Attempt:
		return fmt.Sprintf("the job was adopted: attempt %d runs on server %s, not attempt %d", h.jobAttempt, h.jobServer, f.Attempt)
	}
	return ""
}

// Guarded runs fn, the writes of one fenced change (a driver's bookkeeping,
// such as the simulator's machines and its call log), in one transaction
// that first passes the guard: with the cluster's and then the job's rows
// locked, f.JobID (at f.Attempt) must hold f.ClusterID. If it does not, fn
// does not run, nothing is written, and the error is a *FencedError
// (ErrFenced). The locks order the change against everything that could take
// the cluster from the job (a recovery failing the job, another server
// adopting it, another operation's claim, the job's own end): they happen
// wholly before the change (which is then refused) or after it.
//
// fn gets a Store bound to the transaction: its methods, and the statements
// a driver sends through its Conn, are part of it. The whole transaction is
// run again when it loses a lock conflict (see retrying), so fn must be safe
// to run again and must reset whatever it records outside the database.
func (s *Store) Guarded(ctx context.Context, f Fence, fn func(tx *Store) error) error {
	if f.ClusterID == "" || f.JobID == "" {
		return &FencedError{Fence: f, Reason: "the change names no job or no cluster"}
	}
	return s.transaction(ctx, func(tx *gorm.DB) error {
		if _, err := s.guard(tx, f, false); err != nil {
			return err
		}
		return fn(s.bound(tx))
	})
}

// CheckHolder passes the guard in a transaction of its own and commits at
// once: nil if f.JobID (at f.Attempt) holds f.ClusterID at that moment, a
// *FencedError (ErrFenced) if not. It is for a driver whose changes go to an
// external API that cannot join the transaction: the driver calls it
// immediately before and immediately after each change, so a change made
// while the job lost the cluster is caught by the second check and treated
// as the step's own failure (infra's package doc, Fencing).
func (s *Store) CheckHolder(ctx context.Context, f Fence) error {
	return s.Guarded(ctx, f, func(*Store) error { return nil })
}

// bound returns a Store whose writes and reads go to transaction tx.
func (s *Store) bound(tx *gorm.DB) *Store {
	b := *s
	b.db, b.rdb, b.inTx = tx, tx, true
	return &b
}
