package repository

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/clusterd/clusterd/lifecycle"
)

// History entries that recovery and the scanner write without a state
// change.
const (
	// RecoveryStarted: recovery took over an orphaned operation.
	RecoveryStarted = "RECOVERY_STARTED"
	// Repair: recovery converged something an interrupted operation left.
	Repair = "REPAIR"
	// OrphanMachineRemoved: the scanner removed a machine of the cluster
	// that no operation will ever record (it outlived the cluster's
	// destroy); the cluster's state is unchanged.
	OrphanMachineRemoved = "ORPHAN_MACHINE_REMOVED"
)

// FailJobsOfDeadServers ends every IN_PROGRESS job whose owner is not alive
// (SPEC §5): its server row is missing, carries another incarnation (the
// process restarted), or has not heartbeaten since cutoff; self's own
// incarnation is alive whatever its heartbeat's age (see
// AdoptableQuery.Self), its lost jobs are the scanner's to find. Jobs of self's
// earlier incarnations fail with the stored error restartedErr, the others
// with stoppedErr (the caller encodes both). The update is conditioned on
// IN_PROGRESS, so two live servers never both end a job, and it never looks
// at a job's age. With adoption, offer (non-nil) narrows it to the jobs
// that adoption will not take (see Offer).
//
// Each kind is found by a plain read and then failed by primary key, so the
// write locks only the rows it changes. A range UPDATE over the jobs' status
// index (what this was) takes next-key locks on every IN_PROGRESS job and
// the gaps around them, and deadlocked on MySQL with a job finishing, which
// holds its own row and inserts into one of those gaps as its status changes.
func (s *Store) FailJobsOfDeadServers(ctx context.Context, self Server, cutoff time.Time, offer *Offer, restartedErr, stoppedErr string) (restarted, stopped int64, err error) {
	bound := func(db *gorm.DB) *gorm.DB {
		if offer == nil {
			return db
		}
		return db.Where("create_time <= ?", dbTime(offer.Before)).
			Where("(id IN ? OR attempt >= ? OR deadline <= ? OR resource_id IS NULL OR resource_id = '')",
				append([]string{""}, offer.NotAdopted...), offer.MaxAttempts, dbTime(offer.Now))
	}
	var earlier []string
	err = bound(s.rdb.WithContext(ctx).Model(&jobRow{}).
		Where("status = ? AND server_id = ? AND server_incarnation <> ?", string(JobInProgress), self.ID, self.Incarnation)).
		Order("id").Pluck("id", &earlier).Error
	if err != nil {
		return 0, 0, fmt.Errorf("find jobs of earlier incarnations of %s: %w", self.ID, classify(err))
	}
	if restarted, err = s.failJobs(ctx, earlier, restartedErr, func(db *gorm.DB) *gorm.DB {
		return db.Where("server_id = ? AND server_incarnation <> ?", self.ID, self.Incarnation)
	}); err != nil {
		return 0, 0, fmt.Errorf("fail jobs of earlier incarnations of %s: %w", self.ID, err)
	}
	live := func() *gorm.DB {
		return s.db.Model(&serverRow{}).Select("1").
			Where("servers.id = jobs.server_id AND (jobs.server_incarnation = '' OR servers.incarnation = jobs.server_incarnation) AND servers.heartbeat_time >= ?", cutoff.UTC())
	}
	notSelf := "NOT (server_id = ? AND server_incarnation = ?)"
	var orphaned []string
	err = bound(s.rdb.WithContext(ctx).Model(&jobRow{}).
		Where("status = ? AND NOT EXISTS (?)", string(JobInProgress), live()).Where(notSelf, self.ID, self.Incarnation)).
		Order("id").Pluck("id", &orphaned).Error
	if err != nil {
		return restarted, 0, fmt.Errorf("find jobs of dead servers: %w", classify(err))
	}
	// The owner is checked again in the write: a server seen dead that
	// heartbeat since keeps its jobs.
	if stopped, err = s.failJobs(ctx, orphaned, stoppedErr, func(db *gorm.DB) *gorm.DB {
		return db.Where("NOT EXISTS (?)", live()).Where(notSelf, self.ID, self.Incarnation)
	}); err != nil {
		return restarted, 0, fmt.Errorf("fail jobs of dead servers: %w", err)
	}
	return restarted, stopped, nil
}

