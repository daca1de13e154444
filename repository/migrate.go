package repository

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// The schema is plain SQL, one numbered file per change and per dialect, so a
// reviewer reads exactly what runs on each backend. goose applies what is
// missing at start and records it in goose_db_version.
//
// MariaDB commits each DDL statement on its own, so a migration cut short
// (the process killed, the connection lost) leaves its first statements
// applied and goose_db_version without it; the next start runs the whole
// file again. Every MySQL migration statement is therefore written to be a
// no-op on a schema it already changed (IF [NOT] EXISTS), which
// TestMigrationsRunAgainAfterAnInterruption checks. SQLite runs each file in
// one transaction.
//
//go:embed migrations
var migrations embed.FS

// migrationTimeout bounds a migration run. It is not the caller's deadline:
// a start that gives up on a slow database must not cut a migration short
// between two statements (the next run would repair it, but nothing gains
// from it), so the run goes on without the caller's cancellation.
const migrationTimeout = 5 * time.Minute

// migrate brings the schema up to date. On MySQL a table lock keeps two
// servers that start together from applying the same migration twice.
func migrate(ctx context.Context, backend Backend, db *sql.DB) error {
	dir, err := fs.Sub(migrations, "migrations/"+string(backend))
	if err != nil {
		return fmt.Errorf("migrations for %s: %w", backend, err)
	}
	dialect := goose.DialectSQLite3
	opts := []goose.ProviderOption{goose.WithDisableGlobalRegistry(true)}
	if backend == MySQL {
		dialect = goose.DialectMySQL
		locker, err := lock.NewMySQLTableLocker()
		if err != nil {
			return fmt.Errorf("migration lock: %w", err)
		}
		opts = append(opts, goose.WithLocker(locker))
	}
	provider, err := goose.NewProvider(dialect, db, dir, opts...)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), migrationTimeout)
	defer cancel()
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("migrate schema: %w", classify(err))
	}
	return nil
}
