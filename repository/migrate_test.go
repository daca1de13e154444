package repository_test

import (
	"context"
	"testing"
	"time"

	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// MariaDB commits DDL statement by statement, so a migration cut short (a
// start killed, or one that once gave up on a slow database mid-migration)
// is run again in full at the next start: it must pass over what it already
// changed. Each round forgets every migration from version v on and opens
// the store again, which runs them all again over the complete schema.
func TestMigrationsRunAgainAfterAnInterruption(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		if b.Name != "mysql" {
			continue // SQLite runs each migration in one transaction
		}
		t.Run(b.Name, func(t *testing.T) {
			dsn := b.NewDSN(t)
			open := func() {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				s, err := repository.Open(ctx, dsn)
				if err != nil {
					t.Fatal(err)
				}
				_ = s.Close()
			}
			open()
			var latest int
			repotest.QueryRow(t, dsn, "SELECT MAX(version_id) FROM goose_db_version", &latest)
			if latest < 1 {
				t.Fatalf("latest migration %d", latest)
			}
			for v := latest; v >= 1; v-- {
				repotest.Exec(t, dsn, "DELETE FROM goose_db_version WHERE version_id >= ?", v)
				open()
			}
		})
	}
}