// Offer is what a scanner pass with adoption offered before it fails the
// jobs of dead servers: only a job that adoption will not take may fail.
// That is one out of attempts or time or of no cluster (AdoptableJobs does
// not list it), or one that was offered and could not be adopted
// (NotAdopted); and in either case created before the offer. A job that may
// still be adopted is left to the next pass's offer, even when its owner
// died, or restarted under a new incarnation, after this pass's offer.
type Offer struct {
	// Before is when the offer was made (the pass began).
	Before time.Time
	// Now and MaxAttempts are the offer's AdoptableQuery's.
	Now         time.Time
	MaxAttempts int32
	// NotAdopted are the offered jobs that cannot be adopted (a kind this
	// server cannot resume, a job that no longer holds its cluster).
	NotAdopted []string
}

// failJobs fails the jobs ids that are still IN_PROGRESS and meet cond, by
// primary key, and says how many it failed.
func (s *Store) failJobs(ctx context.Context, ids []string, errJSON string, cond func(*gorm.DB) *gorm.DB) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	var n int64
	// Each failed job's feed row is written in the same transaction: the
	// jobs this write failed are those of ids FAILED with its error at its
	// time (a row of the feed too many only if another server failed one
	// of them with the same error in the same microsecond).
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		now := s.stamp()
		res := cond(tx.Model(&jobRow{}).Where("id IN ? AND status = ?", ids, string(JobInProgress))).
			Updates(map[string]any{"status": string(JobFailed), "error": errJSON, "end_time": now, "update_time": now})
		n = res.RowsAffected
		if res.Error != nil || n == 0 {
			return classify(res.Error)
		}
		args := make([]any, 0, len(ids)+3)
		for _, id := range ids {
			args = append(args, id)
		}
		return s.recordJobChanges(tx, ChangeJobEnded, "j.id IN (?"+strings.Repeat(", ?", len(ids)-1)+") AND j.status = ? AND j.update_time = ? AND j.error = ?",
			append(args, string(JobFailed), now, errJSON)...)
	})
	return n, err
}

// JobStamp is a job's id and the time of its last write: all the scanner
// compares between two passes to tell a job its runner lost from one that
// moves on, so a pass reads two columns of each job in progress, not their
// whole rows (parameters, results, errors), which a server running
// thousands of operations would otherwise read and decode twice a second.
type JobStamp struct {
	ID         string
	UpdateTime time.Time
}

// OwnJobsInProgress lists, in id order, the IN_PROGRESS jobs of this
// server incarnation, so the scanner can find those its runner no longer
// runs.
func (s *Store) OwnJobsInProgress(ctx context.Context, self Server) ([]JobStamp, error) {
	var out []JobStamp
	err := s.rdb.WithContext(ctx).Model(&jobRow{}).Select("id, update_time").
		Where("status = ? AND server_id = ? AND server_incarnation = ?", string(JobInProgress), self.ID, self.Incarnation).
		Order("id").Find(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list jobs of %s: %w", self.ID, classify(err))
	}
	for i := range out {
		out[i].UpdateTime = out[i].UpdateTime.UTC()
	}
	return out, nil
}

// FailJobUnchanged ends an IN_PROGRESS job only if it has not written since
// the caller saw it (its update_time is still seen): a compare-and-set on the
// job's own progress, so a job that moved on in between is left alone
// (ErrConflict).
func (s *Store) FailJobUnchanged(ctx context.Context, id string, seen time.Time, errJSON string) error {
	var res *gorm.DB
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		now := s.stamp()
		res = tx.Model(&jobRow{}).
			Where("id = ? AND status = ? AND update_time = ?", id, string(JobInProgress), seen.UTC()).
			Updates(map[string]any{"status": string(JobFailed), "error": errJSON, "end_time": now, "update_time": now})
		if res.Error != nil || res.RowsAffected != 1 {
			return classify(res.Error)
		}
		return s.recordJobChanges(tx, ChangeJobEnded, "j.id = ?", id)
	})
	if err != nil {
		return fmt.Errorf("fail job %s: %w", id, err)
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("fail job %s: it moved on or ended: %w", id, ErrConflict)
	}
	return nil
}

