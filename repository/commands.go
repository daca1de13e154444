package repository

import (
	"context"
	"database/sql/driver"
	"errors"
	"sync/atomic"
)

// CommandKind is what a Store asked its database to do.
type CommandKind string

// The commands a Store sends. A statement run without a prepared statement
// is one Exec or Query; a prepared one costs a Prepare, its Exec or Query,
// and a Close, each a round trip on MySQL.
const (
	CommandExec     CommandKind = "exec"
	CommandQuery    CommandKind = "query"
	CommandPrepare  CommandKind = "prepare"
	CommandClose    CommandKind = "close"
	CommandBegin    CommandKind = "begin"
	CommandCommit   CommandKind = "commit"
	CommandRollback CommandKind = "rollback"
)

// Command is one command a Store sent to its database: its kind and, for
// prepare, exec and query, its SQL; for exec and query, its arguments too
// (so a test can EXPLAIN the very statement that ran).
type Command struct {
	Kind CommandKind
	SQL  string
	Args []any
}

// IsStatement reports whether the command ran SQL (an exec or a query), as
// opposed to managing a prepared statement or a transaction.
func (c Command) IsStatement() bool { return c.Kind == CommandExec || c.Kind == CommandQuery }

// WithCommandHook calls hook with every command the Store sends to its
// database, from any goroutine (a statement once the driver has taken it,
// the others before they go), with the context of the call that sent it (a
// commit or a close gets that of its begin or its prepare). It exists so that tests can hold each operation to a budget of
// statements and benchmarks can report them, on every backend, by counting
// what really goes over the wire rather than what the code seems to say; the
// context lets them tell whose commands they are. Without it (the default)
// nothing is reported, and a SQLite driver is used as is.
func WithCommandHook(hook func(ctx context.Context, c Command)) Option {
	return func(s *Store) { s.hook = hook }
}

// hookConnector wraps a driver.Connector so that every connection it opens
// reports its commands to hook (when set), and is retired once a
// transaction on it failed to commit or to roll back (hookConn.unsettled).
// Every optional interface of the driver's connection is passed through, so
// the driver behaves exactly as unwrapped (a missing one answers
// driver.ErrSkip, as database/sql expects).
type hookConnector struct {
	driver.Connector
	hook func(context.Context, Command)
}

// Connect opens a connection of the wrapped connector, reporting its commands.
func (c hookConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &hookConn{Conn: conn, hook: c.hook}, nil
}

type hookConn struct {
	driver.Conn
	hook func(context.Context, Command)
	// unsettled says a transaction on this connection failed to commit or
	// to roll back: the server may still hold it open. A Galera node
	// outside the primary component refuses ROLLBACK (1047) and keeps the
	// transaction; the next BEGIN on the connection, once the node is back,
	// would commit the statements that ran before the failure (a claim's
	// compare-and-set and history entry without its job). Such a
	// connection is never used again (IsValid, ResetSession).
	unsettled atomic.Bool
}

// report hands c to the hook, if any.
func (c *hookConn) report(ctx context.Context, cmd Command) {
	if c.hook != nil {
		c.hook(ctx, cmd)
	}
}

var (
	_ driver.ConnBeginTx        = (*hookConn)(nil)
	_ driver.ConnPrepareContext = (*hookConn)(nil)
	_ driver.ExecerContext      = (*hookConn)(nil)
	_ driver.QueryerContext     = (*hookConn)(nil)
	_ driver.Pinger             = (*hookConn)(nil)
	_ driver.SessionResetter    = (*hookConn)(nil)
	_ driver.Validator          = (*hookConn)(nil)
	_ driver.NamedValueChecker  = (*hookConn)(nil)
)

func (c *hookConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *hookConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	c.report(ctx, Command{Kind: CommandPrepare, SQL: query})
	var (
		st  driver.Stmt
		err error
	)
	if pc, ok := c.Conn.(driver.ConnPrepareContext); ok {
		st, err = pc.PrepareContext(ctx, query)
	} else {
		st, err = c.Conn.Prepare(query)
	}
	if err != nil {
		return nil, err
	}
	if c.hook == nil {
		return st, nil
	}
	return &hookStmt{Stmt: st, hook: c.hook, query: query, ctx: ctx}, nil
}

