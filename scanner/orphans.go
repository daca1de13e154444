package scanner

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/clusterd/clusterd/repository"
)

// orphans recovers every cluster in an operation state, or naming a current
// operation, whose job is not IN_PROGRESS on a live server (SPEC §5.1), as
// decideOrphan decides. It reads the clusters, then their jobs, and CASes on
// what it read, so an operation that ends in between makes the write miss.
// A destroy that failed and released its cluster is retried with backoff,
// destroyLimit per pass. It returns the clusters it acted on.
//
// The read is whole (every held cluster) when due (every ReconcileInterval)
// and when the last pass did not deal with all there was (a read that hit
// its limit, an error, a cluster left to an older server's job); otherwise
// it reads only the clusters held by jobs that ended since the last read
// began, less orphanMargin (orphanReadSince), which covers a commit that
// became visible late or a writer's clock behind this server's; the whole
// read finds what that misses, and a cluster naming an operation that has
// no job.
func (s *Scanner) orphans(ctx context.Context, r *Report, due bool) (acted map[string]bool) {
	began := s.now()
	s.mu.Lock()
	since, whole := orphanReadSince(s.orphansRead, due, orphanMargin)
	s.mu.Unlock()
	var (
		clusters []repository.Cluster
		jobs     map[string]repository.Job
		err      error
	)
	if whole {
		clusters, jobs, err = s.cfg.Store.Orphans(ctx, orphanLimit)
	} else {
		clusters, jobs, err = s.cfg.Store.OrphansSince(ctx, since, orphanLimit)
	}
	if err != nil {
		r.fail(fmt.Errorf("orphans: %w", err))
		return nil
	}
	// The next read starts from this one only if this pass dealt with all
	// it read; otherwise it is whole, so nothing left here waits for the
	// next due pass. (A destroy waiting its backoff is unheld, and every
	// read returns those.)
	complete := len(clusters) < orphanLimit
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if complete {
			s.orphansRead = began
		} else {
			s.orphansRead = time.Time{}
		}
	}()
	legacy, err := s.cfg.Store.InProgressJobsWithoutResource(ctx)
	if err != nil {
		complete = false
		r.fail(fmt.Errorf("orphans: %w", err))
		return nil
	}
	all, held := legacyHolds(legacy)
	if all {
		complete = false
		r.Skipped = "a running job of an older server names no cluster: recovery leaves every cluster alone"
		return nil
	}
	acted = map[string]bool{}
	destroys := 0
	for _, c := range clusters {
		if held[c.ID] {
			complete = false
		}
		a := decideOrphan(c, jobs, held[c.ID])
		if a.kind == none {
			continue
		}
		if a.backoff {
			if destroys >= destroyLimit || !s.destroyDue(c.ID) {
				continue
			}
			destroys++
		}
		failed := len(r.Errors)
		s.apply(ctx, r, c, a)
		if len(r.Errors) > failed {
			complete = false
		}
		acted[c.ID] = true
	}
	return acted
}

// orphanReadSince decides how a pass reads the orphans: whole when due, or
// when no earlier read returned every orphan (last zero); otherwise the
// clusters held by jobs that ended since last, less margin.
func orphanReadSince(last time.Time, due bool, margin time.Duration) (since time.Time, whole bool) {
	if due || last.IsZero() {
		return time.Time{}, true
	}
	return last.Add(-margin), false
}

// orphanMargin is how far before the last read's start the next one reads
// the jobs that ended: a job's end time is stamped by its writer before the
// commit, on that server's clock. Not the peer timeout, which may be set
// to hours: every job that ended in it would be read at every pass.
const orphanMargin = 2 * time.Second

// destroyDue takes a retry of the cluster's destroy if its backoff allows
// one now (retry.take).
func (s *Scanner) destroyDue(clusterID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	rt, due := s.destroyRetry[clusterID].take(s.now())
	s.destroyRetry[clusterID] = rt
	return due
}

// legacyHolds applies the mixed-version rule (SPEC §4): a running job written
// without a resource id acts on the cluster its parameters name; one whose
// parameters name none could act on any cluster, so all are left alone.
func legacyHolds(jobs []repository.Job) (all bool, held map[string]bool) {
	held = map[string]bool{}
	for _, j := range jobs {
		id := clusterOfParams(j.Params)
		if id == "" {
			return true, nil
		}
		held[id] = true
	}
	return false, held
}

// clusterOfParams finds a cluster id in an older server's job parameters.
func clusterOfParams(params string) string {
	var m map[string]any
	if json.Unmarshal([]byte(params), &m) != nil {
		return ""
	}
	for _, key := range []string{"cluster_id", "clusterId", "cluster", "resource_id", "name"} {
		if v, ok := m[key].(string); ok {
			v = strings.TrimPrefix(v, "clusters/")
			if _, err := uuid.Parse(v); err == nil {
				return strings.ToLower(v)
			}
		}
	}
	return ""
}
