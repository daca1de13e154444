package e2e

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// TestRealVMBench measures, for BENCHMARKS.md, how long clusterd takes to
// create a cluster of real VMs (1 control + 1 worker, and 1 + 3: four
// guests, so it is not part of make test; run it with make bench-vms,
// which sets CLUSTERD_BENCH_VMS=1), and where the time goes: each step's
// wall time as the operation's metadata shows it (polled every 50 ms), and
// the same creates on libvirt's test driver (test+unix:///default: the
// same binary, steps and libvirt RPCs, but no guest boots and the node
// agents are in process), which is clusterd's own time per step plus a
// libvirt round trip. CLUSTERD_BENCH_VMS_RUNS sets the runs of each
// (default 3). Each cluster is deleted before the next is made.
func TestRealVMBench(t *testing.T) {
	if os.Getenv("CLUSTERD_BENCH_VMS") == "" {
		t.Skip("CLUSTERD_BENCH_VMS is not set (make bench-vms): the 1+3 cluster needs 4 VMs")
	}
	runs := 3
	if n, err := strconv.Atoi(os.Getenv("CLUSTERD_BENCH_VMS_RUNS")); err == nil && n > 0 {
		runs = n
	}
	var report strings.Builder
	for _, uri := range []string{systemURI, "test+unix:///default"} {
		t.Run(uri, func(t *testing.T) {
			e := newVMEnv(t, uri)
			s := startServer(t, e.dsn, "vm-bench", append(e.flags(), "--reconcile-interval", "1h")...)
			for _, workers := range []int32{1, 3} {
				steps := map[string][]time.Duration{}
				var totals []time.Duration
				var loads []string
				for run := range runs {
					loads = append(loads, loadAverage())
					ctx, cancel := rpcCtx()
					began := time.Now()
					op, err := s.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: vmSpec(fmt.Sprintf("bench-%d-%d", workers, run), workers)})
					cancel()
					done, seen := s.vmSucceed(t, fmt.Sprintf("create 1+%d", workers), op, err)
					end := time.Now()
					totals = append(totals, end.Sub(began))
					for i, st := range seen {
						next := end
						if i+1 < len(seen) {
							next = seen[i+1].at
						}
						steps[st.step] = append(steps[st.step], next.Sub(st.at))
					}
					ctx, cancel = rpcCtx()
					del, err := s.clusters.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: metadata(t, done).GetCluster()})
					cancel()
					s.vmSucceed(t, "delete", del, err)
				}
				fmt.Fprintf(&report, "\n%s, 1+%d, %d runs, load %s: create %s (median %s)\n", uri, workers, runs, strings.Join(loads, "/"), durations(totals), median(totals))
				var names []string
				for n := range steps {
					names = append(names, n)
				}
				slices.Sort(names)
				for _, n := range names {
					fmt.Fprintf(&report, "  %-18s per run %s\n", n, perRun(steps[n], runs))
				}
			}
		})
	}
	t.Logf("real-VM creates (step times: wall time between polls that saw the step start, summed per run):%s", report.String())
}

func durations(ds []time.Duration) string {
	var s []string
	for _, d := range ds {
		s = append(s, fmt.Sprintf("%.1fs", d.Seconds()))
	}
	return strings.Join(s, " ")
}

func median(ds []time.Duration) string {
	c := slices.Clone(ds)
	slices.Sort(c)
	if len(c) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fs", c[len(c)/2].Seconds())
}

// perRun is a step's total time in each run (its instances summed), as
// the mean over runs.
func perRun(ds []time.Duration, runs int) string {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return fmt.Sprintf("%6.2fs (%d seen)", (sum / time.Duration(runs)).Seconds(), len(ds))
}
