package bench_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc/codes"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/service"
)

// Every benchmark runs the service path and its baseline as two
// sub-benchmarks of one function, one after the other, and records both:
// TestMain prints each pair's ratio (medians over -count runs).

// timed runs op b.N times on clients goroutines (1: the benchmark's own) and
// records the throughput and the 99th percentile of the latencies.
func timed(b *testing.B, clients int, op func(i int) error) {
	var next atomic.Int64
	timedPer(b, clients, func(*int) error { return op(int(next.Add(1) - 1)) })
}

// timedPer is timed with, for each operation, a slot that identifies the
// goroutine running it.
func timedPer(b *testing.B, clients int, op func(slot *int) error) {
	var (
		mu   sync.Mutex
		lats []time.Duration
		errs atomic.Int64
		last atomic.Value
	)
	work := func(n func() bool) {
		var mine []time.Duration
		slot := new(int)
		for n() {
			start := time.Now()
			if err := op(slot); err != nil {
				errs.Add(1)
				last.Store(err.Error())
			}
			mine = append(mine, time.Since(start))
		}
		mu.Lock()
		lats = append(lats, mine...)
		mu.Unlock()
	}
	b.ResetTimer()
	start := time.Now()
	if clients == 1 {
		i := 0
		work(func() bool { i++; return i <= b.N })
	} else {
		b.SetParallelism((clients + 1) / 2) // GOMAXPROCS is 2 here
		b.RunParallel(func(pb *testing.PB) { work(pb.Next) })
	}
	elapsed := time.Since(start)
	b.StopTimer()
	if n := errs.Load(); n > 0 && b.N > 1 {
		b.Fatalf("%d of %d operations failed, the last: %v", n, b.N, last.Load())
	}
	slices.Sort(lats)
	p99 := lats[len(lats)*99/100]
	ops := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(ops, "ops/s")
	b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
	record(b, ops, p99)
}

// timedEach is timed for clients that each keep state of their own:
// newClient makes one client's operation, once per goroutine.
func timedEach(b *testing.B, clients int, newClient func() func() error) {
	var (
		mu  sync.Mutex
		ops = map[*int]func() error{}
	)
	timedPer(b, clients, func(slot *int) error {
		mu.Lock()
		op, ok := ops[slot]
		if !ok {
			op = newClient()
			ops[slot] = op
		}
		mu.Unlock()
		return op()
	})
}

func BenchmarkAdmission(b *testing.B) {
	for _, be := range backends(b) {
		for _, clients := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/clients=%d", be.Name, clients), func(b *testing.B) {
				e := getEnv(b, be, "ops")
				b.Run("service", func(b *testing.B) {
					ids := e.take(b, b.N)
					ctx := caller()
					before, batches := e.store.BatchStats()
					timed(b, clients, func(i int) error {
						_, err := e.parked.StopCluster(ctx, &clv1.StopClusterRequest{Name: "clusters/" + ids[i]})
						return err
					})
					if after, _ := e.store.BatchStats(); batches && after.Batches > before.Batches {
						// SQLite's group commit: the claims and the jobs'
						// first steps a transaction held.
						b.ReportMetric(float64(after.Writes-before.Writes)/float64(after.Batches-before.Batches), "writes/batch")
					}
				})
				b.Run("raw", func(b *testing.B) {
					ids := e.take(b, b.N)
					base := seq.Add(int64(b.N)) - int64(b.N) + 1 // job ids of its own
					timed(b, clients, func(i int) error { return rawClaim(context.Background(), e.rawW, e.rawR, ids[i], base+int64(i)) })
				})
			})
		}
	}
}

// BenchmarkOperations: 8 clients, each on a 3-node cluster of its own,
// stop it and start it again, each operation carried out to its end by the
// runner and the simulator (no step delay) before the next: operations
// completed a second, the claim and every step and end included, beside the
// same raw claim transaction as Admission. Not the goal (that is
// admission), but what a client sees.
func BenchmarkOperations(b *testing.B) {
	for _, be := range backends(b) {
		b.Run(be.Name+"/clients=8", func(b *testing.B) {
			e := getEnv(b, be, "ops")
			b.Run("service", func(b *testing.B) {
				ids := e.seedRunning(b, 8, 3)
				var mine atomic.Int64
				ctx := caller()
				timedEach(b, 8, func() func() error {
					name := "clusters/" + ids[mine.Add(1)-1]
					stop := true
					return func() error {
						var (
							op  *longrunningpb.Operation
							err error
						)
						if stop {
							op, err = e.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: name})
						} else {
							op, err = e.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: name})
						}
						if err != nil {
							return err
						}
						stop = !stop
						e.wait(jobOf(op))
						return nil
					}
				})
			})
			b.Run("raw", func(b *testing.B) {
				ids := e.take(b, b.N)
				base := seq.Add(int64(b.N)) - int64(b.N) + 1
				timed(b, 8, func(i int) error { return rawClaim(context.Background(), e.rawW, e.rawR, ids[i], base+int64(i)) })
			})
		})
	}
}

