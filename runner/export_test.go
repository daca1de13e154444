package runner

import "time"

// SetWorkerIdle sets how long r's workers wait for a next job, for tests
// that must tell a worker that waits from one that stopped.
func SetWorkerIdle(r *Runner, d time.Duration) { r.workerIdle = d }
