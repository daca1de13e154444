package repository_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// seedScale fills a fresh database, outside the repository, with n resting
// clusters (RUNNING, a few STOPPED and ALERT), each with two machines and a
// finished create job and a simulator call, plus n/100 clusters held by IN_PROGRESS stops of a
// live server and n/100 failed destroys waiting: enough rows that a full
// scan or a sort shows in a plan.
func seedScale(t *testing.T, dsn string, n int, now time.Time) {
	t.Helper()
	ts := func(d time.Duration) string { return "'" + now.Add(d).UTC().Format("2006-01-02 15:04:05.000000") + "'" }
	if strings.HasPrefix(dsn, "sqlite:") {
		// The driver's own time format (see _time_format=sqlite).
		ts = func(d time.Duration) string {
			return "'" + now.Add(d).UTC().Format("2006-01-02 15:04:05.999999999-07:00") + "'"
		}
	}
	var clusters, machines, jobs []string
	for i := range n {
		id := fmt.Sprintf("00000000-0000-7000-8000-%012d", i)
		state, op, power := "RUNNING", "", "RUNNING"
		switch {
		case i%100 == 1:
			state, op = "STOPPING", fmt.Sprintf("00000000-0000-7000-9000-%012d", i)
			jobs = append(jobs, fmt.Sprintf("('%s','stop','acme','%s','peer','inc','IN_PROGRESS','{}','','',%s,%s,%s,NULL)", op, id, ts(time.Hour), ts(-time.Minute), ts(-time.Minute)))
		case i%100 == 2:
			state = "DESTROYING"
		case i%10 == 3:
			state, power = "STOPPED", "STOPPED"
		case i%50 == 4:
			state = "ALERT"
		}
		clusters = append(clusters, fmt.Sprintf("('%s','acme','c%d',1,'','%s',3,'%s','1.30.2',1,1,'medium',%s,%s)", id, i, state, op, ts(-48*time.Hour), ts(-24*time.Hour)))
		for m := range 2 {
			machines = append(machines, fmt.Sprintf("('00000000-0000-7000-b%03d-%012d','%s','WORKER','%s',1,'1.30.2','medium',%s,%s)", m, i, id, power, ts(-48*time.Hour), ts(-24*time.Hour)))
		}
		jobs = append(jobs, fmt.Sprintf("('00000000-0000-7000-a000-%012d','create','acme','%s','peer','inc','SUCCEEDED','{}','','',%s,%s,%s,%s)", i, id, ts(time.Hour), ts(-48*time.Hour), ts(-47*time.Hour), ts(-47*time.Hour)))
	}
	insert := func(head string, rows []string) {
		for len(rows) > 0 {
			k := min(500, len(rows))
			repotest.Exec(t, dsn, head+strings.Join(rows[:k], ","))
			rows = rows[k:]
		}
	}
	insert("INSERT INTO clusters (id, account, display_name, alive, description, state, version, current_operation, kubernetes_version, control_node_count, worker_node_count, service_offering, create_time, update_time) VALUES ", clusters)
	insert("INSERT INTO machines (id, cluster_id, role, power, joined, kubernetes_version, offering, create_time, update_time) VALUES ", machines)
	insert("INSERT INTO jobs (id, kind, account, resource_id, server_id, server_incarnation, status, params, result, error, deadline, create_time, update_time, end_time) VALUES ", jobs)
	repotest.Exec(t, dsn, "INSERT INTO servers (id, incarnation, start_time, heartbeat_time) VALUES ('peer','inc',"+ts(-time.Hour)+","+ts(0)+")")
	if strings.HasPrefix(dsn, "mysql://") {
		// InnoDB's persistent statistics, as a server that has run a while has them.
		repotest.Exec(t, dsn, "ANALYZE TABLE clusters, machines, jobs, servers")
	}
}

// recorder keeps the queries a Store runs.
type recorder struct {
	mu   sync.Mutex
	cmds []repository.Command
}

func (r *recorder) hook(_ context.Context, c repository.Command) {
	if c.Kind != repository.CommandQuery {
		return
	}
	r.mu.Lock()
	r.cmds = append(r.cmds, c)
	r.mu.Unlock()
}

