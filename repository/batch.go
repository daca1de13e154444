package repository

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"gorm.io/gorm"
)

// batcher commits SQLite write transactions that queue for the one writer
// connection together, in one transaction (group commit). A commit appends
// every page its transaction changed to the WAL, and transactions that
// commit together share the pages they all change (the rightmost leaves of
// the jobs, history and feed tables and of their indexes): claim-shaped
// transactions write 25 WAL frames each alone and 9-13 in batches of 4 to 8
// (BENCHMARKS.md). Each member runs in a savepoint of its own, so a member's
// error undoes its writes only, and its caller learns its own outcome once
// the batch has committed: what a member reads or writes is as if the
// members had committed one after the other, in the queue's order.
//
// A write runs without its context's cancellation once its turn has come,
// alone or not, since SQLite rolls back the whole transaction when it
// interrupts a write: a member whose context ends before its turn leaves
// the queue or is skipped, one whose context ends during its turn finishes
// it. A member that a batch rolled back through no fault of its own
// (another member's failure lost the transaction) gets a lock conflict,
// which its transaction's retries run again, alone or in a later batch; a
// failed commit answers every member the commit's error (run again when it
// is a lock conflict).
//
// Batching is for transactions that only read and write the database: a
// Guarded change (a driver's code inside the transaction) runs alone.
type batcher struct {
	mu    sync.Mutex
	queue []*batchMember
	// busy is set while a leader takes and runs batches: a member that
	// finds it set waits to be done, or to be told to lead the next batch.
	busy bool
	// run runs one batch: it sets each member's err (or panicked).
	run func(batch []*batchMember)
	// gather, when set (tests), is called by a leader before it takes the
	// queue.
	gather func()
	// What BatchStats reports.
	batches, writes, undone atomic.Uint64
}

// BatchStats counts what the SQLite writer's batches did since the Store
// opened, for the metrics: Writes (taken into batches, those skipped for
// their ended context included) / Batches is the mean batch size, the
// saving group commit makes; Undone counts writes a batch rolled back for
// another's failure (each run again) or a failed commit (run again when it
// was a lock conflict).
type BatchStats struct {
	Batches, Writes, Undone uint64
}

// BatchStats returns the writer's batch counters; ok is false on a backend
// that does not batch (MySQL commits in groups on its own).
func (s *Store) BatchStats() (st BatchStats, ok bool) {
	if s.batch == nil {
		return BatchStats{}, false
	}
	return BatchStats{Batches: s.batch.batches.Load(), Writes: s.batch.writes.Load(), Undone: s.batch.undone.Load()}, true
}

// batchMember is one transaction in the queue.
type batchMember struct {
	ctx context.Context
	fn  func(tx *gorm.DB) error
	// taken is set, under the batcher's mu, once a leader has taken the
	// member into a batch: it can no longer leave the queue.
	taken    bool
	err      error
	panicked any
	// done is closed when err is set; lead, under mu, when the member is to
	// lead the next batch.
	done, lead chan struct{}
}

// maxBatch bounds the transactions a batch commits, and so how long a
// batch holds the writer connection.
const maxBatch = 32

// errBatchLost is what a member gets whose writes a batch rolled back
// through no fault of its own: a lock conflict, so that its transaction is
// run again.
var errBatchLost = fmt.Errorf("%w: %w: the transaction this write shared was rolled back", ErrUnavailable, errLockConflict)

// do queues fn and returns its outcome once the batch it joined has ended.
// A panic in fn is raised again here, in its caller's goroutine.
func (b *batcher) do(ctx context.Context, fn func(tx *gorm.DB) error) error {
	m := &batchMember{ctx: ctx, fn: fn, done: make(chan struct{}), lead: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, m)
	leads := !b.busy
	b.busy = true
	b.mu.Unlock()
	if !leads {
		select {
		case <-m.done:
		case <-m.lead:
			b.runNext()
		case <-ctx.Done():
			if b.leave(m) {
				return ctx.Err()
			}
			// Taken, or told to lead: the leader skips a member whose
			// context has ended.
			select {
			case <-m.done:
			case <-m.lead:
				b.runNext()
			}
		}
	} else {
		b.runNext()
	}
	<-m.done
	if m.panicked != nil {
		panic(m.panicked)
	}
	return m.err
}

// leave takes m out of the queue unless a leader has taken it or it is to
// lead the next batch; it reports whether it did.
func (b *batcher) leave(m *batchMember) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-m.lead:
		return false
	default:
	}
	if m.taken {
		return false
	}
	for i, q := range b.queue {
		if q == m {
			b.queue = append(b.queue[:i:i], b.queue[i+1:]...)
			return true
		}
	}
	return false
}

