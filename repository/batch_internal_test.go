package repository

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"
)

// batchProbe opens a SQLite Store with a table of its own, whose leader
// waits, before it takes the queue, until want members are queued (or 20 s
// have passed), and which records the size of every batch it runs.
func batchProbe(t *testing.T, want int) (*probe, func() []int) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "b.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := s.sqlDB.Exec("CREATE TABLE probe (id INTEGER PRIMARY KEY, v TEXT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen []int
		once sync.Once
	)
	b := s.batch
	b.gather = func() {
		once.Do(func() { // the first batch only: later ones take what is left
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				b.mu.Lock()
				n := len(b.queue)
				b.mu.Unlock()
				if n >= want {
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	sizes := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
	run := b.run
	b.run = func(batch []*batchMember) {
		mu.Lock()
		seen = append(seen, len(batch))
		mu.Unlock()
		run(batch)
	}
	return &probe{Store: s, sizes: sizes}, sizes
}

// probe is a Store batchProbe opened, with the sizes of the batches run.
type probe struct {
	*Store
	sizes func() []int
}

// insert is a member that writes row id, then returns fail (its write is
// then undone).
func insert(id int, fail error) func(tx *gorm.DB) error {
	return func(tx *gorm.DB) error {
		if _, err := execDirect(tx, "INSERT INTO probe (id, v) VALUES (?, ?)", id, fmt.Sprint("v", id)); err != nil {
			return err
		}
		return fail
	}
}

// rows returns the ids in the probe table.
func rows(t *testing.T, s *probe) []int {
	t.Helper()
	r, err := s.sqlDB.Query("SELECT id FROM probe ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var ids []int
	for r.Next() {
		var id int
		if err := r.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// wantRows checks that the probe table holds the rows want, in id order.
func wantRows(t *testing.T, s *probe, want ...int) {
	t.Helper()
	if got := rows(t, s); !slices.Equal(got, want) {
		t.Errorf("rows %v; want %v", got, want)
	}
}

// runAll runs the members, each through batched in a goroutine of its own,
// queued in their order (the first leads the batch), and returns their
// errors.
func runAll(ctxs []context.Context, s *probe, members []func(tx *gorm.DB) error) []error {
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for i, fn := range members {
		wg.Go(func() { errs[i] = s.batched(ctxs[i], fn) })
		waitQueued(s, i+1)
	}
	wg.Wait()
	return errs
}

// waitQueued waits until n members have joined the queue, counting those
// in the batches run since (up to 20 s).
func waitQueued(s *probe, n int) {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		s.batch.mu.Lock()
		q := len(s.batch.queue)
		s.batch.mu.Unlock()
		for _, size := range s.sizes() {
			q += size
		}
		if q >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func background(n int) []context.Context {
	ctxs := make([]context.Context, n)
	for i := range ctxs {
		ctxs[i] = context.Background()
	}
	return ctxs
}

var errMember = errors.New("the member's own error")

// Writes queued together commit in one transaction, and a member's error
// undoes its own writes only: each caller gets its own outcome.
func TestABatchCommitsTogetherAndAMembersErrorUndoesItsOwnWrites(t *testing.T) {
	s, sizes := batchProbe(t, 4)
	errs := runAll(background(4), s, []func(*gorm.DB) error{insert(1, nil), insert(2, errMember), insert(3, nil), insert(4, nil)})
	for i, err := range errs {
		want := error(nil)
		if i == 1 {
			want = errMember
		}
		if !errors.Is(err, want) {
			t.Errorf("member %d: %v; want %v", i+1, err, want)
		}
	}
	wantRows(t, s, 1, 3, 4)
	if got := sizes(); !slices.Equal(got, []int{4}) {
		t.Errorf("batches of %v; want one of 4", got)
	}
	if st, _ := s.BatchStats(); st != (BatchStats{Batches: 1, Writes: 4}) {
		t.Errorf("stats %+v; want one batch of 4 writes, none undone", st)
	}
}

// A member that sees the writes of one before it in its batch sees them as
// committed: the members run one after the other.
func TestAMemberSeesTheWritesOfTheOnesBeforeIt(t *testing.T) {
	s, _ := batchProbe(t, 2)
	var n int
	errs := runAll(background(2), s, []func(*gorm.DB) error{insert(1, nil), func(tx *gorm.DB) error {
		return rowDirect(tx, "SELECT COUNT(*) FROM probe WHERE id = 1").Scan(&n)
	}})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("the second member saw %d rows of the first's; want 1", n)
	}
}

// A caller whose context ends while it waits for its turn leaves the
// queue: nothing of it is written, and it gets its context's error.
func TestAMemberWhoseContextEndsWhileQueuedIsNotRun(t *testing.T) {
	s, _ := batchProbe(t, 0)
	release := make(chan struct{})
	var once sync.Once
	s.batch.gather = func() { once.Do(func() { <-release }) }
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make([]error, 3)
	var wg, second sync.WaitGroup
	wg.Go(func() { errs[0] = s.batched(context.Background(), insert(1, nil)) })
	waitQueued(s, 1)
	second.Go(func() { errs[1] = s.batched(cctx, insert(2, nil)) })
	waitQueued(s, 2)
	wg.Go(func() { errs[2] = s.batched(context.Background(), insert(3, nil)) })
	waitQueued(s, 3)
	cancel()
	left := make(chan struct{})
	go func() { second.Wait(); close(left) }()
	select {
	case <-left: // it returns while the leader still waits to take the queue
	case <-time.After(20 * time.Second):
		t.Error("the cancelled member still waits for its batch 20 s on")
	}
	close(release)
	wg.Wait()
	if !errors.Is(errs[1], context.Canceled) {
		t.Errorf("the cancelled member: %v; want %v", errs[1], context.Canceled)
	}
	if err := errors.Join(errs[0], errs[2]); err != nil {
		t.Errorf("the others: %v", err)
	}
	wantRows(t, s, 1, 3)
}

// A member that loses the transaction (here it ends it itself; SQLite does
// so when it interrupts a write, or on an I/O error) gets its error; the
// members before it, whose writes went with the transaction, are run again
// and committed; no member after it runs outside a transaction (the last
// one writes, then fails: its row must not stay).
func TestAMemberThatLosesTheTransactionLeavesTheOthersToBeRunAgain(t *testing.T) {
	s, sizes := batchProbe(t, 5)
	loser := func(tx *gorm.DB) error {
		if _, err := execDirect(tx, "INSERT INTO probe (id, v) VALUES (3, 'v3')"); err != nil {
			return err
		}
		if _, err := execDirect(tx, "ROLLBACK"); err != nil {
			return err
		}
		return errMember
	}
	errs := runAll(background(5), s, []func(*gorm.DB) error{insert(1, nil), insert(2, nil), loser, insert(4, nil), insert(5, errMember)})
	for i, err := range errs {
		want := error(nil)
		if i == 2 || i == 4 {
			want = errMember
		}
		if !errors.Is(err, want) {
			t.Errorf("member %d: %v; want %v", i+1, err, want)
		}
	}
	wantRows(t, s, 1, 2, 4)
	if got := sizes(); len(got) < 2 || got[0] != 5 {
		t.Errorf("batches of %v; want one of 5, then the members run again", got)
	}
	if st, _ := s.BatchStats(); st.Undone != 4 {
		t.Errorf("%d writes undone; want 4 (the two before the loser, the two after it)", st.Undone)
	}
	// Run again for another's failure, they met no lock: the database
	// refused none.
	if got := s.LockConflicts(); got != (LockConflicts{}) {
		t.Errorf("lock conflicts counted %+v; want none", got)
	}
	if !errors.Is(errBatchLost, ErrUnavailable) {
		t.Error("a write undone by another's failure is not ErrUnavailable once its retries run out")
	}
}

// A panic in a member is raised in its own caller's goroutine; the other
// members of its batch are answered and their writes kept.
func TestAMembersPanicIsItsCallers(t *testing.T) {
	s, _ := batchProbe(t, 3)
	var recovered any
	panicky := func(tx *gorm.DB) error {
		if _, err := execDirect(tx, "INSERT INTO probe (id, v) VALUES (2, 'v2')"); err != nil {
			return err
		}
		panic("member 2")
	}
	errs := make([]error, 3)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = s.batched(context.Background(), insert(1, nil)) })
	waitQueued(s, 1)
	wg.Go(func() {
		defer func() { recovered = recover() }()
		errs[1] = s.batched(context.Background(), panicky)
	})
	waitQueued(s, 2)
	wg.Go(func() { errs[2] = s.batched(context.Background(), insert(3, nil)) })
	wg.Wait()
	if recovered != "member 2" {
		t.Errorf("member 2's caller recovered %v; want its panic", recovered)
	}
	if err := errors.Join(errs[0], errs[2]); err != nil {
		t.Errorf("the others: %v", err)
	}
	wantRows(t, s, 1, 3)
}

// Members whose contexts end while their batch waits for the writer
// connection (held here by another transaction) give up: they return
// their contexts' error before the connection is free, and write nothing.
func TestABatchWaitingForTheWriterGivesUpWithItsMembers(t *testing.T) {
	s, _ := batchProbe(t, 2)
	conn, err := s.sqlDB.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan []error, 1)
	go func() {
		done <- runAll([]context.Context{ctx, ctx}, s, []func(*gorm.DB) error{insert(1, nil), insert(2, nil)})
	}()
	var errs []error
	select {
	case errs = <-done:
	case <-time.After(20 * time.Second):
		t.Error("the members still wait for the writer 20 s after their contexts ended")
	}
	_ = conn.Close()
	if errs == nil {
		errs = <-done
	}
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("member %d: %v; want %v", i+1, err, context.DeadlineExceeded)
		}
	}
	wantRows(t, s)
}

// A write whose context ends during its turn finishes it, alone as in a
// batch: its caller is told it succeeded, and it did.
func TestAWriteWhoseContextEndsDuringItsTurnFinishesIt(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprint("batch of ", n), func(t *testing.T) {
			s, _ := batchProbe(t, n)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cancelling := func(tx *gorm.DB) error {
				cancel()
				_, err := execDirect(tx, "INSERT INTO probe (id, v) VALUES (100, 'x')")
				return err
			}
			members, ctxs := []func(*gorm.DB) error{cancelling}, []context.Context{ctx}
			if n == 2 {
				members, ctxs = append(members, insert(1, nil)), append(ctxs, context.Background())
			}
			errs := runAll(ctxs, s, members)
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			if got := rows(t, s); !slices.Contains(got, 100) {
				t.Errorf("rows %v; want the cancelled write's, 100", got)
			}
		})
	}
}

