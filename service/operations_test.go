package service

import (
	"context"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/clusterd/clusterd/auth"
	"github.com/clusterd/clusterd/repository"
)

// jobsOnHand is a JobStore of jobs in memory that counts the reads of each.
type jobsOnHand struct {
	mu    sync.Mutex
	jobs  map[string]repository.Job
	reads map[string]int
	// afterRead, when set, runs after each read, outside the lock.
	afterRead func(id string)
}

func (s *jobsOnHand) GetJob(_ context.Context, id string) (repository.Job, error) {
	s.mu.Lock()
	s.reads[id]++
	j, ok := s.jobs[id]
	after := s.afterRead
	s.mu.Unlock()
	if after != nil {
		after(id)
	}
	if !ok {
		return repository.Job{}, repository.ErrNotFound
	}
	return j, nil
}

func (s *jobsOnHand) ListJobs(context.Context, repository.JobQuery) ([]repository.Job, error) {
	return nil, nil
}

func (s *jobsOnHand) RequestCancel(context.Context, string) (repository.Job, error) {
	return repository.Job{}, nil
}

func (s *jobsOnHand) read(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads[id]
}

func (s *jobsOnHand) end(id string) repository.Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.jobs[id]
	j.Status = repository.JobSucceeded
	s.jobs[id] = j
	return j
}

// A job's end wakes the WaitOperation calls on that job at once, and no
// other: each open wait on another job would otherwise read its job again
// at every end on the server (thousands of waits, thousands of reads an end).
// A wait that ends leaves nothing behind.
func TestAJobsEndWakesOnlyItsOwnWaiters(t *testing.T) {
	a, b := "01900000-0000-7000-8000-00000000000a", "01900000-0000-7000-8000-00000000000b"
	store := &jobsOnHand{reads: map[string]int{}, jobs: map[string]repository.Job{
		a: {ID: a, Account: "acme", Kind: "stop", Status: repository.JobInProgress},
		b: {ID: b, Account: "acme", Kind: "stop", Status: repository.JobInProgress},
	}}
	o := NewOperations(store, nil)
	o.poll = time.Hour // only an end wakes a wait here
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx = auth.NewContext(ctx, auth.Identity{Account: "acme", Role: auth.RoleAdmin, Subject: "test"})
	type answer struct {
		op  *longrunningpb.Operation
		err error
	}
	wait := func(id string) chan answer {
		out := make(chan answer, 1)
		go func() {
			op, err := o.WaitOperation(ctx, &longrunningpb.WaitOperationRequest{Name: "operations/" + id, Timeout: durationpb.New(time.Minute)})
			out <- answer{op, err}
		}()
		return out
	}
	waitedA, waitedB := wait(a), wait(b)
	deadline := time.Now().Add(time.Minute)
	for o.Waiting() < 2 || store.read(a) < 1 || store.read(b) < 1 {
		// Each wait reads its job once before it waits: for its state and
		// to check the caller may see it.
		if time.Now().After(deadline) {
			t.Fatalf("the waits did not start: %d open, reads %d and %d", o.Waiting(), store.read(a), store.read(b))
		}
		time.Sleep(time.Millisecond)
	}
	readsB := store.read(b)

	o.Notify(store.end(a))
	select {
	case got := <-waitedA:
		if got.err != nil || !got.op.GetDone() {
			t.Fatalf("the wait on the job that ended: %v, %v; want it done", got.op, got.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the wait on the job that ended did not answer")
	}

	o.Notify(store.end(b))
	if got := <-waitedB; got.err != nil || !got.op.GetDone() {
		t.Fatalf("the wait on job b: %v, %v; want it done", got.op, got.err)
	}
	if n := store.read(b) - readsB; n != 1 {
		t.Errorf("the wait on job b read it %d times from the first end to its answer; want once (after its own end)", n)
	}
	if n := store.read(b); n != 2 {
		t.Errorf("the wait on job b read it %d times in all; want twice (before it waited, after its end)", n)
	}
	// A wait that times out on a job that never ends here.
	c := "01900000-0000-7000-8000-00000000000c"
	store.mu.Lock()
	store.jobs[c] = repository.Job{ID: c, Account: "acme", Kind: "stop", Status: repository.JobInProgress}
	store.mu.Unlock()
	if _, err := o.WaitOperation(ctx, &longrunningpb.WaitOperationRequest{Name: "operations/" + c, Timeout: durationpb.New(time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	o.mu.Lock()
	left := len(o.ends)
	o.mu.Unlock()
	if left != 0 {
		t.Errorf("%d jobs' waits left behind after every wait answered; want none", left)
	}
}

// A job that ends between a wait's read of it and the wait itself still
// wakes the wait at once: the wait on the job's end begins before the read.
func TestAnEndBetweenTheReadAndTheWaitWakesIt(t *testing.T) {
	a := "01900000-0000-7000-8000-00000000000a"
	store := &jobsOnHand{reads: map[string]int{}, jobs: map[string]repository.Job{
		a: {ID: a, Account: "acme", Kind: "stop", Status: repository.JobInProgress},
	}}
	o := NewOperations(store, nil)
	o.poll = time.Hour // only an end wakes a wait here
	var once sync.Once
	store.afterRead = func(id string) {
		once.Do(func() { o.Notify(store.end(id)) }) // the job ends after its first read
	}
	ctx := auth.NewContext(context.Background(), auth.Identity{Account: "acme", Role: auth.RoleAdmin, Subject: "test"})
	start := time.Now()
	op, err := o.WaitOperation(ctx, &longrunningpb.WaitOperationRequest{Name: "operations/" + a, Timeout: durationpb.New(20 * time.Second)})
	if err != nil || !op.GetDone() {
		t.Fatalf("WaitOperation = %v, %v after %v; want the operation done", op, err, time.Since(start))
	}
	if n := store.read(a); n != 2 {
		t.Errorf("the wait read its job %d times; want twice (before it waited, after the end woke it)", n)
	}
}
