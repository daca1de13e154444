package repository

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/clusterd/clusterd/lifecycle"
)

// ClusterCreated is the first entry of every cluster's history.
const ClusterCreated = "CLUSTER_CREATED"

// NewCluster is what CreateCluster needs to insert a cluster.
type NewCluster struct {
	// ID is generated (a UUIDv7, so ids sort in creation order) when empty.
	ID          string
	Account     string
	DisplayName string
	Description string
	Spec        Spec
}

// NewJob is what a claim needs to insert the job that holds the cluster.
type NewJob struct {
	// ID is generated (UUIDv7) when empty.
	ID                string
	Kind              string
	ServerID          string
	ServerIncarnation string
	RequestID         string
	// RequestHash fingerprints the request (see Job.RequestHash).
	RequestHash string
	Params      string
	StepsTotal  int32
	Deadline    time.Time
}

// Changes are the non-state fields an operation writes together with a
// state change, in the same compare-and-set.
type Changes struct {
	Spec     *Spec
	Endpoint *string
}

// Transition is one compare-and-set write of a cluster (SPEC §3.1): it applies
// only if the cluster still is exactly what the writer read (Expect), and it
// bumps the version.
type Transition struct {
	ClusterID string
	Expect    Expect
	// Event drives the state machine: the new state is
	// lifecycle.Admit(Expect.State, Event), so a refused pair cannot be
	// written. EventUnspecified keeps the state (an operation that ends
	// without a state change only releases the cluster).
	Event lifecycle.Event
	// Operation is the cluster's current operation after the write; empty
	// releases the cluster.
	Operation string
	Changes   Changes
	// History names the history entry of a write without an Event (default
	// OPERATION_ENDED), e.g. RECOVERY_STARTED when recovery takes over an
	// orphaned operation in place.
	History string
	// Server (default: the Store's WithServerID) and Message go to the
	// cluster's history.
	Server  string
	Message string
	// Attempt, when set, also requires the job named by Expect.Operation to
	// be IN_PROGRESS at this attempt (its row locked after the cluster's),
	// so a server whose job another server adopted cannot move the cluster
	// the adopter now drives (SPEC §5 step 4).
	Attempt int32
}

// errMissed marks a compare-and-set that matched no row; the caller turns it
// into ErrNotFound or a *ConflictError by reading the row again.
var errMissed = errors.New("compare-and-set matched no row")

// CreateCluster inserts a CREATED cluster already held by its create job, the
// job and the first history entry in one transaction (SPEC §3.6), so no
// unheld CREATED cluster exists while its creator lives.
func (s *Store) CreateCluster(ctx context.Context, nc NewCluster, nj NewJob) (Cluster, Job, error) {
	now := s.stamp()
	if nc.ID == "" {
		nc.ID = newID()
	}
	if nj.ID == "" {
		nj.ID = newID()
	}
	alive := 1
	row := clusterRow{
		ID:                 nc.ID,
		Account:            nc.Account,
		DisplayName:        nc.DisplayName,
		Alive:              &alive,
		Description:        nc.Description,
		State:              lifecycle.Created.String(),
		Version:            1,
		CurrentOperation:   nj.ID,
		KubernetesVersion:  nc.Spec.KubernetesVersion,
		ControlNodeCount:   nc.Spec.ControlNodeCount,
		WorkerNodeCount:    nc.Spec.WorkerNodeCount,
		ServiceOffering:    nc.Spec.ServiceOffering,
		AutoscalingEnabled: nc.Spec.Autoscaling.Enabled,
		AutoscalingMin:     nc.Spec.Autoscaling.MinSize,
		AutoscalingMax:     nc.Spec.Autoscaling.MaxSize,
		CreateTime:         now,
		UpdateTime:         now,
	}
	job := newJobRow(nj, nc.ID, nc.Account, now)
	ev := eventRow{
		ClusterID: nc.ID, Time: now, FromState: lifecycle.StateUnspecified.String(),
		Event: ClusterCreated, ToState: lifecycle.Created.String(), Operation: nj.ID,
		Server: nj.ServerID, Message: "cluster created",
	}
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		if err := tx.Create(&row).Error; err != nil {
			return fmt.Errorf("insert cluster: %w", classify(err))
		}
		if err := tx.Create(&job).Error; err != nil {
			return fmt.Errorf("insert job: %w", classify(err))
		}
		if err := tx.Create(&ev).Error; err != nil {
			return fmt.Errorf("insert event: %w", classify(err))
		}
		return nil
	})
	if err != nil {
		return Cluster{}, Job{}, fmt.Errorf("create cluster %q: %w", nc.DisplayName, classify(err))
	}
	c, err := row.toCluster()
	return c, job.toJob(), err
}

