package scanner

import (
	"context"
	"fmt"
)

// purge deletes finished jobs past the retention period (purgeCutoff), and
// the infrastructure's log of the calls made before it (CallLogPurger).
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
}
