// Package repository is the only place in clusterd that talks SQL. It keeps
// clusters, jobs, cluster events and servers, and makes every write of a
// cluster's state a compare-and-set on (id, state, version) that returns a
// typed error when it misses (SPEC §3.1).
//
// # Fencing
//
// Whether a job still holds its cluster is decided in one place, the guard
// (guard.go): with the cluster's row locked and then the job's, always in
// that order, the cluster must name the job as its current operation, the
// job must be IN_PROGRESS and, when the caller knows its attempt, at that
// attempt. A job's end (FinishJob), its hand-off (HandOffJob) and its
// adoption (AdoptJob) pass it before they write, and so does every driver's
// change: Guarded runs a driver's writes in the guard's transaction, and
// CheckHolder passes the guard alone, for a driver whose changes go to an
// external API it calls immediately before and after each change. The
// writes that follow still carry their own conditions (the cluster's
// compare-and-set, the job's status and attempt), so each stays one
// compare-and-set; progress, which writes only the job's own row, carries
// the job's half of the guard as its condition and locks nothing.
//
// # A driver's own tables
//
// A driver that keeps bookkeeping of its own (the simulator's call log) owns
// its tables: it brings them up to date with Migrate (its own goose
// migrations, its own version table) and sends its statements through Conn,
// which inside Guarded's fn is the guard's transaction, so the bookkeeping
// commits with the check or not at all. clusterd's migrations do not know
// those tables.
//
// # The catalog
//
// Kubernetes versions and service offerings are rows (catalog.go), and the
// rules that tie clusters to them are decided by the database, never by a
// check before a write:
//
//   - A claim that puts a cluster on a version or an offering takes it in
//     the claim's own transaction: CreateCluster takes the cluster's version
//     and both offerings, a Claim its Transition's Uses (an upgrade's target
//     version, a scale's new offering). Taking is one conditional write,
//     UPDATE ... SET claims = claims + 1 WHERE key = ? AND state = 'ENABLED',
//     whose miss (RowsAffected 0) is an *UnusableError (missing or
//     DISABLED) that rolls the claim back. A claim's job records the target
//     version and offering, so a running upgrade or scale uses them too.
//   - A delete writes the entry's row first (the same claims = claims + 1),
//     then looks for users with locking reads, live clusters (alive = 1) on
//     it as kubernetes_version, service_offering or control_offering, then
//     IN_PROGRESS jobs targeting it, refuses with an *InUseError naming one,
//     and deletes otherwise; all in one transaction.
//
// Both sides write the entry's row, so they serialize on its row lock
// (MariaDB, SQLite's single writer) or, on Galera, which certifies written
// rows only, their write-sets conflict and one is rolled back and run
// again: exactly one side of a delete-vs-claim race wins, and no live
// cluster or running job ever names a deleted entry. A DISABLED entry
// refuses new claims only; the clusters on it keep running. Seeding
// (SeedCatalog) fills an empty catalog only, with inserts that keep what
// exists, so servers starting together all succeed.
// # Quotas
//
// An account's usage (clusters, nodes, vCPUs, memory) is never stored: it
// is derived from its live clusters' rows (alive, i.e. not yet DESTROYED),
// so it cannot drift from them. What a cluster counts for is what it holds
// or is about to hold: its control and worker nodes, each of its offering's
// size (one function, roleUsage, per role), and while an operation that
// grows it runs, the larger of its current worker count and the one the
// operation goes to, and per node the larger of its current offering and
// the one an offering change goes to (it resizes every node, control ones
// too). The claim writes those targets to the
// cluster's row (hold_worker_node_count, hold_service_offering, Changes.Hold:
// scale up, add nodes, offering change), and every write that releases
// the cluster clears them: a successful operation has written its new spec
// by then, a failed or cancelled one returns the account to what the
// cluster has. A scale down, a stop or a delete holds what the cluster
// has until it ends (the machines exist until then): the delete frees it
// when the cluster is DESTROYED. A failed create leaves an ERROR cluster
// that keeps the machines it provisioned (a start retries it): it counts
// until it is deleted.
//
// A claim that may grow a cluster (Transition.Quota, NewCluster.Quota) is
// checked in its own transaction: it first writes its account's quota row
// (claims = claims + 1, inserting the row if missing), then makes its own
// write, then reads the account's live clusters (a locking read on MySQL)
// and refuses with a *QuotaExceededError, writing nothing, if a resource it
// grows would pass its limit. The first write serialises the claims of one
// account: on one database by the row lock, and across Galera nodes, which
// certify write-sets only (a locking read there locks nothing on the other
// nodes), by certification: two claims of one account on two nodes both
// write the one row, one fails at COMMIT and is run again (retry.go),
// then sees the other's cluster. Limits are an admin's (SetQuota) or, for
// an account without, the caller's default (QuotaCheck.Default); sizes come
// from the caller (QuotaCheck.Size), since the catalog is not the
// repository's.
package repository

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/libtnb/sqlite"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Backend names the SQL dialect behind a Store; a few statements differ.
type Backend string

