package bench_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// BASELINES. The raw SQL each service path rests on, written by hand
// against clusterd's schema and run on the same database, in the same
// process and run as the service path it is compared with. They are the
// yardstick, not clusterd: nothing outside this file runs them.

// rawClaim is the claim transaction at its barest: read the cluster by
// primary key, then in one transaction the compare-and-set and the job row.
// The job is the live server bench's (any incarnation), so a clusterd
// process on the same database (BenchmarkFrontDoor's) never takes it for a
// dead server's and adopts it.
func rawClaim(ctx context.Context, db *sql.DB, r *sql.DB, id string, n int64) error {
	return retryBusy(func() error { return rawClaimOnce(ctx, db, r, id, n) })
}

// rawClaimOnce is one attempt of rawClaim.
func rawClaimOnce(ctx context.Context, db *sql.DB, r *sql.DB, id string, n int64) error {
	var (
		state, op string
		version   int64
	)
	if err := r.QueryRowContext(ctx, "SELECT state, version, current_operation FROM clusters WHERE id = ?", id).Scan(&state, &version, &op); err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	now := time.Now().UTC().Truncate(time.Microsecond)
	job := rawJobID(n)
	res, err := tx.ExecContext(ctx, "UPDATE clusters SET state = 'STOPPING', version = ?, current_operation = ?, update_time = ? WHERE id = ? AND state = ? AND version = ? AND current_operation = ?",
		version+1, job, now, id, state, version, op)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errLost
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO jobs (id, kind, account, resource_id, server_id, server_incarnation, status, params, result, error, deadline, create_time, update_time) VALUES (?, 'stop', 'acme', ?, 'bench', '', 'IN_PROGRESS', '{}', '', '', ?, ?, ?)",
		job, id, now.Add(time.Hour), now, now); err != nil {
		return err
	}
	return tx.Commit()
}

// errLost is a compare-and-set that found the row changed.
var errLost = fmt.Errorf("lost the compare-and-set")

// rawFlip is the contention baseline: the compare-and-set of rawClaim on
// one row that every client races for, without a job (a job would leave
// the row held and every later claim lost).
func rawFlip(ctx context.Context, db, r *sql.DB, id string) error {
	var version int64
	if err := r.QueryRowContext(ctx, "SELECT version FROM clusters WHERE id = ?", id).Scan(&version); err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, "UPDATE clusters SET version = ?, update_time = ? WHERE id = ? AND version = ?",
		version+1, time.Now().UTC().Truncate(time.Microsecond), id, version)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errLost
	}
	return tx.Commit()
}

// rawGet reads what GetCluster returns: the cluster by primary key, and its
// machines by the cluster's index.
func rawGet(ctx context.Context, r *sql.DB, id string, machines bool) error {
	var c rawCluster
	if err := r.QueryRowContext(ctx, "SELECT "+rawClusterCols+" FROM clusters WHERE id = ?", id).Scan(c.dest()...); err != nil {
		return err
	}
	if !machines {
		return nil
	}
	_, err := rawMachines(ctx, r, []string{id})
	return err
}

// rawList reads what ListClusters returns for a first page of 100: 101
// clusters in id order, and the machines of the 100.
func rawList(ctx context.Context, r *sql.DB) error {
	rows, err := r.QueryContext(ctx, "SELECT "+rawClusterCols+" FROM clusters WHERE state <> 'DESTROYED' ORDER BY id LIMIT 101")
	if err != nil {
		return err
	}
	var ids []string
	for rows.Next() {
		var c rawCluster
		if err := rows.Scan(c.dest()...); err != nil {
			_ = rows.Close()
			return err
		}
		ids = append(ids, c.id)
	}
	if err := rows.Close(); err != nil {
		return err
	}
	_, err = rawMachines(ctx, r, ids[:min(100, len(ids))])
	return err
}

const rawClusterCols = "id, account, display_name, description, state, version, current_operation, kubernetes_version, " +
	"control_node_count, worker_node_count, service_offering, autoscaling_enabled, autoscaling_min, autoscaling_max, endpoint, create_time, update_time"

type rawCluster struct {
	id, account, name, description, state, op, k8s, offering, endpoint string
	version                                                            int64
	control, workers, asMin, asMax                                     int32
	as                                                                 bool
	created, updated                                                   time.Time
}

func (c *rawCluster) dest() []any {
	return []any{&c.id, &c.account, &c.name, &c.description, &c.state, &c.version, &c.op, &c.k8s,
		&c.control, &c.workers, &c.offering, &c.as, &c.asMin, &c.asMax, &c.endpoint, &c.created, &c.updated}
}

