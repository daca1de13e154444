package e2e

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// chaosDatabase is what a soak runs on, and the database fault it suffers.
type chaosDatabase interface {
	// dsnFor is the DSN of the process in slot i.
	dsnFor(slot int) string
	// raw opens the soak's database directly, for the checker.
	raw() *sql.DB
	// fault is the database's part of the chaos; it returns what it did and
	// how long the database (or node) was down.
	fault() (string, time.Duration)
}

// chaosMariaDB is one private MariaDB, restarted once.
type chaosMariaDB struct {
	db  *privateMariaDB
	dsn string
}

func newChaosMariaDB(t *testing.T) *chaosMariaDB {
	db := startPrivateMariaDB(t)
	return &chaosMariaDB{db: db, dsn: db.newDatabase("chaos")}
}

func (m *chaosMariaDB) dsnFor(int) string { return m.dsn }
func (m *chaosMariaDB) raw() *sql.DB      { return m.db.sqlDB("chaos") }
func (m *chaosMariaDB) fault() (string, time.Duration) {
	return "MariaDB restarted", m.db.restart()
}

// chaosGalera is a private 3-node Galera cluster; the process of slot i uses
// node i%3+1, and the fault kills node 2 and starts it again (it rejoins).
type chaosGalera struct {
	t     *testing.T
	g     *privateGalera
	nodes []string // clusterd DSNs of the soak's database, by node
}

func newChaosGalera(t *testing.T) *chaosGalera {
	t.Helper()
	g := startPrivateGalera(t)
	c := &chaosGalera{t: t, g: g}
	first := g.dsn(t, 1)
	db, err := sql.Open("mysql", galeraDriverDSN(t, first, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE DATABASE chaos CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		t.Fatalf("create the soak's database: %v", err)
	}
	for n := 1; n <= 3; n++ {
		dsn := strings.TrimSuffix(g.dsn(t, n), "/test") + "/chaos"
		waitUntil(t, fmt.Sprintf("the soak's database on node %d", n), func() bool {
			node, err := sql.Open("mysql", galeraDriverDSN(t, dsn, "chaos"))
			if err != nil {
				return false
			}
			defer node.Close()
			_, err = node.Exec("SELECT 1")
			return err == nil
		})
		c.nodes = append(c.nodes, dsn)
	}
	return c
}

func (c *chaosGalera) dsnFor(slot int) string { return c.nodes[slot%len(c.nodes)] }

func (c *chaosGalera) raw() *sql.DB {
	db, err := sql.Open("mysql", galeraDriverDSN(c.t, c.nodes[0], "chaos"))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = db.Close() })
	return db
}

func (c *chaosGalera) fault() (string, time.Duration) {
	began := time.Now()
	if err := c.g.run("kill", "2"); err != nil {
		c.t.Error(err)
	}
	if err := c.g.run("start-node", "2"); err != nil {
		c.t.Error(err)
	}
	return "Galera node 2 killed and rejoined", time.Since(began)
}

// jobOnNodes reads job id's row on each node directly: a row that one node
// has and another lacks is a divergence of the nodes, not of clusterd.
func (c *chaosGalera) jobOnNodes(ctx context.Context, id string) []string {
	var out []string
	for i, dsn := range c.nodes {
		db, err := sql.Open("mysql", galeraDriverDSN(c.t, dsn, "chaos"))
		if err != nil {
			out = append(out, fmt.Sprintf("node %d: %v", i+1, err))
			continue
		}
		var status, server string
		var attempt int
		err = db.QueryRowContext(ctx, "SELECT status, server_id, attempt FROM jobs WHERE id = ?", id).Scan(&status, &server, &attempt)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			out = append(out, fmt.Sprintf("node %d: no row", i+1))
		case err != nil:
			out = append(out, fmt.Sprintf("node %d: %v", i+1, err))
		default:
			out = append(out, fmt.Sprintf("node %d: %s on %s, attempt %d", i+1, status, server, attempt))
		}
		_ = db.Close()
	}
	return out
}

// galeraDriverDSN is the go-sql-driver DSN of a clusterd mysql:// DSN.
func galeraDriverDSN(t *testing.T, clusterdDSN, db string) string {
	t.Helper()
	u := strings.TrimPrefix(clusterdDSN, "mysql://")
	creds, rest, _ := strings.Cut(u, "@")
	user, pass, _ := strings.Cut(creds, ":")
	host, _, _ := strings.Cut(rest, "/")
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.User, cfg.Passwd, cfg.DBName = "tcp", host, user, pass, db
	cfg.Timeout = 2 * time.Second
	cfg.ParseTime = true
	cfg.InterpolateParams = true
	return cfg.FormatDSN()
}

// TestChaosGalera is TestChaos with its three servers spread over the three
// nodes of a Galera cluster, and one node killed and rejoined instead of a
// MariaDB restart: the same invariants. CLUSTERD_CHAOS_DURATION sets how long
// (make test: 20s; make chaos-galera: 5 minutes).
func TestChaosGalera(t *testing.T) {
	cfg, long := chaosSettings(t)
	if !long {
		t.Parallel()
		cfg.duration = 20 * time.Second
	}
	cfg.galera = true
	c := newChaos(t, cfg)
	c.run()
	c.settle()
	c.heal()
	c.check()
	c.report()
}
