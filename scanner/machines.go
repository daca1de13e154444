package scanner

import (
	"context"
	"errors"
	"fmt"

	"github.com/clusterd/clusterd/repository"
)

// collectMachines removes the orphan machines of the infrastructure
// (Config.Collector) as decideOrphanMachine decides, each judged on its
// cluster read from the store after the listing, so the record is never
// older than the machine; a removal is recorded in its cluster's history
// (repository.OrphanMachineRemoved, a state-less entry) when the cluster
// exists, and logged. It reads a cluster per distinct cluster of the
// listed machines older than the grace; it runs every half grace.
func (s *Scanner) collectMachines(ctx context.Context, r *Report) {
	ms, err := s.cfg.Collector.OwnMachines(ctx)
	if err != nil {
		r.fail(fmt.Errorf("list machines for orphans: %w", err))
		return
	}
	now := s.now()
	type read struct {
		c   *repository.Cluster
		err error
	}
	clusters := map[string]read{}
	for _, m := range ms {
		if m.ClusterID == "" || m.CreateTime.IsZero() || now.Sub(m.CreateTime) < s.cfg.OrphanMachineGrace {
			continue // decided without its cluster
		}
		rd, ok := clusters[m.ClusterID]
		if !ok {
			c, err := s.cfg.Store.GetCluster(ctx, m.ClusterID)
			switch {
			case errors.Is(err, repository.ErrNotFound):
			case err != nil:
				rd.err = err
			default:
				rd.c = &c
			}
			clusters[m.ClusterID] = rd
		}
		if rd.err != nil {
			r.fail(fmt.Errorf("orphan machine %s: read cluster %s: %w", m.ID, m.ClusterID, rd.err))
			continue
		}
		remove, reason := decideOrphanMachine(m, rd.c, now, s.cfg.OrphanMachineGrace)
		if !remove {
			continue
		}
		if err := s.cfg.Collector.RemoveOrphan(ctx, m.ID, m.ClusterID); err != nil {
			r.fail(fmt.Errorf("remove orphan machine %s: %w", m.ID, err))
			continue
		}
		r.MachinesRemoved++
		s.log.Info("scanner removed an orphan machine", "machine", m.ID, "cluster", m.ClusterID, "reason", reason)
		if rd.c == nil {
			continue
		}
		if err := s.cfg.Store.RecordEvent(ctx, repository.Event{ClusterID: m.ClusterID, From: rd.c.State, To: rd.c.State,
			Name: repository.OrphanMachineRemoved, Message: "removed: " + reason}); err != nil {
			r.fail(fmt.Errorf("record the removal of orphan machine %s: %w", m.ID, err))
		}
	}
}