// The supported backends.
const (
	SQLite Backend = "sqlite"
	MySQL  Backend = "mysql"
)

// Store is clusterd's persistence. It is safe for concurrent use.
type Store struct {
	// db writes, and reads inside transactions; rdb reads outside them.
	// They are one pool on MySQL. On SQLite, db is the one writer
	// connection and rdb a pool of read-only connections beside it (WAL
	// lets them read while the writer writes), so reads never queue
	// behind writes.
	db      *gorm.DB
	rdb     *gorm.DB
	sqlDB   *sql.DB
	rsqlDB  *sql.DB
	backend Backend
	now     func() time.Time
	server  string
	// inTx is set on a Store bound to one transaction (see Guarded): its
	// writes are not retried on their own (see retrying).
	inTx bool
	// onRetry, optional, sees every lock conflict (WithRetryHook).
	onRetry func(attempt int, err error)
	// conflicts counts the lock conflicts retrying met (LockConflicts);
	// shared with the Stores bound to a transaction.
	conflicts *conflictCounts
	// idleTx is MariaDB's idle_transaction_timeout (0: the server's).
	idleTx time.Duration
	// hook, optional, sees every command sent (WithCommandHook).
	hook func(context.Context, Command)
	// batch, on SQLite, commits the writes queued for the writer together
	// (see batched).
	batch *batcher
	// cols are the column lists of the hand-scanned reads on this backend.
	cols hotColumns
}

// Option changes how Open builds a Store.
type Option func(*Store)

// WithClock makes the Store stamp rows with now() instead of the wall clock,
// so tests can control time without sleeping.
func WithClock(now func() time.Time) Option {
	return func(s *Store) { s.now = now }
}

// WithIdleTransactionTimeout makes MariaDB end a session that sits idle
// inside a transaction for longer than d (its idle_transaction_timeout; MySQL
// has none and ignores this), rolling it back and releasing its row locks.
// clusterd's transactions never wait between their statements, so only a
// process that is frozen (SIGSTOP, a VM paused) or cut off mid-transaction
// is affected; without it, its locks would keep its peers from recovering the
// clusters it held until it woke. Give it less than the peer timeout.
func WithIdleTransactionTimeout(d time.Duration) Option {
	return func(s *Store) { s.idleTx = d }
}

// WithServerID names the server process using the Store; history entries
// it writes record it unless a Transition names another.
func WithServerID(id string) Option {
	return func(s *Store) { s.server = id }
}

// ErrInvalidDSN: the database name given cannot be opened whatever the
// database does (an unknown scheme, no path, no database name); waiting for
// the database will not help.
var ErrInvalidDSN = errors.New("invalid database DSN")