// GetCluster reads one cluster, destroyed ones included (their state says so).
func (s *Store) GetCluster(ctx context.Context, id string) (Cluster, error) {
	var row clusterRow
	err := s.db.WithContext(ctx).Where("id = ?", id).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Cluster{}, fmt.Errorf("cluster %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Cluster{}, fmt.Errorf("get cluster %s: %w", id, classify(err))
	}
	return row.toCluster()
}

// ClusterQuery selects a page of clusters in creation order.
type ClusterQuery struct {
	// Where keeps the clusters it matches (a Filter on Cluster... fields);
	// the zero Filter keeps all, DESTROYED ones included.
	Where Filter
	// Account, when set, keeps only that account's clusters whatever Where
	// says: the caller's scope.
	Account string
	// After is the id of the last cluster of the previous page.
	After string
	// Limit is the page size; it must be positive.
	Limit int
}

// ListClusters returns up to q.Limit clusters after q.After.
func (s *Store) ListClusters(ctx context.Context, q ClusterQuery) ([]Cluster, error) {
	if q.Limit <= 0 {
		return nil, fmt.Errorf("list clusters: limit %d must be positive", q.Limit)
	}
	where, args, err := q.Where.where(clusterColumns)
	if err != nil {
		return nil, fmt.Errorf("list clusters: %w", err)
	}
	db := s.db.WithContext(ctx).Model(&clusterRow{}).Where("("+where+")", args...)
	if q.Account != "" {
		db = db.Where("account = ?", q.Account)
	}
	if q.After != "" {
		db = db.Where("id > ?", q.After)
	}
	var rows []clusterRow
	if err := db.Order("id").Limit(q.Limit).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list clusters: %w", classify(err))
	}
	return toClusters(rows)
}

// Transition applies one compare-and-set to a cluster and records it in the
// cluster's history, in one transaction. It returns the cluster as written.
// A miss is ErrNotFound or a *ConflictError (errors.Is ErrConflict); a pair
// the state machine refuses is a *lifecycle.TransitionError, and nothing is
// written in either case.
func (s *Store) Transition(ctx context.Context, t Transition) (Cluster, error) {
	var out clusterRow
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		row, err := s.casCluster(tx, t)
		out = row
		return err
	})
	if err != nil {
		return Cluster{}, s.explain(ctx, t, err)
	}
	return out.toCluster()
}

// Claim moves a cluster into an operation and makes the new job its current
// operation (SPEC §3.2): the compare-and-set, the job row and the history
// entry are one transaction, so no claimed cluster exists without its job,
// and no job without its claim. t.Operation is ignored (it becomes the new
// job's id); the job takes the cluster's account. The job is IN_PROGRESS
// when Claim returns.
func (s *Store) Claim(ctx context.Context, t Transition, nj NewJob) (Cluster, Job, error) {
	if nj.ID == "" {
		nj.ID = newID()
	}
	t.Operation = nj.ID
	if t.Server == "" {
		t.Server = nj.ServerID
	}
	var (
		out clusterRow
		job jobRow
	)
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		row, err := s.casCluster(tx, t)
		if err != nil {
			return err
		}
		out = row
		job = newJobRow(nj, t.ClusterID, row.Account, row.UpdateTime)
		if err := tx.Create(&job).Error; err != nil {
			return fmt.Errorf("insert job: %w", classify(err))
		}
		return nil
	})
	if err != nil {
		return Cluster{}, Job{}, s.explain(ctx, t, err)
	}
	c, err := out.toCluster()
	return c, job.toJob(), err
}

