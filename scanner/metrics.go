package scanner

import (
	"sync/atomic"
	"time"
)

// Report is what one pass did.
type Report struct {
	// JobsFailed: IN_PROGRESS jobs of dead servers or earlier incarnations.
	JobsFailed int
	// Recovered: recovery and reconciliation actions that won their CAS.
	Recovered int
	// Reconciled: clusters reconciliation acted on (won or lost).
	Reconciled int
	// LostRaces: actions whose CAS someone else won first (normal).
	LostRaces int
	// Purged: finished jobs deleted after the retention period.
	Purged int
	// Errors the pass met (it goes on past them).
	Errors []error
	// Skipped says why the pass, or its recovery, did nothing.
	Skipped  string
	Duration time.Duration
}

func (r *Report) fail(err error) { r.Errors = append(r.Errors, err) }

// counters accumulate reports for metrics (exposed in a later issue).
type counters struct {
	passes, jobsFailed, recovered, lostRaces, purged, errors atomic.Int64
	lastPassNanos                                            atomic.Int64
}

func (c *counters) record(r Report) {
	c.passes.Add(1)
	c.jobsFailed.Add(int64(r.JobsFailed))
	c.recovered.Add(int64(r.Recovered))
	c.lostRaces.Add(int64(r.LostRaces))
	c.purged.Add(int64(r.Purged))
	c.errors.Add(int64(len(r.Errors)))
	c.lastPassNanos.Store(int64(r.Duration))
}

// Metrics is a snapshot of the scanner's counters since the process started.
type Metrics struct {
	Passes, JobsFailed, Recovered, LostRaces, Purged, Errors int64
	LastPass                                                 time.Duration
}

// Metrics returns the counters; a later issue exports them.
func (s *Scanner) Metrics() Metrics {
	c := &s.metrics
	return Metrics{
		Passes: c.passes.Load(), JobsFailed: c.jobsFailed.Load(), Recovered: c.recovered.Load(),
		LostRaces: c.lostRaces.Load(), Purged: c.purged.Load(), Errors: c.errors.Load(),
		LastPass: time.Duration(c.lastPassNanos.Load()),
	}
}
