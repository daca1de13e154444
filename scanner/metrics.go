package scanner

import (
	"sync/atomic"
	"time"
)

// Report is what one pass did.
type Report struct {
	// JobsFailed: IN_PROGRESS jobs of dead servers or earlier incarnations.
	JobsFailed int
	// Adopted: jobs of dead servers, earlier incarnations or handed off that
	// this server adopted.
	Adopted int
	// Recovered: recovery and reconciliation actions that won their CAS.
	Recovered int
	// Reconciled: clusters reconciliation acted on (won or lost).
	Reconciled int
	// LostRaces: actions whose CAS someone else won first (normal).
	LostRaces int
	// Purged: finished jobs deleted after the retention period.
	Purged int
	// MachinesRemoved: orphan machines removed (decideOrphanMachine).
	MachinesRemoved int
	// Errors the pass met (it goes on past them).
	Errors []error
	// Skipped says why the pass, or its recovery, did nothing.
	Skipped  string
	Duration time.Duration
}

func (r *Report) fail(err error) { r.Errors = append(r.Errors, err) }

// PassBuckets are the upper bounds of the pass duration histogram: a pass
// is a few queries, so most land in the milliseconds; a slow database shows
// in the upper buckets.
var PassBuckets = [...]time.Duration{
	time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond,
	50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

// counters accumulate reports for metrics (the server exports them).
type counters struct {
	passes, jobsFailed, adopted, recovered, lostRaces, purged, errors atomic.Int64
	lastPassNanos                                                     atomic.Int64
	// passNanos and passBuckets make the histogram of pass durations: their
	// sum, and per bound of PassBuckets the passes at most that long.
	passNanos   atomic.Int64
	passBuckets [len(PassBuckets)]atomic.Int64
}

func (c *counters) record(r Report) {
	c.passes.Add(1)
	c.jobsFailed.Add(int64(r.JobsFailed))
	c.adopted.Add(int64(r.Adopted))
	c.recovered.Add(int64(r.Recovered))
	c.lostRaces.Add(int64(r.LostRaces))
	c.purged.Add(int64(r.Purged))
	c.errors.Add(int64(len(r.Errors)))
	c.lastPassNanos.Store(int64(r.Duration))
	c.passNanos.Add(int64(r.Duration))
	for i, bound := range PassBuckets {
		if r.Duration <= bound {
			c.passBuckets[i].Add(1)
		}
	}
}

// Metrics is a snapshot of the scanner's counters since the process started.
type Metrics struct {
	Passes, JobsFailed, Adopted, Recovered, LostRaces, Purged, Errors int64
	LastPass                                                          time.Duration
	// PassTotal is the time all passes took; PassesWithin[i] counts the
	// passes that took at most PassBuckets[i] (a cumulative histogram, as
	// Prometheus wants it).
	PassTotal    time.Duration
	PassesWithin [len(PassBuckets)]int64
}

// Metrics returns the counters, which the server exports to Prometheus.
// Passes skipped for want of a lease are not counted.
func (s *Scanner) Metrics() Metrics {
	c := &s.metrics
	// The buckets are read before the passes: record counts a pass before
	// its bucket, so the snapshot never holds more passes in a bucket than
	// in all (a pass recorded between the two reads counts in Passes only).
	var within [len(PassBuckets)]int64
	for i := range c.passBuckets {
		within[i] = c.passBuckets[i].Load()
	}
	return Metrics{
		Passes: c.passes.Load(), JobsFailed: c.jobsFailed.Load(), Adopted: c.adopted.Load(), Recovered: c.recovered.Load(),
		LostRaces: c.lostRaces.Load(), Purged: c.purged.Load(), Errors: c.errors.Load(),
		LastPass: time.Duration(c.lastPassNanos.Load()), PassTotal: time.Duration(c.passNanos.Load()),
		PassesWithin: within,
	}
}