// OrphanCandidates lists, in one query, the clusters recovery must look at:
// those in an operation state, CREATED ones, and any naming a current
// operation.
func (s *Store) OrphanCandidates(ctx context.Context) ([]Cluster, error) {
	var states []string
	for _, st := range lifecycle.States() {
		if _, ok := lifecycle.OrphanEvent(st); ok {
			states = append(states, st.String())
		}
	}
	var rows []clusterRow
	err := s.rdb.WithContext(ctx).
		Where("state IN ? OR (current_operation > '' AND state <> ?)", states, lifecycle.Destroyed.String()).
		Order("id").Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("list orphan candidates: %w", classify(err))
	}
	return toClusters(rows)
}

// JobsByID reads the given jobs in one query; missing ids are absent from the map.
func (s *Store) JobsByID(ctx context.Context, ids []string) (map[string]Job, error) {
	out := map[string]Job{}
	if len(ids) == 0 {
		return out, nil
	}
	var rows []jobRow
	if err := s.rdb.WithContext(ctx).Where("id IN ?", ids).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("read jobs: %w", classify(err))
	}
	for i := range rows {
		out[rows[i].ID] = rows[i].toJob()
	}
	return out, nil
}

// InProgressJobsWithoutResource lists running jobs written by servers that
// predate the resource column (SPEC §4, mixed versions).
func (s *Store) InProgressJobsWithoutResource(ctx context.Context) ([]Job, error) {
	var rows []jobRow
	err := s.rdb.WithContext(ctx).Where("(resource_id IS NULL AND status = ?) OR (resource_id = '' AND status = ?)", string(JobInProgress), string(JobInProgress)).
		Order("id").Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("list jobs without resource: %w", classify(err))
	}
	return toJobs(rows), nil
}

// UnheldClusters lists up to limit clusters in the given states that no
// operation holds, after the cluster id after ("" from the start), in id
// order, so reconciliation can walk any number of clusters a page per pass.
func (s *Store) UnheldClusters(ctx context.Context, states []lifecycle.State, after string, limit int) ([]Cluster, error) {
	names := make([]string, len(states))
	for i, st := range states {
		names[i] = st.String()
	}
	// Walked in primary-key order, stopping at limit: the planners would
	// rather read every cluster in the states off their index and sort
	// them (855 ms a page at 100,000 clusters on MariaDB). The unary +
	// keeps SQLite off that index; MySQL is told.
	table := "clusters"
	if s.backend == MySQL {
		table = "clusters FORCE INDEX (PRIMARY)"
	}
	var rows []clusterRow
	err := s.rdb.WithContext(ctx).Table(table).Where("+state IN ? AND +current_operation = '' AND id > ?", names, after).
		Order("id").Limit(limit).Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("list unheld clusters: %w", classify(err))
	}
	return toClusters(rows)
}

// RecordEvent adds a history entry that changes no state (a repair). An
// entry that names an operation is written only while that operation holds
// the cluster, checked with the cluster's row locked (MySQL; SQLite
// transactions are serial), so the history never shows a job acting after
// it lost the cluster; otherwise nothing is written and the error wraps
// ErrNotHeld.
func (s *Store) RecordEvent(ctx context.Context, e Event) error {
	server := e.Server
	if server == "" {
		server = s.server
	}
	row := eventRow{
		ClusterID: e.ClusterID, Time: s.stamp(), FromState: e.From.String(), Event: e.Name,
		ToState: e.To.String(), Operation: e.Operation, Server: server, Message: e.Message,
	}
	notHeld := false
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		notHeld = false
		if e.Operation != "" {
			q := tx.Select("id", "current_operation").Where("id = ?", e.ClusterID)
			if s.backend == MySQL {
				q = q.Clauses(clause.Locking{Strength: "UPDATE"})
			}
			var c clusterRow
			if err := q.Take(&c).Error; err != nil {
				return classify(err)
			}
			if c.CurrentOperation != e.Operation {
				notHeld = true
				return nil
			}
		}
		entry := row // fresh each attempt (see CreateCluster)
		if err := tx.Create(&entry).Error; err != nil {
			return classify(err)
		}
		return s.recordClusterChange(tx, e.ClusterID, e.Operation)
	})
	if err != nil {
		return fmt.Errorf("record %s event of cluster %s: %w", e.Name, e.ClusterID, err)
	}
	if notHeld {
		return fmt.Errorf("record %s event of cluster %s by %s: %w", e.Name, e.ClusterID, e.Operation, ErrNotHeld)
	}
	return nil
}

