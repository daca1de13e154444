package repository

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

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
	// Secrets, sealed by the caller for cluster ID (NewClusterID), are
	// inserted in the create's transaction: a cluster never exists without
	// its credentials, nor credentials without their cluster.
	Secrets []Secret
	// Quota, when set, refuses the create if it would take the account
	// past its limits (see the package doc, "Quotas").
	Quota *QuotaCheck
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
	// Step and StepsTotal are the job's progress as its claim writes it:
	// the step the job will start first, when the claim already knows it
	// (its runner then reads that step's row instead of writing it again),
	// and the steps it expects.
	Step       string
	StepsTotal int32
	Deadline   time.Time
}

// Changes are the non-state fields an operation writes together with a
// state change, in the same compare-and-set.
type Changes struct {
	Spec     *Spec
	Endpoint *string
	// Hold is what the cluster is about to hold while the operation runs
	// (a claim that grows it writes it). Every write that releases the
	// cluster clears it.
	Hold *Hold
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
	// without a state change only releases the cluster). Ignored when
	// Decided is set.
	Event lifecycle.Event
	// Decided, when set, is the state machine's decision for this write,
	// made by the caller from the cluster it read (lifecycle.Decide, End or
	// Stay); its From must be Expect.State. The write carries it out as
	// decided, without asking the state machine again.
	Decided *lifecycle.Decision
	// Read, when set, is the cluster as the caller read it (Read.Expect()
	// must be Expect). Since every write bumps the version, the row the
	// compare-and-set hits is exactly Read, so the cluster as written is
	// returned without reading it back.
	Read *Cluster
	// Operation is the cluster's current operation after the write; empty
	// releases the cluster.
	Operation string
	Changes   Changes
	// Uses are the catalog entries a Claim needs ENABLED and takes in its
	// transaction (an upgrade's target version, a scale's new offering);
	// the claim's job records the version and offering as its targets, so
	// a delete of either is refused while the job runs. Transition, which
	// starts no operation, ignores them.
	Uses Uses
	// History names the history entry of a write without an Event (default
	// OPERATION_ENDED), e.g. RECOVERY_STARTED when recovery takes over an
	// orphaned operation in place.
	History string
	// Server (default: the Store's WithServerID) and Message go to the
	// cluster's history.
	Server  string
	Message string
	// Quota, when set, refuses the write if it would take the cluster's
	// account past its limits (see the package doc, "Quotas"). Claims that
	// may grow a cluster set it.
	Quota *QuotaCheck
}

// Move is the transition that carries out decision d on cluster c as read:
// the compare-and-set expects c, writes d, and returns the cluster as
// written without reading it back. Set Operation, Changes and the history
// fields on the result.
func Move(c Cluster, d lifecycle.Decision) Transition {
	return Transition{ClusterID: c.ID, Expect: c.Expect(), Decided: &d, Read: &c}
}

// Apply returns c as the transition writes it at time now (its state,
// version, holder, changes and, once DESTROYED, delete time): what the
// row holds after the write when c is what it held before.
func (t Transition) Apply(c Cluster, now time.Time) Cluster {
	c.State = t.to()
	c.Version = t.Expect.Version + 1
	c.CurrentOperation = t.Operation
	c.UpdateTime = now
	if sp := t.Changes.Spec; sp != nil {
		c.Spec = *sp
	}
	if t.Changes.Endpoint != nil {
		c.Endpoint = *t.Changes.Endpoint
	}
	if c.State == lifecycle.Destroyed {
		c.DeleteTime = &now
	}
	if st, ok := t.status(now); ok {
		c.Status = st
	}
	return c
}

// maxStatusMessage bounds the status message (the column's width, in
// characters); the history entry keeps the whole message.
const maxStatusMessage = 1024

// status is the status message the write leaves (lifecycle.StatusOn), and
// false when it keeps the one the cluster has.
func (t Transition) status(now time.Time) (Status, bool) {
	switch lifecycle.StatusOn(t.Expect.State, t.to()) {
	case lifecycle.StatusSet:
		msg := t.Message
		if r := []rune(msg); len(r) > maxStatusMessage {
			msg = string(r[:maxStatusMessage-1]) + "…"
		}
		return Status{Message: msg, Time: &now}, true
	case lifecycle.StatusCleared:
		return Status{}, true
	}
	return Status{}, false
}