// Open connects to the database named by dsn, runs the schema migrations and
// returns a ready Store. Two forms are accepted:
//
//	sqlite:<path>                        embedded SQLite (pure Go), one writer connection
//	mysql://user:pass@host:port/db?opts  MySQL or MariaDB
//
// MySQL sessions always get clientFoundRows=true (so an UPDATE that writes
// identical values still reports its matched row) and parseTime=true.
func Open(ctx context.Context, dsn string, opts ...Option) (*Store, error) {
	s := &Store{now: time.Now, conflicts: &conflictCounts{}}
	for _, o := range opts {
		o(s)
	}
	switch {
	case strings.HasPrefix(dsn, "sqlite:"):
		path := strings.TrimPrefix(dsn, "sqlite:")
		if path == "" {
			return nil, fmt.Errorf("open database: %w: empty sqlite path in %q", ErrInvalidDSN, dsn)
		}
		if err := sqliteFolderExists(path); err != nil {
			return nil, fmt.Errorf("open database: %w", err)
		}
		s.backend = SQLite
		drv, err := sqliteDriver()
		if err != nil {
			return nil, fmt.Errorf("open database: %w", err)
		}
		var readers driver.Connector
		if !sqliteInMemory(path) {
			readers = stmtCacheConnector{dsnConnector{dsn: sqliteReaderDSN(path), drv: drv}, stmtCacheSize}
		}
		writer := immediateConnector{stmtCacheConnector{dsnConnector{dsn: sqliteDSN(path), drv: drv}, stmtCacheSize}}
		if err := s.connect(ctx, writer, readers); err != nil {
			return nil, err
		}
	case strings.HasPrefix(dsn, "mysql://"):
		s.backend = MySQL
		driverDSN, err := mysqlDSN(dsn, s.idleTx)
		if err != nil {
			return nil, fmt.Errorf("open database: %w: %w", ErrInvalidDSN, err)
		}
		err = s.connectMySQL(ctx, driverDSN)
		var my *mysql.MySQLError
		if errors.As(err, &my) && my.Number == mysqlUnknownVariable && s.idleTx > 0 {
			// MySQL has no idle_transaction_timeout (MariaDB does).
			driverDSN, _ = mysqlDSN(dsn, 0)
			err = s.connectMySQL(ctx, driverDSN)
		}
		if err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("open database: %w: unsupported DSN %q (want sqlite:<path> or mysql://user:pass@host:port/db)", ErrInvalidDSN, redact(dsn))
	}
	if err := migrate(ctx, s.backend, s.sqlDB); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("open %s database: %w", s.backend, err)
	}
	s.cols = columnsFor(s.backend)
	return s, nil
}

// connectMySQL opens the pool of the driver DSN dsn.
func (s *Store) connectMySQL(ctx context.Context, dsn string) error {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return fmt.Errorf("open %s database: %w: %w", s.backend, ErrInvalidDSN, err)
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return fmt.Errorf("open %s database: %w: %w", s.backend, ErrInvalidDSN, err)
	}
	return s.connect(ctx, conn, nil)
}

// connect opens the connection pool of conn, and on SQLite the pool of
// readers (nil: reads share the writer's pool), and pings them.
func (s *Store) connect(ctx context.Context, conn, readers driver.Connector) error {
	open := func(c driver.Connector) (*gorm.DB, *sql.DB, error) {
		if s.hook != nil || s.backend == MySQL {
			// On MySQL always: a connection whose transaction failed to
			// end is retired (hookConn.unsettled).
			c = hookConnector{Connector: c, hook: s.hook}
		}
		sqlDB := sql.OpenDB(c)
		var dialector gorm.Dialector = &sqlite.Dialector{Conn: sqlDB}
		if s.backend == MySQL {
			dialector = gormmysql.New(gormmysql.Config{Conn: sqlDB})
		}
		db, err := gorm.Open(dialector, &gorm.Config{
			Logger:                 logger.Default.LogMode(logger.Silent),
			SkipDefaultTransaction: true,
			NowFunc:                func() time.Time { return s.now().UTC() },
		})
		if err != nil {
			_ = sqlDB.Close()
			return nil, nil, fmt.Errorf("open %s database: %w", s.backend, classify(err))
		}
		if err := sqlDB.PingContext(ctx); err != nil {
			_ = sqlDB.Close()
			return nil, nil, fmt.Errorf("open %s database: ping: %w: %w", s.backend, ErrUnavailable, err)
		}
		return db, sqlDB, nil
	}
	db, sqlDB, err := open(conn)
	if err != nil {
		return err
	}
	if s.backend == SQLite {
		// Measured here: several SQLite writer connections stall for seconds and
		// fail with SQLITE_BUSY under 8-32 concurrent writers; one connection
		// serialises them without errors.
		sqlDB.SetMaxOpenConns(1)
		s.batch = &batcher{}
		s.batch.run = s.runBatch
	} else {
		sqlDB.SetMaxOpenConns(32)
		sqlDB.SetMaxIdleConns(16)
		sqlDB.SetConnMaxLifetime(5 * time.Minute)
	}
	s.db, s.sqlDB, s.rdb, s.rsqlDB = db, sqlDB, db, nil
	if readers == nil {
		return nil
	}
	rdb, rsqlDB, err := open(readers)
	if err != nil {
		_ = sqlDB.Close()
		return err
	}
	rsqlDB.SetMaxOpenConns(sqliteReaders)
	rsqlDB.SetMaxIdleConns(sqliteReaders)
	s.rdb, s.rsqlDB = rdb, rsqlDB
	return nil
}

