package repository

import (
	"database/sql"

	"gorm.io/gorm"
)

// execDirect runs a statement written out on db's connection (the
// transaction db is bound to, or its pool) with db's context, without
// GORM's statement building: the clone, callbacks and clause build that
// tx.Exec adds cost a claim about a tenth of clusterd's CPU (profiles in
// BENCHMARKS.md). The statement, its connection and its arguments are what
// tx.Exec would send; arguments must be scalars (GORM's expansion of a
// slice into a list of placeholders is not done). It returns how many rows
// the statement changed, which both backends' drivers always know.
func execDirect(db *gorm.DB, query string, args ...any) (int64, error) {
	res, err := db.Statement.ConnPool.ExecContext(db.Statement.Context, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// rowDirect is execDirect's read of one row, for the scanned-by-hand reads
// on the path of every step (Scan returns sql.ErrNoRows for none).
func rowDirect(db *gorm.DB, query string, args ...any) *sql.Row {
	return db.Statement.ConnPool.QueryRowContext(db.Statement.Context, query, args...)
}
