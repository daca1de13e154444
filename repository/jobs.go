package repository

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// ErrNotHeld: a job ended, but the cluster was no longer held by it (someone
// else took it since), so the cluster was left alone (SPEC §3.5). The job's
// own row was written.
var ErrNotHeld = errors.New("operation no longer holds the cluster")

func newJobRow(nj NewJob, clusterID, account string, now time.Time) jobRow {
	return jobRow{
		ID:                nj.ID,
		Kind:              nj.Kind,
		Account:           account,
		ResourceID:        nullable(clusterID),
		ServerID:          nj.ServerID,
		ServerIncarnation: nj.ServerIncarnation,
		Status:            string(JobInProgress),
		RequestID:         nullable(nj.RequestID),
		RequestHash:       nj.RequestHash,
		Params:            nj.Params,
		Step:              nj.Step,
		StepsTotal:        nj.StepsTotal,
		Attempt:           1,
		Deadline:          nj.Deadline.UTC().Truncate(time.Microsecond),
		CreateTime:        now,
		UpdateTime:        now,
	}
}

// insertJob inserts a new job's row (written out: every claim makes one).
func insertJob(tx *gorm.DB, j jobRow) error {
	_, err := execDirect(tx, "INSERT INTO jobs (id, kind, account, resource_id, server_id, server_incarnation, status, request_id, request_hash,"+
		" params, result, error, step, steps_done, steps_total, cancel_requested, deadline, create_time, update_time,"+
		" target_version, target_offering)"+
		" VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
		j.ID, j.Kind, j.Account, j.ResourceID, j.ServerID, j.ServerIncarnation, j.Status, j.RequestID, j.RequestHash,
		j.Params, j.Result, j.Error, j.Step, j.StepsDone, j.StepsTotal, j.CancelRequested, j.Deadline, j.CreateTime, j.UpdateTime,
		j.TargetVersion, j.TargetOffering)
	if err != nil {
		return fmt.Errorf("insert job: %w", classify(err))
	}
	return nil
}

// GetJob reads one job.
func (s *Store) GetJob(ctx context.Context, id string) (Job, error) {
	row, err := scanJob(rowDirect(s.rdb.WithContext(ctx), "SELECT "+s.cols.job+" FROM jobs WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return Job{}, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Job{}, fmt.Errorf("get job %s: %w", id, classify(err))
	}
	return row.toJob(), nil
}

// scanJob scans one row of hotColumns.job: a job's read is written out and
// scanned by hand, since every GetOperation and every WaitOperation (at each
// wake) reads one.
func scanJob(r interface{ Scan(dest ...any) error }) (jobRow, error) {
	var j jobRow
	err := r.Scan(&j.ID, &j.Kind, &j.Account, &j.ResourceID, &j.ServerID, &j.ServerIncarnation, &j.Status, &j.RequestID, &j.RequestHash,
		&j.Params, &j.Result, &j.Error, &j.Step, &j.StepsDone, &j.StepsTotal, &j.CancelRequested, &j.Attempt, &j.HandedOff,
		stamp{&j.Deadline}, stamp{&j.CreateTime}, stamp{&j.UpdateTime}, maybeStamp{&j.EndTime})
	return j, err
}

// GetJobByRequestID finds the job a request id (AIP-155) of an account
// created, so a retried request returns the same operation. Request ids are
// keys per account: another account's use of the same id is not found.
func (s *Store) GetJobByRequestID(ctx context.Context, account, requestID string) (Job, error) {
	var row jobRow
	err := s.rdb.WithContext(ctx).Where("account = ? AND request_id = ?", account, requestID).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Job{}, fmt.Errorf("job with request id %q in account %q: %w", requestID, account, ErrNotFound)
	}
	if err != nil {
		return Job{}, fmt.Errorf("get job by request id %q: %w", requestID, classify(err))
	}
	return row.toJob(), nil
}

// JobQuery selects a page of jobs in creation order.
type JobQuery struct {
	// Where keeps the jobs it matches (a Filter on Job... fields); the zero
	// Filter keeps all.
	Where Filter
	// Account, when set, keeps only that account's jobs whatever Where says:
	// the caller's scope.
	Account string
	// After is the id of the last job of the previous page.
	After string
	// Limit is the page size; it must be positive.
	Limit int
}