// to is the state a decided transition writes (Expect.State otherwise; only
// call it once decide has checked the transition).
func (t Transition) to() lifecycle.State {
	if t.Decided != nil {
		return t.Decided.To
	}
	return t.Expect.State
}

// errMissed marks a compare-and-set that matched no row; the caller turns it
// into ErrNotFound or a *ConflictError by reading the row again.
var errMissed = errors.New("compare-and-set matched no row")

// CreateCluster inserts a CREATED cluster already held by its create job, the
// job and the first history entry in one transaction (SPEC §3.6), so no
// unheld CREATED cluster exists while its creator lives. The same
// transaction takes the cluster's Kubernetes version and offerings (see the
// package doc, "The catalog"): a missing or DISABLED one is an
// *UnusableError and nothing is written.
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
		ControlOffering:    nc.Spec.ControlOffering,
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
	uses := Uses{Version: nc.Spec.KubernetesVersion, Offering: nc.Spec.ServiceOffering, ControlOffering: nc.Spec.ControlOffering}
	err := s.batched(ctx, func(tx *gorm.DB) error {
		ctx := tx.Statement.Context // the transaction's: on SQLite, not cancelled (see batcher)
		if err := s.use(tx, uses); err != nil {
			return err
		}
		if nc.Quota != nil {
			if err := s.bumpClaims(tx, nc.Account); err != nil {
				return err
			}
		}
		if err := tx.Create(&row).Error; err != nil {
			return fmt.Errorf("insert cluster: %w", classify(err))
		}
		if err := tx.Create(&job).Error; err != nil {
			return fmt.Errorf("insert job: %w", classify(err))
		}
		// A fresh copy each attempt: a retried transaction must not insert
		// the id the rolled-back one was given, or the feed row below would
		// not name this entry (an explicit id leaves LAST_INSERT_ID as the
		// connection's previous insert).
		entry := ev
		if err := tx.Create(&entry).Error; err != nil {
			return fmt.Errorf("insert event: %w", classify(err))
		}
		if err := s.recordClusterChange(tx, nc.ID, nj.ID); err != nil {
			return err
		}
		if err := insertSecrets(tx, nc.ID, nc.Secrets, now); err != nil {
			return err
		}
		if nc.Quota != nil {
			check := nc.Quota.memo(tx)
			delta, err := heldRow{ControlNodeCount: nc.Spec.ControlNodeCount, WorkerNodeCount: nc.Spec.WorkerNodeCount,
				ServiceOffering: nc.Spec.ServiceOffering, ControlOffering: nc.Spec.ControlOffering}.usage(ctx, check.Size)
			if err != nil {
				return fmt.Errorf("usage of the new cluster: %w", err)
			}
			return s.checkQuota(ctx, tx, nc.Account, delta, check)
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
	if !s.inTx {
		cs, err := s.readClusters(ctx, 1, s.cols.getCluster, id)
		switch {
		case err != nil:
			return Cluster{}, fmt.Errorf("get cluster %s: %w", id, classify(err))
		case len(cs) == 0:
			return Cluster{}, fmt.Errorf("cluster %s: %w", id, ErrNotFound)
		}
		return cs[0], nil
	}
	var row clusterRow
	err := s.rdb.WithContext(ctx).Where("id = ?", id).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Cluster{}, fmt.Errorf("cluster %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Cluster{}, fmt.Errorf("get cluster %s: %w", id, classify(err))
	}
	return row.toCluster()
}

// GetClusterWithMachines is GetCluster and ListMachines of that cluster
// (oldest first) in one statement: one round trip to the database where
// the two reads made two, and the machines read in the same snapshot as the
// row. GetCluster's RPC makes it for every call.
func (s *Store) GetClusterWithMachines(ctx context.Context, id string) (Cluster, []Machine, error) {
	if s.inTx {
		c, err := s.GetCluster(ctx, id)
		if err != nil {
			return Cluster{}, nil, err
		}
		ms, err := s.ListMachines(ctx, id)
		if err != nil {
			return Cluster{}, nil, fmt.Errorf("get cluster %s with its machines: %w", id, err)
		}
		return c, ms, nil
	}
	c, ms, err := s.readClusterWithMachines(ctx, id)
	if err != nil {
		return Cluster{}, nil, fmt.Errorf("get cluster %s with its machines: %w", id, classify(err))
	}
	if c.ID == "" {
		return Cluster{}, nil, fmt.Errorf("cluster %s: %w", id, ErrNotFound)
	}
	return c, ms, nil
}

// readClusterWithMachines runs GetClusterWithMachines's statement: a row a
// machine, each carrying the cluster's columns too (one row with the
// machine's columns NULL when it has none, none when the cluster does not
// exist). The cluster is scanned from the first row; later rows' cluster
// columns are discarded.
func (s *Store) readClusterWithMachines(ctx context.Context, id string) (Cluster, []Machine, error) {
	rows, err := s.readDB().QueryContext(ctx, s.cols.getClusterMachines, id)
	if err != nil {
		return Cluster{}, nil, err
	}
	defer rows.Close()
	var (
		row                clusterRow
		alive              sql.NullInt64
		ms                 []Machine
		mid, role, power   sql.NullString
		k8s, iso, offering sql.NullString
		joined, cordoned   sql.NullBool
		created, updated   time.Time
	)
	dest := clusterDest(&row, &alive)
	clusterN := len(dest)
	dest = append(dest, &mid, &role, &power, &joined, &cordoned, &k8s, &iso, &offering,
		joinedStamp{&created}, joinedStamp{&updated})
	for first := true; rows.Next(); first = false {
		if err := rows.Scan(dest...); err != nil {
			return Cluster{}, nil, err
		}
		if first {
			row.setAlive(alive)
			// Room for the machines its spec asks for, up to a bound.
			ms = make([]Machine, 0, min(max(0, int(row.ControlNodeCount)+int(row.WorkerNodeCount)), 64))
			for i := range clusterN {
				dest[i] = discard{} // the same cluster, again
			}
		}
		if !mid.Valid {
			continue // a cluster without machines
		}
		m := Machine{ID: mid.String, ClusterID: row.ID, Role: role.String, Power: power.String, Joined: joined.Bool,
			Cordoned: cordoned.Bool, KubernetesVersion: k8s.String, AttachedISO: iso.String, Offering: offering.String,
			CreateTime: created, UpdateTime: updated}
		ms = append(ms, m)
	}
	if err := rows.Err(); err != nil {
		return Cluster{}, nil, err
	}
	if row.ID == "" {
		return Cluster{}, nil, nil
	}
	c, err := row.toCluster()
	return c, ms, err
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
	query := "SELECT " + s.cols.cluster + " FROM clusters c WHERE (" + where + ")"
	if q.Account != "" {
		query += " AND c.account = ?"
		args = append(args, q.Account)
	}
	if q.After != "" {
		query += " AND c.id > ?"
		args = append(args, q.After)
	}
	cs, err := s.readClusters(ctx, q.Limit, query+" ORDER BY c.id LIMIT ?", append(args, q.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("list clusters: %w", classify(err))
	}
	return cs, nil
}

// readDB is the pool reads outside a transaction go to.
func (s *Store) readDB() *sql.DB {
	if s.rsqlDB != nil {
		return s.rsqlDB
	}
	return s.sqlDB
}

// readClusters runs a query of s.cols.cluster on the readers, scanning the rows
// by hand: the hottest reads (GetCluster, ListClusters) skip GORM, whose
// reflection cost as much as the query itself. size is the number of rows
// the query may return: the slice is made that large at once (up to 1,024,
// a page of the largest size).
func (s *Store) readClusters(ctx context.Context, size int, query string, args ...any) ([]Cluster, error) {
	rows, err := s.readDB().QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]Cluster, 0, min(size, 1024))
	for rows.Next() {
		r, err := scanCluster(rows)
		if err != nil {
			return nil, err
		}
		c, err := r.toCluster()
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// Transition applies one compare-and-set to a cluster and records it in the
// cluster's history, in one transaction. It returns the cluster as written
// (read back, unless t.Read is set). A miss is ErrNotFound or a
// *ConflictError (errors.Is ErrConflict); a pair the state machine refuses
// is a *lifecycle.TransitionError, and nothing is written in either case.
func (s *Store) Transition(ctx context.Context, t Transition) (Cluster, error) {
	var out Cluster
	err := s.batched(ctx, func(tx *gorm.DB) error {
		c, err := s.casCluster(tx, t)
		out = c
		return err
	})
	if err != nil {
		return Cluster{}, s.explain(ctx, t, err)
	}
	return out, nil
}

// Claim moves a cluster into an operation and makes the new job its current
// operation (SPEC §3.2): the compare-and-set, the job row and the history
// entry are one transaction, so no claimed cluster exists without its job,
// and no job without its claim. t.Operation is ignored (it becomes the new
// job's id); the job takes the cluster's account. The job is IN_PROGRESS
// when Claim returns. With t.Read set, the claim is three statements (the
// compare-and-set, the history entry, the job) and nothing is read back.
func (s *Store) Claim(ctx context.Context, t Transition, nj NewJob) (Cluster, Job, error) {
	if nj.ID == "" {
		nj.ID = newID()
	}
	t.Operation = nj.ID
	if t.Server == "" {
		t.Server = nj.ServerID
	}
	var (
		out Cluster
		job jobRow
	)
	err := s.batched(ctx, func(tx *gorm.DB) error {
		ctx := tx.Statement.Context // the transaction's: on SQLite, not cancelled (see batcher)
		var (
			before heldRow
			delta  Usage
			check  QuotaCheck
		)
		if t.Quota != nil {
			var err error
			if before, err = heldBefore(tx, t); err != nil {
				return err
			}
			if err := s.bumpClaims(tx, before.Account); err != nil {
				return err
			}
			check = t.Quota.memo(tx)
			if delta, err = claimDelta(ctx, before, t, check.Size); err != nil {
				return fmt.Errorf("usage of the claim: %w", err)
			}
		}
		c, err := s.casCluster(tx, t)
		if err != nil {
			return err
		}
		if t.Quota != nil {
			if err := s.checkQuota(ctx, tx, before.Account, delta, check); err != nil {
				return err
			}
		}
		out = c
		if err := s.use(tx, t.Uses); err != nil {
			return err
		}
		job = newJobRow(nj, t.ClusterID, c.Account, c.UpdateTime)
		job.TargetVersion, job.TargetOffering = nullable(t.Uses.Version), nullable(t.Uses.Offering)
		return insertJob(tx, job)
	})
	if err != nil {
		return Cluster{}, Job{}, s.explain(ctx, t, err)
	}
	return out, job.toJob(), nil
}

// decide checks t against the state machine once: the decision the caller
// made (t.Decided, which must start from the state it expects) or, for a
// caller that sends an event, Admit's. It returns t with Decided set, and the
// name of its history entry.
func decide(t Transition) (Transition, string, error) {
	name := OperationEnded
	if t.History != "" {
		name = t.History
	}
	switch {
	case t.Decided != nil:
		if t.Decided.From != t.Expect.State {
			return t, "", fmt.Errorf("cluster %s: a decision from %s for a write expecting %s", t.ClusterID, t.Decided.From, t.Expect.State)
		}
	case t.Event != lifecycle.EventUnspecified:
		d, err := lifecycle.Decide(t.Expect.State, t.Event)
		if err != nil {
			return t, "", fmt.Errorf("cluster %s: %w", t.ClusterID, err)
		}
		t.Decided = &d
	default:
		d := lifecycle.Stay(t.Expect.State)
		t.Decided = &d
	}
	if t.Decided.Moves() {
		name = t.Decided.Event.String()
	}
	if t.Read != nil && t.Read.Expect() != t.Expect {
		return t, "", fmt.Errorf("cluster %s: read as %s, written expecting %s", t.ClusterID, t.Read.Expect(), t.Expect)
	}
	return t, name, nil
}

// casCluster is the one compare-and-set every cluster write goes through:
// UPDATE ... WHERE id AND state AND version AND current_operation, bumping the
// version, then checking the rows affected; and the history entry. It must run
// inside a transaction. It returns the cluster as written: t.Read with the
// write applied, or, without t.Read, the row read back.
func (s *Store) casCluster(tx *gorm.DB, t Transition) (Cluster, error) {
	t, name, err := decide(t)
	if err != nil {
		return Cluster{}, err
	}
	to := t.to()
	now := s.stamp()
	// Written out rather than built by GORM from a map: this is the one
	// write of every claim and every end.
	set := "state = ?, version = ?, current_operation = ?, update_time = ?"
	args := []any{to.String(), t.Expect.Version + 1, t.Operation, now}
	if sp := t.Changes.Spec; sp != nil {
		set += ", kubernetes_version = ?, control_node_count = ?, worker_node_count = ?, service_offering = ?," +
			" control_offering = ?, autoscaling_enabled = ?, autoscaling_min = ?, autoscaling_max = ?"
		args = append(args, sp.KubernetesVersion, sp.ControlNodeCount, sp.WorkerNodeCount, sp.ServiceOffering, sp.ControlOffering,
			sp.Autoscaling.Enabled, sp.Autoscaling.MinSize, sp.Autoscaling.MaxSize)
	}
	if t.Changes.Endpoint != nil {
		set += ", endpoint = ?"
		args = append(args, *t.Changes.Endpoint)
	}
	switch h := t.Changes.Hold; {
	case t.Operation == "":
		// Released: what an operation was about to hold is either the
		// spec it wrote now, or not held any more.
		set += ", hold_worker_node_count = 0, hold_service_offering = ''"
	case h != nil:
		set += ", hold_worker_node_count = ?, hold_service_offering = ?"
		args = append(args, h.WorkerNodeCount, h.ServiceOffering)
	}
	if to == lifecycle.Destroyed {
		// Soft delete: keep the row, free the display name for reuse.
		set += ", delete_time = ?, alive = NULL"
		args = append(args, now)
	}
	if st, ok := t.status(now); ok {
		set += ", status_message = ?, status_time = ?"
		args = append(args, st.Message, st.Time)
	}
	n, err := execDirect(tx, "UPDATE clusters SET "+set+" WHERE id = ? AND state = ? AND version = ? AND current_operation = ?",
		append(args, t.ClusterID, t.Expect.State.String(), t.Expect.Version, t.Expect.Operation)...)
	if err != nil {
		return Cluster{}, fmt.Errorf("update cluster %s: %w", t.ClusterID, classify(err))
	}
	if n != 1 {
		return Cluster{}, errMissed
	}
	if to == lifecycle.Destroyed {
		if err := deleteSecrets(tx, t.ClusterID); err != nil {
			return Cluster{}, err
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
	if _, err := execDirect(tx, "INSERT INTO cluster_events (cluster_id, time, from_state, event, to_state, operation, server, message) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
		t.ClusterID, now, t.Expect.State.String(), name, to.String(), op, server, t.Message); err != nil {
		return Cluster{}, fmt.Errorf("insert event for cluster %s: %w", t.ClusterID, classify(err))
	}
	if err := s.recordClusterChange(tx, t.ClusterID, op); err != nil {
		return Cluster{}, err
	}
	if t.Read != nil {
		return t.Apply(*t.Read, now), nil
	}
	var row clusterRow
	if err := tx.Where("id = ?", t.ClusterID).Take(&row).Error; err != nil {
		return Cluster{}, fmt.Errorf("read back cluster %s: %w", t.ClusterID, classify(err))
	}
	return row.toCluster()
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
	err := s.rdb.WithContext(ctx).Where("cluster_id = ? AND id > ?", clusterID, after).
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
