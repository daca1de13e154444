package bench_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// The front door: bin/clusterd, built from this tree, in a process of its
// own on the benchmark's database, driven by 8 gRPC callers (and one REST
// case) like a user's client, beside raw baselines through as many
// connections, in the same run. Identities are on (a token file, an admin
// token), so every call passes the whole interceptor chain. One process
// parks the jobs it accepts (--sim-step-delay 1h): admission alone, reads
// and lists. A second runs them at once (0s): admission while jobs run,
// and operations carried to their end. Beside throughput, the CPU each
// call cost: clusterd's process, the database server's (MariaDB; SQLite
// runs inside clusterd) and the calling process's (the gRPC client, or the
// raw side's driver), read from /proc around each run. With -bench.profile
// DIR, a 5 s CPU profile of clusterd under the same calls is written per
// measure through --debug-addr, after the measured runs.

var profileDir = flag.String("bench.profile", "", "write a CPU profile of bin/clusterd per front-door measure into this folder")

// doorEnv measures bin/clusterd under runtime settings of an operator's
// (GOGC, GOMEMLIMIT, GOMAXPROCS), which the baselines' process does not get.
var doorEnv = flag.String("bench.door-env", "", "space-separated NAME=value pairs added to bin/clusterd's environment (GOGC=400 ...)")

// frontDoor is one clusterd process and the clients that call it.
type frontDoor struct {
	cmd      *exec.Cmd
	clusters clv1.ClusterLifecycleClient
	ops      longrunningpb.OperationsClient
	conn     *grpc.ClientConn
	gateway  string // http://host:port of the REST gateway
	debug    string // host:port of --debug-addr
	token    string
	id       string // its --server-id
	http     *http.Client
	log      string
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// clusterdBinary builds bin/clusterd from this tree once a process.
func clusterdBinary(b *testing.B) string {
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "clusterd-bench-bin-")
		if err != nil {
			binErr = err
			return
		}
		cleanups = append(cleanups, func() { _ = os.RemoveAll(dir) })
		binPath = filepath.Join(dir, "clusterd")
		build := exec.Command("go", "build", "-o", binPath, "github.com/clusterd/clusterd/cmd/clusterd")
		build.Stderr = os.Stderr
		binErr = build.Run()
	})
	must(b, binErr)
	return binPath
}

// startFrontDoor starts clusterd on env e's database, killed when the
// benchmark b ends. stepDelay is its --sim-step-delay: 1h parks the jobs it
// accepts in their first step, 0s runs them at once. Each process has a
// server id of its own: the jobs an earlier one parked stay with it (dead,
// and never adopted with --peer-timeout 24h) rather than being recovered
// by the next one while it is measured. The ports are picked free and
// bound by clusterd later: when another process (an outgoing connection's
// ephemeral port, another test's listener) took one meanwhile, clusterd
// exits and is started again on new ports.
func startFrontDoor(b *testing.B, e *env, stepDelay string) *frontDoor {
	const attempts = 5
	for i := 1; ; i++ {
		d, err := launchFrontDoor(b, e, stepDelay)
		if err == nil {
			return d
		}
		if !errors.Is(err, errBind) || i == attempts {
			b.Fatal(err)
		}
		b.Logf("start clusterd, attempt %d of %d: %v; again on other ports", i, attempts, err)
	}
}

// errBind: a port picked for clusterd was taken before it bound it.
var errBind = errors.New("a picked port was taken before clusterd bound it")

