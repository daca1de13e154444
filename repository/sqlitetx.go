package repository

import (
	"context"
	"database/sql/driver"
)

// immediateConnector opens the SQLite writer connections, whose write
// transactions begin with BEGIN IMMEDIATE, taking the file's write lock up
// front (waiting for it up to the busy timeout) instead of at their first
// write.
//
// Why: two servers may share one SQLite file (SPEC §5), each Store with its
// writer connection. A DEFERRED transaction reads from a snapshot and asks
// for the write lock at its first write; if the other Store committed in
// between, SQLite cannot let it write from its stale snapshot and fails it
// at once with SQLITE_BUSY_SNAPSHOT ("database is locked (517)"), and if the
// other Store holds the write lock then, with SQLITE_BUSY, without waiting
// (waiting could deadlock two readers that both want to write). No busy
// timeout helps either; every fenced infrastructure call (read who holds the
// cluster, then write) hit them under load. An IMMEDIATE transaction never
// holds a snapshot it cannot write from.
//
// The Store begins the transaction itself rather than through a driver's
// _txlock=immediate DSN parameter, which glebarez/go-sqlite (the driver
// before modernc.org/sqlite) ignored whenever _time_format was also given,
// so the behaviour does not hang on a driver's parsing of its DSN. Every
// other call goes to the connection below unchanged.
type immediateConnector struct {
	driver.Connector
}

// Connect opens a connection of the wrapped connector.
func (c immediateConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &immediateConn{Conn: conn}, nil
}

// immediateConn passes through every optional interface of the driver's
// connection the hookConn does (a missing one answers driver.ErrSkip, as
// database/sql expects), so that the driver runs statements exactly as
// unwrapped.
type immediateConn struct {
	driver.Conn
}

var (
	_ driver.ConnBeginTx        = (*immediateConn)(nil)
	_ driver.ConnPrepareContext = (*immediateConn)(nil)
	_ driver.ExecerContext      = (*immediateConn)(nil)
	_ driver.QueryerContext     = (*immediateConn)(nil)
	_ driver.Pinger             = (*immediateConn)(nil)
	_ driver.SessionResetter    = (*immediateConn)(nil)
	_ driver.Validator          = (*immediateConn)(nil)
	_ driver.NamedValueChecker  = (*immediateConn)(nil)
)

func (c *immediateConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx begins a read-only transaction as the driver does (DEFERRED: it
// never writes), any other with BEGIN IMMEDIATE. Like the driver's BEGIN, it
// runs without ctx: database/sql has checked ctx already, and SQLite does
// not interrupt a wait for the write lock anyway, so ctx would only cost a
// goroutine a transaction.
func (c *immediateConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if opts.ReadOnly {
		if bc, ok := c.Conn.(driver.ConnBeginTx); ok {
			return bc.BeginTx(ctx, opts)
		}
		return c.Conn.Begin() //nolint:staticcheck // the driver has nothing else
	}
	if _, err := c.ExecContext(context.Background(), "BEGIN IMMEDIATE", nil); err != nil {
		return nil, err
	}
	return immediateTx{c: c}, nil
}

func (c *immediateConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if pc, ok := c.Conn.(driver.ConnPrepareContext); ok {
		return pc.PrepareContext(ctx, query)
	}
	return c.Conn.Prepare(query)
}

func (c *immediateConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if ec, ok := c.Conn.(driver.ExecerContext); ok {
		return ec.ExecContext(ctx, query, args)
	}
	return nil, driver.ErrSkip
}

func (c *immediateConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if qc, ok := c.Conn.(driver.QueryerContext); ok {
		return qc.QueryContext(ctx, query, args)
	}
	return nil, driver.ErrSkip
}

func (c *immediateConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *immediateConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *immediateConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *immediateConn) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := c.Conn.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// immediateTx ends a transaction that immediateConn began. Like the
// driver's, its COMMIT and ROLLBACK do not heed the context of the begin:
// database/sql rolls back a transaction whose context ends.
type immediateTx struct {
	c *immediateConn
}

func (t immediateTx) Commit() error {
	_, err := t.c.ExecContext(context.Background(), "COMMIT", nil)
	return err
}

func (t immediateTx) Rollback() error {
	_, err := t.c.ExecContext(context.Background(), "ROLLBACK", nil)
	return err
}
