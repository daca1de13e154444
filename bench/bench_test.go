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
	var (
		next atomic.Int64
		mu   sync.Mutex
		lats []time.Duration
		errs atomic.Int64
		last atomic.Value
	)
	work := func(n func() bool) {
		var mine []time.Duration
		for n() {
			i := int(next.Add(1) - 1)
			start := time.Now()
			if err := op(i); err != nil {
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

func BenchmarkAdmission(b *testing.B) {
	for _, be := range backends(b) {
		for _, clients := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/clients=%d", be.Name, clients), func(b *testing.B) {
				e := getEnv(b, be, "ops")
				b.Run("service", func(b *testing.B) {
					ids := e.take(b, b.N)
					ctx := caller()
					timed(b, clients, func(i int) error {
						_, err := e.parked.StopCluster(ctx, &clv1.StopClusterRequest{Name: "clusters/" + ids[i]})
						return err
					})
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
					first := time.Now()
					e.scan.Pass(context.Background())
					sweepPage[fmt.Sprintf("%s/clusters=%d", be.Name, n)] = time.Since(first)
					for range n/1000 + 2 { // the rest of the sweep
						e.scan.Pass(context.Background())
					}
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

// sweepPage is the duration of the first pass at each size: a page of
// reconciliation's start-up sweep.
var sweepPage = map[string]time.Duration{}