// launchFrontDoor starts one clusterd process and waits until it serves;
// the process is killed when b ends, or at once if it does not serve.
func launchFrontDoor(b *testing.B, e *env, stepDelay string) (*frontDoor, error) {
	bin := clusterdBinary(b)
	dir := b.TempDir()
	token := randomHex(b, 32)
	sum := sha256.Sum256([]byte(token))
	tokens := filepath.Join(dir, "tokens")
	must(b, os.WriteFile(tokens, []byte("sha256:"+hex.EncodeToString(sum[:])+" acme admin\n"), 0o600))
	key := make([]byte, 32)
	_, err := rand.Read(key)
	must(b, err)
	keys := filepath.Join(dir, "secrets-key")
	must(b, os.WriteFile(keys, []byte("k1 "+base64.StdEncoding.EncodeToString(key)+"\n"), 0o600))
	grpcAddr, httpAddr, debugAddr := loopbackAddr(b), loopbackAddr(b), loopbackAddr(b)
	d := &frontDoor{gateway: "http://" + httpAddr, debug: debugAddr, token: token, log: filepath.Join(dir, "clusterd.log")}
	logFile, err := os.Create(d.log)
	must(b, err)
	d.id = fmt.Sprintf("door-%s-%s-%d", e.backend, stepDelay, seq.Add(1))
	d.cmd = exec.Command(bin, "--database", e.dsn, "--server-id", d.id,
		"--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--debug-addr", debugAddr,
		"--auth-tokens", tokens, "--secrets-key-file", keys,
		// Peers (the in-process benchmarks' server, the other front doors)
		// are never taken for dead.
		"--sim-step-delay", stepDelay, "--peer-timeout", "24h", "--log-level", "WARN")
	d.cmd.Stdout, d.cmd.Stderr = logFile, logFile
	if *doorEnv != "" {
		d.cmd.Env = append(os.Environ(), strings.Fields(*doorEnv)...)
	}
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	must(b, d.cmd.Start())
	exited := make(chan struct{})
	go func() {
		_ = d.cmd.Wait()
		close(exited)
	}()
	stop := func() {
		_ = d.cmd.Process.Kill()
		<-exited
		_ = logFile.Close()
		if d.conn != nil {
			_ = d.conn.Close()
		}
	}
	d.conn, err = grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		stop()
		return nil, fmt.Errorf("dial clusterd: %w", err)
	}
	d.clusters = clv1.NewClusterLifecycleClient(d.conn)
	d.ops = longrunningpb.NewOperationsClient(d.conn)
	d.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 30 * time.Second}
	// Serving once a request for a cluster that does not exist answers.
	var last error
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		select {
		case <-exited:
			stop()
			log, _ := os.ReadFile(d.log)
			if strings.Contains(string(log), "address already in use") {
				return nil, fmt.Errorf("%w: %s", errBind, log)
			}
			return nil, fmt.Errorf("bin/clusterd exited before serving (%v); its log:\n%s", d.cmd.ProcessState, log)
		default:
		}
		_, last = d.clusters.GetCluster(d.ctx(), &clv1.GetClusterRequest{Name: "clusters/01000000-0000-7000-8000-000000000000"})
		if status.Code(last) == codes.NotFound {
			b.Cleanup(stop)
			return d, nil
		}
	}
	stop()
	log, _ := os.ReadFile(d.log)
	return nil, fmt.Errorf("bin/clusterd did not serve within 2 min (last answer: %v); its log:\n%s", last, log)
}

// readsInProgress is how many operations the reads' front door runs while
// the reads are measured.
const readsInProgress = 1000

// startReadsDoor starts the front door the reads are measured on
// (GetCluster, the health check, ListClusters): a clusterd that parks the
// jobs it accepts, running readsInProgress stops of clusters of their own
// (each job waiting in its first step). A read costs more beside more
// operations in progress: every garbage collection scans each one's
// goroutine. On the admissions' door the reads ran beside however many
// operations the admissions before them had left (thousands, a number that
// changed from run to run, and more when profiles were taken), and a page
// of ListClusters cost clusterd 3,100-4,900 µs of CPU from run to run.
func startReadsDoor(b *testing.B, e *env) *frontDoor {
	d := startFrontDoor(b, e, "1h")
	for _, id := range e.seedRunning(b, readsInProgress, 3) {
		_, err := d.clusters.StopCluster(d.ctx(), &clv1.StopClusterRequest{Name: "clusters/" + id})
		must(b, err)
	}
	return d
}

