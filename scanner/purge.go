package scanner

import (
	"context"
	"fmt"
)

// purge deletes finished jobs past the retention period (purgeCutoff), the
// infrastructure's log of the calls made before it (CallLogPurger), and the
// change feed's rows past ChangeRetention (ChangePurger).
func (s *Scanner) purge(ctx context.Context, r *Report) {
	cutoff := purgeCutoff(s.now(), s.cfg.JobRetention)
	n, err := s.cfg.Store.PurgeJobs(ctx, cutoff, purgeLimit)
	r.Purged += int(n)
	if err != nil {
		r.fail(fmt.Errorf("purge: %w", err))
	}
	if p, ok := s.cfg.Infra.(CallLogPurger); ok {
		if _, err := p.PurgeCallLog(ctx, cutoff, purgeLimit); err != nil {
			r.fail(fmt.Errorf("purge the infrastructure's call log: %w", err))
		}
	}
	if p, ok := s.cfg.Store.(ChangePurger); ok {
		if _, err := p.PurgeChanges(ctx, s.cfg.ChangeRetention, purgeLimit); err != nil {
			r.fail(fmt.Errorf("purge the change feed: %w", err))
		}
	}
}