func (r *recorder) take() []repository.Command {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.cmds
	r.cmds = nil
	return out
}

// TestScanQueryPlans: every query of a scanner pass, and the reads of the
// RPCs, is answered from an index on both backends, with no full scan of a
// table or an index and no sort of anything but its own small result.
// EXPLAIN runs the very statement the repository sent, with its arguments.
func TestScanQueryPlans(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			dsn := b.NewDSN(t)
			now := time.Now()
			rec := &recorder{}
			ctx := ctxT(t)
			s, err := repository.Open(ctx, dsn, repository.WithCommandHook(rec.hook))
			if err != nil {
				t.Fatal(err)
			}
			repotest.SeedCatalog(t, s)
			t.Cleanup(func() { _ = s.Close() })
			seedScale(t, dsn, 3000, now)
			self := repository.Server{ID: "me", Incarnation: "me-1"}
			resting := []lifecycle.State{lifecycle.Running, lifecycle.Stopped, lifecycle.Alert}
			// uses names the indexes a query must be answered from: a plan
			// can avoid a full scan and still read far more than it needs.
			cases := []struct {
				name string
				uses []string
				run  func() error
			}{
				{"liveness", nil, func() error {
					_, _, err := s.FailJobsOfDeadServers(ctx, self, now.Add(-time.Hour), nil, "", "")
					return err
				}},
				{"liveness after an adoption offer", nil, func() error {
					offer := &repository.Offer{Before: now, Now: now, MaxAttempts: 3, NotAdopted: []string{"00000000-0000-7000-9000-000000000001"}}
					_, _, err := s.FailJobsOfDeadServers(ctx, self, now.Add(-time.Hour), offer, "", "")
					return err
				}},
				{"job owners", []string{"jobs_status_owner", map[string]string{"mysql": "Using index for group-by", "sqlite": "COVERING INDEX jobs_status_owner"}[b.Name]}, func() error {
					o, err := s.InProgressOwners(ctx)
					if err == nil && (len(o.Jobs) != 1 || o.Jobs[0] != repository.JobOwner{ServerID: "peer", Incarnation: "inc"} || o.HandedOff) {
						err = fmt.Errorf("owners %+v; want peer's incarnation inc alone, nothing handed off", o)
					}
					return err
				}},
				{"own jobs", nil, func() error { _, err := s.OwnJobsInProgress(ctx, self); return err }},
				{"cancel requests", []string{"jobs_status_cancel"}, func() error {
					_, err := s.CancelRequested(ctx, []string{"00000000-0000-7000-9000-000000000001"})
					return err
				}},
				{"orphans", []string{"clusters_current_operation", "clusters_state_operation"}, func() error {
					cs, _, err := s.Orphans(ctx, 1000)
					if err == nil && len(cs) != 3000/100 {
						err = fmt.Errorf("%d orphans; want the %d failed destroys", len(cs), 3000/100)
					}
					return err
				}},
				{"orphans since", []string{"jobs_end_time", "clusters_current_operation", "clusters_state_operation"}, func() error {
					cs, _, err := s.OrphansSince(ctx, now.Add(-time.Minute), 1000)
					if err == nil && len(cs) != 3000/100 {
						err = fmt.Errorf("%d orphans; want the %d failed destroys", len(cs), 3000/100)
					}
					return err
				}},
				{"legacy jobs", nil, func() error { _, err := s.InProgressJobsWithoutResource(ctx); return err }},
				{"reconcile changes", []string{"clusters_update_time", "machines_update_time"}, func() error {
					cs, err := s.ChangedUnheldClusters(ctx, resting, now.Add(-time.Minute), 1000)
					if err == nil && len(cs) != 0 {
						err = fmt.Errorf("%d changed clusters; want none", len(cs))
					}
					return err
				}},
				{"reconcile sweep", nil, func() error {
					_, err := s.UnheldClusters(ctx, resting, "00000000-0000-7000-8000-000000001234", 1000)
					return err
				}},
				{"purge", []string{"jobs_end_time"}, func() error { _, err := s.PurgeJobs(ctx, now.Add(-7*24*time.Hour), 500); return err }},
				{"get cluster", nil, func() error { _, err := s.GetCluster(ctx, "00000000-0000-7000-8000-000000001234"); return err }},
				{"get cluster with machines", []string{"machines_cluster"}, func() error {
					_, _, err := s.GetClusterWithMachines(ctx, "00000000-0000-7000-8000-000000001234")
					return err
				}},
				{"list clusters", nil, func() error {
					_, err := s.ListClusters(ctx, repository.ClusterQuery{After: "00000000-0000-7000-8000-000000001234", Limit: 101})
					return err
				}},
				{"the guard's locking read", nil, func() error {
					err := s.CheckHolder(ctx, repository.Fence{ClusterID: "00000000-0000-7000-8000-000000001234", JobID: "00000000-0000-7000-9000-000000000001"})
					if errors.Is(err, repository.ErrFenced) {
						return nil
					}
					return err
				}},
				{"machines of a page", nil, func() error {
					_, err := s.ListMachines(ctx, "00000000-0000-7000-8000-000000001234", "00000000-0000-7000-8000-000000001235")
					return err
				}},
			}
			raw := openRaw(t, dsn)
			for _, c := range cases {
				rec.take()
				if err := c.run(); err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				var plans []string
				for _, q := range rec.take() {
					plan, bad := explain(t, raw, b.Name, q)
					plans = append(plans, plan)
					t.Logf("%s: %s %v\n%s", c.name, q.SQL, q.Args, plan)
					if bad != "" {
						t.Errorf("%s: %s\n  %s\n%s", c.name, bad, q.SQL, plan)
					}
				}
				for _, index := range c.uses {
					if !strings.Contains(strings.Join(plans, "\n"), index) {
						t.Errorf("%s: not answered from %s:\n%s", c.name, index, strings.Join(plans, "\n"))
					}
				}
			}
		})
	}
}

