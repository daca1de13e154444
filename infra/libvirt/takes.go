package libvirt

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/repository"
)

// Takes of free machines.
//
// A domain's metadata has no compare-and-set, and the driver's machine lock
// is per process, so two servers sharing one libvirtd could each read a
// free machine as free and each write it into their own cluster. So
// validate_node first takes the machine in the database, in the
// transaction that fences its call: one conditional insert of the
// machine's row in libvirt_machine_takes (this driver's own table, created
// by its own migrations), whose primary key lets exactly one cluster
// through. Only then does it read, check and write the domain's metadata.
// The row goes once that is done, whether the machine was taken or found
// unusable: the metadata is the record again, and a later take, which
// reads the metadata only after its own insert, sees it. A row whose
// taker died before deleting it is taken over once the taker's job has
// ended; while that job is in progress, other clusters are refused.
//
//go:embed migrations
var migrations embed.FS

// TakeStore is the database the driver keeps its takes in: a
// repository.Store on clusterd's database, whose Guarded fences the take
// like any change of the call's job.
type TakeStore interface {
	// Guarded runs fn in one transaction, only while the fence's job
	// holds its cluster (repository.ErrFenced otherwise).
	Guarded(ctx context.Context, f repository.Fence, fn func(tx *repository.Store) error) error
	// Conn sends the driver's own statements outside a transaction.
	Conn() repository.Conn
	// Migrate brings the driver's own tables up to date (New runs it).
	Migrate(ctx context.Context, name string, dir fs.FS) error
}

// Migrate creates or updates the driver's own tables (New runs it when
// Config.Takes is set).
func Migrate(ctx context.Context, store interface {
	Migrate(ctx context.Context, name string, dir fs.FS) error
}) error {
	dir, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("libvirt driver schema: %w", err)
	}
	if err := store.Migrate(ctx, "libvirt", dir); err != nil {
		return fmt.Errorf("libvirt driver schema: %w", err)
	}
	return nil
}

// take records, fenced, that the call's job is taking the call's free
// machine, or says who is: infra.ErrUnusable while another cluster's job
// in progress holds the take, infra.ErrFenced when the call's job no longer
// holds its cluster. A take of the call's own cluster (the job's adopted
// attempt, or a later job of the cluster after one that died) is the
// call's, and so is one whose job has ended.
func (d *Driver) take(ctx context.Context, step string, c infra.Call) error {
	if d.takes == nil {
		return fmt.Errorf("%s: machine %s: the driver has no database to take free machines in (Config.Takes): %w", step, c.MachineID, infra.ErrUnusable)
	}
	f := repository.Fence{ClusterID: c.ClusterID, JobID: c.Operation, Attempt: c.Attempt, Step: step, MachineID: c.MachineID}
	err := d.takes.Guarded(ctx, f, func(tx *repository.Store) error { return d.takeIn(ctx, tx, c) })
	if errors.Is(err, repository.ErrFenced) {
		d.log.Warn("libvirt step refused: its job no longer holds the cluster", "step", step, "when", "before",
			"cluster", c.ClusterID, "operation", c.Operation, "attempt", c.Attempt, "machine", c.MachineID, "error", err)
		return fmt.Errorf("%s on cluster %s by operation %s (before): %w: %v", step, c.ClusterID, c.Operation, infra.ErrFenced, err)
	}
	if err != nil {
		return fmt.Errorf("%s: take machine %s: %w", step, c.MachineID, err)
	}
	return nil
}

