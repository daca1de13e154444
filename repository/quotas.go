package repository

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"gorm.io/gorm"
)

// ErrQuotaExceeded: a claim would take an account past one of its limits.
// Nothing was written. Use errors.As with *QuotaExceededError for details.
var ErrQuotaExceeded = errors.New("quota exceeded")

// Limit names, as the API and the error details spell them.
const (
	LimitClusters = "clusters"
	LimitNodes    = "nodes"
	LimitCPUs     = "cpus"
	LimitMemoryMB = "memory_mb"
)

// Limits caps what an account may hold; a nil field is unlimited.
type Limits struct {
	Clusters *int64
	Nodes    *int64
	CPUs     *int64
	MemoryMB *int64
}

// byName pairs each limit with its name, in the order errors list them.
func (l Limits) byName() []namedLimit {
	return []namedLimit{{LimitClusters, l.Clusters}, {LimitNodes, l.Nodes}, {LimitCPUs, l.CPUs}, {LimitMemoryMB, l.MemoryMB}}
}

type namedLimit struct {
	name string
	max  *int64
}

// Usage is what an account's clusters hold or are about to hold (see the
// package doc, "Quotas").
type Usage struct {
	Clusters int64
	Nodes    int64
	CPUs     int64
	MemoryMB int64
}

// get returns the usage of a limit by name.
func (u Usage) get(name string) int64 {
	switch name {
	case LimitClusters:
		return u.Clusters
	case LimitNodes:
		return u.Nodes
	case LimitCPUs:
		return u.CPUs
	default:
		return u.MemoryMB
	}
}

func (u Usage) plus(o Usage) Usage {
	return Usage{u.Clusters + o.Clusters, u.Nodes + o.Nodes, u.CPUs + o.CPUs, u.MemoryMB + o.MemoryMB}
}

func (u Usage) minus(o Usage) Usage {
	return Usage{u.Clusters - o.Clusters, u.Nodes - o.Nodes, u.CPUs - o.CPUs, u.MemoryMB - o.MemoryMB}
}

// Size is one node's resources: its offering's.
type Size struct {
	CPUs     int64
	MemoryMB int64
}

// SizeFunc returns the size of a node of an offering. The repository does
// not own the catalog; the caller passes how to read it. Offerings' sizes
// are immutable, so usage computed with it cannot change under a cluster.
type SizeFunc func(ctx context.Context, offering string) (Size, error)

// QuotaCheck is what a claim that may grow an account needs to enforce its
// quota: the limits of accounts without their own, and node sizes.
type QuotaCheck struct {
	Default Limits
	// Size, when nil, reads the service_offerings rows, inside the claim's
	// transaction when it checks one. A Size given is called inside the
	// claim's transaction, which on SQLite may be shared with other writes
	// and run by another goroutine (see batcher), with a context that is
	// never cancelled: it must not wait on anything but itself.
	Size SizeFunc
}

// memo is c with one Size for a whole check in transaction tx, which reads
// each offering once.
func (c QuotaCheck) memo(tx *gorm.DB) QuotaCheck {
	c.Size = memoSize(c.sizer(tx))
	return c
}

// sizer is Size, or a reader of the service_offerings rows through db.
func (c QuotaCheck) sizer(db *gorm.DB) SizeFunc {
	if c.Size != nil {
		return c.Size
	}
	return func(ctx context.Context, o string) (Size, error) {
		var r offeringRow
		err := db.WithContext(ctx).Select("cpus", "memory_mb").Where("name = ?", o).Take(&r).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return Size{}, fmt.Errorf("%s %q: %w", kindOffering, o, ErrNotFound)
		}
		if err != nil {
			return Size{}, fmt.Errorf("size of %s %q: %w", kindOffering, o, classify(err))
		}
		return Size{CPUs: int64(r.CPUs), MemoryMB: int64(r.MemoryMB)}, nil
	}
}

// Hold is what a cluster is about to hold while the operation that claims
// it runs: the worker count and offering it grows to. Written by the claim,
// cleared when the operation releases the cluster, so a failed operation
// returns the account to what the cluster has.
type Hold struct {
	WorkerNodeCount int32
	ServiceOffering string
}

// Quota is an account's limits and what it holds.
type Quota struct {
	Account string
	// Explicit is set when an admin set the limits; otherwise they are the
	// default.
	Explicit   bool
	Limits     Limits
	Usage      Usage
	UpdateTime time.Time
}

// QuotaViolation is one limit a claim would exceed.
type QuotaViolation struct {
	Limit string
	Max   int64
	// Usage is what the account holds without the claim, Request what the
	// claim adds.
	Usage   int64
	Request int64
}