// casCluster is the one compare-and-set every cluster write goes through:
// UPDATE ... WHERE id AND state AND version AND current_operation, bumping the
// version, then checking the rows affected; and the history entry. It must run
// inside a transaction.
func (s *Store) casCluster(tx *gorm.DB, t Transition) (clusterRow, error) {
	to := t.Expect.State
	name := OperationEnded
	if t.History != "" {
		name = t.History
	}
	if t.Event != lifecycle.EventUnspecified {
		next, err := lifecycle.Admit(t.Expect.State, t.Event)
		if err != nil {
			return clusterRow{}, fmt.Errorf("cluster %s: %w", t.ClusterID, err)
		}
		to, name = next, t.Event.String()
	}
	now := s.stamp()
	set := map[string]any{
		"state":             to.String(),
		"version":           t.Expect.Version + 1,
		"current_operation": t.Operation,
		"update_time":       now,
	}
	if sp := t.Changes.Spec; sp != nil {
		set["kubernetes_version"] = sp.KubernetesVersion
		set["control_node_count"] = sp.ControlNodeCount
		set["worker_node_count"] = sp.WorkerNodeCount
		set["service_offering"] = sp.ServiceOffering
		set["autoscaling_enabled"] = sp.Autoscaling.Enabled
		set["autoscaling_min"] = sp.Autoscaling.MinSize
		set["autoscaling_max"] = sp.Autoscaling.MaxSize
	}
	if t.Changes.Endpoint != nil {
		set["endpoint"] = *t.Changes.Endpoint
	}
	if to == lifecycle.Destroyed {
		// Soft delete: keep the row, free the display name for reuse.
		set["delete_time"] = now
		set["alive"] = nil
	}
	res := tx.Model(&clusterRow{}).
		Where("id = ? AND state = ? AND version = ? AND current_operation = ?",
			t.ClusterID, t.Expect.State.String(), t.Expect.Version, t.Expect.Operation).
		Updates(set)
	if res.Error != nil {
		return clusterRow{}, fmt.Errorf("update cluster %s: %w", t.ClusterID, classify(res.Error))
	}
	if res.RowsAffected != 1 {
		return clusterRow{}, errMissed
	}
	if t.Attempt > 0 {
		if err := s.atAttemptOf(tx, t.Expect.Operation, t.Attempt); err != nil {
			return clusterRow{}, err
		}
	}
	op := t.Operation
	if op == "" {
		op = t.Expect.Operation
	}
	server := t.Server
	if server == "" {
		server = s.server
	}
	ev := eventRow{
		ClusterID: t.ClusterID, Time: now, FromState: t.Expect.State.String(), Event: name,
		ToState: to.String(), Operation: op, Server: server, Message: t.Message,
	}
	if err := tx.Create(&ev).Error; err != nil {
		return clusterRow{}, fmt.Errorf("insert event for cluster %s: %w", t.ClusterID, classify(err))
	}
	var row clusterRow
	if err := tx.Where("id = ?", t.ClusterID).Take(&row).Error; err != nil {
		return clusterRow{}, fmt.Errorf("read back cluster %s: %w", t.ClusterID, classify(err))
	}
	return row, nil
}

// atAttemptOf locks job id's row and returns errMissed unless the job is
// IN_PROGRESS at attempt. It must run inside a transaction.
func (s *Store) atAttemptOf(tx *gorm.DB, id string, attempt int32) error {
	q := tx.Select("id", "status", "attempt").Where("id = ?", id)
	if s.backend == MySQL {
		q = q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	var j jobRow
	err := q.Take(&j).Error
	switch {
	case errors.Is(err, gorm.ErrRecordNotFound):
		return errMissed
	case err != nil:
		return fmt.Errorf("lock job %s: %w", id, classify(err))
	case j.Status != string(JobInProgress) || j.Attempt != attempt:
		return errMissed
	}
	return nil
}

// explain turns a missed compare-and-set into ErrNotFound or a *ConflictError
// saying what the row holds now, and wraps everything else with context. A
// lock conflict is not a miss: it was retried (see retrying) and, if it kept
// failing, is ErrUnavailable, since nobody need have changed the cluster.
func (s *Store) explain(ctx context.Context, t Transition, err error) error {
	if !errors.Is(err, errMissed) {
		return fmt.Errorf("cluster %s: %w", t.ClusterID, err)
	}
	conflict := &ConflictError{ClusterID: t.ClusterID, Want: t.Expect}
	got, gerr := s.GetCluster(ctx, t.ClusterID)
	if errors.Is(gerr, ErrNotFound) {
		return gerr
	}
	if gerr == nil {
		conflict.Got = got.Expect()
	}
	return conflict
}

// ListEvents returns up to limit history entries of a cluster after the
// entry with id after (0 for the first page), oldest first.
func (s *Store) ListEvents(ctx context.Context, clusterID string, after int64, limit int) ([]Event, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("list events: limit %d must be positive", limit)
	}
	var rows []eventRow
	err := s.db.WithContext(ctx).Where("cluster_id = ? AND id > ?", clusterID, after).
		Order("id").Limit(limit).Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("list events of cluster %s: %w", clusterID, classify(err))
	}
	out := make([]Event, len(rows))
	for i := range rows {
		out[i] = rows[i].toEvent()
	}
	return out, nil
}

// stamp is the time written to rows: UTC, at the microsecond precision MySQL
// keeps, so a value read back equals the value written.
func (s *Store) stamp() time.Time {
	return s.now().UTC().Truncate(time.Microsecond)
}

// newID returns a UUIDv7: unique, and sorted by creation time, which keyset
// pagination by id relies on.
func newID() string {
	return uuid.Must(uuid.NewV7()).String()
}