// ctx is a call's context, carrying the admin token.
func (d *frontDoor) ctx() context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+d.token)
}

// getREST is GetCluster through the gateway.
func (d *frontDoor) getREST(id string) error {
	req, err := http.NewRequest(http.MethodGet, d.gateway+"/v1/clusters/"+id, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := d.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /v1/clusters/%s: %s: %.200s", id, resp.Status, body)
	}
	return nil
}

// stopAndWait stops cluster id and waits for the stop to end, which must
// succeed.
func (d *frontDoor) stopAndWait(id string) error {
	op, err := d.clusters.StopCluster(d.ctx(), &clv1.StopClusterRequest{Name: "clusters/" + id})
	for err == nil && !op.GetDone() {
		op, err = d.ops.WaitOperation(d.ctx(), &longrunningpb.WaitOperationRequest{Name: op.GetName(), Timeout: durationpb.New(time.Minute)})
	}
	if err == nil && op.GetError() != nil {
		err = fmt.Errorf("stop of %s failed: %v", id, op.GetError())
	}
	return err
}

// profile writes a 5 s CPU profile of clusterd, taken while load runs, to
// the -bench.profile folder.
func (d *frontDoor) profile(b *testing.B, name string, load func(stop <-chan struct{})) {
	if *profileDir == "" {
		return
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { load(stop) })
	defer func() { close(stop); wg.Wait() }()
	req, err := http.NewRequest(http.MethodGet, "http://"+d.debug+"/debug/pprof/profile?seconds=5", nil)
	must(b, err)
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	must(b, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		b.Fatalf("profile: %s: %.200s", resp.Status, body)
	}
	must(b, os.MkdirAll(*profileDir, 0o755))
	path := filepath.Join(*profileDir, strings.NewReplacer("/", "_", "=", "").Replace(name)+".pprof")
	f, err := os.Create(path)
	must(b, err)
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	must(b, err)
}

// frontMeasure is one pair of BenchmarkFrontDoor.
type frontMeasure struct {
	name string
	door *frontDoor
	// pool gives n clusters of their own to calls that each change one
	// (op's i indexes them); nil for calls that change none.
	pool         func(b *testing.B, n int) []string
	service, raw func(taken []string) func(i int) error
}

