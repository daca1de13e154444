package e2e

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/lease"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// The chaos soak (issue 8): three clusterd processes on one MariaDB (a
// private mariadbd, so that it can be restarted), 16 clients sending random
// operations to 20 clusters through any live process (and cancelling one in
// eight of them a moment later), a process SIGKILLed
// and restarted every ~20s, one SIGSTOPped for longer than the peer timeout
// and then continued, and one MariaDB restart; then every client stops, the
// system settles, ALERT clusters are started (or upgraded when their nodes
// run a version the record does not), and an invariant checker reads the histories, the jobs and the
// simulator's fencing log:
//
//   - never two holders: every claim finds the cluster unheld or takes it
//     over from a job that had ended; every end is written by the holder;
//   - every operation ended: no job is IN_PROGRESS, and every accepted one
//     has ended;
//   - no cluster is left in an operation state, or held;
//   - no infrastructure change by a job after it lost its claim: every call
//     the simulator accepted was made while the history shows its job
//     holding the cluster;
//   - machines match the cluster at rest; and, sampled every second while
//     the chaos runs, every cluster at rest RUNNING has every machine
//     running, joined and at the recorded version (sampleAtRest).
//
// It runs once per --on-owner-loss: with resume (the default), a killed
// process's operations are adopted by its restarted self and a stopped
// one's by its peers, and the checker also requires that no call of an
// adopted job's earlier attempt went through after the adoption; with fail,
// they are failed and their clusters recovered, as before adoption existed.
// CLUSTERD_CHAOS_ON_OWNER_LOSS picks one.
//
// CLUSTERD_CHAOS_DURATION sets how long the chaos lasts: make test runs a
// short variant (the default, 40s, with shorter liveness settings and a kill
// every ~10s) of both, make chaos the 5-minute one (the binary's liveness
// defaults, a kill every ~20s) with resume unless told otherwise.
func TestChaos(t *testing.T) {
	cfg, long := chaosSettings(t)
	modes := []string{"resume", "fail"}
	if v := os.Getenv("CLUSTERD_CHAOS_ON_OWNER_LOSS"); v != "" || long {
		modes = []string{cfg.onOwnerLoss}
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			if !long {
				t.Parallel()
			}
			cfg := cfg
			cfg.onOwnerLoss = mode
			c := newChaos(t, cfg)
			c.run()
			c.settle()
			c.heal()
			c.check()
			c.report()
		})
	}
}

// TestChaosRollingRestart is the soak's load with one kind of chaos: a
// rolling restart of the three processes (SIGTERM, wait for exit 0, start
// again; one at a time, every 7.5s, 20s with make chaos), as an operator
// upgrading clusterd would do it. Every operation a stopping process was
// running is handed off and adopted, so none fails: every job, accepted
// operations and the scanner's alike, must end SUCCEEDED (the clients
// cancel nothing), besides the invariants TestChaos checks.
func TestChaosRollingRestart(t *testing.T) {
	cfg, long := chaosSettings(t)
	if !long {
		t.Parallel()
		cfg.duration = 30 * time.Second
	}
	cfg.rolling = true
	cfg.onOwnerLoss = "resume"
	c := newChaos(t, cfg)
	c.run()
	c.settle()
	c.check()
	c.report()
}

// chaosSettings reads CLUSTERD_CHAOS_DURATION and CLUSTERD_CHAOS_ON_OWNER_LOSS
// and returns the soak's settings, and whether it is the long one.
func chaosSettings(t *testing.T) (chaosConfig, bool) {
	d := 40 * time.Second
	if v := getenvDuration(t, "CLUSTERD_CHAOS_DURATION"); v > 0 {
		d = v
	}
	long := d >= 2*time.Minute
	cfg := chaosConfig{
		duration: d, clusters: 20, clients: 16, servers: 3,
		killEvery: 10 * time.Second, peerTimeout: 3 * time.Second, reconcileEvery: 2 * time.Second, onOwnerLoss: "resume",
		flags: []string{"--heartbeat-interval", "300ms", "--peer-timeout", "3s", "--scan-interval", "500ms", "--reconcile-interval", "2s", "--sim-step-delay", "20ms"},
	}
	if v := os.Getenv("CLUSTERD_CHAOS_ON_OWNER_LOSS"); v != "" {
		cfg.onOwnerLoss = v
	}
	if long {
		// The binary's liveness defaults (lease.DefaultHeartbeatInterval,
		// lease.DefaultPeerTimeout, scanner.DefaultScanInterval, reconcile 10s).
		cfg.killEvery, cfg.peerTimeout, cfg.reconcileEvery = 20*time.Second, lease.DefaultPeerTimeout, 10*time.Second
		cfg.flags = []string{"--sim-step-delay", "20ms"}
	}
	return cfg, long
}

// getenvDuration reads a duration from the environment (0 when unset).
func getenvDuration(t *testing.T, name string) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

type chaosConfig struct {
	// galera spreads the servers over the three nodes of a private Galera
	// cluster, whose fault is a node killed and rejoined, instead of one
	// private MariaDB restarted.
	galera      bool
	duration    time.Duration
	clusters    int
	clients     int
	servers     int
	killEvery   time.Duration
	peerTimeout time.Duration
	// reconcileEvery is the processes' reconcile interval (as flags set it).
	reconcileEvery time.Duration
	flags          []string
	// onOwnerLoss is every process's --on-owner-loss: resume or fail.
	onOwnerLoss string
	// rolling replaces the kills, the SIGSTOP and the MariaDB restart with a
	// rolling restart: SIGTERM one process, start it again, every killEvery.
	rolling bool
	// previous, when set, is the clusterd binary of the previous release:
	// each slot's first process runs it, and the rolling restart starts
	// the current binary in its place (a rolling upgrade).
	previous string
}

// chaos is one soak: the database, the processes, what the clients and the
// chaos did, and what the checker found.
type chaos struct {
	t    *testing.T
	cfg  chaosConfig
	db   chaosDatabase
	repo *repository.Store
	raw  *sql.DB // reads the checker makes that the repository has no query for

	// measures are the goroutines timing recoveries; settle joins them.
	measures sync.WaitGroup

	slots []*slot
	conns []*grpc.ClientConn

	names []string // the clusters

	mu         sync.Mutex
	accepted   map[string]string // operation -> verb
	refused    map[string]int    // reason -> count
	unexpected []string
	retries    atomic.Int64 // requests sent again (same request_id) after UNAVAILABLE

	kills, stops, dbRestarts, restarts int
	// downKills counts the kills whose process stayed down past the peer
	// timeout, so that its peers adopted its operations.
	downKills int
	// disturbed is when the chaos struck each server id (by slot): a
	// SIGKILL until its process served again, a SIGSTOP until its
	// SIGCONT, a SIGTERM until it served again. Peers may judge a server
	// dead only around these.
	disturbed  map[string][]window
	dbDown     []time.Duration
	recoveries []recoveryTime

	violations []string
	notes      []string
	// logs are the processes' log files, for the lines a violation names.
	logs    []string
	figures map[string]int
	// failures counts the messages of operations that failed other than
	// by a kill or a stop (the database restart, a lost lease, fencing).
	failures map[string]int
	// previousHeld are the jobs previous-release processes were running
	// when they were sent SIGTERM (a rolling upgrade), with their attempts.
	previousHeld map[string]runningJob
}

