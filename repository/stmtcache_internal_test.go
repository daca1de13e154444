package repository

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

// cacheProbe opens a one-connection SQLite pool whose connection keeps
// size statements, and records the commands that reach the driver under
// the cache.
func cacheProbe(t *testing.T, size int) (*sql.DB, func() []Command) {
	t.Helper()
	drv, err := sqliteDriver()
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen []Command
	)
	hook := func(_ context.Context, c Command) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, c)
	}
	conn := stmtCacheConnector{hookConnector{dsnConnector{dsn: sqliteDSN(filepath.Join(t.TempDir(), "c.db")), drv: drv}, hook}, size}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	if _, err := db.Exec("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := db.Exec("INSERT INTO t (id, v) VALUES (?, ?)", i, fmt.Sprint("v", i)); err != nil {
			t.Fatal(err)
		}
	}
	return db, func() []Command {
		mu.Lock()
		defer mu.Unlock()
		out := slices.Clone(seen)
		seen = nil
		return out
	}
}

func count(cs []Command, kind CommandKind) int {
	n := 0
	for _, c := range cs {
		if c.Kind == kind {
			n++
		}
	}
	return n
}

func TestStmtCache_PreparesAStatementOncePerConnection(t *testing.T) {
	db, seen := cacheProbe(t, 8)
	seen()
	for i := range 5 {
		var v string
		if err := db.QueryRow("SELECT v FROM t WHERE id = ?", i%3).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprint("v", i%3); v != want {
			t.Fatalf("read %q, want %q", v, want)
		}
		if _, err := db.Exec("UPDATE t SET v = v WHERE id = ?", i%3); err != nil {
			t.Fatal(err)
		}
	}
	cs := seen()
	if p, q, e := count(cs, CommandPrepare), count(cs, CommandQuery), count(cs, CommandExec); p != 2 || q != 5 || e != 5 {
		t.Fatalf("5 reads and 5 updates: %d prepares, %d queries, %d execs; want 2, 5, 5", p, q, e)
	}
}

func TestStmtCache_AQueryWhileItsRowsAreOpenRunsApart(t *testing.T) {
	db, seen := cacheProbe(t, 8)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	const q = "SELECT id, v FROM t WHERE id >= ? ORDER BY id"
	rows, err := tx.Query(q, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var (
			id int
			v  string
		)
		if err := rows.Scan(&id, &v); err != nil {
			t.Fatal(err)
		}
		// The same text, while the outer rows are open on the same
		// connection: it must not reset the outer statement.
		inner, err := tx.Query(q, id)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for inner.Next() {
			n++
		}
		if err := inner.Close(); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d:%s:%d", id, v, n))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	_ = rows.Close()
	if want := []string{"0:v0:3", "1:v1:2", "2:v2:1"}; !slices.Equal(got, want) {
		t.Fatalf("outer rows with an inner query of the same text: %v, want %v", got, want)
	}
	seen()
	// The kept statement is free again: the next run prepares nothing.
	var n int
	if err := tx.QueryRow("SELECT COUNT(*) FROM t WHERE id >= ?", 0).Scan(&n); err != nil {
		t.Fatal(err)
	}
	rows, err = tx.Query(q, 1)
	if err != nil {
		t.Fatal(err)
	}
	_ = rows.Close()
	if p := count(seen(), CommandPrepare); p != 1 {
		t.Fatalf("after the nesting, a new text and the kept one: %d prepares, want 1", p)
	}
}

func TestStmtCache_KeepsAtMostSizeStatements(t *testing.T) {
	db, seen := cacheProbe(t, 2)
	read := func(col string) {
		t.Helper()
		var v any
		if err := db.QueryRow("SELECT " + col + " FROM t WHERE id = 0").Scan(&v); err != nil {
			t.Fatal(err)
		}
	}
	read("id")
	read("v") // the two kept, the set-up's statements let go
	seen()
	read("id || v") // evicts "id"
	cs := seen()
	if p, c := count(cs, CommandPrepare), count(cs, CommandClose); p != 1 || c != 1 {
		t.Fatalf("a third text through a cache of two: %d prepares, %d closes; want 1, 1", p, c)
	}
	read("v")  // kept
	read("id") // prepared again, evicting "id || v"
	cs = seen()
	if p, c := count(cs, CommandPrepare), count(cs, CommandClose); p != 1 || c != 1 {
		t.Fatalf("a kept text and an evicted one: %d prepares, %d closes; want 1, 1", p, c)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if c := count(seen(), CommandClose); c != 2 {
		t.Fatalf("closing the pool closed %d kept statements, want 2", c)
	}
}