// BenchmarkContention: 32 clients race for one cluster. The service's
// clients send stops and starts that the real runner carries out, so the
// cluster keeps changing hands; a refusal (ABORTED, FAILED_PRECONDITION) is
// an answer like an acceptance. The baseline races the bare
// compare-and-set. Throughput is requests answered.
func BenchmarkContention(b *testing.B) {
	for _, be := range backends(b) {
		b.Run(be.Name+"/clients=32", func(b *testing.B) {
			e := getEnv(b, be, "ops")
			b.Run("service", func(b *testing.B) {
				id := "clusters/" + e.seedRunning(b, 1, 3)[0]
				ctx := caller()
				var won atomic.Int64
				start := time.Now()
				timed(b, 32, func(i int) error {
					var err error
					if i%2 == 0 {
						_, err = e.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: id})
					} else {
						_, err = e.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: id})
					}
					switch service.Status(err).Code() {
					case codes.OK:
						won.Add(1)
						return nil
					case codes.Aborted, codes.FailedPrecondition:
						return nil
					}
					return err
				})
				wins[strings.TrimPrefix(b.Name(), "Benchmark")] = float64(won.Load()) / time.Since(start).Seconds()
			})
			b.Run("raw", func(b *testing.B) {
				id := e.seedRunning(b, 1, 0)[0]
				var won atomic.Int64
				start := time.Now()
				timed(b, 32, func(int) error {
					err := rawFlip(context.Background(), e.rawW, e.rawR, id)
					switch {
					case err == nil:
						won.Add(1)
					case !errors.Is(err, errLost):
						return err
					}
					return nil
				})
				wins[strings.TrimPrefix(b.Name(), "Benchmark")] = float64(won.Load()) / time.Since(start).Seconds()
			})
		})
	}
}

func BenchmarkGetCluster(b *testing.B) {
	for _, be := range backends(b) {
		b.Run(be.Name+"/clients=8", func(b *testing.B) {
			e := getEnv(b, be, "ops")
			ids := e.seedRunning(b, 1000, 3)
			b.Run("service", func(b *testing.B) {
				ctx := caller()
				timed(b, 8, func(int) error {
					_, err := e.clusters.GetCluster(ctx, &clv1.GetClusterRequest{Name: "clusters/" + ids[rand.IntN(len(ids))]})
					return err
				})
			})
			b.Run("raw", func(b *testing.B) {
				timed(b, 8, func(int) error { return rawGet(context.Background(), e.rawR, ids[rand.IntN(len(ids))], true) })
			})
			b.Run("raw-row-only", func(b *testing.B) {
				timed(b, 8, func(int) error { return rawGet(context.Background(), e.rawR, ids[rand.IntN(len(ids))], false) })
			})
		})
	}
}

func BenchmarkListClusters(b *testing.B) {
	for _, be := range backends(b) {
		b.Run(be.Name+"/page=100/clients=8", func(b *testing.B) {
			e := getEnv(b, be, "ops")
			e.seedRunning(b, 200, 3)
			b.Run("service", func(b *testing.B) {
				ctx := caller()
				timed(b, 8, func(int) error {
					_, err := e.clusters.ListClusters(ctx, &clv1.ListClustersRequest{PageSize: 100})
					return err
				})
			})
			b.Run("raw", func(b *testing.B) {
				timed(b, 8, func(int) error { return rawList(context.Background(), e.rawR) })
			})
		})
	}
}

// BenchmarkScannerPass: a full pass (liveness, lost jobs, orphans,
// reconciliation, purge) over a fleet of 1,000, 10,000 and 100,000
// clusters at rest with some operations running, beside the orphan
// anti-join alone. The pass is measured once reconciliation's start-up
// sweep is over (its first pass, a sweep page, is recorded apart).
func BenchmarkScannerPass(b *testing.B) {
	for _, be := range backends(b) {
		for _, n := range []int{1000, 10000, 100000} {
			b.Run(fmt.Sprintf("%s/clusters=%d", be.Name, n), func(b *testing.B) {
				e := getEnv(b, be, "scan")
				if e.seeded < n {
					e.seedScale(b, n)
					// The start-up sweep, a page a pass. Its first pass runs
					// right after the bulk load (cold caches, the database
					// still flushing): the later ones are the sweep's cost.
					var pages []float64
					for i := range n/1000 + 2 {
						start := time.Now()
						e.scan.Pass(context.Background())
						if i > 0 && i < n/1000 {
							pages = append(pages, float64(time.Since(start)))
						}
					}
					sweepPage[fmt.Sprintf("%s/clusters=%d", be.Name, n)] = time.Duration(median(pages))
				}
				b.Run("service", func(b *testing.B) {
					timed(b, 1, func(int) error {
						if r := e.scan.Pass(context.Background()); len(r.Errors) > 0 || r.Recovered+r.Reconciled+r.Purged+r.JobsFailed > 0 {
							return fmt.Errorf("a pass at rest acted: %+v", r)
						}
						return nil
					})
				})
				b.Run("raw", func(b *testing.B) {
					timed(b, 1, func(int) error {
						got, err := rawOrphans(context.Background(), e.rawR)
						if err == nil && got != 0 {
							err = fmt.Errorf("%d orphans at rest", got)
						}
						return err
					})
				})
			})
		}
	}
}

// wins is, per contention sub-benchmark, the requests that won the
// cluster (an accepted operation; a compare-and-set that hit) a second.
var wins = map[string]float64{}

// sweepPage is, at each size, the median duration of a pass that sweeps a
// page of reconciliation's start-up sweep (its first pass left out; none at
// 1,000 clusters, whose sweep is one page).
var sweepPage = map[string]time.Duration{}
