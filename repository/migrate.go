package repository

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// The schema is plain SQL, one numbered file per change and per dialect, so a
// reviewer reads exactly what runs on each backend. goose applies what is
// missing at start and records it in goose_db_version.
//
//go:embed migrations
var migrations embed.FS

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
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("migrate schema: %w", classify(err))
	}
	return nil
}
