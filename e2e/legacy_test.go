package e2e

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// TestLegacyJobsHoldRecovery checks the mixed-version rule (SPEC §4), with
// --on-owner-loss=fail (a legacy job, naming no cluster, is never adopted): a job
// row an older server wrote without a resource id holds the cluster its
// parameters name away from recovery; one with no parameters holds every
// cluster. Two clusters, X and Y, are orphaned by a kill mid-stop; an
// "old-server", alive, has two IN_PROGRESS legacy jobs: one naming X and
// one with no parameters. After the restart nothing is recovered; once the
// job without parameters is gone, only Y is; once the old server dies (its
// job failed by liveness), X is too.
func TestLegacyJobsHoldRecovery(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	db := openSQL(t, dsn)
	const id = "e2e-legacy"
	const scan = 200 * time.Millisecond
	flags := append([]string{"--scan-interval", scan.String(), "--reconcile-interval", "1h"}, failOnOwnerLoss...)
	s := startServer(t, dsn, id, flags...)
	x := s.create(t, "x").GetName()
	y := s.create(t, "y").GetName()
	s.hold(t, "power_off", "")
	stops := map[string]string{}
	for _, c := range []string{x, y} {
		ctx, cancel := rpcCtx()
		resp, err := s.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: c})
		cancel()
		stops[c] = started(t, "stop "+c, resp, err)
		s.waitHeld(t, "power_off of "+c, heldStep("power_off", c))
	}
	s.kill9()

	execSQL(t, db, "INSERT INTO servers (id, incarnation, start_time, heartbeat_time) "+
		"VALUES ('old-server', ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)", uuid.NewString())
	legacyAll := insertLegacyJob(t, db, "")
	legacyX := insertLegacyJob(t, db, `{"cluster_id":"`+strings.TrimPrefix(x, "clusters/")+`"}`)

	s = startServer(t, dsn, id, flags...)
	// The first pass fails the killed incarnation's stops; every later pass
	// must leave both clusters to the old server's jobs.
	for _, c := range []string{x, y} {
		operationError(t, s.waitOp(t, stops[c]), "server restarted", "SERVER_STOPPED")
	}
	s.stillHeld(t, 5*scan, "while an older server's job names no cluster", x, y)

	execSQL(t, db, "DELETE FROM jobs WHERE id = ?", legacyAll)
	removed := time.Now()
	if c, took := s.waitRecovered(t, y, removed, opTimeout); c.GetState() != clv1.Cluster_ALERT {
		t.Errorf("after the job without parameters was removed, %s is %s, want ALERT", y, c.GetState())
	} else {
		recordRecovery(t, "legacy job without parameters removed -> cluster recovered", took)
	}
	s.stillHeld(t, 5*scan, "while an older server's job names it", x)

	execSQL(t, db, "UPDATE servers SET heartbeat_time = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR WHERE id = 'old-server'")
	died := time.Now()
	c, took := s.waitRecovered(t, x, died, opTimeout)
	recordRecovery(t, "old server of a legacy job naming the cluster dead -> cluster recovered", took)
	if c.GetState() != clv1.Cluster_ALERT {
		t.Errorf("after the old server died, %s is %s, want ALERT", x, c.GetState())
	}
	var status, jobErr string
	if err := db.QueryRow("SELECT status, error FROM jobs WHERE id = ?", legacyX).Scan(&status, &jobErr); err != nil {
		t.Fatalf("read legacy job: %v", err)
	}
	if status != "FAILED" || !strings.Contains(jobErr, "owner server stopped") {
		t.Errorf("the dead old server's job is %s (%s), want FAILED with owner server stopped", status, jobErr)
	}
	for _, c := range []string{x, y} {
		checkRecoveryHistory(t, s, c, stops[c], clv1.Cluster_ALERT, nil)
		s.converged(t, s.cluster(t, c))
		if !t.Failed() {
			startAgain(t, s, &crashEnv{cluster: c}, nil)
		}
	}
}

// stillHeld watches clusters for d and fails if recovery touches any: each
// must stay STOPPING, named by its (failed) stop.
func (s *server) stillHeld(t *testing.T, d time.Duration, why string, clusters ...string) {
	t.Helper()
	want := map[string]string{}
	for _, c := range clusters {
		want[c] = s.cluster(t, c).GetCurrentOperation()
	}
	for until := time.Now().Add(d); time.Now().Before(until); time.Sleep(pollEvery) {
		for _, name := range clusters {
			c := s.cluster(t, name)
			if c.GetState() != clv1.Cluster_STOPPING || c.GetCurrentOperation() != want[name] {
				t.Fatalf("%s: %s was recovered (now %s held by %q), want it left STOPPING held by %s:%s",
					why, name, c.GetState(), c.GetCurrentOperation(), want[name], describeEvents(s.events(t, name)))
			}
		}
	}
}

// insertLegacyJob writes the IN_PROGRESS job row of an older server: no
// resource id, params as given, on the live "old-server".
func insertLegacyJob(t *testing.T, db *sql.DB, params string) string {
	t.Helper()
	id := uuid.NewString()
	execSQL(t, db, "INSERT INTO jobs (id, kind, resource_id, server_id, server_incarnation, status, params, result, error, deadline, create_time, update_time) "+
		"VALUES (?, 'stop', NULL, 'old-server', '', 'IN_PROGRESS', ?, '', '', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))", id, params)
	return id
}

func execSQL(t *testing.T, db *sql.DB, query string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	if _, err := db.ExecContext(ctx, query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}