// takeIn is take's transaction. Every write is conditional: the insert on
// the primary key, a change of a row on the row as read. On MySQL the row
// is read locked (FOR UPDATE) before anything is written, so a take holds
// no shared lock it would have to upgrade while a release's delete waits
// for it (a deadlock that would cost the release); two takes of a machine
// with no row may still deadlock on their inserts, and Guarded runs the
// loser's transaction again.
func (d *Driver) takeIn(ctx context.Context, tx *repository.Store, c infra.Call) error {
	db := tx.Conn()
	insert, lock := "INSERT OR IGNORE INTO", ""
	if tx.Backend() == repository.MySQL {
		insert, lock = "INSERT IGNORE INTO", " FOR UPDATE"
	}
	now := d.now().UTC().Truncate(time.Microsecond)
	// Three rounds: a row that appears, goes or changes between the
	// statements (it cannot on SQLite, whose transaction holds the write
	// lock, nor on MySQL while the read's lock is held; the rounds make
	// sure of it) is read again.
	for range 3 {
		var cluster, job string
		var attempt int32
		err := queryRow(ctx, db, "SELECT cluster_id, job_id, attempt FROM libvirt_machine_takes WHERE machine_id = ?"+lock,
			[]any{c.MachineID}, &cluster, &job, &attempt)
		if errors.Is(err, sql.ErrNoRows) {
			res, err := db.ExecContext(ctx, insert+" libvirt_machine_takes (machine_id, cluster_id, job_id, attempt, server, time) VALUES (?, ?, ?, ?, ?, ?)",
				c.MachineID, c.ClusterID, c.Operation, c.Attempt, tx.ServerID(), now)
			if err != nil {
				return fmt.Errorf("insert take: %w", err)
			}
			if n, err := res.RowsAffected(); err != nil {
				return fmt.Errorf("insert take: %w", err)
			} else if n == 1 {
				return nil
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("read take: %w", err)
		}
		if cluster != c.ClusterID {
			j, err := tx.GetJob(ctx, job)
			switch {
			case errors.Is(err, repository.ErrNotFound):
			case err != nil:
				return fmt.Errorf("read the job of cluster %s taking the machine: %w", cluster, err)
			case !j.Status.Done():
				return fmt.Errorf("machine %s: cluster %s is taking it (operation %s): %w", c.MachineID, cluster, job, infra.ErrUnusable)
			}
			d.log.Info("taking over a free machine's take whose job has ended", "machine", c.MachineID,
				"cluster", c.ClusterID, "operation", c.Operation, "from_cluster", cluster, "from_operation", job)
		}
		res, err := db.ExecContext(ctx, "UPDATE libvirt_machine_takes SET cluster_id = ?, job_id = ?, attempt = ?, server = ?, time = ?"+
			" WHERE machine_id = ? AND cluster_id = ? AND job_id = ? AND attempt = ?",
			c.ClusterID, c.Operation, c.Attempt, tx.ServerID(), now, c.MachineID, cluster, job, attempt)
		if err != nil {
			return fmt.Errorf("take over take: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("take over take: %w", err)
		} else if n == 1 {
			return nil
		}
	}
	return fmt.Errorf("machine %s: its take kept changing concurrently: %w", c.MachineID, repository.ErrConflict)
}

// release deletes the call's take of its machine, once the domain's
// metadata says who has the machine. It is not fenced: it deletes the
// call's own row only (its job and attempt), which a job that lost its
// cluster may drop as well as leave. A row it fails to delete is logged
// and left: it refuses other clusters until the job ends, and the
// metadata refuses them anyway once it names the cluster.
func (d *Driver) release(ctx context.Context, c infra.Call) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	var err error
	// A delete that loses a lock conflict (a take of the machine holds
	// its row) is tried again, three times in all.
	for try := 1; try <= 3; try++ {
		_, err = d.takes.Conn().ExecContext(ctx, "DELETE FROM libvirt_machine_takes WHERE machine_id = ? AND job_id = ? AND attempt = ?",
			c.MachineID, c.Operation, c.Attempt)
		if err == nil || try == 3 {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(try) * 100 * time.Millisecond):
		}
	}
	if err != nil {
		d.log.Warn("could not delete a free machine's take; it is taken over when its job ends", "machine", c.MachineID,
			"cluster", c.ClusterID, "operation", c.Operation, "error", err)
	}
}

// queryRow reads one row of query into dest (sql.ErrNoRows when none).
func queryRow(ctx context.Context, db repository.Conn, query string, args []any, dest ...any) error {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	return rows.Close()
}