// QuotaExceededError refuses a claim that would take an account past its
// limits.
type QuotaExceededError struct {
	Account    string
	Violations []QuotaViolation
}

// Error names every limit exceeded, with the usage and the request.
func (e *QuotaExceededError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "quota of account %q exceeded:", e.Account)
	for i, v := range e.Violations {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s limit %d, in use %d, requested %d", v.Limit, v.Max, v.Usage, v.Request)
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrQuotaExceeded) true.
func (e *QuotaExceededError) Unwrap() error { return ErrQuotaExceeded }

// quotaRow is the GORM mapping of quotas.
type quotaRow struct {
	Account     string `gorm:"primaryKey"`
	Explicit    bool
	MaxClusters *int64
	MaxNodes    *int64
	MaxCPUs     *int64 `gorm:"column:max_cpus"`
	MaxMemoryMB *int64 `gorm:"column:max_memory_mb"`
	Claims      int64
	UpdateTime  time.Time
}

func (quotaRow) TableName() string { return "quotas" }

// limits returns the row's limits, or def when an admin set none.
func (r *quotaRow) limits(def Limits) Limits {
	if r == nil || !r.Explicit {
		return def
	}
	return Limits{Clusters: r.MaxClusters, Nodes: r.MaxNodes, CPUs: r.MaxCPUs, MemoryMB: r.MaxMemoryMB}
}

// heldCols are the columns usage is derived from.
const heldCols = "account, control_node_count, worker_node_count, service_offering, control_offering, hold_worker_node_count, hold_service_offering"

// heldRow is what one cluster holds, as stored.
type heldRow struct {
	Account          string
	ControlNodeCount int32
	WorkerNodeCount  int32
	ServiceOffering  string
	// ControlOffering is the control nodes' own offering; empty, they have
	// ServiceOffering and an offering change resizes them with the workers.
	ControlOffering     string
	HoldWorkerNodeCount int32
	HoldServiceOffering string
}

// usage is what one cluster holds or is about to hold: one cluster, and per
// role its nodes and their sizes. A worker count or offering the running
// operation grows to counts over the current one (the larger of the two).
func (r heldRow) usage(ctx context.Context, size SizeFunc) (Usage, error) {
	u := Usage{Clusters: 1}
	// Control nodes without an offering of their own have the cluster's,
	// and an offering change resizes them too.
	controlOfferings := []string{r.ServiceOffering, r.HoldServiceOffering}
	if r.ControlOffering != "" {
		controlOfferings = []string{r.ControlOffering}
	}
	control, err := roleUsage(ctx, size, r.ControlNodeCount, controlOfferings...)
	if err != nil {
		return Usage{}, err
	}
	workers, err := roleUsage(ctx, size, max(r.WorkerNodeCount, r.HoldWorkerNodeCount), r.ServiceOffering, r.HoldServiceOffering)
	if err != nil {
		return Usage{}, err
	}
	return u.plus(control).plus(workers), nil
}

// roleUsage is what n nodes of one role hold: per node, the larger size of
// the offerings named (the current one and the one an operation moves to;
// empty names are skipped).
func roleUsage(ctx context.Context, size SizeFunc, n int32, offerings ...string) (Usage, error) {
	var per Size
	for _, o := range offerings {
		if o == "" {
			continue
		}
		sz, err := size(ctx, o)
		if err != nil {
			return Usage{}, fmt.Errorf("size of offering %q: %w", o, err)
		}
		per.CPUs, per.MemoryMB = max(per.CPUs, sz.CPUs), max(per.MemoryMB, sz.MemoryMB)
	}
	return Usage{Nodes: int64(n), CPUs: int64(n) * per.CPUs, MemoryMB: int64(n) * per.MemoryMB}, nil
}

// memoSize caches a SizeFunc for one computation.
func memoSize(size SizeFunc) SizeFunc {
	seen := map[string]Size{}
	return func(ctx context.Context, o string) (Size, error) {
		if sz, ok := seen[o]; ok {
			return sz, nil
		}
		sz, err := size(ctx, o)
		if err == nil {
			seen[o] = sz
		}
		return sz, err
	}
}

// sumUsage adds up what the rows hold, per account.
func sumUsage(ctx context.Context, rows []heldRow, size SizeFunc) (map[string]Usage, error) {
	size = memoSize(size)
	out := map[string]Usage{}
	for _, r := range rows {
		u, err := r.usage(ctx, size)
		if err != nil {
			return nil, err
		}
		out[r.Account] = out[r.Account].plus(u)
	}
	return out, nil
}