// window is a span of time during which a server was disturbed.
type window struct{ from, to time.Time }

// disturb records that the chaos struck slot s's server from from to to.
func (c *chaos) disturb(s *slot, from, to time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.serverID(s)
	c.disturbed[id] = append(c.disturbed[id], window{from, to})
}

// slot is one of the three processes: its fixed addresses (so a restarted
// process gets the same default server id, host:port) and the current one.
type slot struct {
	i                  int
	grpcAddr, httpAddr string
	mu                 sync.Mutex
	cur                *server
	launches           int
	stopped            bool // SIGSTOPped now
	// previous says the process runs the previous release's binary;
	// currentSince is when the slot's first current process started.
	previous     bool
	currentSince time.Time
}

// recoveryTime is how long the operations a killed, stopped or restarted
// process was running took to move again: with --on-owner-loss=resume, to
// be adopted (or to end); with fail, for their clusters to be released (by
// the restarted process, or by its peers).
type recoveryTime struct {
	what string
	jobs int
	took time.Duration
}

func newChaos(t *testing.T, cfg chaosConfig) *chaos {
	c := &chaos{t: t, cfg: cfg, accepted: map[string]string{}, refused: map[string]int{}, figures: map[string]int{}, failures: map[string]int{},
		disturbed: map[string][]window{}, previousHeld: map[string]runningJob{}}
	if cfg.galera {
		c.db = newChaosGalera(t)
	} else {
		c.db = newChaosMariaDB(t)
	}
	var err error
	c.repo, err = repository.Open(context.Background(), c.db.dsnFor(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.repo.Close() })
	c.raw = c.db.raw()
	for i := range cfg.servers {
		s := &slot{i: i, grpcAddr: stableAddr(t), httpAddr: stableAddr(t)}
		c.slots = append(c.slots, s)
		c.launch(s)
		// One connection per address, kept across restarts; a short
		// reconnect backoff so a restarted process is used again soon.
		bo := backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 200 * time.Millisecond}
		conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: time.Second}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		c.conns = append(c.conns, conn)
	}
	c.createClusters()
	return c
}

// launch starts slot s's process (no --server-id: the default, host:port).
func (c *chaos) launch(s *slot) {
	c.t.Helper()
	s.launches++
	log := filepath.Join(c.t.TempDir(), fmt.Sprintf("clusterd-%d-%d.log", s.i, s.launches))
	c.mu.Lock()
	c.logs = append(c.logs, log)
	c.mu.Unlock()
	args := append([]string{"--database", c.db.dsnFor(s.i), "--on-owner-loss", c.cfg.onOwnerLoss}, c.cfg.flags...)
	bin, previous := binary, c.cfg.previous != "" && s.launches == 1
	if previous {
		bin = c.cfg.previous
	}
	began := time.Now()
	srv, err := spawnBinaryAt(c.t, bin, fmt.Sprintf("slot%d", s.i), args, s.grpcAddr, s.httpAddr, log)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := srv.waitServing(c.t, 60*time.Second); err != nil {
		c.t.Fatalf("slot %d launch %d: %v", s.i, s.launches, err)
	}
	s.mu.Lock()
	s.cur = srv
	s.previous = previous
	if !previous && s.currentSince.IsZero() {
		s.currentSince = began
	}
	s.mu.Unlock()
}

func (c *chaos) createClusters() {
	t := c.t
	clients := clv1.NewClusterLifecycleClient(c.conns[0])
	ops := longrunningpb.NewOperationsClient(c.conns[0])
	var pending []string
	for i := range c.cfg.clusters {
		ctx, cancel := rpcCtx()
		op, err := clients.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
			DisplayName: fmt.Sprintf("chaos-%d", i), KubernetesVersion: "1.30.2",
			ControlNodeCount: 1, WorkerNodeCount: 1 + int32(i%3), ServiceOffering: "medium",
		}})
		cancel()
		if err != nil {
			t.Fatalf("create chaos-%d: %v", i, err)
		}
		c.accepted[op.GetName()] = "create"
		pending = append(pending, op.GetName())
	}
	for _, name := range pending {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			ctx, cancel := rpcCtx()
			op, err := ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: name})
			cancel()
			if err == nil && op.GetDone() {
				if op.GetError() != nil {
					t.Fatalf("create %s failed: %v", name, op.GetError())
				}
				md := &clv1.OperationMetadata{}
				_ = op.GetMetadata().UnmarshalTo(md)
				c.names = append(c.names, md.GetCluster())
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("create %s not done: %v", name, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// run lets the clients and the chaos loose for the configured duration.
func (c *chaos) run() {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.duration)
	defer cancel()
	var wg sync.WaitGroup
	seed := uint64(time.Now().UnixNano())
	c.t.Logf("chaos: %s, %d processes (--on-owner-loss=%s), %d clients, %d clusters, seed %d", c.cfg.duration, c.cfg.servers, c.cfg.onOwnerLoss, c.cfg.clients, c.cfg.clusters, seed)
	for g := range c.cfg.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.client(ctx, rand.New(rand.NewPCG(seed, uint64(g))))
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.sampleAtRest(ctx)
	}()
	if c.cfg.rolling {
		c.rollingRestart(ctx)
	} else {
		c.monkey(ctx, rand.New(rand.NewPCG(seed, 1<<32)))
	}
	wg.Wait()
}