func rawMachines(ctx context.Context, r *sql.DB, ids []string) (int, error) {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	rows, err := r.QueryContext(ctx, "SELECT id, cluster_id, role, power, joined, cordoned, kubernetes_version, attached_iso, offering, create_time, update_time FROM machines WHERE cluster_id IN (?"+strings.Repeat(",?", len(ids)-1)+") ORDER BY create_time, id", args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			id, cluster, role, power, version, iso, offering string
			joined, cordoned                                 bool
			created, updated                                 time.Time
		)
		if err := rows.Scan(&id, &cluster, &role, &power, &joined, &cordoned, &version, &iso, &offering, &created, &updated); err != nil {
			return n, err
		}
		n++
	}
	return n, rows.Err()
}

// rawOrphans is the anti-join a scanner pass rests on: the clusters held by
// an operation whose job is not IN_PROGRESS, and the unheld clusters in an
// operation state, in the form that reads the fewest rows on clusterd's
// schema (each half on its own index), ids only.
func rawOrphans(ctx context.Context, r *sql.DB) (int, error) {
	rows, err := r.QueryContext(ctx, "SELECT c.id FROM clusters c LEFT JOIN jobs j ON j.id = c.current_operation"+
		" WHERE c.current_operation > '' AND c.state <> ? AND (j.id IS NULL OR j.status <> ?)"+
		" UNION ALL SELECT c.id FROM clusters c WHERE c.state IN (?,?,?,?,?,?,?,?,?,?) AND c.current_operation = ''",
		"DESTROYED", "IN_PROGRESS", "CREATED", "STARTING", "STOPPING", "SCALING", "SCALING_STOPPED_CLUSTER", "UPGRADING", "IMPORTING", "REMOVING_NODES", "RECOVERING", "DESTROYING")
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		n++
	}
	return n, rows.Err()
}

// rawStopJob is the transactions a stop's job of a 1+2 cluster runs after
// its claim (rawClaim's, job id job), at their barest: a transaction per
// step (three: the job's progress, and a row of a change log beside it,
// as clusterd's feed has), then the end: the cluster's and the job's rows
// read, the cluster's compare-and-set to STOPPED, a change row, the job
// ended. The change rows go to a table of the baseline's own
// (bench_raw_changes), which nothing of clusterd's reads.
func rawStopJob(ctx context.Context, db, r *sql.DB, id, job string) error {
	for step := 1; step <= 3; step++ {
		if err := inTx(ctx, db, func(tx *sql.Tx) error {
			now := time.Now().UTC().Truncate(time.Microsecond)
			if _, err := tx.ExecContext(ctx, "UPDATE jobs SET step = ?, steps_done = ?, steps_total = 3, update_time = ? WHERE id = ? AND status = 'IN_PROGRESS'",
				fmt.Sprintf("power_off#%d", step), step, now, job); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, "INSERT INTO bench_raw_changes (cluster_id, job_id, kind, time) VALUES (?, ?, 'step', ?)", id, job, now)
			return err
		}); err != nil {
			return err
		}
	}
	return inTx(ctx, db, func(tx *sql.Tx) error {
		var (
			state  string
			ver    int64
			status string
		)
		if err := tx.QueryRowContext(ctx, "SELECT state, version FROM clusters WHERE id = ?", id).Scan(&state, &ver); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, "SELECT status FROM jobs WHERE id = ?", job).Scan(&status); err != nil {
			return err
		}
		now := time.Now().UTC().Truncate(time.Microsecond)
		res, err := tx.ExecContext(ctx, "UPDATE clusters SET state = 'STOPPED', version = ?, current_operation = '', update_time = ? WHERE id = ? AND state = ? AND version = ? AND current_operation = ?",
			ver+1, now, id, state, ver, job)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errLost
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO bench_raw_changes (cluster_id, job_id, kind, time) VALUES (?, ?, 'end', ?)", id, job, now); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "UPDATE jobs SET status = 'SUCCEEDED', end_time = ?, update_time = ? WHERE id = ? AND status = 'IN_PROGRESS'", now, now, job)
		return err
	})
}

// rawJobID is the job id rawClaim gives claim n.
func rawJobID(n int64) string { return fmt.Sprintf("02000000-0000-7000-a000-%012d", n) }

// inTx runs fn in a transaction of db, committed if fn succeeds; a
// transaction SQLite refused as busy is run again (retryBusy).
func inTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	return retryBusy(func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if err := fn(tx); err != nil {
			return err
		}
		return tx.Commit()
	})
}

// retryBusy runs fn again while SQLite answers that the database is locked
// (SQLITE_BUSY, SQLITE_BUSY_SNAPSHOT), or MariaDB that the transaction lost
// a deadlock (1213), as the repository does: with a bin/clusterd writing
// the same file from its own process, the busy timeout alone does not
// serialise the two writers; and on MariaDB the baseline's claims and its
// jobs' transactions, run side by side, now and then deadlock on the jobs'
// index entries as clusterd's do.
func retryBusy(fn func() error) error {
	for try := 1; ; try++ {
		err := fn()
		var my *mysql.MySQLError
		if err == nil || try == 100 || !(strings.Contains(err.Error(), "database is locked") || errors.As(err, &my) && my.Number == 1213) {
			return err
		}
		time.Sleep(time.Duration(try) * time.Millisecond)
	}
}
