package bench_test

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// result is one measurement of one sub-benchmark, at one b.N.
type result struct {
	n   int
	ops float64
	p99 time.Duration
}

var (
	resultsMu sync.Mutex
	// results by sub-benchmark name, in call order. The testing package
	// calls a benchmark with b.N = 1 first, then with the b.N it settles
	// on; with -count each run starts at 1 again.
	results = map[string][]result{}
	order   []string
)

func record(b *testing.B, ops float64, p99 time.Duration) {
	resultsMu.Lock()
	defer resultsMu.Unlock()
	name := strings.TrimPrefix(b.Name(), "Benchmark")
	if _, ok := results[name]; !ok {
		order = append(order, name)
	}
	results[name] = append(results[name], result{n: b.N, ops: ops, p99: p99})
}

// runs returns the measurement of each run of name: the last of each
// sequence that starts at b.N = 1.
func runs(name string) []result {
	return lastOfRuns(results[name], func(r result) int { return r.n })
}

// lastOfRuns keeps, of measurements in call order, the last of each
// sequence that starts at b.N = 1 (n gives a measurement's b.N).
func lastOfRuns[T any](all []T, n func(T) int) []T {
	var out []T
	for _, r := range all {
		if n(r) == 1 || len(out) == 0 {
			out = append(out, r)
			continue
		}
		out[len(out)-1] = r
	}
	return out
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

var plotPath = flag.String("bench.plot", "", "write the PNG plot of scanner pass time against cluster count here")

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if len(order) > 0 {
		report()
	}
	for _, c := range cleanups {
		c()
	}
	os.Exit(code)
}

// report prints, per pair, the medians of the service path and of its
// baseline over the runs, and the median of the runs' ratios (each ratio
// from one run, where both ran back to back).
func report() {
	load, _ := os.ReadFile("/proc/loadavg")
	if slices.ContainsFunc(order, func(name string) bool { return strings.HasSuffix(name, "/service") }) {
		fmt.Printf("\n== clusterd against raw SQL, same run (FrontDoor: bin/clusterd in its own process through gRPC or REST; the rest in process; medians of %s runs; load average %s)\n", maxRuns(), strings.Join(strings.Fields(string(load))[:3], " "))
		fmt.Printf("%-44s %16s %16s %10s %12s %12s\n", "measure", "service", "raw SQL", "ratio", "p99 service", "p99 raw")
	}
	var scanPoints []scanPoint
	for _, name := range order {
		base, ok := strings.CutSuffix(name, "/service")
		if !ok {
			continue
		}
		svc := runs(name)
		for _, rawName := range []string{base + "/raw", base + "/raw-row-only"} {
			raw := runs(rawName)
			if len(raw) == 0 {
				continue
			}
			var sOps, rOps, ratios, sP, rP []float64
			for i := range min(len(svc), len(raw)) {
				sOps, rOps = append(sOps, svc[i].ops), append(rOps, raw[i].ops)
				ratios = append(ratios, svc[i].ops/raw[i].ops)
				sP, rP = append(sP, float64(svc[i].p99)), append(rP, float64(raw[i].p99))
			}
			label := base
			if strings.HasSuffix(rawName, "raw-row-only") {
				label += " (vs the row alone)"
			}
			if strings.HasPrefix(base, "ScannerPass/") {
				// Times: a pass against one anti-join, and how many times
				// as long the pass takes.
				var inv []float64
				for _, r := range ratios {
					inv = append(inv, 1/r)
				}
				fmt.Printf("%-44s %13.2f ms %13.2f ms %9.2fx %12s %12s\n", label, 1000/median(sOps), 1000/median(rOps), median(inv),
					time.Duration(median(sP)).Round(time.Microsecond), time.Duration(median(rP)).Round(time.Microsecond))
				if sp, ok := sweepPage[strings.TrimPrefix(base, "ScannerPass/")]; ok && sp > 0 {
					fmt.Printf("%-44s %13.2f ms\n", "  a pass that sweeps 1,000 clusters", float64(sp.Microseconds())/1000)
				}
				scanPoints = append(scanPoints, scanPoint{name: base, service: 1000 / median(sOps), raw: 1000 / median(rOps)})
				continue
			}
			fmt.Printf("%-44s %14.0f/s %14.0f/s %9.1f%% %12s %12s\n", label, median(sOps), median(rOps), 100*median(ratios),
				time.Duration(median(sP)).Round(time.Microsecond), time.Duration(median(rP)).Round(time.Microsecond))
			if w, ok := wins[name]; ok {
				fmt.Printf("%-44s %14.0f/s %14.0f/s   (operations accepted; compare-and-sets won; last run)\n", "  of which won the cluster", w, wins[rawName])
			}
		}
	}
	for _, name := range order {
		if strings.HasPrefix(name, "RSS/") {
			fmt.Printf("%-44s %13.1f MiB (peak resident memory of bin/clusterd; VmHWM)\n", name, rss[name])
		}
	}
	for _, name := range order {
		if f, ok := watchResults[name]; ok {
			reportWatch(name, f)
		}
	}
	reportCPU()
	if *plotPath != "" && len(scanPoints) > 0 {
		if err := plot(*plotPath, scanPoints); err != nil {
			fmt.Fprintln(os.Stderr, "plot:", err)
		} else {
			fmt.Println("plot written to", *plotPath)
		}
	}
}