// sampleAtRest checks, every second while the chaos runs, that every
// cluster at rest RUNNING has every machine running, joined and at the
// recorded Kubernetes version (SPEC §5.2: an operation that ends RUNNING
// leaves them so, or ends ALERT). It is sound without stopping anything:
// it reads the clusters, then their machines, then the clusters again, and
// judges only a cluster that was RUNNING, unheld and at the same row
// version both times. No claim happened in between (every claim bumps the
// version), and a machine of a cluster changes only under a job holding it
// (fencing), so the machines read are those the cluster rests on. Nothing
// in the soak breaks a machine behind clusterd's back (no out-of-band power
// change), so there is no legitimate window in which reconciliation has yet
// to flag a RUNNING cluster. A sample the database cannot answer (its
// restart) is skipped.
func (c *chaos) sampleAtRest(ctx context.Context) {
	ids := make([]string, len(c.names))
	for i, name := range c.names {
		ids[i] = strings.TrimPrefix(name, "clusters/")
	}
	read := func() (map[string]repository.Cluster, bool) {
		out := map[string]repository.Cluster{}
		for _, id := range ids {
			cl, err := c.repo.GetCluster(ctx, id)
			if err != nil {
				return nil, false
			}
			out[id] = cl
		}
		return out, true
	}
	seen := map[string]bool{} // cluster and row version: a violation is reported once
	for ctx.Err() == nil {
		c.pause(ctx, time.Second)
		before, ok := read()
		if !ok {
			continue
		}
		ms, err := c.repo.ListMachines(ctx, ids...)
		if err != nil {
			continue
		}
		after, ok := read()
		if !ok {
			continue
		}
		byCluster := map[string][]repository.Machine{}
		for _, m := range ms {
			byCluster[m.ClusterID] = append(byCluster[m.ClusterID], m)
		}
		c.mu.Lock()
		c.figures["at-rest samples"]++
		for _, id := range ids {
			b, a := before[id], after[id]
			if b.State.String() != "RUNNING" || b.CurrentOperation != "" || a.Version != b.Version {
				continue
			}
			c.figures["at-rest samples: RUNNING clusters checked"]++
			key := fmt.Sprintf("%s@%d", id, b.Version)
			for _, m := range byCluster[id] {
				if (m.Power != "RUNNING" || !m.Joined || m.KubernetesVersion != b.Spec.KubernetesVersion) && !seen[key+m.ID] {
					seen[key+m.ID] = true
					c.violate("sampled while running: clusters/%s RUNNING at rest (version %d) at %s, but machine %s power %s joined %t version %s",
						id, b.Version, b.Spec.KubernetesVersion, m.ID, m.Power, m.Joined, m.KubernetesVersion)
				}
			}
		}
		c.mu.Unlock()
	}
}

// client sends random operations, each with a request_id, through a random
// process; a request a process could not answer (killed, stopped, draining,
// its lease or its database gone) is sent again, with the same request_id,
// through another, so an operation accepted just before a kill is found
// again rather than lost or started twice.
func (c *chaos) client(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		name := c.names[rng.IntN(len(c.names))]
		conn := c.conns[rng.IntN(len(c.conns))]
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		cl, err := clv1.NewClusterLifecycleClient(conn).GetCluster(rctx, &clv1.GetClusterRequest{Name: name})
		cancel()
		if err != nil {
			c.pause(ctx, 50*time.Millisecond)
			continue
		}
		verb, send := chaosRequest(rng, cl)
		for attempt := 0; attempt < 6 && ctx.Err() == nil; attempt++ {
			conn := c.conns[(rng.IntN(len(c.conns))+attempt)%len(c.conns)]
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			op, err := send(rctx, clv1.NewClusterLifecycleClient(conn))
			cancel()
			if err == nil {
				c.mu.Lock()
				c.accepted[op.GetName()] = verb
				c.mu.Unlock()
				if !c.cfg.rolling && rng.IntN(8) == 0 {
					c.cancelLater(ctx, rng, op.GetName())
				}
				break
			}
			code, info := refusal(err)
			if code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Canceled {
				c.retries.Add(1)
				c.pause(ctx, 100*time.Millisecond)
				continue
			}
			c.mu.Lock()
			switch {
			case code == codes.Aborted || code == codes.FailedPrecondition:
				c.refused[info.GetReason()]++
			default:
				c.unexpected = append(c.unexpected, fmt.Sprintf("%s of %s: %v", verb, name, err))
			}
			c.mu.Unlock()
			break
		}
		c.pause(ctx, time.Duration(20+rng.IntN(60))*time.Millisecond)
	}
}

// cancelLater cancels an accepted operation after a short random pause,
// through a random process (the rolling restart cancels nothing: it wants
// every job to succeed). A cancel lands at the operation's next step, or
// not at all when it has ended: either way the cluster must end at rest
// with machines that match its record, e.g. an upgrade cancelled after its
// last node ends ALERT, and heal upgrades it again.
func (c *chaos) cancelLater(ctx context.Context, rng *rand.Rand, op string) {
	c.pause(ctx, time.Duration(20+rng.IntN(300))*time.Millisecond)
	conn := c.conns[rng.IntN(len(c.conns))]
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := longrunningpb.NewOperationsClient(conn).CancelOperation(rctx, &longrunningpb.CancelOperationRequest{Name: op})
	cancel()
	c.mu.Lock()
	if err == nil {
		c.figures["cancels sent"]++
	} else {
		c.figures["cancels not answered"]++
	}
	c.mu.Unlock()
}

func (c *chaos) pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// chaosRequest picks a request for cluster cl as read: start, stop, a scale
// of one worker up or down, or an upgrade to a later version, each with a
// request_id of its own that its retries keep.
func chaosRequest(rng *rand.Rand, cl *clv1.Cluster) (string, func(context.Context, clv1.ClusterLifecycleClient) (*longrunningpb.Operation, error)) {
	name, id := cl.GetName(), uuid.NewString()
	next := map[string][]string{"1.30.2": {"1.30.5", "1.31.1"}, "1.30.5": {"1.31.1"}}[cl.GetKubernetesVersion()]
	switch n := rng.IntN(10); {
	case n < 3:
		return "start", func(ctx context.Context, c clv1.ClusterLifecycleClient) (*longrunningpb.Operation, error) {
			return c.StartCluster(ctx, &clv1.StartClusterRequest{Name: name, RequestId: id})
		}
	case n < 5:
		return "stop", func(ctx context.Context, c clv1.ClusterLifecycleClient) (*longrunningpb.Operation, error) {
			return c.StopCluster(ctx, &clv1.StopClusterRequest{Name: name, RequestId: id})
		}
	case n < 9 || len(next) == 0:
		w := cl.GetWorkerNodeCount()
		switch {
		case w >= 3:
			w--
		case w <= 1:
			w++
		case rng.IntN(2) == 0:
			w--
		default:
			w++
		}
		return "scale", func(ctx context.Context, c clv1.ClusterLifecycleClient) (*longrunningpb.Operation, error) {
			return c.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: name, WorkerNodeCount: proto.Int32(w), RequestId: id, Etag: cl.GetEtag()})
		}
	default:
		v := next[rng.IntN(len(next))]
		return "upgrade", func(ctx context.Context, c clv1.ClusterLifecycleClient) (*longrunningpb.Operation, error) {
			return c.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: name, KubernetesVersion: v, RequestId: id, Etag: cl.GetEtag()})
		}
	}
}

