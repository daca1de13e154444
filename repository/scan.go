package repository

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
)

// The scanner's reads. Each is one indexed query that returns only what the
// scanner acts on, whatever the number of clusters (the EXPLAIN plans are
// checked on both backends by TestScanQueryPlans). `current_operation > ''`
// says "held" in a form SQLite can answer from an index (it cannot use one
// for <>).

// scanCluster reads the columns of hotColumns.cluster of one row, then extra.
func scanCluster(rows *sql.Rows, extra ...any) (clusterRow, error) {
	var (
		r     clusterRow
		alive sql.NullInt64
	)
	if err := rows.Scan(clusterDest(&r, &alive, extra...)...); err != nil {
		return r, err
	}
	r.setAlive(alive)
	return r, nil
}

// clusterDest is what a row of hotColumns.cluster, then extra, is scanned
// into: r, and alive for its nullable column (see setAlive).
func clusterDest(r *clusterRow, alive *sql.NullInt64, extra ...any) []any {
	return append([]any{&r.ID, &r.Account, &r.DisplayName, alive, &r.Description, &r.State, &r.Version,
		&r.CurrentOperation, &r.KubernetesVersion, &r.ControlNodeCount, &r.WorkerNodeCount,
		&r.ServiceOffering, &r.AutoscalingEnabled, &r.AutoscalingMin, &r.AutoscalingMax, &r.Endpoint,
		stamp{&r.CreateTime}, stamp{&r.UpdateTime}, maybeStamp{&r.DeleteTime}, &r.ControlOffering, &r.StatusMessage,
		maybeStamp{&r.StatusTime}}, extra...)
}

// setAlive sets r.Alive from the column clusterDest scanned it into.
func (r *clusterRow) setAlive(alive sql.NullInt64) {
	if alive.Valid {
		a := int(alive.Int64)
		r.Alive = &a
	}
}

// discard is a column's destination whose value is not wanted.
type discard struct{}

// Scan implements sql.Scanner.
func (discard) Scan(any) error { return nil }

// Orphans lists, in one query, up to limit clusters that recovery must take
// over (SPEC §5.1), those held by an operation first: a cluster that names
// an operation whose job is not IN_PROGRESS (ended, or missing), and an
// unheld cluster in an operation state, CREATED or DESTROYING. Jobs maps
// each named operation that exists to its job (ID, Kind, Status, Error and
// Params only: a recovery of an interrupted recovery repairs for the kind
// its parameters name). A job that is IN_PROGRESS holds its cluster as far as this query
// goes: liveness fails the jobs of dead servers first.
//
// It is an anti-join on two indexes, the held clusters (current_operation)
// joined to their jobs by primary key, and the unheld ones (state,
// current_operation), so it reads the running operations and the orphans,
// never the resting clusters.
func (s *Store) Orphans(ctx context.Context, limit int) ([]Cluster, map[string]Job, error) {
	return s.orphans(ctx, "SELECT "+s.cols.cluster+", j.id, j.kind, j.status, j.error, j.params"+
		" FROM clusters c LEFT JOIN jobs j ON j.id = c.current_operation"+
		" WHERE c.current_operation > '' AND c.state <> ? AND (j.id IS NULL OR j.status <> ?)",
		[]any{lifecycle.Destroyed.String(), string(JobInProgress)}, limit)
}

// OrphansSince is Orphans for the clusters held by a job that ended at or
// after since: it reads the jobs that ended since then (their end time's
// index) and the clusters they still hold, where Orphans reads every held
// cluster; and the unheld clusters in an operation state as Orphans does.
// A cluster held by an operation that has no job, or whose job ended
// before since, is left to Orphans: the scanner reads both, this one at
// most passes and Orphans now and then.
func (s *Store) OrphansSince(ctx context.Context, since time.Time, limit int) ([]Cluster, map[string]Job, error) {
	// The jobs are read first, off their end time: STRAIGHT_JOIN on MySQL
	// and CROSS JOIN on SQLite keep the planners from starting with the
	// held clusters, which is Orphans' read.
	join := "CROSS JOIN"
	if s.backend == MySQL {
		join = "STRAIGHT_JOIN"
	}
	return s.orphans(ctx, "SELECT "+s.cols.cluster+", j.id, j.kind, j.status, j.error, j.params"+
		" FROM jobs j "+join+" clusters c ON c.current_operation = j.id"+
		" WHERE j.end_time >= ? AND c.state <> ? AND j.status <> ?",
		[]any{dbTime(since), lifecycle.Destroyed.String(), string(JobInProgress)}, limit)
}

