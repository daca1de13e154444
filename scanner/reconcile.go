package scanner

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/repository"
)

// observeLimit bounds the clusters Observe keeps for the next pass; more
// are left to a sweep.
const observeLimit = 100

// Observe asks for the given clusters to be reconciled in the next pass,
// whether or not reconciliation is due then: a source of infrastructure
// events (a hypervisor's domain events) calls it when it sees a machine of
// a cluster change, so the cluster goes to ALERT, or back, within a pass
// rather than a reconcile interval. The pass reads each cluster and lists
// its machines afresh, after the event, and decides as for any other
// (decideReconcile). It keeps up to observeLimit clusters; past that, it
// asks for a sweep of every resting cluster instead, so none is missed.
// It is safe to call from any goroutine, and never blocks on I/O.
func (s *Scanner) Observe(clusterIDs ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range clusterIDs {
		if !s.observed[id] && len(s.observed) >= observeLimit {
			s.cursor.again = true
			continue
		}
		s.observed[id] = true
	}
}

// Sweep asks for a sweep of every resting cluster, starting at the next
// due reconciliation (once the current one, if any, is done): a source of
// infrastructure events calls it after a gap in its events (a lost
// connection), since Observe could not be told what changed meanwhile.
// It is safe to call from any goroutine, and never blocks on I/O.
func (s *Scanner) Sweep() { s.sweepAgain() }

// takeObserved returns the clusters Observe marked, in id order, and clears
// the marks.
func (s *Scanner) takeObserved() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.observed) == 0 {
		return nil
	}
	ids := make([]string, 0, len(s.observed))
	for id := range s.observed {
		ids = append(ids, id)
	}
	clear(s.observed)
	slices.Sort(ids)
	return ids
}

// sweepAgain asks for a sweep of every resting cluster once the current
// one, if any, is done: for observed clusters a pass could not read.
func (s *Scanner) sweepAgain() {
	s.mu.Lock()
	s.cursor.again = true
	s.mu.Unlock()
}

// reconcile compares the clusters no operation holds with their machines
// (SPEC §5.2) and acts as decideReconcile decides: the clusters observed
// since the last pass (Observe) and, when due, the next page of
// reconcilePage. Their machines are listed in one call, after the clusters
// were read, so what is decided is never older than the record it CASes on.
// It leaves alone the clusters in skip, which this pass already acted on:
// a recovery it started may have ended (ALERT) before the page was read,
// and a pass acts on a cluster once (an observed one waits for the next).
func (s *Scanner) reconcile(ctx context.Context, r *Report, due bool, skip map[string]bool) {
	var clusters []repository.Cluster
	if due {
		var err error
		if clusters, err = s.reconcilePage(ctx); err != nil {
			r.fail(fmt.Errorf("reconcile: %w", err))
		}
	}
	observed := s.takeObserved()
	clusters = append(clusters, s.readObserved(ctx, r, observed, clusters)...)
	if len(clusters) == 0 {
		return
	}
	ids := make([]string, len(clusters))
	for i, c := range clusters {
		ids[i] = c.ID
	}
	all, err := s.cfg.Infra.Machines(ctx, ids...)
	if err != nil {
		r.fail(fmt.Errorf("reconcile: %w", err))
		if len(observed) > 0 {
			s.sweepAgain()
		}
		return
	}
	byCluster := map[string][]infra.Machine{}
	for _, m := range all {
		byCluster[m.ClusterID] = append(byCluster[m.ClusterID], m)
	}
	for _, c := range clusters {
		if skip[c.ID] {
			if slices.Contains(observed, c.ID) {
				s.Observe(c.ID)
			}
			continue
		}
		if a := decideReconcile(c, byCluster[c.ID]); a.kind != none {
			s.apply(ctx, r, c, a)
			r.Reconciled++
		}
	}
}

// readObserved reads the observed clusters that reconciliation may act on
// (reconcilable) and that page, already read, does not hold. A cluster
// that is gone is skipped; one it cannot read is left to a sweep.
func (s *Scanner) readObserved(ctx context.Context, r *Report, ids []string, page []repository.Cluster) []repository.Cluster {
	var out []repository.Cluster
	for _, id := range ids {
		if slices.ContainsFunc(page, func(c repository.Cluster) bool { return c.ID == id }) {
			continue
		}
		c, err := s.cfg.Store.GetCluster(ctx, id)
		switch {
		case errors.Is(err, repository.ErrNotFound):
		case err != nil:
			r.fail(fmt.Errorf("reconcile observed cluster %s: %w", id, err))
			s.sweepAgain()
		case reconcilable(c):
			out = append(out, c)
		}
	}
	return out
}

// reconcilePage returns the clusters a due reconciliation reads: the next
// page of a sweep of every resting cluster, or, between sweeps, those that
// changed (or whose machines changed) since the last one (cursor). Seeing
// a machine change relies on the infrastructure's machines being rows of
// clusterd's database, as the simulator's are; a driver whose machines
// live elsewhere feeds its changes through Observe.
func (s *Scanner) reconcilePage(ctx context.Context) ([]repository.Cluster, error) {
	now := s.now()
	margin := s.cfg.PeerTimeout + s.cfg.ReconcileInterval
	s.mu.Lock()
	var p page
	s.cursor, p = s.cursor.plan(now)
	s.mu.Unlock()
	var clusters []repository.Cluster
	var err error
	if p.sweeping() {
		clusters, err = s.cfg.Store.UnheldClusters(ctx, restingStates, p.after, reconcileLimit)
	} else {
		clusters, err = s.cfg.Store.ChangedUnheldClusters(ctx, restingStates, p.since, reconcileLimit)
	}
	if err != nil {
		return nil, err
	}
	last := ""
	if len(clusters) > 0 {
		last = clusters[len(clusters)-1].ID
	}
	s.mu.Lock()
	s.cursor = s.cursor.advance(p, now, margin, len(clusters) == reconcileLimit, last)
	s.mu.Unlock()
	return clusters, nil
}