// monkey is the chaos: a SIGKILL and restart every ~killEvery, one SIGSTOP
// longer than the peer timeout at a third of the run, one MariaDB restart at
// two thirds.
func (c *chaos) monkey(ctx context.Context, rng *rand.Rand) {
	began := time.Now()
	stopAt := began.Add(c.cfg.duration / 3)
	dbAt := began.Add(2 * c.cfg.duration / 3)
	nextKill := began.Add(c.cfg.killEvery/2 + time.Duration(rng.Int64N(int64(c.cfg.killEvery/2))))
	var bg sync.WaitGroup
	defer bg.Wait()
	for {
		now := time.Now()
		switch {
		case ctx.Err() != nil:
			return
		case !stopAt.IsZero() && now.After(stopAt):
			live := c.live()
			if len(live) == 0 {
				break
			}
			stopAt = time.Time{}
			s := live[rng.IntN(len(live))]
			bg.Add(1)
			go func() {
				defer bg.Done()
				c.sigstop(s, c.cfg.peerTimeout+2*time.Second)
			}()
		case !dbAt.IsZero() && now.After(dbAt):
			dbAt = time.Time{}
			what, down := c.db.fault()
			c.mu.Lock()
			c.dbRestarts++
			c.dbDown = append(c.dbDown, down)
			c.mu.Unlock()
			c.t.Logf("chaos: %s (down %s)", what, down.Round(time.Millisecond))
		case now.After(nextKill):
			nextKill = now.Add(c.cfg.killEvery/2 + time.Duration(rng.Int64N(int64(c.cfg.killEvery))))
			live := c.live()
			if len(live) < 2 {
				// Leave a peer alive to adopt.
				break
			}
			s := live[rng.IntN(len(live))]
			c.mu.Lock()
			down := c.kills%2 == 1
			c.mu.Unlock()
			if !down {
				c.kill(s, 0)
				break
			}
			// Every other kill, the process stays down past the peer
			// timeout: its peers adopt its operations.
			bg.Add(1)
			s.mu.Lock()
			s.stopped = true
			s.mu.Unlock()
			go func() {
				defer bg.Done()
				c.kill(s, c.cfg.peerTimeout+2*time.Second)
			}()
		}
		c.pause(ctx, 50*time.Millisecond)
	}
}

// live lists the slots whose process runs (not stopped, not down).
func (c *chaos) live() []*slot {
	var live []*slot
	for _, s := range c.slots {
		s.mu.Lock()
		if !s.stopped {
			live = append(live, s)
		}
		s.mu.Unlock()
	}
	return live
}

// rollingRestart stops the processes gracefully and starts them again, one
// at a time, every killEvery (more often if that would leave a process
// out), until ctx is done.
func (c *chaos) rollingRestart(ctx context.Context) {
	every := min(c.cfg.killEvery, c.cfg.duration/time.Duration(c.cfg.servers+1))
	for i := 0; ; i++ {
		c.pause(ctx, every)
		if ctx.Err() != nil {
			return
		}
		c.restart(c.slots[i%len(c.slots)])
	}
}

// restart stops slot s's process with SIGTERM, requires it to exit 0, and
// starts it again on the same port (so the same server id); it measures how
// long the operations it was running take to move again.
func (c *chaos) restart(s *slot) {
	s.mu.Lock()
	srv := s.cur
	s.mu.Unlock()
	s.mu.Lock()
	previous := s.previous
	s.mu.Unlock()
	held := c.inProgress(c.serverID(s))
	// A rolling upgrade stops a previous-release process while it runs
	// operations, so that they are handed across versions (within a
	// bound: the load keeps every process busy).
	for wait := time.Now().Add(15 * time.Second); previous && len(held) == 0 && time.Now().Before(wait); {
		time.Sleep(50 * time.Millisecond)
		held = c.inProgress(c.serverID(s))
	}
	if previous {
		c.mu.Lock()
		for id, r := range held {
			c.previousHeld[id] = r
		}
		c.mu.Unlock()
	}
	began := time.Now()
	_ = srv.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-srv.exited:
		if code := srv.cmd.ProcessState.ExitCode(); code != 0 {
			c.mu.Lock()
			c.violate("slot %d exited %d after SIGTERM", s.i, code)
			c.mu.Unlock()
		}
	case <-time.After(30 * time.Second):
		srv.kill9()
		c.mu.Lock()
		c.violate("slot %d still running 30s after SIGTERM", s.i)
		c.mu.Unlock()
	}
	c.t.Logf("chaos: SIGTERM slot %d (%d jobs running): exited after %s", s.i, len(held), time.Since(began).Round(time.Millisecond))
	c.launch(s)
	c.disturb(s, began, time.Now())
	c.mu.Lock()
	c.restarts++
	c.mu.Unlock()
	c.measures.Add(1)
	go func() {
		defer c.measures.Done()
		c.measure(fmt.Sprintf("SIGTERM of slot %d (handed off)", s.i), began, held)
	}()
}

// runningJob is an IN_PROGRESS job as seen: its cluster and its attempt.
type runningJob struct {
	cluster string
	attempt int32
}

// inProgress lists the IN_PROGRESS jobs of a server id with their clusters
// and attempts.
func (c *chaos) inProgress(serverID string) map[string]runningJob {
	rows, err := c.raw.Query("SELECT id, COALESCE(resource_id, ''), attempt FROM jobs WHERE status = 'IN_PROGRESS' AND server_id = ?", serverID)
	if err != nil {
		return nil
	}
	defer rows.Close()
	out := map[string]runningJob{}
	for rows.Next() {
		var id string
		var r runningJob
		if rows.Scan(&id, &r.cluster, &r.attempt) == nil {
			out[id] = r
		}
	}
	return out
}

// serverID is the default id of slot s's process: host and gRPC port.
func (c *chaos) serverID(s *slot) string {
	host, _ := os.Hostname()
	_, port, _ := strings.Cut(s.grpcAddr, ":")
	return host + ":" + port
}

// kill SIGKILLs slot s's process and starts it again after down (at once
// when 0), on the same port (so the same server id); it measures how long
// the clusters its jobs held take to be released: by the restarted process,
// or, when down is past the peer timeout, by its peers.
func (c *chaos) kill(s *slot, down time.Duration) {
	s.mu.Lock()
	srv := s.cur
	s.mu.Unlock()
	killed := time.Now()
	srv.kill9()
	held := c.inProgress(c.serverID(s))
	what := fmt.Sprintf("kill of slot %d", s.i)
	if down > 0 {
		what = fmt.Sprintf("kill of slot %d, down %s (adopted by its peers)", s.i, down)
		c.t.Logf("chaos: SIGKILL slot %d (%d jobs running), down for %s", s.i, len(held), down)
	}
	c.measures.Add(1)
	go func() {
		defer c.measures.Done()
		c.measure(what, killed, held)
	}()
	time.Sleep(down)
	c.launch(s)
	c.disturb(s, killed, time.Now())
	s.mu.Lock()
	s.stopped = false
	s.mu.Unlock()
	c.mu.Lock()
	c.kills++
	if down > 0 {
		c.downKills++
	}
	c.mu.Unlock()
}