// orphans runs held, the query of the held orphans and their jobs (args its
// arguments), with the unheld clusters in an operation state after it, in
// one statement of at most limit rows.
func (s *Store) orphans(ctx context.Context, held string, args []any, limit int) ([]Cluster, map[string]Job, error) {
	var states []string
	for _, st := range lifecycle.States() {
		if _, ok := lifecycle.OrphanEvent(st); ok {
			states = append(states, st.String())
		}
	}
	rows, err := s.rdb.WithContext(ctx).Raw(held+
		" UNION ALL SELECT "+s.cols.cluster+", NULL, NULL, NULL, NULL, NULL FROM clusters c"+
		" WHERE c.state IN ? AND c.current_operation = '' LIMIT ?",
		append(args, states, limit)...).Rows()
	if err != nil {
		return nil, nil, fmt.Errorf("list orphans: %w", classify(err))
	}
	defer rows.Close()
	var out []Cluster
	jobs := map[string]Job{}
	for rows.Next() {
		var id, kind, status, jerr, params sql.NullString
		r, err := scanCluster(rows, &id, &kind, &status, &jerr, &params)
		if err != nil {
			return nil, nil, fmt.Errorf("list orphans: %w", classify(err))
		}
		c, err := r.toCluster()
		if err != nil {
			return nil, nil, err
		}
		out = append(out, c)
		if id.Valid {
			jobs[id.String] = Job{ID: id.String, Kind: kind.String, Status: JobStatus(status.String), Error: jerr.String, Params: params.String}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("list orphans: %w", classify(err))
	}
	return out, jobs, nil
}

// ChangedUnheldClusters lists up to limit clusters in the given states that
// no operation holds and that changed at or after since, themselves or one
// of their machines, in id order (when there are more, which ones is not
// said): reconciliation's pass over what changed,
// one query on two indexes (the clusters' and the machines' update times),
// so a pass where nothing changed reads nothing.
func (s *Store) ChangedUnheldClusters(ctx context.Context, states []lifecycle.State, since time.Time, limit int) ([]Cluster, error) {
	names := make([]string, len(states))
	for i, st := range states {
		names[i] = st.String()
	}
	since = dbTime(since)
	// The unary + (a no-op on MySQL) keeps SQLite, which plans without
	// statistics, from reading every resting cluster off the state index
	// instead of only the changed ones off the update times.
	rows, err := s.rdb.WithContext(ctx).Raw("SELECT "+s.cols.cluster+" FROM clusters c"+
		" WHERE c.update_time >= ? AND +c.state IN ? AND +c.current_operation = ''"+
		" UNION ALL SELECT "+s.cols.cluster+" FROM clusters c"+
		" WHERE c.id IN (SELECT m.cluster_id FROM machines m WHERE m.update_time >= ?) AND +c.state IN ? AND +c.current_operation = ''"+
		" LIMIT ?",
		since, names, since, names, limit).Rows()
	if err != nil {
		return nil, fmt.Errorf("list changed clusters: %w", classify(err))
	}
	defer rows.Close()
	var out []Cluster
	for rows.Next() {
		r, err := scanCluster(rows)
		if err != nil {
			return nil, fmt.Errorf("list changed clusters: %w", classify(err))
		}
		c, err := r.toCluster()
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list changed clusters: %w", classify(err))
	}
	// Sorted and deduplicated (a cluster that changed with its machines is
	// in both halves) here, not by the query: an ORDER BY or a UNION would
	// have SQLite walk the primary key to merge the two halves in order.
	slices.SortFunc(out, func(a, b Cluster) int { return strings.Compare(a.ID, b.ID) })
	return slices.CompactFunc(out, func(a, b Cluster) bool { return a.ID == b.ID }), nil
}

// dbTime is t as a bound of an indexed range on a time column: UTC, at the
// microsecond precision the columns keep. MariaDB does not take a time with
// nanoseconds (what time.Now() has) as a constant of the column's type, and
// then reads the whole index instead of the range.
func dbTime(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }
