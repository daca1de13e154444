package scanner

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/clusterd/clusterd/repository"
)

// adoptableStore serves a fixed list of adoptable jobs; the scanner's other
// reads are not used by adopt.
type adoptableStore struct {
	Store
	jobs []repository.Job
}

func (s adoptableStore) AdoptableJobs(context.Context, repository.AdoptableQuery) ([]repository.Job, error) {
	return s.jobs, nil
}

// barrierAdopter holds every Adopt call until n calls are in flight at once,
// or until its deadline, when the call fails.
type barrierAdopter struct {
	n        int
	mu       sync.Mutex
	inFlight int
	all      chan struct{}
}

func (a *barrierAdopter) Adopt(ctx context.Context, j repository.Job, _ time.Time, _ string) error {
	a.mu.Lock()
	a.inFlight++
	if a.inFlight == a.n {
		close(a.all)
	}
	a.mu.Unlock()
	select {
	case <-a.all:
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("job %s: the other adoptions never ran beside this one", j.ID)
	}
}

// A dead server's jobs are adopted side by side: the last one moves again
// about one adoption after the first, whatever their number.
func TestAdoptionsOfOnePassRunSideBySide(t *testing.T) {
	const n = 5
	var jobs []repository.Job
	for i := range n {
		jobs = append(jobs, repository.Job{ID: fmt.Sprintf("job-%d", i), ServerID: "dead", Kind: "create", ResourceID: fmt.Sprintf("c%d", i)})
	}
	a := &barrierAdopter{n: n, all: make(chan struct{})}
	s := New(Config{Store: adoptableStore{jobs: jobs}, Adopter: a, Self: repository.Server{ID: "self"}})
	var r Report
	offer := s.adopt(context.Background(), &r, time.Now(), time.Now())
	if r.Adopted != n || len(r.Errors) != 0 {
		t.Fatalf("adopted %d of %d jobs, errors %v", r.Adopted, n, r.Errors)
	}
	if offer == nil || len(offer.NotAdopted) != 0 {
		t.Fatalf("offer after adopting every job = %+v, want one that excludes nothing", offer)
	}
}