// sigstop freezes slot s's process for d (longer than the peer timeout), then
// lets it go on: its peers must fail its jobs and recover its clusters, and
// when it wakes, its steps must be refused.
func (c *chaos) sigstop(s *slot, d time.Duration) {
	s.mu.Lock()
	srv := s.cur
	s.stopped = true
	s.mu.Unlock()
	stopped := time.Now()
	_ = srv.cmd.Process.Signal(syscall.SIGSTOP)
	held := c.inProgress(c.serverID(s))
	c.t.Logf("chaos: SIGSTOP slot %d (%d jobs running) for %s", s.i, len(held), d)
	c.measures.Add(1)
	go func() {
		defer c.measures.Done()
		c.measure(fmt.Sprintf("SIGSTOP of slot %d (recovered by its peers)", s.i), stopped, held)
	}()
	time.Sleep(d)
	_ = srv.cmd.Process.Signal(syscall.SIGCONT)
	c.disturb(s, stopped, time.Now())
	s.mu.Lock()
	s.stopped = false
	s.mu.Unlock()
	c.mu.Lock()
	c.stops++
	c.mu.Unlock()
}

// measure waits until every job held (as seen before the chaos struck)
// moves again, and records how long that took from since: with resume, until
// each is adopted (a later attempt) or has ended; with fail, until no
// cluster is held by any of them.
func (c *chaos) measure(what string, since time.Time, held map[string]runningJob) {
	if len(held) == 0 {
		return
	}
	db := c.raw
	deadline := since.Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		still := 0
		for job, r := range held {
			if c.cfg.onOwnerLoss == "resume" {
				var status string
				var attempt int32
				if err := db.QueryRow("SELECT status, attempt FROM jobs WHERE id = ?", job).Scan(&status, &attempt); err != nil || (status == "IN_PROGRESS" && attempt <= r.attempt) {
					still++
				}
				continue
			}
			var cur string
			if err := db.QueryRow("SELECT current_operation FROM clusters WHERE id = ?", r.cluster).Scan(&cur); err != nil || cur == job {
				still++
			}
		}
		if still == 0 {
			c.mu.Lock()
			c.recoveries = append(c.recoveries, recoveryTime{what, len(held), time.Since(since)})
			c.mu.Unlock()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.mu.Lock()
	c.violate("%s: clusters of %d jobs still held 2 minutes later", what, len(held))
	c.mu.Unlock()
}

// settle waits until every job has ended and every cluster is released.
func (c *chaos) settle() {
	c.measures.Wait()
	db := c.raw
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var jobs, held int
		err1 := db.QueryRow("SELECT COUNT(*) FROM jobs WHERE status = 'IN_PROGRESS'").Scan(&jobs)
		err2 := db.QueryRow("SELECT COUNT(*) FROM clusters WHERE current_operation <> '' OR state IN ('CREATED','STARTING','STOPPING','SCALING','SCALING_STOPPED_CLUSTER','UPGRADING','IMPORTING','REMOVING_NODES','RECOVERING','DESTROYING')").Scan(&held)
		if err1 == nil && err2 == nil && jobs == 0 && held == 0 {
			return
		}
		if time.Now().After(deadline) {
			c.violate("not settled 3 minutes after the chaos: %d jobs IN_PROGRESS, %d clusters held or in an operation state (%v %v)", jobs, held, err1, err2)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// heal brings every ALERT cluster back: a start, or, when a node runs a
// version newer than the record, an upgrade to it (from ALERT), so that "machines match
// the cluster at rest" can be checked on every cluster. Reconciliation may
// take a cluster to ALERT only after heal looked at it: a machine that an
// interrupted stop left off, under a cluster that a later scale (allowed
// from ALERT) took to RUNNING, is seen at its next pass. So heal goes in
// rounds, each after two reconcile intervals (a pass may have begun just
// before the last change), until a round finds nothing to heal; the checker
// reports whatever five rounds leave.
func (c *chaos) heal() {
	for round := 1; round <= 5; round++ {
		time.Sleep(2*c.cfg.reconcileEvery + time.Second)
		if !c.healRound() {
			return
		}
	}
}

// healRound sends the heal operations the clusters need now, waits for
// them and for the clusters to settle, and says whether it sent any.
func (c *chaos) healRound() bool {
	t := c.t
	sent := false
	cl := clv1.NewClusterLifecycleClient(c.conns[0])
	ops := longrunningpb.NewOperationsClient(c.conns[0])
	wait := func(op *longrunningpb.Operation) *longrunningpb.Operation {
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			ctx, cancel := rpcCtx()
			got, err := ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: op.GetName()})
			cancel()
			if err == nil && got.GetDone() {
				return got
			}
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	}
	for _, name := range c.names {
		for attempt := 0; attempt < 5; attempt++ {
			ctx, cancel := rpcCtx()
			got, err := cl.GetCluster(ctx, &clv1.GetClusterRequest{Name: name})
			cancel()
			if err != nil {
				t.Fatalf("GetCluster %s: %v", name, err)
			}
			if got.GetState() != clv1.Cluster_ALERT {
				break
			}
			ctx, cancel = rpcCtx()
			var op *longrunningpb.Operation
			if v := newestNode(got); v != got.GetKubernetesVersion() {
				// Nodes on a version the record does not have (an upgrade
				// that failed or was cancelled): the upgrade, allowed from
				// ALERT, records it; a start could not end RUNNING on them.
				op, err = cl.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: name, KubernetesVersion: v})
			} else {
				op, err = cl.StartCluster(ctx, &clv1.StartClusterRequest{Name: name})
			}
			cancel()
			if err == nil {
				if done := wait(op); done != nil && done.GetError() != nil {
					c.notes = append(c.notes, fmt.Sprintf("heal of %s: %s failed: %s", name, op.GetName(), done.GetError().GetMessage()))
				}
			}
			c.figures["heal operations"]++
			sent = true
		}
	}
	c.settle()
	return sent
}

func newestNode(cl *clv1.Cluster) string {
	newest := cl.GetKubernetesVersion()
	for _, n := range cl.GetNodes() {
		if v := n.GetKubernetesVersion(); v > newest {
			newest = v
		}
	}
	return newest
}

func (c *chaos) violate(format string, args ...any) {
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
}

