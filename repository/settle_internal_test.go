package repository

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync/atomic"
	"testing"
)

// A connection whose transaction failed to roll back, or to commit, is not
// used again: the server may still hold that transaction open, and the next
// BEGIN on it would commit what ran before the failure (seen on a Galera
// node outside the primary component, which refuses ROLLBACK with 1047).
// One that rolled back cleanly is kept.
func TestAConnectionWhoseTransactionDidNotEndIsRetired(t *testing.T) {
	for _, c := range []struct {
		name   string
		end    func(*sql.Tx) error
		failTx error
		fresh  bool
	}{
		{"rollback refused", (*sql.Tx).Rollback, errRefused, true},
		{"commit refused", (*sql.Tx).Commit, errRefused, true},
		{"rolled back", (*sql.Tx).Rollback, nil, false},
		{"committed", (*sql.Tx).Commit, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			fc := &fakeConnector{txErr: c.failTx}
			db := sql.OpenDB(hookConnector{Connector: fc})
			defer db.Close()
			db.SetMaxOpenConns(1)
			tx, err := db.BeginTx(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.end(tx); !errors.Is(err, c.failTx) {
				t.Fatalf("end: %v; want %v", err, c.failTx)
			}
			if _, err := db.ExecContext(context.Background(), "SELECT 1"); err != nil {
				t.Fatal(err)
			}
			if got, want := fc.opened.Load(), map[bool]int64{true: 2, false: 1}[c.fresh]; got != want {
				t.Errorf("%d connections opened; want %d", got, want)
			}
		})
	}
}

var errRefused = errors.New("Error 1047 (08S01): WSREP has not yet prepared node for application use")

// fakeConnector opens connections whose transactions end with txErr.
type fakeConnector struct {
	opened atomic.Int64
	txErr  error
}

func (f *fakeConnector) Connect(context.Context) (driver.Conn, error) {
	f.opened.Add(1)
	return &fakeConn{txErr: f.txErr}, nil
}

func (f *fakeConnector) Driver() driver.Driver { return nil }

type fakeConn struct{ txErr error }

func (c *fakeConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("not prepared") }
func (c *fakeConn) Close() error                        { return nil }
func (c *fakeConn) Begin() (driver.Tx, error)           { return fakeTx{c.txErr}, nil }
func (c *fakeConn) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	return driver.RowsAffected(0), nil
}

type fakeTx struct{ err error }

func (t fakeTx) Commit() error   { return t.err }
func (t fakeTx) Rollback() error { return t.err }
