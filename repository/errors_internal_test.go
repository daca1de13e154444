package repository

import (
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// A Galera node outside the primary component refuses reads (1047) and
// writes (1180, seen in TestChaosGalera while a node was killed): both are
// ErrUnavailable, which a running operation rides out, never an error the
// status mapping does not know (INTERNAL). A duplicate key and a deadlock
// keep their own meanings; an error classify does not know is unchanged.
func TestClassifyMySQLErrors(t *testing.T) {
	for _, c := range []struct {
		err         *mysql.MySQLError
		unavailable bool
		conflict    bool
		exists      bool
	}{
		{&mysql.MySQLError{Number: 1047, Message: "WSREP has not yet prepared node for application use"}, true, false, false},
		{&mysql.MySQLError{Number: 1180, Message: "Error while appending streaming replication fragment(provider status: Not connected to Primary Component)"}, true, false, false},
		{&mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock; try restarting transaction"}, true, true, false},
		{&mysql.MySQLError{Number: 1062, Message: "Duplicate entry"}, false, false, true},
		{&mysql.MySQLError{Number: 1064, Message: "You have an error in your SQL syntax"}, false, false, false},
	} {
		got := classify(c.err)
		if errors.Is(got, ErrUnavailable) != c.unavailable || errors.Is(got, errLockConflict) != c.conflict || errors.Is(got, ErrAlreadyExists) != c.exists {
			t.Errorf("classify(%d %s) = %v; want unavailable %v, lock conflict %v, already exists %v",
				c.err.Number, c.err.Message, got, c.unavailable, c.conflict, c.exists)
		}
		if !errors.Is(got, c.err) {
			t.Errorf("classify(%d) = %v; want it to wrap the driver's error", c.err.Number, got)
		}
	}
}