func maxRuns() string {
	n := 0
	for _, name := range order {
		n = max(n, len(runs(name)))
	}
	return strconv.Itoa(n)
}

// rss is the peak resident memory (MiB) of each RSS measurement's run.
var rss = map[string]float64{}

// BenchmarkRSS runs bin/clusterd, built from this tree, on the scanner
// benchmarks' fleet of 100,000 clusters (run after them), with a pass every
// 200 ms for 30 s (reconciliation's start-up sweep included) and a
// ListClusters a second, and reads its peak resident memory.
func BenchmarkRSS(b *testing.B) {
	for _, be := range backends(b) {
		b.Run(be.Name+"/clusters=100000", func(b *testing.B) {
			e := getEnv(b, be, "scan")
			if e.seeded < 100000 {
				e.seedScale(b, 100000)
			}
			name := "RSS/" + be.Name + "/clusters=100000"
			resultsMu.Lock()
			_, measured := rss[name]
			resultsMu.Unlock()
			if measured || b.N > 1 {
				b.Skip("measured once a process")
			}
			bin := filepath.Join(b.TempDir(), "clusterd")
			build := exec.Command("go", "build", "-o", bin, "github.com/clusterd/clusterd/cmd/clusterd")
			build.Stderr = os.Stderr
			must(b, build.Run())
			ports := func() string {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				must(b, err)
				defer l.Close()
				return l.Addr().String()
			}
			cmd := exec.Command(bin, "--database", e.dsn, "--grpc-addr", ports(), "--http-addr", ports(),
				"--server-id", "rss-"+be.Name, "--scan-interval", "200ms", "--reconcile-interval", "200ms",
				"--peer-timeout", "24h", "--log-level", "WARN")
			cmd.Stderr = os.Stderr
			must(b, cmd.Start())
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			<-ctx.Done()
			peak := vmHWM(b, cmd.Process.Pid)
			resultsMu.Lock()
			if _, ok := results[name]; !ok {
				order = append(order, name)
				results[name] = nil
			}
			rss[name] = peak
			resultsMu.Unlock()
			b.ReportMetric(peak, "MiB")
		})
	}
}

// vmHWM reads a process's peak resident set size, in MiB.
func vmHWM(b *testing.B, pid int) float64 {
	if runtime.GOOS != "linux" {
		b.Skip("reads /proc")
	}
	peak := procPeakRSS(pid)
	if peak == 0 {
		b.Fatalf("no VmHWM for process %d", pid)
	}
	return peak
}