// ListJobs returns up to q.Limit jobs after q.After.
func (s *Store) ListJobs(ctx context.Context, q JobQuery) ([]Job, error) {
	if q.Limit <= 0 {
		return nil, fmt.Errorf("list jobs: limit %d must be positive", q.Limit)
	}
	where, args, err := q.Where.where(jobColumns)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	db := s.rdb.WithContext(ctx).Model(&jobRow{}).Where("("+where+")", args...)
	if q.Account != "" {
		db = db.Where("account = ?", q.Account)
	}
	if q.After != "" {
		db = db.Where("id > ?", q.After)
	}
	var rows []jobRow
	if err := db.Order("id").Limit(q.Limit).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list jobs: %w", classify(err))
	}
	return toJobs(rows), nil
}

// Progress is where a running job is.
type Progress struct {
	Step       string
	StepsDone  int32
	StepsTotal int32
	// Attempt, when set, is the attempt of the job that writes: the write
	// misses once the job has been adopted by another server (Job.Attempt).
	Attempt int32
}

// RecordProgress stores a running job's step and returns the job's status
// and cancellation flag as stored with the progress written, so the runner
// learns in the same round trip whether a cancellation was requested
// (possibly through another server). The write is conditioned on the job
// running at p.Attempt and not cancelled, so the usual step is one write
// (with its feed row, ChangeProgress, in its transaction) and nothing is
// read; only a job that was cancelled (the job returned is then the whole
// row, CancelRequested set), is no longer IN_PROGRESS
// (recovery failed it) or is no longer at p.Attempt (another server adopted
// it) is read: the last two are a *JobConflictError, its work must stop.
// Progress writes only the job's own row, so it carries only the job's half
// of the guard (whereHeld) and locks nothing: a driver's changes, not the
// record of a step, are what the guard's cluster lock orders.
func (s *Store) RecordProgress(ctx context.Context, jobID string, p Progress) (Job, error) {
	var (
		written         int64 // rows the last write changed
		now             time.Time
		unlessCancelled = true
	)
	write := func() error {
		return s.batched(ctx, func(tx *gorm.DB) error {
			now = s.stamp()
			// Written out: every step of every job writes it.
			held, args := heldCond(jobID, p.Attempt)
			if unlessCancelled {
				held += " AND cancel_requested = ?"
				args = append(args, false)
			}
			var err error
			written, err = execDirect(tx, "UPDATE jobs SET step = ?, steps_done = ?, steps_total = ?, update_time = ? WHERE "+held,
				append([]any{p.Step, p.StepsDone, p.StepsTotal, now}, args...)...)
			if err != nil || written != 1 {
				return classify(err)
			}
			return s.recordJobChanges(tx, ChangeProgress, "j.id = ?", jobID)
		})
	}
	if err := write(); err != nil {
		return Job{}, fmt.Errorf("record progress of job %s: %w", jobID, err)
	}
	if written == 1 {
		return Job{ID: jobID, Status: JobInProgress, Attempt: p.Attempt, Step: p.Step, StepsDone: p.StepsDone, StepsTotal: p.StepsTotal, UpdateTime: now}, nil
	}
	job, err := s.GetJob(ctx, jobID)
	if err != nil {
		return Job{}, err
	}
	if job.Status != JobInProgress || (p.Attempt > 0 && job.Attempt != p.Attempt) {
		return job, jobConflict(job)
	}
	// Cancelled: the step is still recorded, so the operation shows where
	// it stopped.
	unlessCancelled = false
	if err := write(); err != nil {
		return Job{}, fmt.Errorf("record progress of job %s: %w", jobID, err)
	}
	if written != 1 {
		return s.jobMissed(ctx, jobID) // ended or adopted in between
	}
	job.Step, job.StepsDone, job.StepsTotal, job.UpdateTime = p.Step, p.StepsDone, p.StepsTotal, now
	return job, nil
}

// whereHeld conditions a write of job id on the job's half of the guard:
// the job is IN_PROGRESS and, when attempt is set, at that attempt. A job's
// own writes carry it even after passing the guard, so each stays one
// compare-and-set on the job's row; progress, which writes nothing else,
// carries only it and takes no lock (see RecordProgress).
func whereHeld(db *gorm.DB, id string, attempt int32) *gorm.DB {
	cond, args := heldCond(id, attempt)
	return db.Where(cond, args...)
}