// runNext takes up to maxBatch members off the queue (a leader that finds
// itself alone yields once first), runs them, and then hands the lead to
// the first member still queued, if any. Should run panic (a defect:
// members' panics are caught), the batch's members are answered and the
// lead handed on before the panic goes on.
func (b *batcher) runNext() {
	if b.gather != nil {
		b.gather()
	}
	b.mu.Lock()
	if len(b.queue) == 1 {
		// Alone: let the goroutines that are ready run first, so that the
		// writes they are about to queue join this batch rather than wait
		// for the next (eight callers' admissions on SQLite: 3.8-4.0 writes
		// a batch without it, 4.6-4.7 with it, in BENCHMARKS.md).
		b.mu.Unlock()
		runtime.Gosched()
		b.mu.Lock()
	}
	n := min(len(b.queue), maxBatch)
	batch := make([]*batchMember, n)
	copy(batch, b.queue)
	b.queue = append(b.queue[:0:0], b.queue[n:]...)
	for _, m := range batch {
		m.taken = true
	}
	b.mu.Unlock()
	answered := false
	defer func() {
		if !answered {
			for _, m := range batch {
				if m.err == nil && m.panicked == nil {
					m.err = errBatchStopped
				}
			}
		}
		for _, m := range batch {
			close(m.done)
		}
		b.mu.Lock()
		if len(b.queue) > 0 {
			close(b.queue[0].lead)
		} else {
			b.busy = false
		}
		b.mu.Unlock()
	}()
	b.run(batch)
	answered = true
	b.batches.Add(1)
	b.writes.Add(uint64(n))
}

// errBatchStopped answers the members of a batch that stopped on a panic.
var errBatchStopped = errors.New("the batch this write joined stopped on a panic: it may or may not have been committed")

// runBatch runs a batch in one transaction on the writer connection, for
// which it waits while any member still does (see waitContext). A lone
// member runs as in a transaction of its own; several, each in a
// savepoint.
func (s *Store) runBatch(batch []*batchMember) {
	wait, stop := waitContext(batch)
	defer stop()
	err := s.db.WithContext(wait).Connection(func(conn *gorm.DB) error {
		s.runOn(conn, batch)
		return nil
	})
	if err != nil { // no connection: every member gave up, or the Store closed
		for _, m := range batch {
			if m.err = m.ctx.Err(); m.err == nil {
				m.err = classify(err)
			}
		}
	}
}

// waitContext is a context that ends once every member's context has: a
// batch waits for the writer connection while one of its members would.
func waitContext(batch []*batchMember) (context.Context, func()) {
	if len(batch) == 1 {
		return batch[0].ctx, func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int32
	left.Store(int32(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, m := range batch {
		stops[i] = context.AfterFunc(m.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// runOn runs the batch in a transaction on conn. Its statements, the
// members' included, run without cancellation (see batcher); the begin and
// the end of a lone member's transaction carry its context's values.
func (s *Store) runOn(conn *gorm.DB, batch []*batchMember) {
	lone := len(batch) == 1
	begin := context.Background()
	if lone {
		begin = context.WithoutCancel(batch[0].ctx)
	}
	tx := conn.WithContext(begin).Begin()
	if tx.Error != nil {
		for _, m := range batch {
			m.err = classify(tx.Error)
		}
		return
	}
	var (
		ran  []*batchMember // members whose writes the commit keeps
		lost bool           // the transaction is gone: run nothing more
	)
	for _, m := range batch {
		if lost {
			m.err = errBatchLost
			s.batch.undone.Add(1)
			continue
		}
		if err := m.ctx.Err(); err != nil {
			m.err = err
			continue
		}
		if !lone {
			if _, err := execDirect(tx, "SAVEPOINT batch_member"); err != nil {
				lost, m.err = true, errBatchLost
				s.batch.undone.Add(1)
				continue
			}
		}
		mtx := tx.WithContext(context.WithoutCancel(m.ctx))
		m.err, m.panicked = callMember(func() error { return m.fn(mtx) })
		failed := m.err != nil || m.panicked != nil
		m.err = classify(m.err)
		if !lone {
			if failed {
				if _, err := execDirect(tx, "ROLLBACK TO batch_member"); err != nil {
					// SQLite rolled the whole transaction back (an I/O
					// error, say, in the member's statements): so much as
					// one more statement would run in autocommit.
					lost = true
					continue
				}
			}
			if _, err := execDirect(tx, "RELEASE batch_member"); err != nil {
				lost = true
				if !failed {
					m.err = errBatchLost
					s.batch.undone.Add(1)
				}
				continue
			}
		}
		if !failed {
			ran = append(ran, m)
		}
	}
	if lost || len(ran) == 0 {
		_ = tx.Rollback().Error // the transaction may be gone already
		for _, m := range ran {
			m.err = errBatchLost
		}
		s.batch.undone.Add(uint64(len(ran)))
		return
	}
	if err := tx.Commit().Error; err != nil {
		err = classify(err)
		if !lone {
			err = fmt.Errorf("commit a batch of %d: %w", len(batch), err)
			s.batch.undone.Add(uint64(len(ran)))
		}
		for _, m := range ran {
			m.err = err
		}
	}
}

// callMember calls fn, returning a panic's value rather than letting it
// unwind the leader, whose batch still has members to answer.
func callMember(fn func() error) (err error, panicked any) {
	defer func() {
		if r := recover(); r != nil {
			panicked = r
			if err == nil {
				err = errors.New("panic in a batched transaction")
			}
		}
	}()
	return fn(), nil
}

// batched is transaction for a closure that only reads and writes through
// tx: on SQLite it joins the writer's queue (see batcher) and may commit
// with others; elsewhere, and on a Store bound to a transaction, it is
// transaction.
func (s *Store) batched(ctx context.Context, fn func(tx *gorm.DB) error) error {
	if s.batch == nil || s.inTx {
		return s.transaction(ctx, fn)
	}
	return s.retrying(ctx, func() error { return s.batch.do(ctx, fn) })
}