// bumpClaims is a quota-checked claim's first statement: a write to its
// account's quota row (inserted if missing). Every claim of one account
// writes this one row, so they serialise: on one database the row lock
// orders them, and across Galera nodes, which certify write-sets only (a
// locking read there locks nothing on the other nodes), two of them
// conflict at certification and the loser is run again (see retrying).
func (s *Store) bumpClaims(tx *gorm.DB, account string) error {
	q := "INSERT INTO quotas (account, claims, update_time) VALUES (?, 1, ?) ON CONFLICT(account) DO UPDATE SET claims = claims + 1"
	if s.backend == MySQL {
		q = "INSERT INTO quotas (account, claims, update_time) VALUES (?, 1, ?) ON DUPLICATE KEY UPDATE claims = claims + 1"
	}
	if err := tx.Exec(q, account, s.stamp()).Error; err != nil {
		return fmt.Errorf("quota of account %q: %w", account, classify(err))
	}
	return nil
}

// checkQuota runs inside a claim's transaction, after bumpClaims and the
// claim's own write: in one statement it reads the account's limits and its
// live clusters as written (a locking read on MySQL, so it sees the latest
// committed rows and holds them to the commit), and refuses the claim if it
// grows a resource past its limit. delta is what the claim adds to the
// account. A resource the claim does not grow is never refused, even above
// its limit (an admin may have lowered it).
func (s *Store) checkQuota(ctx context.Context, tx *gorm.DB, account string, delta Usage, check QuotaCheck) error {
	q := "SELECT q.explicit, q.max_clusters, q.max_nodes, q.max_cpus, q.max_memory_mb," +
		" c.control_node_count, c.worker_node_count, c.service_offering, c.control_offering, c.hold_worker_node_count, c.hold_service_offering" +
		" FROM quotas q LEFT JOIN clusters c ON c.account = q.account AND c.alive = 1 WHERE q.account = ?"
	if s.backend == MySQL {
		q += " FOR UPDATE"
	}
	rows, err := tx.Raw(q, account).Rows()
	if err != nil {
		return fmt.Errorf("read quota of account %q: %w", account, classify(err))
	}
	defer rows.Close()
	var (
		row  quotaRow
		held []heldRow
	)
	for rows.Next() {
		var (
			control, workers, holdWorkers           sql.NullInt32
			offering, controlOffering, holdOffering sql.NullString
		)
		if err := rows.Scan(&row.Explicit, &row.MaxClusters, &row.MaxNodes, &row.MaxCPUs, &row.MaxMemoryMB,
			&control, &workers, &offering, &controlOffering, &holdWorkers, &holdOffering); err != nil {
			return fmt.Errorf("read quota of account %q: %w", account, classify(err))
		}
		if offering.Valid {
			held = append(held, heldRow{Account: account, ControlNodeCount: control.Int32, WorkerNodeCount: workers.Int32,
				ServiceOffering: offering.String, ControlOffering: controlOffering.String, HoldWorkerNodeCount: holdWorkers.Int32, HoldServiceOffering: holdOffering.String})
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read quota of account %q: %w", account, classify(err))
	}
	limits := row.limits(check.Default)
	usage, err := sumUsage(ctx, held, check.sizer(tx))
	if err != nil {
		return fmt.Errorf("usage of account %q: %w", account, err)
	}
	total := usage[account]
	var refused []QuotaViolation
	for _, l := range limits.byName() {
		add, now := delta.get(l.name), total.get(l.name)
		if l.max != nil && add > 0 && now > *l.max {
			refused = append(refused, QuotaViolation{Limit: l.name, Max: *l.max, Usage: now - add, Request: add})
		}
	}
	if len(refused) > 0 {
		return &QuotaExceededError{Account: account, Violations: refused}
	}
	return nil
}

// heldBefore is what a cluster holds before a claim writes it: the cluster
// as the claim read it when it was unheld (a released cluster holds no
// more than its spec), read from the row otherwise.
func heldBefore(tx *gorm.DB, t Transition) (heldRow, error) {
	if c := t.Read; c != nil && c.CurrentOperation == "" {
		return heldRow{Account: c.Account, ControlNodeCount: c.Spec.ControlNodeCount, WorkerNodeCount: c.Spec.WorkerNodeCount,
			ServiceOffering: c.Spec.ServiceOffering, ControlOffering: c.Spec.ControlOffering}, nil
	}
	clusterID := t.ClusterID
	var r heldRow
	err := tx.Table("clusters").Select(heldCols).Where("id = ?", clusterID).Take(&r).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return r, errMissed
	}
	if err != nil {
		return r, fmt.Errorf("read cluster %s: %w", clusterID, classify(err))
	}
	return r, nil
}

