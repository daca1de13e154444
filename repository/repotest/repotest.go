// Package repotest gives tests a fresh, throwaway database on every backend
// clusterd supports: a SQLite file in the test's temporary directory, and a
// MariaDB/MySQL database created for the test and dropped after it.
//
// The MySQL server comes from CLUSTERD_TEST_MYSQL_DSN (default
// mysql://clusterd:clusterd@127.0.0.1:3306/test, the user that
// scripts/mariadb-setup.sh creates). When it does not answer, the MySQL half
// is skipped with a loud message, or fails when CI is set.
package repotest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/glebarez/go-sqlite" // the "sqlite" driver of Exec
	"github.com/go-sql-driver/mysql"

	"github.com/clusterd/clusterd/repository"
)

// DefaultMySQLDSN is where tests look for MariaDB when the environment says nothing.
const DefaultMySQLDSN = "mysql://clusterd:clusterd@127.0.0.1:3306/test"

// Backend is one database flavour a test runs on.
type Backend struct {
	Name string
	// NewDSN returns the DSN of a fresh, empty database that is dropped when
	// the test ends.
	NewDSN func(t testing.TB) string
}

// Backends returns SQLite, and MySQL when it is reachable (see package doc).
func Backends(t testing.TB) []Backend {
	t.Helper()
	bs := []Backend{{Name: "sqlite", NewDSN: sqliteDSN}}
	if base, ok := mysqlBase(t); ok {
		bs = append(bs, Backend{Name: "mysql", NewDSN: func(t testing.TB) string { return mysqlDSN(t, base) }})
	}
	return bs
}

// Open opens a Store on a fresh database of backend b, closed at the end of the test.
func Open(t testing.TB, b Backend, opts ...repository.Option) *repository.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := repository.Open(ctx, b.NewDSN(t), opts...)
	if err != nil {
		t.Fatalf("open %s store: %v", b.Name, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func sqliteDSN(t testing.TB) string {
	return "sqlite:" + filepath.Join(t.TempDir(), "clusterd.db")
}

func mysqlBase(t testing.TB) (*url.URL, bool) {
	raw := os.Getenv("CLUSTERD_TEST_MYSQL_DSN")
	if raw == "" {
		raw = DefaultMySQLDSN
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("CLUSTERD_TEST_MYSQL_DSN: %v", err)
	}
	db, err := sql.Open("mysql", driverDSN(u, ""))
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = db.PingContext(ctx)
		cancel()
		_ = db.Close()
	}
	if err != nil {
		msg := fmt.Sprintf("\n"+
			"!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"+
			"!! MariaDB/MySQL at %s is unreachable: %v\n"+
			"!! The MySQL half of this test is NOT running. Run scripts/mariadb-setup.sh\n"+
			"!! (make test does) or set CLUSTERD_TEST_MYSQL_DSN.\n"+
			"!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", u.Host, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Log(msg)
		return nil, false
	}
	return u, true
}

// mysqlDSN creates a database named after the test and drops it at cleanup.
func mysqlDSN(t testing.TB, base *url.URL) string {
	t.Helper()
	buf := make([]byte, 6)
	_, _ = rand.Read(buf)
	name := "clusterd_test_" + hex.EncodeToString(buf)
	admin, err := sql.Open("mysql", driverDSN(base, ""))
	if err != nil {
		t.Fatalf("mysql admin connection: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		_ = admin.Close()
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u := *base
	u.Path = "/" + name
	return u.String()
}

func driverDSN(u *url.URL, db string) string {
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr = "tcp", u.Host
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.DBName = strings.TrimPrefix(db, "/")
	cfg.Timeout = 5 * time.Second
	return cfg.FormatDSN()
}

// Exec runs one statement on the database of dsn (as NewDSN returned it)
// outside the repository, for rows the repository cannot write any more,
// such as those of servers that predate a column.
func Exec(t testing.TB, dsn, query string, args ...any) {
	t.Helper()
	driver, source := "sqlite", strings.TrimPrefix(dsn, "sqlite:")
	if strings.HasPrefix(dsn, "mysql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatalf("parse %s: %v", dsn, err)
		}
		driver, source = "mysql", driverDSN(u, u.Path)
	}
	db, err := sql.Open(driver, source)
	if err != nil {
		t.Fatalf("open %s: %v", driver, err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// DriverDSN is the go-sql-driver/mysql DSN of a mysql:// DSN as NewDSN
// returned it, for tests and benchmarks that talk to the database beside
// the repository (EXPLAIN, raw-SQL baselines).
func DriverDSN(t testing.TB, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("parse %s: %v", dsn, err)
	}
	return driverDSN(u, u.Path)
}