// heldCond is whereHeld's condition, for a statement written out.
func heldCond(id string, attempt int32) (string, []any) {
	if attempt > 0 {
		return "id = ? AND status = ? AND attempt = ?", []any{id, string(JobInProgress), attempt}
	}
	return "id = ? AND status = ?", []any{id, string(JobInProgress)}
}

// JobConflictError says a job write expected the job IN_PROGRESS at the
// writer's attempt, but found it already ended (by its runner or by
// recovery), or adopted by another server since (Status IN_PROGRESS, a later
// Attempt).
type JobConflictError struct {
	JobID  string
	Status JobStatus
	// Attempt and ServerID are the job's as found.
	Attempt  int32
	ServerID string
}

func jobConflict(j Job) *JobConflictError {
	return &JobConflictError{JobID: j.ID, Status: j.Status, Attempt: j.Attempt, ServerID: j.ServerID}
}

// updateHeld writes set (assignments of columns to placeholders, and their
// arguments) to job id while it is IN_PROGRESS at attempt (any, when 0; see
// whereHeld); errMissed when it is not. Written out: every job's end writes
// it.
func updateHeld(tx *gorm.DB, id string, attempt int32, set string, args ...any) error {
	held, hargs := heldCond(id, attempt)
	n, err := execDirect(tx, "UPDATE jobs SET "+set+" WHERE "+held, append(args, hargs...)...)
	switch {
	case err != nil:
		return fmt.Errorf("update job: %w", classify(err))
	case n != 1:
		return errMissed
	}
	return nil
}

// jobMissed reads the job a conditioned write missed and returns it with
// why: a *JobConflictError naming its status or its adopter (or the read's
// error).
func (s *Store) jobMissed(ctx context.Context, id string) (Job, error) {
	job, err := s.GetJob(ctx, id)
	if err != nil {
		return Job{}, err
	}
	return job, jobConflict(job)
}

// Error names the status the job already has, or who adopted it.
func (e *JobConflictError) Error() string {
	if e.Status == JobInProgress {
		return fmt.Sprintf("job %s was adopted: attempt %d runs on server %s", e.JobID, e.Attempt, e.ServerID)
	}
	return fmt.Sprintf("job %s already ended: %s", e.JobID, e.Status)
}

// Unwrap makes errors.Is(err, ErrConflict) true.
func (e *JobConflictError) Unwrap() error { return ErrConflict }

// RequestCancel marks a running job for cooperative cancellation (its runner
// stops at the next step). Cancelling a finished job changes nothing and is
// not an error; the job is returned as stored either way. The first request
// appends a progress row to the change feed, so that watchers learn of it
// before the job's next step.
func (s *Store) RequestCancel(ctx context.Context, jobID string) (Job, error) {
	err := s.batched(ctx, func(tx *gorm.DB) error {
		res := tx.Model(&jobRow{}).
			Where("id = ? AND status = ? AND cancel_requested = ?", jobID, string(JobInProgress), false).
			Updates(map[string]any{"cancel_requested": true, "update_time": s.stamp()})
		if res.Error != nil || res.RowsAffected != 1 {
			return classify(res.Error)
		}
		return s.recordJobChanges(tx, ChangeProgress, "j.id = ?", jobID)
	})
	if err != nil {
		return Job{}, fmt.Errorf("cancel job %s: %w", jobID, err)
	}
	return s.GetJob(ctx, jobID)
}

// CancelRequested returns, in id order, which of the jobs ids are
// IN_PROGRESS with a cancellation requested: a runner asks it of the jobs
// it runs, so that a cancel sent through another server reaches a step in
// flight (runner.Config.WatchCancels) rather than waiting for the job's
// next step. It reads the cancelled jobs in progress (jobs_status_cancel),
// which are few, whatever the number of ids, and keeps those asked about:
// a server running thousands of jobs asks every heartbeat.
func (s *Store) CancelRequested(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var found []string
	err := s.rdb.WithContext(ctx).Model(&jobRow{}).
		Where("status = ? AND cancel_requested = ?", string(JobInProgress), true).
		Order("id").Pluck("id", &found).Error
	if err != nil {
		return nil, fmt.Errorf("read cancellations of %d jobs: %w", len(ids), classify(err))
	}
	asked := make(map[string]bool, len(ids))
	for _, id := range ids {
		asked[id] = true
	}
	out := found[:0]
	for _, id := range found {
		if asked[id] {
			out = append(out, id)
		}
	}
	return out, nil
}