func openRaw(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	driver, source := "sqlite", strings.TrimPrefix(dsn, "sqlite:")
	if strings.HasPrefix(dsn, "mysql://") {
		// As the repository sends them: arguments interpolated.
		driver, source = "mysql", repotest.DriverDSN(t, dsn)+"&interpolateParams=true"
	}
	db, err := sql.Open(driver, source)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// bigTables are the tables whose size grows with the clusters.
var bigTables = map[string]bool{"clusters": true, "jobs": true, "machines": true, "cluster_events": true, "c": true, "j": true, "m": true}

// explain returns the plan of q and, if it reads a big table whole, or
// sorts rows of one to find the first few (a LIMIT that an index order
// should answer), why that is wrong. Sorting a whole result (the running
// jobs in id order, a union of changed clusters) sorts only what is
// returned, and is fine.
func explain(t *testing.T, db *sql.DB, backend string, q repository.Command) (plan, bad string) {
	t.Helper()
	topN := strings.Contains(q.SQL, "LIMIT") && !strings.Contains(q.SQL, "UNION")
	prefix := "EXPLAIN QUERY PLAN "
	if backend == "mysql" {
		prefix = "EXPLAIN "
	}
	rows, err := db.QueryContext(ctxT(t), prefix+q.SQL, q.Args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", q.SQL, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var lines []string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := map[string]string{}
		var parts []string
		for i, c := range cols {
			row[c] = vals[i].String
			parts = append(parts, c+"="+vals[i].String)
		}
		lines = append(lines, "    "+strings.Join(parts, " "))
		if bad != "" {
			continue
		}
		if backend == "mysql" {
			switch table := row["table"]; {
			case !bigTables[table]:
			case row["type"] == "ALL":
				bad = "full scan of " + table
			case row["type"] == "index":
				bad = "full index scan of " + table
			case topN && strings.Contains(row["Extra"], "filesort"):
				bad = "sort of " + table + " for a LIMIT"
			}
			continue
		}
		d := row["detail"]
		if f := strings.Fields(d); len(f) >= 2 && f[0] == "SCAN" && bigTables[f[1]] {
			bad = "full scan: " + d
		} else if topN && strings.HasPrefix(d, "USE TEMP B-TREE FOR ORDER BY") {
			bad = "sort for a LIMIT: " + d
		}
	}
	return strings.Join(lines, "\n"), bad
}
