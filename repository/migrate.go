package repository

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"path"
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

// migrate brings clusterd's own schema up to date.
func migrate(ctx context.Context, backend Backend, db *sql.DB) error {
	return migrateSet(ctx, backend, db, migrations, "migrations", "goose_db_version")
}

// Migrate brings the schema of a driver's own bookkeeping tables up to date
// (the simulator's call log, for one), so that a driver owns its tables
// without clusterd's migrations knowing them. dir holds one folder per
// backend, "mysql" and "sqlite", of numbered goose SQL files, as
// repository's own migrations do; name (letters, digits, '_') keeps the
// applied versions apart, in the table goose_<name>_version. Run it after
// Open and before the driver's first write; it is safe to run from several
// servers at once, and again. The tables' names are the driver's to keep
// apart from clusterd's (a prefix of its own).
func (s *Store) Migrate(ctx context.Context, name string, dir fs.FS) error {
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return fmt.Errorf("migrate %q: the name must be lower-case letters, digits and '_'", name)
		}
	}
	if name == "" {
		return fmt.Errorf("migrate: no name")
	}
	if err := migrateSet(ctx, s.backend, s.sqlDB, dir, ".", "goose_"+name+"_version"); err != nil {
		return fmt.Errorf("migrate %s: %w", name, err)
	}
	return nil
}

// migrateSet applies the migrations of root/<backend> in fsys that table
// does not record. On MySQL a table lock keeps two servers that start
// together from applying the same migration twice.
func migrateSet(ctx context.Context, backend Backend, db *sql.DB, fsys fs.FS, root, table string) error {
	dir, err := fs.Sub(fsys, path.Join(root, string(backend)))
	if err != nil {
		return fmt.Errorf("migrations for %s: %w", backend, err)
	}
	dialect := goose.DialectSQLite3
	opts := []goose.ProviderOption{goose.WithDisableGlobalRegistry(true), goose.WithTableName(table)}
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