// Finish is how a job ends.
type Finish struct {
	JobID  string
	Status JobStatus
	Result string
	Error  string
	// Release, when set, moves the cluster the job holds (its Operation is
	// forced to empty: the job lets go). It applies only while the job still
	// holds the cluster; otherwise the job still ends and FinishJob returns
	// ErrNotHeld.
	Release *Transition
	// Attempt, when set, is the attempt that ends the job: nothing is
	// written once another server has adopted it (Job.Attempt).
	Attempt int32
	// Progress, when set, is the job's last progress, written with its end
	// rather than in a statement of its own.
	Progress *Progress
	// Job, when set, is the job as its runner knows it (as claimed, with its
	// progress): FinishJob returns it as ended instead of reading the row
	// back. A cancellation requested since the runner last looked is then
	// not in it.
	Job *Job
}

// FinishJob ends an IN_PROGRESS job and, in the same transaction, releases the
// cluster it holds. A job that already ended, or that another server adopted
// since f.Attempt, is a *JobConflictError and nothing is written (the
// cluster's release included: it is one transaction). With a release, the
// job passes the guard first (the cluster's row, then the job's, locked), so
// its end is ordered against a driver's fenced change like every other
// write that takes the cluster from it.
func (s *Store) FinishJob(ctx context.Context, f Finish) (Job, error) {
	if !f.Status.Done() {
		return Job{}, fmt.Errorf("finish job %s: status %s is not final", f.JobID, f.Status)
	}
	notHeld := false
	var now time.Time
	err := s.batched(ctx, func(tx *gorm.DB) error {
		notHeld = false // this may be a second attempt
		if f.Release != nil {
			t := *f.Release
			t.Operation = ""
			h, err := s.guard(tx, Fence{ClusterID: t.ClusterID, JobID: f.JobID, Attempt: f.Attempt, Step: "finish"}, false)
			var fenced *FencedError
			switch {
			case err != nil && !errors.As(err, &fenced):
				return err
			case errors.As(err, &fenced) && h.clusterHeld(fenced.Fence):
				return errMissed // the job ended or was adopted: nothing is written
			case errors.As(err, &fenced) || t.Expect.Operation != f.JobID:
				notHeld = true // the job still ends; the cluster is left alone
			default:
				if _, err := s.casCluster(tx, t); errors.Is(err, errMissed) {
					notHeld = true
				} else if err != nil {
					return err
				}
			}
		}
		now = s.stamp()
		set := "status = ?, result = ?, error = ?, end_time = ?, update_time = ?"
		args := []any{string(f.Status), f.Result, f.Error, now, now}
		if p := f.Progress; p != nil {
			set += ", step = ?, steps_done = ?, steps_total = ?"
			args = append(args, p.Step, p.StepsDone, p.StepsTotal)
		}
		if err := updateHeld(tx, f.JobID, f.Attempt, set, args...); err != nil {
			return err
		}
		return s.recordJobChanges(tx, ChangeJobEnded, "j.id = ?", f.JobID)
	})
	if errors.Is(err, errMissed) {
		return s.jobMissed(ctx, f.JobID)
	}
	if err != nil {
		return Job{}, fmt.Errorf("finish job %s: %w", f.JobID, err)
	}
	var job Job
	if f.Job != nil {
		job = *f.Job
		job.Status, job.Result, job.Error, job.EndTime, job.UpdateTime = f.Status, f.Result, f.Error, &now, now
		if p := f.Progress; p != nil {
			job.Step, job.StepsDone, job.StepsTotal = p.Step, p.StepsDone, p.StepsTotal
		}
	} else if job, err = s.GetJob(ctx, f.JobID); err != nil {
		return Job{}, err
	}
	if notHeld {
		return job, fmt.Errorf("job %s ended %s, cluster %s left alone: %w", f.JobID, f.Status, f.Release.ClusterID, ErrNotHeld)
	}
	return job, nil
}