// check is the invariant checker.
func (c *chaos) check() {
	ctx := context.Background()
	jobs := map[string]repository.Job{}
	after := ""
	for {
		page, err := c.repo.ListJobs(ctx, repository.JobQuery{After: after, Limit: 1000})
		if err != nil {
			c.t.Fatal(err)
		}
		for _, j := range page {
			jobs[j.ID] = j
		}
		if len(page) < 1000 {
			break
		}
		after = page[len(page)-1].ID
	}
	// Every operation ended; every accepted one exists and ended.
	for id, j := range jobs {
		if !j.Status.Done() {
			c.violate("job %s (%s of %s) is %s", id, j.Kind, j.ResourceID, j.Status)
		}
		if j.Attempt > 1 {
			c.figures["operations adopted (attempt > 1)"]++
			if j.Status == repository.JobSucceeded {
				c.figures["operations adopted and succeeded"]++
			}
		}
		if c.cfg.rolling && j.Status != repository.JobSucceeded {
			c.violate("a rolling restart failed %s (%s of %s, attempt %d): %s %s", id, j.Kind, j.ResourceID, j.Attempt, j.Status, firstLine(j.Error))
		}
		switch {
		case j.Status == repository.JobSucceeded:
			c.figures["operations succeeded"]++
		case strings.Contains(j.Error, "server restarted"):
			c.figures["operations failed: server restarted (killed)"]++
		case strings.Contains(j.Error, "owner server stopped"):
			c.figures["operations failed: owner stopped (peer recovery)"]++
		default:
			c.figures["operations failed: other"]++
			c.failures[firstLine(j.Error)]++
		}
		// Every failure has its reason (STEP_FAILED naming the step, ...):
		// INTERNAL is a hole in the one status mapping.
		var st struct{ Code codes.Code }
		if j.Status != repository.JobSucceeded && json.Unmarshal([]byte(j.Error), &st) == nil && st.Code == codes.Internal {
			c.violate("operation %s (%s of %s) ended INTERNAL: %s", id, j.Kind, j.ResourceID, firstLine(j.Error))
		}
		if j.Kind == "recover" {
			c.figures["recovery jobs"]++
		}
	}
	c.figures["operations (jobs, recoveries included)"] = len(jobs)
	c.checkAdoptions(ctx)
	c.checkQuotaUsage(ctx)
	for op := range c.accepted {
		if _, ok := jobs[strings.TrimPrefix(op, "operations/")]; !ok {
			c.violate("accepted operation %s has no job", op)
		}
	}

	calls, err := sim.Calls(ctx, c.repo, "")
	if err != nil {
		c.t.Fatal(err)
	}
	callsOf := map[string][]sim.Call{}
	for _, call := range calls {
		callsOf[call.Fence.ClusterID] = append(callsOf[call.Fence.ClusterID], call)
		if call.Refused {
			c.figures["infrastructure calls refused (fenced)"]++
		} else {
			c.figures["infrastructure calls accepted"]++
		}
	}

	for _, name := range c.names {
		id := strings.TrimPrefix(name, "clusters/")
		cl, err := c.repo.GetCluster(ctx, id)
		if err != nil {
			c.t.Fatal(err)
		}
		if cl.CurrentOperation != "" || cl.State.IsOperation() {
			c.violate("%s left %s held by %q", name, cl.State, cl.CurrentOperation)
		}
		evs, err := c.repo.ListEvents(ctx, id, 0, 1<<20)
		if err != nil {
			c.t.Fatal(err)
		}
		before := len(c.violations)
		holderAt := c.replay(name, evs, jobs)
		if len(c.violations) > before {
			c.explainHistory(ctx, name, evs, jobs)
		}
		for _, call := range callsOf[id] {
			if call.Refused {
				continue
			}
			h, attempt := holderAt(call.LastEventID)
			switch {
			case h != call.Fence.JobID:
				c.violate("%s: %s by job %s accepted (call %d) while the history shows %q holding the cluster", name, call.Fence.Step, call.Fence.JobID, call.ID, h)
			case call.Fence.Attempt != attempt:
				c.violate("%s: %s by attempt %d of job %s (server %s) accepted (call %d) while the history shows attempt %d running it",
					name, call.Fence.Step, call.Fence.Attempt, call.Fence.JobID, call.Server, call.ID, attempt)
			}
		}
		before = len(c.violations)
		if c.checkMachines(ctx, name, cl); len(c.violations) > before {
			c.notes = append(c.notes, fmt.Sprintf("history of %s, for the violation above:%s", name, historyTail(evs, jobs, 12)))
		}
	}
}

// replay checks one cluster's history for two holders and returns who held
// the cluster after any history entry, and which attempt of it ran then (1,
// and one more per OPERATION_ADOPTED of it since its claim).
func (c *chaos) replay(name string, evs []repository.Event, jobs map[string]repository.Job) func(eventID int64) (string, int32) {
	type mark struct {
		id      int64
		holder  string
		attempt int32
	}
	var marks []mark
	holder, attempt := "", int32(0)
	takeover := func(e repository.Event) {
		attempt = 1
		if holder == "" {
			return
		}
		prev, ok := jobs[holder]
		switch {
		case !ok:
			c.violate("%s: entry %d %s by %s took over from %s, which has no job row", name, e.ID, e.Name, e.Operation, holder)
		case !prev.Status.Done():
			c.violate("%s: entry %d %s by %s took over from %s, which is %s", name, e.ID, e.Name, e.Operation, holder, prev.Status)
		case prev.EndTime != nil && prev.EndTime.After(e.Time):
			c.violate("%s: entry %d %s by %s at %s took over from %s, which ended later, at %s", name, e.ID, e.Name, e.Operation, e.Time, holder, *prev.EndTime)
		default:
			c.figures["takeovers of ended jobs"]++
		}
	}
	for _, e := range evs {
		c.figures["history entries "+e.Name]++
		switch {
		case e.Name == repository.ClusterCreated:
			holder, attempt = e.Operation, 1
		case e.Name == "START_REQUESTED" && e.From.String() == "CREATED" && holder == e.Operation:
			// The create job's own first step.
		case strings.HasSuffix(e.Name, "_REQUESTED"):
			takeover(e)
			holder = e.Operation
		case e.Name == repository.RecoveryStarted:
			takeover(e)
			holder = e.Operation
		case slices.Contains([]string{"OPERATION_SUCCEEDED", "OPERATION_FAILED", "CREATE_FAILED", repository.OperationEnded}, e.Name):
			if holder != e.Operation {
				c.violate("%s: entry %d %s by %s while %q held the cluster", name, e.ID, e.Name, e.Operation, holder)
			}
			holder = ""
		case e.Name == "FAULTS_DETECTED" && e.Operation != "":
			// An operation's end that found its machines not matching the
			// record (lifecycle.Settle): it ends the hold like any end.
			if holder != e.Operation {
				c.violate("%s: entry %d FAULTS_DETECTED by %s while %q held the cluster", name, e.ID, e.Operation, holder)
			}
			holder = ""
		case e.Name == "FAULTS_DETECTED":
			if holder != "" {
				c.violate("%s: entry %d FAULTS_DETECTED while %s held the cluster", name, e.ID, holder)
			}
		case e.Name == repository.Repair:
			if holder != e.Operation {
				c.violate("%s: entry %d REPAIR by %s while %q held the cluster", name, e.ID, e.Operation, holder)
			}
		case e.Name == repository.OperationAdopted || e.Name == repository.OperationHandedOff:
			// The job goes on: the cluster keeps its holder.
			if holder != e.Operation {
				c.violate("%s: entry %d %s of %s while %q held the cluster", name, e.ID, e.Name, e.Operation, holder)
			}
			if e.Name == repository.OperationAdopted {
				attempt++
			}
		default:
			c.violate("%s: unexpected history entry %d %s", name, e.ID, e.Name)
		}
		marks = append(marks, mark{e.ID, holder, attempt})
	}
	return func(id int64) (string, int32) {
		i := sort.Search(len(marks), func(i int) bool { return marks[i].id > id })
		if i == 0 {
			return "", 0
		}
		return marks[i-1].holder, marks[i-1].attempt
	}
}