func BenchmarkFrontDoor(b *testing.B) {
	for _, be := range backends(b) {
		e := getEnv(b, be, "frontdoor")
		_, err := e.rawW.Exec("CREATE TABLE IF NOT EXISTS bench_raw_changes (cluster_id VARCHAR(36) NOT NULL, job_id VARCHAR(36) NOT NULL, kind VARCHAR(16) NOT NULL, time DATETIME(6) NOT NULL)")
		must(b, err)
		parked, running := startFrontDoor(b, e, "1h"), startFrontDoor(b, e, "0s")
		ids := e.seedRunning(b, 1000, 3)
		e.seedRunning(b, 200, 3) // a page of 100 to list is always there
		reads := startReadsDoor(b, e)
		pick := func() string { return ids[mrand.IntN(len(ids))] }
		threeMachines := func(b *testing.B, n int) []string { return e.seedRunning(b, n, 3) }
		// Jobs the raw side runs in the background, as a runner would.
		var (
			jobs    sync.WaitGroup
			jobErrs atomic.Int64
			jobLast atomic.Value
		)
		rawGetOp := func([]string) func(int) error {
			return func(int) error { return rawGet(context.Background(), e.rawR, pick(), true) }
		}
		claims := func(taken []string) (base int64) { return seq.Add(int64(len(taken))) - int64(len(taken)) + 1 }
		measures := []frontMeasure{
			{
				// Stops of 1+2 clusters: the job waits in its first
				// power_off (a cluster without machines would have no step
				// to wait in, and its job would end at once).
				name: "admission-parked", door: parked, pool: threeMachines,
				service: func(taken []string) func(int) error {
					return func(i int) error {
						_, err := parked.clusters.StopCluster(parked.ctx(), &clv1.StopClusterRequest{Name: "clusters/" + taken[i]})
						return err
					}
				},
				raw: func(taken []string) func(int) error {
					base := claims(taken)
					return func(i int) error { return rawClaim(context.Background(), e.rawW, e.rawR, taken[i], base+int64(i)) }
				},
			},
			{
				// Stops of 1+2 clusters whose jobs run (and the simulator's
				// writes with them, in the same database) while more are
				// accepted; the baseline claims and hands each job's
				// transactions (rawStopJob) to a goroutine.
				name: "admission-running", door: running, pool: threeMachines,
				service: func(taken []string) func(int) error {
					return func(i int) error {
						_, err := running.clusters.StopCluster(running.ctx(), &clv1.StopClusterRequest{Name: "clusters/" + taken[i]})
						return err
					}
				},
				raw: func(taken []string) func(int) error {
					base := claims(taken)
					return func(i int) error {
						if err := rawClaim(context.Background(), e.rawW, e.rawR, taken[i], base+int64(i)); err != nil {
							return err
						}
						jobs.Go(func() {
							if err := rawStopJob(context.Background(), e.rawW, e.rawR, taken[i], rawJobID(base+int64(i))); err != nil {
								jobErrs.Add(1)
								jobLast.Store(err.Error())
							}
						})
						return nil
					}
				},
			},
			{
				// Each caller stops a 1+2 cluster and waits for the stop to
				// end (WaitOperation) before the next; the baseline runs the
				// claim and the job's transactions in turn.
				name: "carried-to-end", door: running, pool: threeMachines,
				service: func(taken []string) func(int) error {
					return func(i int) error { return running.stopAndWait(taken[i]) }
				},
				raw: func(taken []string) func(int) error {
					base := claims(taken)
					return func(i int) error {
						if err := rawClaim(context.Background(), e.rawW, e.rawR, taken[i], base+int64(i)); err != nil {
							return err
						}
						return rawStopJob(context.Background(), e.rawW, e.rawR, taken[i], rawJobID(base+int64(i)))
					}
				},
			},
			{
				name: "get", door: reads,
				service: func([]string) func(int) error {
					return func(int) error {
						_, err := reads.clusters.GetCluster(reads.ctx(), &clv1.GetClusterRequest{Name: "clusters/" + pick()})
						return err
					}
				},
				raw: rawGetOp,
			},
			{
				// The front door's own cost: a health check crosses the
				// same connection, transport and interceptor chain as
				// GetCluster and reads no database. Against the raw read
				// of GetCluster, its ratio is the most GetCluster's can be.
				name: "floor-health", door: reads,
				service: func([]string) func(int) error {
					health := healthpb.NewHealthClient(reads.conn)
					return func(int) error {
						_, err := health.Check(reads.ctx(), &healthpb.HealthCheckRequest{})
						return err
					}
				},
				raw: rawGetOp,
			},
			{
				name: "get-rest", door: reads,
				service: func([]string) func(int) error { return func(int) error { return reads.getREST(pick()) } },
				raw:     rawGetOp,
			},
			{
				name: "list-page100", door: reads,
				service: func([]string) func(int) error {
					return func(int) error {
						_, err := reads.clusters.ListClusters(reads.ctx(), &clv1.ListClustersRequest{PageSize: 100})
						return err
					}
				},
				raw: func([]string) func(int) error {
					return func(int) error { return rawList(context.Background(), e.rawR) }
				},
			},
		}
		for _, m := range measures {
			take := func(b *testing.B, n int) []string {
				if m.pool == nil {
					return nil
				}
				return m.pool(b, n)
			}
			b.Run(fmt.Sprintf("%s/%s/clients=8", be.Name, m.name), func(b *testing.B) {
				b.Run("service", func(b *testing.B) {
					op := m.service(take(b, b.N))
					cpuTimed(b, m.door.cmd.Process.Pid, be.Name, e.dsn, func() { timed(b, 8, op) })
					if m.door == running {
						// The raw side is measured on a database that
						// clusterd's accepted jobs no longer write to.
						running.drain(b, e)
					}
				})
				b.Run("raw", func(b *testing.B) {
					op := m.raw(take(b, b.N))
					cpuTimed(b, os.Getpid(), be.Name, e.dsn, func() { timed(b, 8, op) })
					jobs.Wait()
					if n := jobErrs.Swap(0); n > 0 {
						b.Fatalf("%d raw jobs failed, the last: %v", n, jobLast.Load())
					}
				})
				resultsMu.Lock()
				profiled := doneProfiles[b.Name()]
				doneProfiles[b.Name()] = true
				resultsMu.Unlock()
				if profiled || *profileDir == "" {
					return
				}
				m.door.profileLoad(b, b.Name(), take(b, 8000), m.service, m.pool != nil)
			})
		}
	}
}