// PurgeJobs deletes up to limit finished jobs that ended before cutoff and
// that no cluster names as its current operation. They are found oldest
// first on the end time's index, in its order: nothing is sorted, and
// nothing is read when no job is old enough.
func (s *Store) PurgeJobs(ctx context.Context, cutoff time.Time, limit int) (int64, error) {
	held := s.rdb.Model(&clusterRow{}).Select("current_operation").Where("current_operation > ''")
	var ids []string
	err := s.rdb.WithContext(ctx).Model(&jobRow{}).
		Where("end_time < ? AND status <> ? AND id NOT IN (?)", dbTime(cutoff), string(JobInProgress), held).
		Order("end_time").Limit(limit).Pluck("id", &ids).Error
	if err != nil {
		return 0, fmt.Errorf("find jobs to purge: %w", classify(err))
	}
	if len(ids) == 0 {
		return 0, nil
	}
	n, err := s.deleteWhere(ctx, &jobRow{}, "id IN ? AND status <> ?", ids, string(JobInProgress))
	if err != nil {
		return 0, fmt.Errorf("purge jobs: %w", err)
	}
	return n, nil
}

// deleteWhere deletes the rows of model that match the condition, retrying
// the statement through deadlocks, and returns how many it deleted.
func (s *Store) deleteWhere(ctx context.Context, model any, cond string, args ...any) (int64, error) {
	var res *gorm.DB
	err := s.retrying(ctx, func() error {
		res = s.db.WithContext(ctx).Where(cond, args...).Delete(model)
		return classify(res.Error)
	})
	if err != nil {
		return 0, err
	}
	return res.RowsAffected, nil
}

func toJobs(rows []jobRow) []Job {
	out := make([]Job, len(rows))
	for i := range rows {
		out[i] = rows[i].toJob()
	}
	return out
}