// checkMachines: a cluster at rest has the machines its state and spec say.
func (c *chaos) checkMachines(ctx context.Context, name string, cl repository.Cluster) {
	ms, err := c.repo.ListMachines(ctx, cl.ID)
	if err != nil {
		c.t.Fatal(err)
	}
	rules, err := c.repo.ListNetworkRules(ctx, cl.ID)
	if err != nil {
		c.t.Fatal(err)
	}
	count := map[string]int32{}
	want := map[string]bool{}
	for _, m := range ms {
		count[m.Role]++
		want[m.ID+" ssh:22"] = true
		if m.Role == "CONTROL" {
			want[m.ID+" api:6443"] = true
		}
	}
	got := map[string]bool{}
	for _, r := range rules {
		got[fmt.Sprintf("%s %s:%d", r.MachineID, r.Kind, r.Port)] = true
	}
	power := map[string]string{"RUNNING": "RUNNING", "STOPPED": "STOPPED"}[cl.State.String()]
	if power == "" {
		c.violate("%s is %s at rest after healing; want RUNNING or STOPPED", name, cl.State)
		return
	}
	if count["CONTROL"] != cl.Spec.ControlNodeCount || count["WORKER"] != cl.Spec.WorkerNodeCount || len(ms) != int(cl.Spec.ControlNodeCount+cl.Spec.WorkerNodeCount) {
		c.violate("%s (%s): %d control and %d worker machines (%d in all); spec %d and %d", name, cl.State, count["CONTROL"], count["WORKER"], len(ms), cl.Spec.ControlNodeCount, cl.Spec.WorkerNodeCount)
	}
	for _, m := range ms {
		if m.Power != power || !m.Joined || m.Cordoned || m.AttachedISO != "" || m.KubernetesVersion != cl.Spec.KubernetesVersion {
			c.violate("%s (%s at %s): machine %s power %s joined %t cordoned %t iso %q version %s", name, cl.State, cl.Spec.KubernetesVersion, m.ID, m.Power, m.Joined, m.Cordoned, m.AttachedISO, m.KubernetesVersion)
		}
	}
	if !mapsEqual(got, want) {
		c.violate("%s: network rules %v; want %v", name, keys(got), keys(want))
	}
}

// explainHistory notes what a violation in the history of cluster name
// needs to be understood: its last entries, and for each operation in them
// that has no job row, whether any database node has that row and the
// processes' log lines that name it.
func (c *chaos) explainHistory(ctx context.Context, name string, evs []repository.Event, jobs map[string]repository.Job) {
	c.notes = append(c.notes, fmt.Sprintf("history of %s, for the violation above:%s", name, historyTail(evs, jobs, 40)))
	missing := map[string]bool{}
	for _, e := range evs {
		if _, ok := jobs[e.Operation]; e.Operation != "" && !ok {
			missing[e.Operation] = true
		}
	}
	for _, op := range slices.Sorted(maps.Keys(missing)) {
		if n, ok := c.db.(interface {
			jobOnNodes(ctx context.Context, id string) []string
		}); ok {
			c.notes = append(c.notes, fmt.Sprintf("job %s on each node: %s", op, strings.Join(n.jobOnNodes(ctx, op), "; ")))
		}
		c.notes = append(c.notes, fmt.Sprintf("log lines naming %s:%s", op, grepLogs(c.logs, op, 40)))
	}
}

// grepLogs returns up to n lines of the files at paths that contain s, each
// prefixed with its file's name.
func grepLogs(paths []string, s string, n int) string {
	var b strings.Builder
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			fmt.Fprintf(&b, "\n    %s: %v", filepath.Base(p), err)
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() && n > 0 {
			if strings.Contains(sc.Text(), s) {
				fmt.Fprintf(&b, "\n    %s: %s", filepath.Base(p), sc.Text())
				n--
			}
		}
		_ = f.Close()
	}
	return b.String()
}

// historyTail renders the last n entries of a history with their jobs'
// kinds, attempts and outcomes.
func historyTail(evs []repository.Event, jobs map[string]repository.Job, n int) string {
	var b strings.Builder
	for _, e := range evs[max(0, len(evs)-n):] {
		j := jobs[e.Operation]
		fmt.Fprintf(&b, "\n    %d %s -%s-> %s %s (%s attempt %d %s) by %s: %s", e.ID, e.From, e.Name, e.To, e.Operation, j.Kind, j.Attempt, j.Status, e.Server, e.Message)
	}
	return b.String()
}

