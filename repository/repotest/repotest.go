// Package repotest gives tests a fresh, throwaway database on every backend
// clusterd supports: a SQLite file in the test's temporary directory, and a
// MariaDB/MySQL database created for the test and dropped after it.
//
// The MySQL server comes from CLUSTERD_TEST_MYSQL_DSN (default
// mysql://clusterd:clusterd@127.0.0.1:3306/test, the user that
// scripts/mariadb-setup.sh creates). When it does not answer, the MySQL half
// is skipped with a loud message, or fails when CI is set.
//
// A MariaDB Galera cluster (scripts/galera.sh, which make test starts) is a
// third backend for the tests that ask for it (Galera): its nodes come from
// CLUSTERD_TEST_GALERA_DSNS, one DSN a node, comma-separated; unset, those
// tests are skipped with a loud message, or fail when CI is set.
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
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "modernc.org/sqlite" // the "sqlite" driver of Exec

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
	// NodeDSNs, set for a multi-primary backend (Galera), returns the DSNs
	// of one fresh database on every node, so a test can write to it
	// through several primaries at once.
	NodeDSNs func(t testing.TB) []string
}

// Galera returns the Galera backend when CLUSTERD_TEST_GALERA_DSNS names
// reachable nodes; otherwise it logs a loud banner (fails under CI) and
// returns false.
func Galera(t testing.TB) (Backend, bool) {
	t.Helper()
	raw := os.Getenv("CLUSTERD_TEST_GALERA_DSNS")
	var nodes []*url.URL
	var problem error
	for _, d := range strings.Split(raw, ",") {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		u, err := url.Parse(d)
		if err != nil {
			problem = fmt.Errorf("CLUSTERD_TEST_GALERA_DSNS: %w", err)
			break
		}
		if err := ping(u); err != nil {
			problem = fmt.Errorf("node %s: %w", u.Host, err)
			break
		}
		nodes = append(nodes, u)
	}
	if problem == nil && len(nodes) < 2 {
		problem = fmt.Errorf("CLUSTERD_TEST_GALERA_DSNS names %d nodes; want at least 2 (scripts/galera.sh start, as make test does)", len(nodes))
	}
	if problem != nil {
		msg := fmt.Sprintf("\n"+
			"!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"+
			"!! MariaDB Galera is not available: %v\n"+
			"!! The Galera half of this test is NOT running. make test starts a 3-node\n"+
			"!! cluster with scripts/galera.sh.\n"+
			"!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", problem)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Log(msg)
		return Backend{}, false
	}
	nodeDSNs := func(t testing.TB) []string {
		t.Helper()
		// The database is created on one node; Galera replicates the DDL.
		first := mysqlDSN(t, nodes[0])
		name := strings.TrimPrefix(mustParse(t, first).Path, "/")
		out := []string{first}
		for _, n := range nodes[1:] {
			u := *n
			u.Path = "/" + name
			// The other nodes apply the CREATE DATABASE as the first
			// returns: wait until each has it (bounded).
			deadline := time.Now().Add(30 * time.Second)
			for ping(&u) != nil {
				if time.Now().After(deadline) {
					t.Fatalf("database %s not on galera node %s after 30s: %v", name, u.Host, ping(&u))
				}
				time.Sleep(20 * time.Millisecond)
			}
			out = append(out, u.String())
		}
		return out
	}
	return Backend{
		Name:     "galera",
		NewDSN:   func(t testing.TB) string { return nodeDSNs(t)[0] },
		NodeDSNs: nodeDSNs,
	}, true
}

// GaleraRounds is how many rounds a Galera race test runs:
// CLUSTERD_GALERA_RACE_ROUNDS, or def (make chaos-galera sets 1000).
func GaleraRounds(t testing.TB, def int) int {
	t.Helper()
	v := os.Getenv("CLUSTERD_GALERA_RACE_ROUNDS")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("CLUSTERD_GALERA_RACE_ROUNDS=%q: want a positive number", v)
	}
	return n
}

func mustParse(t testing.TB, raw string) *url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// ping checks that the server at u answers a statement in u's database (a
// Galera node out of the primary component answers pings, not statements).
func ping(u *url.URL) error {
	db, err := sql.Open("mysql", driverDSN(u, u.Path))
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = db.ExecContext(ctx, "SELECT 1")
	return err
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

// Open opens a Store on a fresh database of backend b, closed at the end of
// the test, its catalog seeded with the tests' versions and offerings
// (SeedCatalog).
func Open(t testing.TB, b Backend, opts ...repository.Option) *repository.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := repository.Open(ctx, b.NewDSN(t), opts...)
	if err != nil {
		t.Fatalf("open %s store: %v", b.Name, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	SeedCatalog(t, s)
	return s
}

// Versions and Offerings are the catalog SeedCatalog writes: every
// Kubernetes version and service offering the tests' clusters use, all
// ENABLED, the versions without minimum sizes (a cluster's claim needs its
// version and offerings in the catalog; the service checks the sizes).
var (
	Versions  = []string{"1.28.9", "1.29.4", "1.29.6", "1.30.2", "1.30.5", "1.31.1"}
	Offerings = []repository.ServiceOffering{
		{Name: "small", CPUs: 1, MemoryMB: 1024},
		{Name: "medium", CPUs: 2, MemoryMB: 2048},
		{Name: "large", CPUs: 4, MemoryMB: 8192},
		{Name: "xlarge", CPUs: 8, MemoryMB: 16384},
	}
)

// SeedCatalog fills an empty catalog of s with Versions and Offerings.
func SeedCatalog(t testing.TB, s *repository.Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	vs := make([]repository.KubernetesVersion, len(Versions))
	for i, v := range Versions {
		vs[i] = repository.KubernetesVersion{Version: v, State: repository.CatalogEnabled}
	}
	os := slices.Clone(Offerings)
	for i := range os {
		os[i].State = repository.CatalogEnabled
	}
	if err := s.SeedCatalog(ctx, vs, os); err != nil {
		t.Fatalf("seed catalog: %v", err)
	}
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
	db := openRaw(t, dsn)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// openRaw opens the database of dsn (as NewDSN returned it) with its
// driver alone, beside the repository.
func openRaw(t testing.TB, dsn string) *sql.DB {
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
	return db
}

// QueryRow reads one row of the database of dsn (as NewDSN returned it)
// outside the repository into dest, for what the repository does not expose
// (goose's version table, say).
func QueryRow(t testing.TB, dsn, query string, dest ...any) {
	t.Helper()
	db := openRaw(t, dsn)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.QueryRowContext(ctx, query).Scan(dest...); err != nil {
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