// drain waits until none of the jobs this clusterd accepted is in
// progress.
func (d *frontDoor) drain(b *testing.B, e *env) {
	deadline := time.Now().Add(10 * time.Minute)
	for {
		var n int
		must(b, e.rawR.QueryRow("SELECT COUNT(*) FROM jobs WHERE status = 'IN_PROGRESS' AND server_id = ?", d.id).Scan(&n))
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d jobs of %s still in progress after 10 min", n, d.id)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// profileLoad profiles clusterd for 5 s under 8 callers of service, on
// the clusters taken (until they run out) when every call changes one.
func (d *frontDoor) profileLoad(b *testing.B, name string, taken []string, service func([]string) func(int) error, consumes bool) {
	op := service(taken)
	var next atomic.Int64
	d.profile(b, name, func(stop <-chan struct{}) {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					i := int(next.Add(1) - 1)
					if consumes && i >= len(taken) {
						return
					}
					_ = op(i)
				}
			})
		}
		wg.Wait()
	})
}

// doneProfiles: the measures already profiled (once a process).
var doneProfiles = map[string]bool{}

// cpuUse is the CPU one call cost, in microseconds: the serving process's
// (clusterd, or the benchmark's own for a raw baseline, which is then the
// client's too), the database server's, and the calling process's.
type cpuUse struct {
	n                     int
	server, db, client    float64
	dbInProcess, sameProc bool
}

var cpuResults = map[string][]cpuUse{}

// all is the CPU the call cost every process taking part: the serving one,
// the database server and the caller (counted once when it serves too).
func (u cpuUse) all() float64 {
	if u.sameProc {
		return u.server + u.db
	}
	return u.server + u.db + u.client
}

// cpuTimed runs run (one timed measurement) and records the CPU that
// process pid, the database server and this process used meanwhile, per
// operation.
func cpuTimed(b *testing.B, pid int, backend, dsn string, run func()) {
	db := 0
	if backend != "sqlite" {
		db = databasePID(dsn)
	}
	// The peak is the one during this measurement: the door served other
	// measures before, and its lifetime peak would be theirs.
	peakReset := false
	if pid != os.Getpid() {
		err := resetPeakRSS(pid)
		if err != nil {
			peakResetFailed.Do(func() { fmt.Fprintf(os.Stderr, "bench: no peak-rss-MiB: %v\n", err) })
		}
		peakReset = err == nil
	}
	s0, d0, c0 := procCPU(pid), procCPU(db), procCPU(os.Getpid())
	run()
	s1, d1, c1 := procCPU(pid), procCPU(db), procCPU(os.Getpid())
	per := func(a, z time.Duration) float64 { return float64((z - a).Microseconds()) / float64(b.N) }
	u := cpuUse{n: b.N, server: per(s0, s1), db: per(d0, d1), client: per(c0, c1), dbInProcess: db == 0, sameProc: pid == os.Getpid()}
	resultsMu.Lock()
	name := strings.TrimPrefix(b.Name(), "Benchmark")
	cpuResults[name] = append(cpuResults[name], u)
	resultsMu.Unlock()
	b.ReportMetric(u.server, "cpu-µs/op")
	if peakReset {
		b.ReportMetric(procPeakRSS(pid), "peak-rss-MiB")
	}
}