func mapsEqual(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkAdoptions reads every adoption by a peer that judged the owner dead
// (no heartbeat for the peer timeout) and requires the owner to have been
// disturbed by the chaos then: killed, stopped or restarted, up to a peer
// timeout and two scans before (a pass may have read the heartbeat just
// before the process came back). On one MariaDB its restart is no excuse:
// every server's heartbeat stalls alike, and a peer must not take that for
// a death. On Galera the servers of the node killed and rejoined may be
// judged dead rightly, so such adoptions are counted, not violations.
// checkQuotaUsage: quota usage never drifts (issue 19). At rest no cluster
// holds more than its spec (every release, by its job, a recovery or the
// scanner, cleared what the operation was about to hold, however it
// ended), and each account's usage as GetQuota derives it is what its live
// clusters' specs add up to (the soak's clusters are all "medium": 2 vCPUs,
// 2048 MiB a node).
func (c *chaos) checkQuotaUsage(ctx context.Context) {
	var stale int
	if err := c.raw.QueryRowContext(ctx, "SELECT COUNT(*) FROM clusters WHERE current_operation = ''"+
		" AND (hold_worker_node_count <> 0 OR hold_service_offering <> '')").Scan(&stale); err != nil {
		c.t.Fatal(err)
	}
	if stale > 0 {
		c.violate("%d released clusters still hold what an ended operation was about to hold", stale)
	}
	cs, err := c.repo.ListClusters(ctx, repository.ClusterQuery{
		Where: repository.Compare(repository.ClusterState, repository.Ne, lifecycle.Destroyed), Limit: 1000})
	if err != nil {
		c.t.Fatal(err)
	}
	want := map[string]repository.Usage{}
	for _, cl := range cs {
		u := want[cl.Account]
		n := int64(cl.Spec.ControlNodeCount + cl.Spec.WorkerNodeCount)
		u.Clusters, u.Nodes, u.CPUs, u.MemoryMB = u.Clusters+1, u.Nodes+n, u.CPUs+2*n, u.MemoryMB+2048*n
		want[cl.Account] = u
	}
	size := func(_ context.Context, o string) (repository.Size, error) {
		if o != "medium" {
			return repository.Size{}, fmt.Errorf("offering %q: the soak uses medium only", o)
		}
		return repository.Size{CPUs: 2, MemoryMB: 2048}, nil
	}
	for account, w := range want {
		q, err := c.repo.GetQuota(ctx, account, repository.QuotaCheck{Size: size})
		if err != nil {
			c.t.Fatal(err)
		}
		if q.Usage != w {
			c.violate("account %s: quota usage %+v; its live clusters hold %+v", account, q.Usage, w)
		}
		c.figures["quota usage checked (nodes)"] += int(w.Nodes)
	}
}

func (c *chaos) checkAdoptions(ctx context.Context) {
	slack := c.cfg.peerTimeout + 2*time.Second
	for _, name := range c.names {
		id := strings.TrimPrefix(name, "clusters/")
		var after int64
		for {
			page, err := c.repo.ListEvents(ctx, id, after, 1000)
			if err != nil {
				c.t.Fatal(err)
			}
			for _, e := range page {
				after = e.ID
				// "<kind> adopted by server A from server B (owner server B
				// stopped (no heartbeat for the peer timeout ...)): ..."
				_, owner, ok := strings.Cut(e.Message, " from server ")
				if e.Name != repository.OperationAdopted || !ok || !strings.Contains(e.Message, "(owner server ") {
					continue
				}
				owner, _, _ = strings.Cut(owner, " (")
				c.figures["operations adopted by a peer (owner judged dead)"]++
				if c.wasDisturbed(owner, e.Time, slack) {
					continue
				}
				c.figures["operations adopted from a server neither killed nor stopped"]++
				if !c.cfg.galera {
					c.violate("operation %s of %s adopted at %s from server %s, which was neither killed nor stopped then",
						e.Operation, id, e.Time.Format(time.RFC3339Nano), owner)
				}
			}
			if len(page) < 1000 {
				break
			}
		}
	}
}

// wasDisturbed says whether the chaos struck server id within slack before at.
func (c *chaos) wasDisturbed(id string, at time.Time, slack time.Duration) bool {
	for _, w := range c.disturbed[id] {
		if !at.Before(w.from) && !at.After(w.to.Add(slack)) {
			return true
		}
	}
	return false
}

// report prints the figures and fails the test on any violation.
func (c *chaos) report() {
	t := c.t
	byVerb := map[string]int{}
	for _, v := range c.accepted {
		byVerb[v]++
	}
	var b strings.Builder
	where, fault := "one MariaDB", "MariaDB restart"
	if c.cfg.galera {
		where, fault = "the 3 nodes of a Galera cluster", "Galera node killed and rejoined"
	}
	fmt.Fprintf(&b, "\nchaos soak: %s, %d processes on %s (--on-owner-loss=%s), %d clients, %d clusters\n", c.cfg.duration, c.cfg.servers, where, c.cfg.onOwnerLoss, c.cfg.clients, c.cfg.clusters)
	fmt.Fprintf(&b, "  operations accepted: %d %v; refused: %v; sent again after UNAVAILABLE: %d\n", len(c.accepted), byVerb, c.refused, c.retries.Load())
	if c.cfg.rolling {
		fmt.Fprintf(&b, "  chaos: %d rolling restarts (SIGTERM, exit, start again)\n", c.restarts)
	} else {
		fmt.Fprintf(&b, "  chaos: %d SIGKILL+restart (%d of them left down past the peer timeout %s), %d SIGSTOP (> peer timeout), %d %s (down %v)\n",
			c.kills, c.downKills, c.cfg.peerTimeout, c.stops, c.dbRestarts, fault, roundAll(c.dbDown))
	}
	var names []string
	for k := range c.figures {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(&b, "  %s: %d\n", k, c.figures[k])
	}
	var ds []time.Duration
	for _, r := range c.recoveries {
		moved := "clusters released"
		if c.cfg.onOwnerLoss == "resume" {
			moved = "operations adopted or ended"
		}
		fmt.Fprintf(&b, "  after %s: %d jobs' %s in %s\n", r.what, r.jobs, moved, r.took.Round(time.Millisecond))
		ds = append(ds, r.took)
	}
	if len(ds) > 0 {
		slices.Sort(ds)
		fmt.Fprintf(&b, "  time to move again: median %s, max %s over %d events\n", ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), len(ds))
	}
	var byPeers []time.Duration
	for _, r := range c.recoveries {
		if strings.Contains(r.what, "by its peers") {
			byPeers = append(byPeers, r.took)
		}
	}
	if len(byPeers) > 0 {
		slices.Sort(byPeers)
		fmt.Fprintf(&b, "  time to move again on a peer (kill with the process left down, SIGSTOP): median %s, max %s over %d events\n",
			byPeers[len(byPeers)/2].Round(time.Millisecond), byPeers[len(byPeers)-1].Round(time.Millisecond), len(byPeers))
	}
	for msg, n := range c.failures {
		fmt.Fprintf(&b, "  failed %dx: %s\n", n, msg)
	}
	for _, n := range c.notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	for _, u := range c.unexpected {
		fmt.Fprintf(&b, "  unexpected refusal: %s\n", u)
	}
	fmt.Fprintf(&b, "  violations: %d\n", len(c.violations))
	t.Log(b.String())
	for _, v := range c.violations {
		t.Error("violation: " + v)
	}
	if len(c.unexpected) > 0 {
		t.Errorf("%d refusals with a code other than ABORTED, FAILED_PRECONDITION or UNAVAILABLE", len(c.unexpected))
	}
	switch {
	case c.cfg.rolling && (c.restarts < c.cfg.servers || len(c.accepted) < c.cfg.clusters*2):
		t.Errorf("the soak did not exercise enough: %d restarts, %d operations", c.restarts, len(c.accepted))
	case !c.cfg.rolling && (c.kills == 0 || c.stops == 0 || c.dbRestarts == 0 || len(c.accepted) < c.cfg.clusters*2):
		t.Errorf("the soak did not exercise enough: %d kills, %d stops, %d database restarts, %d operations", c.kills, c.stops, c.dbRestarts, len(c.accepted))
	}
}

func roundAll(ds []time.Duration) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond).String()
	}
	return out
}

// firstLine is a job's stored error message, shortened for the report.
func firstLine(jobErr string) string {
	msg := jobErr
	if i := strings.Index(msg, `"message":`); i >= 0 {
		msg = msg[i+len(`"message":`):]
	}
	if len(msg) > 160 {
		msg = msg[:160] + "..."
	}
	return msg
}
