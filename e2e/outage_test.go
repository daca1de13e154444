package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// outageCreates is how many creates run while the database is down.
const outageCreates = 6

// dbOutages are the database outages the outage tests simulate, from
// CLUSTERD_CHAOS_DB_OUTAGES (comma-separated durations); make test: 5s, make
// chaos: 40s and 3m as well.
func dbOutages(t *testing.T) []time.Duration {
	t.Helper()
	v := os.Getenv("CLUSTERD_CHAOS_DB_OUTAGES")
	if v == "" {
		return []time.Duration{5 * time.Second}
	}
	var out []time.Duration
	for _, f := range strings.Split(v, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d <= 0 {
			t.Fatalf("CLUSTERD_CHAOS_DB_OUTAGES=%q: %q is not a positive duration", v, f)
		}
		out = append(out, d)
	}
	return out
}

// A private MariaDB is killed (-9) while six creates run on one server and
// is started again after each outage of dbOutages: every accepted operation
// survives it. Its jobs wait for the database (the server reports
// NOT_SERVING meanwhile), or hand themselves off once it answers when the
// outage outlived their lease, and go on from their last recorded step:
// none fails, and every cluster ends RUNNING and converged. (Before, a
// 5-second outage failed all six UNAVAILABLE and left their clusters in
// ERROR; a 40-second one failed them JOB_LOST.)
func TestOperationsRideOutADatabaseOutage(t *testing.T) {
	t.Parallel()
	for _, down := range dbOutages(t) {
		t.Run(down.String(), func(t *testing.T) {
			db := startPrivateMariaDB(t)
			dsn := db.newDatabase("outage")
			rideOut(t, dsn, down, "MariaDB killed (-9)", db.kill, db.start)
		})
	}
}

// TestOperationsRideOutAGaleraNodeOutage is the same on a Galera cluster:
// the node the server uses is killed (-9) and rejoins after the outage,
// while its two peers keep the primary component. It runs only when
// CLUSTERD_CHAOS_DB_OUTAGES is set (make chaos-galera): a private Galera
// cluster and a node's rejoin take minutes here, too long for make test.
func TestOperationsRideOutAGaleraNodeOutage(t *testing.T) {
	if os.Getenv("CLUSTERD_CHAOS_DB_OUTAGES") == "" {
		t.Skip("CLUSTERD_CHAOS_DB_OUTAGES is not set: make chaos-galera runs this test")
	}
	t.Parallel()
	g := startPrivateGalera(t)
	for i, down := range dbOutages(t) {
		t.Run(down.String(), func(t *testing.T) {
			name := fmt.Sprintf("outage%d", i)
			first := g.dsn(t, 1)
			admin, err := sql.Open("mysql", galeraDriverDSN(t, first, ""))
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close()
			if _, err := admin.Exec("CREATE DATABASE " + name + " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
				t.Fatalf("create the test's database: %v", err)
			}
			dsn := strings.TrimSuffix(first, "/test") + "/" + name
			kill := func() {
				if err := g.run("kill", "1"); err != nil {
					t.Fatal(err)
				}
			}
			start := func() {
				if err := g.run("start-node", "1"); err != nil {
					t.Fatal(err)
				}
			}
			rideOut(t, dsn, down, "Galera node 1 killed (-9)", kill, start)
		})
	}
}

// rideOut runs one server on dsn, starts outageCreates creates (300ms per
// step, 4s more at wait_api), kills the database under them, brings it back
// after down, and checks that every create succeeds. It logs the figures:
// operations started and failed, how long the database was down, and how
// long after it came back the last operation finished.
func rideOut(t *testing.T, dsn string, down time.Duration, what string, kill, start func()) {
	s := startServer(t, dsn, "e2e-outage", "--sim-step-delay", "300ms")
	s.inject(t, &clv1.Fault{Step: "wait_api", Mode: clv1.Fault_DELAY, Delay: durationpb.New(4 * time.Second)})
	var ops []string
	for i := range outageCreates {
		ctx, cancel := rpcCtx()
		op, err := s.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: spec(fmt.Sprintf("outage-%d", i))})
		cancel()
		ops = append(ops, started(t, fmt.Sprintf("create %d", i), op, err))
	}
	// Every create is past its first step, and none has finished: each is
	// somewhere in its steps when the database goes.
	for _, name := range ops {
		waitUntil(t, "operation "+name+" under way", func() bool {
			ctx, cancel := rpcCtx()
			defer cancel()
			op, err := s.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: name})
			return err == nil && metadata(t, op).GetStepsDone() > 0
		})
	}

	kill()
	killed := time.Now()
	health := healthpb.NewHealthClient(s.conn)
	notServing := false
	for time.Since(killed) < down { // observing while the database is down
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		notServing = notServing || (err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING)
		time.Sleep(min(200*time.Millisecond, time.Until(killed.Add(down))))
	}
	start()
	back := time.Now()
	t.Logf("%s for %s (back %s after the kill)", what, down, back.Sub(killed).Round(time.Millisecond))
	if !notServing {
		// The log says it too, if the polls all missed it.
		s.waitLog(t, "NOT_SERVING", 10*time.Second)
	}

	// Generous: the outage's own length, and minutes for the rest.
	deadline := back.Add(5 * time.Minute)
	failed, last := 0, back
	var clusters []string
	for _, name := range ops {
		var op *longrunningpb.Operation
		for {
			ctx, cancel := rpcCtx()
			got, err := s.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: name})
			cancel()
			if err == nil && got.GetDone() {
				op = got
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("operation %s not done %s after the database came back (last: %v, %v)", name, time.Since(back).Round(time.Second), got.GetMetadata(), err)
			}
			time.Sleep(pollEvery)
		}
		if now := time.Now(); now.After(last) {
			last = now
		}
		if e := op.GetError(); e != nil {
			failed++
			t.Errorf("create %s failed through the outage: code %d: %s", name, e.GetCode(), e.GetMessage())
		}
		clusters = append(clusters, metadata(t, op).GetCluster())
	}
	t.Logf("figures: %d operations started, %d failed, the last done %s after the database came back (%s after the kill)",
		len(ops), failed, last.Sub(back).Round(time.Millisecond), last.Sub(killed).Round(time.Millisecond))
	for _, name := range clusters {
		c, _ := s.waitCluster(t, name, "released", opTimeout, released)
		s.healthy(t, c)
	}
}