func (c *hookConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *hookConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.report(ctx, Command{Kind: CommandBegin})
	var (
		tx  driver.Tx
		err error
	)
	if bc, ok := c.Conn.(driver.ConnBeginTx); ok {
		tx, err = bc.BeginTx(ctx, opts)
	} else {
		tx, err = c.Conn.Begin() //nolint:staticcheck // the driver has nothing else
	}
	if err != nil {
		return nil, err
	}
	return &hookTx{Tx: tx, conn: c, ctx: ctx}, nil
}

func (c *hookConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	ec, ok := c.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	res, err := ec.ExecContext(ctx, query, args)
	if !errors.Is(err, driver.ErrSkip) {
		// ErrSkip: the driver wants it prepared; Prepare reports it.
		c.report(ctx, Command{Kind: CommandExec, SQL: query, Args: argValues(args)})
	}
	return res, err
}

func (c *hookConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	qc, ok := c.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	rows, err := qc.QueryContext(ctx, query, args)
	if !errors.Is(err, driver.ErrSkip) {
		c.report(ctx, Command{Kind: CommandQuery, SQL: query, Args: argValues(args)})
	}
	return rows, err
}

func (c *hookConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *hookConn) ResetSession(ctx context.Context) error {
	if c.unsettled.Load() {
		return driver.ErrBadConn
	}
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *hookConn) IsValid() bool {
	if c.unsettled.Load() {
		return false
	}
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *hookConn) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := c.Conn.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

type hookStmt struct {
	driver.Stmt
	hook  func(context.Context, Command)
	query string
	ctx   context.Context // of the prepare
}

var (
	_ driver.StmtExecContext   = (*hookStmt)(nil)
	_ driver.StmtQueryContext  = (*hookStmt)(nil)
	_ driver.NamedValueChecker = (*hookStmt)(nil)
)

func (s *hookStmt) Close() error {
	s.hook(s.ctx, Command{Kind: CommandClose, SQL: s.query})
	return s.Stmt.Close()
}

func (s *hookStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.hook(ctx, Command{Kind: CommandExec, SQL: s.query, Args: argValues(args)})
	if ec, ok := s.Stmt.(driver.StmtExecContext); ok {
		return ec.ExecContext(ctx, args)
	}
	vals, err := values(args)
	if err != nil {
		return nil, err
	}
	return s.Stmt.Exec(vals) //nolint:staticcheck // the driver has nothing else
}

func (s *hookStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.hook(ctx, Command{Kind: CommandQuery, SQL: s.query, Args: argValues(args)})
	if qc, ok := s.Stmt.(driver.StmtQueryContext); ok {
		return qc.QueryContext(ctx, args)
	}
	vals, err := values(args)
	if err != nil {
		return nil, err
	}
	return s.Stmt.Query(vals) //nolint:staticcheck // the driver has nothing else
}

func (s *hookStmt) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := s.Stmt.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

func argValues(args []driver.NamedValue) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = a.Value
	}
	return out
}

func values(args []driver.NamedValue) ([]driver.Value, error) {
	out := make([]driver.Value, len(args))
	for i, a := range args {
		if a.Name != "" {
			return nil, errors.New("named arguments need a driver with StmtExecContext")
		}
		out[i] = a.Value
	}
	return out, nil
}

type hookTx struct {
	driver.Tx
	conn *hookConn
	ctx  context.Context // of the begin
}

func (t *hookTx) Commit() error {
	t.conn.report(t.ctx, Command{Kind: CommandCommit})
	err := t.Tx.Commit()
	if err != nil {
		t.conn.unsettled.Store(true)
	}
	return err
}

func (t *hookTx) Rollback() error {
	t.conn.report(t.ctx, Command{Kind: CommandRollback})
	err := t.Tx.Rollback()
	if err != nil {
		t.conn.unsettled.Store(true)
	}
	return err
}

// dsnConnector is a driver.Connector for a driver that only opens by name.
type dsnConnector struct {
	dsn string
	drv driver.Driver
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open(c.dsn) }

func (c dsnConnector) Driver() driver.Driver { return c.drv }