// claimDelta is what a claim adds to its account: the cluster with the
// claim's hold (and spec, if it writes one) less the cluster as it was.
func claimDelta(ctx context.Context, before heldRow, t Transition, size SizeFunc) (Usage, error) {
	after := before
	if sp := t.Changes.Spec; sp != nil {
		after.ControlNodeCount, after.WorkerNodeCount, after.ServiceOffering = sp.ControlNodeCount, sp.WorkerNodeCount, sp.ServiceOffering
	}
	if h := t.Changes.Hold; h != nil {
		after.HoldWorkerNodeCount, after.HoldServiceOffering = h.WorkerNodeCount, h.ServiceOffering
	}
	size = memoSize(size)
	b, err := before.usage(ctx, size)
	if err != nil {
		return Usage{}, err
	}
	a, err := after.usage(ctx, size)
	if err != nil {
		return Usage{}, err
	}
	return a.minus(b), nil
}

// GetQuota returns an account's limits (the default when an admin set none)
// and its usage, derived from its clusters.
func (s *Store) GetQuota(ctx context.Context, account string, check QuotaCheck) (Quota, error) {
	qs, err := s.quotas(ctx, account, check)
	if err != nil {
		return Quota{}, fmt.Errorf("get quota of account %q: %w", account, err)
	}
	if len(qs) == 0 {
		return Quota{Account: account, Limits: check.Default}, nil
	}
	return qs[0], nil
}

// ListQuotas returns the quota of every account that has live clusters or
// limits of its own, by account.
func (s *Store) ListQuotas(ctx context.Context, check QuotaCheck) ([]Quota, error) {
	qs, err := s.quotas(ctx, "", check)
	if err != nil {
		return nil, fmt.Errorf("list quotas: %w", err)
	}
	return qs, nil
}

// quotas reads the quotas of one account, or of all when account is empty.
func (s *Store) quotas(ctx context.Context, account string, check QuotaCheck) ([]Quota, error) {
	db := s.rdb.WithContext(ctx)
	var qrows []quotaRow
	q := db.Where("explicit = 1")
	if account != "" {
		q = q.Where("account = ?", account)
	}
	if err := q.Find(&qrows).Error; err != nil {
		return nil, classify(err)
	}
	var rows []heldRow
	c := db.Table("clusters").Select(heldCols).Where("alive = 1")
	if account != "" {
		c = c.Where("account = ?", account)
	}
	if err := c.Scan(&rows).Error; err != nil {
		return nil, classify(err)
	}
	usage, err := sumUsage(ctx, rows, check.sizer(db))
	if err != nil {
		return nil, err
	}
	byAccount := map[string]*Quota{}
	for _, r := range qrows {
		byAccount[r.Account] = &Quota{Account: r.Account, Explicit: true, Limits: r.limits(check.Default), UpdateTime: r.UpdateTime.UTC()}
	}
	for a, u := range usage {
		q, ok := byAccount[a]
		if !ok {
			q = &Quota{Account: a, Limits: check.Default}
			byAccount[a] = q
		}
		q.Usage = u
	}
	out := make([]Quota, 0, len(byAccount))
	for _, q := range byAccount {
		out = append(out, *q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Account < out[j].Account })
	return out, nil
}

// SetQuota sets an account's limits (every one of them: a nil limit is
// unlimited); the account's claims are held to them from now on.
func (s *Store) SetQuota(ctx context.Context, account string, l Limits) error {
	now := s.stamp()
	q := "INSERT INTO quotas (account, explicit, max_clusters, max_nodes, max_cpus, max_memory_mb, claims, update_time)" +
		" VALUES (?, 1, ?, ?, ?, ?, 0, ?)"
	if s.backend == MySQL {
		q += " ON DUPLICATE KEY UPDATE explicit = 1, max_clusters = VALUES(max_clusters), max_nodes = VALUES(max_nodes)," +
			" max_cpus = VALUES(max_cpus), max_memory_mb = VALUES(max_memory_mb), update_time = VALUES(update_time)"
	} else {
		q += " ON CONFLICT(account) DO UPDATE SET explicit = 1, max_clusters = excluded.max_clusters, max_nodes = excluded.max_nodes," +
			" max_cpus = excluded.max_cpus, max_memory_mb = excluded.max_memory_mb, update_time = excluded.update_time"
	}
	err := s.retrying(ctx, func() error {
		return classify(s.db.WithContext(ctx).Exec(q, account, l.Clusters, l.Nodes, l.CPUs, l.MemoryMB, now).Error)
	})
	if err != nil {
		return fmt.Errorf("set quota of account %q: %w", account, err)
	}
	return nil
}