// A leader that finds itself alone in the queue yields once before it takes
// the queue, so that a write about to queue joins its batch. On one P, a
// goroutine started just before the leader runs during the yield and
// queues its write, and the two commit as one batch; without the yield
// they are two batches of one. The scheduler may now and then run the
// leader again first (it looks at the global run queue first every 61st
// time), so most rounds, not every one, must batch both.
func TestALoneLeaderYieldsToAWriteAboutToQueue(t *testing.T) {
	runtime.GOMAXPROCS(1)
	defer runtime.SetDefaultGOMAXPROCS()
	const rounds = 20
	var (
		mu    sync.Mutex
		sizes []int
	)
	b := &batcher{run: func(batch []*batchMember) {
		mu.Lock()
		sizes = append(sizes, len(batch))
		mu.Unlock()
	}}
	ctx := context.Background()
	noop := func(*gorm.DB) error { return nil }
	together := 0
	for range rounds {
		mu.Lock()
		sizes = nil
		mu.Unlock()
		other := make(chan error, 1)
		go func() { other <- b.do(ctx, noop) }()
		if err := b.do(ctx, noop); err != nil {
			t.Fatal(err)
		}
		if err := <-other; err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		if slices.Equal(sizes, []int{2}) {
			together++
		}
		mu.Unlock()
	}
	if together < rounds*3/4 {
		t.Errorf("the two writes were one batch in %d of %d rounds; want most: a lone leader yields before it takes the queue", together, rounds)
	}
}