// peakResetFailed says once that the peaks cannot be reset (and are not
// reported).
var peakResetFailed sync.Once

// resetPeakRSS sets process pid's peak resident memory (VmHWM) to its
// resident memory now, so that the next read of it is the peak since.
func resetPeakRSS(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// procPeakRSS is process pid's peak resident memory (VmHWM: since it
// started, or since resetPeakRSS), in MiB; 0 if it cannot be read.
func procPeakRSS(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// lastCPU is, per run of name, the CPU of its last measurement (see runs).
func lastCPU(name string) []cpuUse {
	return lastOfRuns(cpuResults[name], func(u cpuUse) int { return u.n })
}

// reportCPU prints the CPU per call of each front-door pair.
func reportCPU() {
	if len(cpuResults) == 0 {
		return
	}
	fmt.Printf("\n== CPU per call, through the front door (medians; µs of CPU a call: clusterd or, for raw SQL, the calling process; the database server; the gRPC or REST client;\n" +
		"   all of them a call, and the raw side's share of the service's: on a machine whose cores the measure keeps busy, the most the throughput ratio can be)\n")
	fmt.Printf("%-44s %12s %12s %12s %12s %12s %10s %10s %9s\n", "measure", "clusterd", "db (svc)", "client", "raw SQL", "db (raw)", "all (svc)", "all (raw)", "CPU ratio")
	for _, name := range order {
		base, ok := strings.CutSuffix(name, "/service")
		if !ok || len(cpuResults[name]) == 0 {
			continue
		}
		svc, raw := lastCPU(name), lastCPU(base+"/raw")
		col := func(us []cpuUse, f func(cpuUse) float64) float64 {
			var xs []float64
			for _, u := range us {
				xs = append(xs, f(u))
			}
			return median(xs)
		}
		db := func(us []cpuUse) string {
			if len(us) > 0 && us[0].dbInProcess {
				return "in process"
			}
			return fmt.Sprintf("%.0f", col(us, func(u cpuUse) float64 { return u.db }))
		}
		allSvc, allRaw := col(svc, cpuUse.all), col(raw, cpuUse.all)
		fmt.Printf("%-44s %12.0f %12s %12.0f %12.0f %12s %10.0f %10.0f %8.1f%%\n", base,
			col(svc, func(u cpuUse) float64 { return u.server }), db(svc),
			col(svc, func(u cpuUse) float64 { return u.client }),
			col(raw, func(u cpuUse) float64 { return u.server }), db(raw),
			allSvc, allRaw, 100*allRaw/allSvc)
	}
}

// procCPU is the user and system CPU process pid has used (0 for pid 0).
func procCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command's closing parenthesis; utime and stime are
	// the 14th and 15th of the whole line, in clock ticks (100 a second).
	rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

// databasePID is the process of the MariaDB server dsn connects to: a
// mariadbd or mysqld whose --port is the DSN's (3306 when neither names
// one); 0 if none is found.
func databasePID(dsn string) int {
	port := "3306"
	if u, err := url.Parse(dsn); err == nil && u.Port() != "" {
		port = u.Port()
	}
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		if _, err := strconv.Atoi(ent.Name()); err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "comm"))
		if c := strings.TrimSpace(string(comm)); err != nil || c != "mariadbd" && c != "mysqld" {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil {
			continue
		}
		own := "3306"
		for _, arg := range strings.Split(string(cmdline), "\x00") {
			if p, ok := strings.CutPrefix(arg, "--port="); ok {
				own = p
			}
		}
		if own == port {
			pid, _ := strconv.Atoi(ent.Name())
			return pid
		}
	}
	return 0
}

// loopbackAddr is a free port on 127.0.0.1.
func loopbackAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(b, err)
	defer l.Close()
	return l.Addr().String()
}

func randomHex(b *testing.B, n int) string {
	buf := make([]byte, n)
	_, err := rand.Read(buf)
	must(b, err)
	return hex.EncodeToString(buf)
}