// sqliteReaders is the size of SQLite's pool of readers.
const sqliteReaders = 4

// Backend says which dialect the Store speaks.
func (s *Store) Backend() Backend { return s.backend }

// Ping reports whether the database answers; health checks use it.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.sqlDB.PingContext(ctx); err != nil {
		return fmt.Errorf("ping: %w: %w", ErrUnavailable, err)
	}
	// A Galera node outside the primary component still answers a ping,
	// and even a SELECT without a table, but refuses statements on tables.
	var n int
	if err := s.sqlDB.QueryRowContext(ctx, "SELECT COUNT(*) FROM servers").Scan(&n); err != nil {
		if err = classify(err); !errors.Is(err, ErrUnavailable) {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

// Close releases the connections.
func (s *Store) Close() error {
	err := s.sqlDB.Close()
	if s.rsqlDB != nil {
		err = errors.Join(err, s.rsqlDB.Close())
	}
	return err
}

// sqliteDSN adds the pragmas clusterd relies on: WAL so readers do not block
// the writer, a busy timeout for other processes (or Stores) on the same
// file, and foreign keys; and temporary files in memory, since a batch's
// savepoints (see batcher) copy the pages each member changes to a
// sub-journal, which SQLite otherwise spills to a file past 64 KiB. Transactions take the write lock up front (BEGIN
// IMMEDIATE) instead of failing at their first write, but not through the
// driver's _txlock parameter, which it ignores here: see immediateConnector.
func sqliteDSN(path string) string {
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return path + sep + "_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_pragma=temp_store(MEMORY)&_time_format=sqlite"
}

// sqliteReaderDSN is the DSN of a reader connection: read-only (a write
// through it is an error), with the writer's busy timeout; the writer has
// put the file in WAL mode, which persists.
func sqliteReaderDSN(path string) string {
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return path + sep + "_pragma=busy_timeout(10000)&_pragma=query_only(1)&_time_format=sqlite"
}

// sqliteInMemory reports whether path names an in-memory database, which
// each connection would see as a database of its own: it gets no readers.
func sqliteInMemory(path string) bool {
	file, query, _ := strings.Cut(path, "?")
	return file == ":memory:" || strings.Contains(file, ":memory:") || strings.Contains(query, "mode=memory")
}

// sqliteDriver is the pure-Go SQLite driver, which registers itself by name
// and only opens connections by DSN.
func sqliteDriver() (driver.Driver, error) {
	db, err := sql.Open(sqlite.DriverName, "")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	return db.Driver(), nil
}

// mysqlDSN turns mysql://user:pass@host:port/db?opts into the driver's DSN,
// forcing the options compare-and-set depends on.
func mysqlDSN(dsn string, idleTx time.Duration) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		// url.Error repeats the whole DSN, password included: keep only its cause.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return "", fmt.Errorf("parse mysql DSN %q: %w", redact(dsn), err)
	}
	cfg := mysql.NewConfig()
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if u.Port() == "" && u.Host != "" {
		cfg.Addr = u.Host + ":3306"
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if cfg.DBName == "" {
		return "", fmt.Errorf("mysql DSN %q names no database", redact(dsn))
	}
	for k, vs := range u.Query() {
		if len(vs) > 0 {
			if cfg.Params == nil {
				cfg.Params = map[string]string{}
			}
			cfg.Params[k] = vs[len(vs)-1]
		}
	}
	// Options that CAS correctness depends on win over whatever the DSN says.
	delete(cfg.Params, "clientFoundRows")
	delete(cfg.Params, "parseTime")
	cfg.ClientFoundRows = true
	cfg.ParseTime = true
	// Arguments are interpolated by the driver, so a statement is one round
	// trip (a query), not three (Prepare, Execute, Close: what the driver
	// does for every statement with arguments otherwise), and never a
	// server-side prepared statement. Measured here, GetCluster and its
	// machines on MariaDB, 8 clients: 4,200-6,700/s prepared per call,
	// 11,500-12,500/s interpolated. And on MariaDB 10.11 Galera, with
	// prepared statements, a transaction that a replicated write aborted
	// (brute-force abort) went on without an error, its later statements ran
	// in autocommit and its COMMIT answered OK: 33 of 2000 three-node claim
	// races had two "winners" (one with only a job row written); with
	// interpolation, 0 of 2000. So no statement cache either. The
	// connection's character set is utf8mb4, which interpolation escapes
	// safely.
	delete(cfg.Params, "interpolateParams")
	cfg.InterpolateParams = true
	cfg.Loc = time.UTC
	cfg.Timeout = 5 * time.Second
	cfg.ReadTimeout = 30 * time.Second
	cfg.WriteTimeout = 30 * time.Second
	// A lock wait longer than this is a lost race, not a stuck request.
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	if _, ok := cfg.Params["innodb_lock_wait_timeout"]; !ok {
		cfg.Params["innodb_lock_wait_timeout"] = "5"
	}
	if _, ok := cfg.Params["time_zone"]; !ok {
		cfg.Params["time_zone"] = "'+00:00'"
	}
	if _, ok := cfg.Params["idle_transaction_timeout"]; !ok && idleTx > 0 {
		cfg.Params["idle_transaction_timeout"] = strconv.Itoa(int(max(time.Second, idleTx).Round(time.Second) / time.Second))
	}
	return cfg.FormatDSN(), nil
}

// redact hides a password in a DSN before it reaches a message. A DSN that
// does not even parse loses everything between its scheme and its last '@'.
func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		scheme, rest, ok := strings.Cut(dsn, "://")
		if at := strings.LastIndex(rest, "@"); ok && at >= 0 {
			return scheme + "://xxxxx@" + rest[at+1:]
		}
		if ok {
			return scheme + "://xxxxx"
		}
		return "xxxxx"
	}
	if u.User == nil {
		return dsn
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// sqliteFolderExists says plainly that the folder of a SQLite database file
// is missing (the driver would only say it cannot open the file).
func sqliteFolderExists(path string) error {
	file, _, _ := strings.Cut(path, "?")
	if file == ":memory:" || strings.HasPrefix(file, "file:") {
		return nil
	}
	dir := filepath.Dir(file)
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("the folder %s of the SQLite database %s does not exist; create it first", dir, file)
	case err != nil:
		return fmt.Errorf("the folder of the SQLite database %s: %w", file, err)
	case !st.IsDir():
		return fmt.Errorf("%s, the folder of the SQLite database %s, is not a folder", dir, file)
	}
	return nil
}

// isSQLiteUnique recognises a UNIQUE or PRIMARY KEY violation from the pure-Go
// SQLite driver without importing its internals.
func isSQLiteUnique(err error) bool {
	var coded interface{ Code() int }
	if !errors.As(err, &coded) {
		return false
	}
	const (
		sqliteConstraintPrimaryKey = 1555
		sqliteConstraintUnique     = 2067
	)
	switch coded.Code() {
	case sqliteConstraintPrimaryKey, sqliteConstraintUnique:
		return true
	}
	return false
}
