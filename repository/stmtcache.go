package repository

import (
	"container/list"
	"context"
	"database/sql/driver"
	"errors"
)

// stmtCacheConnector opens SQLite connections that keep their statements
// prepared (see stmtCacheConn).
type stmtCacheConnector struct {
	driver.Connector
	size int
}

// Connect opens a connection of the wrapped connector.
func (c stmtCacheConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return newStmtCacheConn(conn, c.size), nil
}

// stmtCacheSize is how many statements each SQLite connection keeps
// prepared: the Store's fixed statements, and IN lists of the lengths in
// use, with room over.
const stmtCacheSize = 256

// stmtCacheConn runs each statement sent to a SQLite connection through a
// prepared statement it keeps, one per query text (the least recently used
// closed beyond size), so that SQLite parses and plans a statement once per
// connection instead of at every call: parsing was a fifth of clusterd's CPU
// in a GetCluster through the front door and a sixth in an admission. The
// driver (modernc.org/sqlite) keeps a prepared statement's handle and
// resets it between runs. MySQL has no such layer: its DSN interpolates
// arguments, so that a statement is one round trip (open.go).
//
// It sits under every other wrapper, so the command hook still sees one
// exec or query per statement, as before. A statement whose earlier rows are
// still open on the connection (a query run while iterating another's rows
// in a transaction) runs through a statement of its own, closed with its
// rows. Every optional interface the Store's other wrappers pass through is
// passed through here.
type stmtCacheConn struct {
	driver.Conn
	size  int
	lru   *list.List // of *cachedStmt, most recently used first
	stmts map[string]*list.Element
}

// cachedStmt is one prepared statement of a connection, busy while rows it
// returned are open.
type cachedStmt struct {
	query string
	stmt  driver.Stmt
	busy  bool
}

func newStmtCacheConn(conn driver.Conn, size int) *stmtCacheConn {
	return &stmtCacheConn{Conn: conn, size: size, lru: list.New(), stmts: map[string]*list.Element{}}
}

var (
	_ driver.ConnBeginTx        = (*stmtCacheConn)(nil)
	_ driver.ConnPrepareContext = (*stmtCacheConn)(nil)
	_ driver.ExecerContext      = (*stmtCacheConn)(nil)
	_ driver.QueryerContext     = (*stmtCacheConn)(nil)
	_ driver.Pinger             = (*stmtCacheConn)(nil)
	_ driver.SessionResetter    = (*stmtCacheConn)(nil)
	_ driver.Validator          = (*stmtCacheConn)(nil)
	_ driver.NamedValueChecker  = (*stmtCacheConn)(nil)
)

// cached returns the kept statement of query, preparing and keeping it if
// needed, or nil when it is busy (the caller prepares one of its own).
// database/sql uses a connection from one goroutine at a time, so the
// cache needs no lock.
func (c *stmtCacheConn) cached(ctx context.Context, query string) (*cachedStmt, error) {
	if el, ok := c.stmts[query]; ok {
		cs := el.Value.(*cachedStmt)
		if cs.busy {
			return nil, nil
		}
		c.lru.MoveToFront(el)
		return cs, nil
	}
	st, err := c.prepare(ctx, query)
	if err != nil {
		return nil, err
	}
	cs := &cachedStmt{query: query, stmt: st}
	c.stmts[query] = c.lru.PushFront(cs)
	for c.lru.Len() > c.size {
		old := c.lru.Back()
		ocs := old.Value.(*cachedStmt)
		if ocs.busy {
			break // closed with its rows (see cachedRows)
		}
		c.lru.Remove(old)
		delete(c.stmts, ocs.query)
		_ = ocs.stmt.Close()
	}
	return cs, nil
}

func (c *stmtCacheConn) prepare(ctx context.Context, query string) (driver.Stmt, error) {
	if pc, ok := c.Conn.(driver.ConnPrepareContext); ok {
		return pc.PrepareContext(ctx, query)
	}
	return c.Conn.Prepare(query)
}

// ExecContext runs query through its kept statement.
func (c *stmtCacheConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	cs, err := c.cached(ctx, query)
	if err != nil {
		return nil, err
	}
	st := (driver.Stmt)(nil)
	if cs != nil {
		st = cs.stmt
	} else {
		if st, err = c.prepare(ctx, query); err != nil {
			return nil, err
		}
		defer st.Close()
	}
	ec, ok := st.(driver.StmtExecContext)
	if !ok {
		return nil, errors.New("stmtCacheConn: the driver's statement has no ExecContext")
	}
	return ec.ExecContext(ctx, args)
}

// QueryContext runs query through its kept statement, which stays busy
// until the rows are closed.
func (c *stmtCacheConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	cs, err := c.cached(ctx, query)
	if err != nil {
		return nil, err
	}
	if cs == nil {
		st, err := c.prepare(ctx, query)
		if err != nil {
			return nil, err
		}
		cs = &cachedStmt{query: query, stmt: st}
		rows, err := queryStmt(ctx, st, args)
		if err != nil {
			_ = st.Close()
			return nil, err
		}
		return &cachedRows{Rows: rows, done: func() { _ = st.Close() }}, nil
	}
	rows, err := queryStmt(ctx, cs.stmt, args)
	if err != nil {
		return nil, err
	}
	cs.busy = true
	return &cachedRows{Rows: rows, done: func() { c.release(cs) }}, nil
}

func queryStmt(ctx context.Context, st driver.Stmt, args []driver.NamedValue) (driver.Rows, error) {
	qc, ok := st.(driver.StmtQueryContext)
	if !ok {
		return nil, errors.New("stmtCacheConn: the driver's statement has no QueryContext")
	}
	return qc.QueryContext(ctx, args)
}

// release ends a kept statement's busy spell; one the cache has let go of
// meanwhile (beyond size) is closed now.
func (c *stmtCacheConn) release(cs *cachedStmt) {
	cs.busy = false
	if el, ok := c.stmts[cs.query]; ok && el.Value == cs {
		if c.lru.Len() > c.size && c.lru.Back() == el {
			c.lru.Remove(el)
			delete(c.stmts, cs.query)
			_ = cs.stmt.Close()
		}
		return
	}
	_ = cs.stmt.Close()
}

// cachedRows calls done once, when the rows are closed.
type cachedRows struct {
	driver.Rows
	done func()
}

func (r *cachedRows) Close() error {
	err := r.Rows.Close()
	if r.done != nil {
		r.done()
		r.done = nil
	}
	return err
}

// Close closes the kept statements, then the connection.
func (c *stmtCacheConn) Close() error {
	var errs []error
	for el := c.lru.Front(); el != nil; el = el.Next() {
		errs = append(errs, el.Value.(*cachedStmt).stmt.Close())
	}
	c.lru.Init()
	clear(c.stmts)
	return errors.Join(append(errs, c.Conn.Close())...)
}

func (c *stmtCacheConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *stmtCacheConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if bc, ok := c.Conn.(driver.ConnBeginTx); ok {
		return bc.BeginTx(ctx, opts)
	}
	return c.Conn.Begin() //nolint:staticcheck // the driver has nothing else
}

func (c *stmtCacheConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.prepare(ctx, query)
}

func (c *stmtCacheConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *stmtCacheConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *stmtCacheConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *stmtCacheConn) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := c.Conn.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}