func toClusters(rows []clusterRow) ([]Cluster, error) {
	out := make([]Cluster, 0, len(rows))
	for i := range rows {
		c, err := rows[i].toCluster()
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// JobOwner is a server incarnation that owns jobs in progress.
type JobOwner struct {
	ServerID    string
	Incarnation string
}

// maxOwners bounds the owners InProgressOwners lists; past it, it says so
// (Owners.More) rather than read on.
const maxOwners = 256

// Owners is what a scanner pass reads first to tell whether liveness has
// anything to do, in a few index seeks whatever the number of jobs in
// progress: who owns them, the rows of those servers, and whether any is
// handed off. The reads that find the jobs to adopt or fail each visit
// every job in progress, so a pass makes them only when this says a job may
// be one of those.
type Owners struct {
	// Jobs are the distinct owners of IN_PROGRESS jobs, in order.
	Jobs []JobOwner
	// More says there are more owners than Jobs lists.
	More bool
	// Servers are the rows of the owners' servers, by id; an owner whose
	// server has no row is missing from it.
	Servers map[string]Server
	// HandedOff says a job in progress of a listed owner is handed off.
	HandedOff bool
}

// InProgressOwners lists the owners of the jobs in progress (see Owners)
// off the jobs' (status, server_id, server_incarnation, handed_off) index,
// without walking the jobs, and their servers by primary key. On MySQL that
// is one GROUP BY, which it answers by a loose index scan (a seek an
// owner); SQLite has none, and is asked three seeks an owner (see
// ownersBySeeks), each a call into the library rather than a round trip.
func (s *Store) InProgressOwners(ctx context.Context) (Owners, error) {
	var (
		out Owners
		err error
	)
	if s.backend == MySQL {
		out, err = s.ownersDistinct(ctx)
	} else {
		out, err = s.ownersBySeeks(ctx)
	}
	if err != nil {
		return Owners{}, fmt.Errorf("list owners of jobs in progress: %w", classify(err))
	}
	out.Servers = map[string]Server{}
	if len(out.Jobs) == 0 {
		return out, nil
	}
	ids := make([]string, 0, len(out.Jobs))
	for _, o := range out.Jobs {
		if len(ids) == 0 || ids[len(ids)-1] != o.ServerID {
			ids = append(ids, o.ServerID)
		}
	}
	var rows []serverRow
	if err := s.rdb.WithContext(ctx).Where("id IN ?", ids).Find(&rows).Error; err != nil {
		return Owners{}, fmt.Errorf("read the servers of jobs in progress: %w", classify(err))
	}
	for _, r := range rows {
		out.Servers[r.ID] = r.toServer()
	}
	return out, nil
}

// ownersDistinct is InProgressOwners' read of the owners on MySQL: one
// row an owner, with whether any of its jobs is handed off. Grouped by the
// index's leading columns, it is a loose index scan ("Using index for
// group-by"): a seek an owner.
func (s *Store) ownersDistinct(ctx context.Context) (Owners, error) {
	var out Owners
	rows, err := s.rdb.WithContext(ctx).Raw("SELECT server_id, server_incarnation, MAX(handed_off) FROM jobs WHERE status = ?"+
		" GROUP BY status, server_id, server_incarnation ORDER BY NULL LIMIT ?", string(JobInProgress), maxOwners+1).Rows()
	if err != nil {
		return out, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			o      JobOwner
			handed bool
		)
		if err := rows.Scan(&o.ServerID, &o.Incarnation, &handed); err != nil {
			return out, err
		}
		if len(out.Jobs) == maxOwners {
			out.More = true
			break
		}
		out.HandedOff = out.HandedOff || handed
		out.Jobs = append(out.Jobs, o)
	}
	if err := rows.Err(); err != nil {
		return out, err
	}
	// The grouping's order is the index's, but SQL does not promise it.
	slices.SortFunc(out.Jobs, func(a, b JobOwner) int {
		return cmp.Or(strings.Compare(a.ServerID, b.ServerID), strings.Compare(a.Incarnation, b.Incarnation))
	})
	return out, nil
}

// ownersBySeeks is InProgressOwners' read of the owners on SQLite: per
// owner, a seek for its first handed-off job, and one for the next
// incarnation of the same server or else one for the next server.
func (s *Store) ownersBySeeks(ctx context.Context) (Owners, error) {
	db := s.rdb.WithContext(ctx)
	var out Owners
	next := func(q string, args ...any) (JobOwner, bool, error) {
		var o JobOwner
		err := db.Raw(q, args...).Row().Scan(&o.ServerID, &o.Incarnation)
		if errors.Is(err, sql.ErrNoRows) {
			return o, false, nil
		}
		return o, err == nil, err
	}
	const cols = "SELECT server_id, server_incarnation FROM jobs WHERE status = ?"
	in := string(JobInProgress)
	o, ok, err := next(cols+" ORDER BY server_id, server_incarnation LIMIT 1", in)
	for ok && err == nil {
		if len(out.Jobs) == maxOwners {
			out.More = true
			break
		}
		out.Jobs = append(out.Jobs, o)
		if !out.HandedOff {
			var handed []int
			if err = db.Raw("SELECT 1 FROM jobs WHERE status = ? AND server_id = ? AND server_incarnation = ? AND handed_off = ? LIMIT 1",
				in, o.ServerID, o.Incarnation, true).Scan(&handed).Error; err != nil {
				break
			}
			out.HandedOff = len(handed) > 0
		}
		prev := o
		o, ok, err = next(cols+" AND server_id = ? AND server_incarnation > ? ORDER BY server_incarnation LIMIT 1", in, prev.ServerID, prev.Incarnation)
		if err == nil && !ok {
			o, ok, err = next(cols+" AND server_id > ? ORDER BY server_id, server_incarnation LIMIT 1", in, prev.ServerID)
		}
	}
	return out, err
}
