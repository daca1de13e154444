package repository

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"

	"github.com/go-sql-driver/mysql"

	"github.com/clusterd/clusterd/lifecycle"
)

// Sentinel errors let callers decide what a failed write means without
// parsing messages: a lost race is retried or refused, a missing row is
// NOT_FOUND, an unreachable database is UNAVAILABLE.
var (
	// ErrNotFound: the row does not exist (or the cluster is destroyed).
	ErrNotFound = errors.New("not found")
	// ErrConflict: a compare-and-set missed because someone else moved the row
	// first. Nothing was written. Use errors.As with *ConflictError for details.
	// Only a real miss is a conflict: a transaction that InnoDB rolled back on
	// a deadlock or a lock wait timeout is run again (see retrying), and one
	// that keeps losing is ErrUnavailable.
	ErrConflict = errors.New("concurrent modification")
	// ErrAlreadyExists: a unique key (display name, request id) is taken.
	ErrAlreadyExists = errors.New("already exists")
	// ErrUnavailable: the database did not answer, or could not do the write
	// just now (a lock conflict that outlasted its retries); the write may or
	// may not have happened, so callers must re-read before acting on it.
	ErrUnavailable = errors.New("database unavailable")
)

// ConflictError says what a compare-and-set expected and what it found, so
// the caller can tell a user which operation took the cluster. Got is the
// zero Expect when the row could not be re-read.
type ConflictError struct {
	ClusterID string
	Want      Expect
	Got       Expect
}

// Error names both sides of the lost race.
func (e *ConflictError) Error() string {
	return fmt.Sprintf("cluster %s changed concurrently: expected %s, found %s", e.ClusterID, e.Want, e.Got)
}

// Unwrap makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Unwrap() error { return ErrConflict }

// Expect is what a writer read and conditions its write on (SPEC §3.1): the
// state, the version counter and the operation holding the cluster.
type Expect struct {
	State     lifecycle.State
	Version   int64
	Operation string
}

// String prints an Expect for error messages and logs.
func (e Expect) String() string {
	op := e.Operation
	if op == "" {
		op = "none"
	}
	return fmt.Sprintf("%s@v%d (operation %s)", e.State, e.Version, op)
}

// MySQL error numbers: a deadlock (1213, which Galera also returns at COMMIT
// for a certification failure) or a lock wait timeout (1205) rolled the
// statement or transaction back: nothing was written, and it is run again
// (errLockConflict). A duplicate key (1062) is ErrAlreadyExists.
const (
	mysqlLockWaitTimeout = 1205
	mysqlDeadlock        = 1213
	mysqlDuplicateKey    = 1062
	mysqlUnknownVariable = 1193
)

// MySQL and MariaDB error numbers of a server going away or too busy to take
// the connection: the statement did not run, and may once it is back
// (ErrUnavailable).
var mysqlUnavailable = map[uint16]bool{
	1040: true, // too many connections
	1053: true, // server shutdown in progress
	1317: true, // query execution was interrupted (a shutdown kills queries)
	1927: true, // connection was killed (MariaDB, at shutdown)
	// A Galera node outside the primary component refuses every statement
	// ("WSREP has not yet prepared node for application use"); another
	// node, or this one once it rejoins, can do it.
	1047: true,
	// A write on such a node is refused as "Error while appending
	// streaming replication fragment (provider status: Not connected to
	// Primary Component)": the server reports it and rolls the transaction
	// back, as it does any error during COMMIT.
	1180: true,
}

// classify turns driver errors into the package's sentinels so that no caller
// ever sees a driver type. Errors it does not know are returned unchanged.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		switch my.Number {
		case mysqlDeadlock, mysqlLockWaitTimeout:
			return fmt.Errorf("%w: %w: %w", ErrUnavailable, errLockConflict, err)
		case mysqlDuplicateKey:
			return fmt.Errorf("%w: %w", ErrAlreadyExists, err)
		}
		if mysqlUnavailable[my.Number] {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	if isSQLiteUnique(err) {
		return fmt.Errorf("%w: %w", ErrAlreadyExists, err)
	}
	if isSQLiteBusy(err) {
		return fmt.Errorf("%w: %w: %w", ErrUnavailable, errLockConflict, err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var netErr net.Error
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) || errors.As(err, &netErr) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// isLockWaitTimeout reports whether err is MySQL's lock wait timeout (1205)
// or SQLite's SQLITE_BUSY after its busy timeout: either has already waited.
func isLockWaitTimeout(err error) bool {
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		return my.Number == mysqlLockWaitTimeout
	}
	return isSQLiteBusy(err) && sqliteCode(err) != sqliteBusySnapshot
}

// SQLite result codes: SQLITE_BUSY (5, with its extended codes in the high
// bits), and SQLITE_BUSY_SNAPSHOT (517), a deferred transaction's write from
// a snapshot another connection has since committed over.
const (
	sqliteBusy         = 5
	sqliteBusySnapshot = 517
)

// isSQLiteBusy recognises SQLITE_BUSY and its extended codes: another
// connection (another Store on the same file) held the write lock past the
// busy timeout, or, for SQLITE_BUSY_SNAPSHOT, committed under a transaction
// that had read. The statement failed and wrote nothing, and the Store's
// write transactions begin IMMEDIATE (immediateConnector), so it can only be
// the first statement of one: the whole transaction is run again (see
// retrying), like MySQL's lock conflicts.
func isSQLiteBusy(err error) bool {
	code := sqliteCode(err)
	return code >= 0 && code&0xff == sqliteBusy
}

// sqliteCode is the (extended) result code of a SQLite error, -1 for any
// other error.
func sqliteCode(err error) int {
	var coded interface{ Code() int }
	if !errors.As(err, &coded) {
		return -1
	}
	return coded.Code()
}
