package bench_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Seeding writes rows straight into the tables, thousands a statement: the
// benchmarks need 100,000 clusters in seconds, not an hour of RPCs. It is
// test code, like the baselines.

var seq atomic.Int64

// ts is a time as the backend's columns store it.
func (e *env) ts(t time.Time) string {
	if e.backend == "sqlite" {
		return "'" + t.UTC().Format("2006-01-02 15:04:05.999999999-07:00") + "'"
	}
	return "'" + t.UTC().Format("2006-01-02 15:04:05.000000") + "'"
}

// insert writes rows (SQL tuples) into table in statements of 1,000 rows,
// in one transaction.
func (e *env) insert(b *testing.B, head string, rows []string) {
	tx, err := e.rawW.Begin()
	must(b, err)
	for len(rows) > 0 {
		k := min(1000, len(rows))
		if _, err := tx.Exec(head + strings.Join(rows[:k], ",")); err != nil {
			_ = tx.Rollback()
			b.Fatal(err)
		}
		rows = rows[k:]
	}
	must(b, tx.Commit())
}

// clusterID makes a fresh cluster id (UUIDv7-shaped, in creation order).
func clusterID(n int64) string { return fmt.Sprintf("01000000-0000-7000-8000-%012d", n) }

// seedRunning adds n RUNNING clusters with machines machines each (their
// create jobs finished) and returns their ids.
func (e *env) seedRunning(b *testing.B, n, machines int) []string {
	now := time.Now().Add(-time.Hour)
	ids := make([]string, n)
	var cs, ms, js []string
	for i := range n {
		k := seq.Add(1)
		id := clusterID(k)
		ids[i] = id
		cs = append(cs, fmt.Sprintf("('%s','acme','b%d',1,'','RUNNING',3,'','1.30.2',1,%d,'medium',%s,%s)", id, k, max(machines-1, 1), e.ts(now), e.ts(now)))
		for m := range machines {
			role := "WORKER"
			if m == 0 {
				role = "CONTROL"
			}
			ms = append(ms, fmt.Sprintf("('%s','%s','%s','RUNNING',1,'1.30.2','medium',%s,%s)", machineID(k, m), id, role, e.ts(now), e.ts(now)))
		}
		js = append(js, fmt.Sprintf("('%s','create','acme','%s','bench','old','SUCCEEDED','{}','','',%s,%s,%s,%s)", jobID(k), id, e.ts(now.Add(time.Hour)), e.ts(now), e.ts(now), e.ts(now)))
	}
	e.insertClusters(b, cs, ms, js)
	return ids
}

func machineID(n int64, m int) string { return fmt.Sprintf("01000000-0000-7000-b%03d-%012d", m, n) }

func jobID(n int64) string { return fmt.Sprintf("01000000-0000-7000-a000-%012d", n) }

func (e *env) insertClusters(b *testing.B, cs, ms, js []string) {
	e.insert(b, "INSERT INTO clusters (id, account, display_name, alive, description, state, version, current_operation, kubernetes_version, control_node_count, worker_node_count, service_offering, create_time, update_time) VALUES ", cs)
	if len(ms) > 0 {
		e.insert(b, "INSERT INTO machines (id, cluster_id, role, power, joined, kubernetes_version, offering, create_time, update_time) VALUES ", ms)
	}
	e.insert(b, "INSERT INTO jobs (id, kind, account, resource_id, server_id, server_incarnation, status, params, result, error, deadline, create_time, update_time, end_time) VALUES ", js)
}

// seedScale grows the scanner's data set to n clusters, shaped like a
// fleet at rest with some work going on: per 100 clusters, 1 held by a
// running stop of a live peer, 10 STOPPED, 2 ALERT with a machine off, the
// rest RUNNING; 3 machines each; every cluster's create job finished a day
// ago (within the retention, so nothing is purged).
func (e *env) seedScale(b *testing.B, n int) {
	if e.seeded == 0 {
		now := e.ts(time.Now())
		_, err := e.rawW.Exec("INSERT INTO servers (id, incarnation, start_time, heartbeat_time) VALUES ('peer','inc'," + now + "," + e.ts(time.Now().Add(time.Hour)) + ")")
		must(b, err)
	}
	day := time.Now().Add(-24 * time.Hour)
	var cs, ms, js []string
	for i := e.seeded; i < n; i++ {
		k := seq.Add(1)
		id := clusterID(k)
		state, op, off := "RUNNING", "", -1
		switch i % 100 {
		case 1:
			state, op = "STOPPING", fmt.Sprintf("01000000-0000-7000-9000-%012d", k)
			js = append(js, fmt.Sprintf("('%s','stop','acme','%s','peer','inc','IN_PROGRESS','{}','','',%s,%s,%s,NULL)", op, id, e.ts(day.Add(48*time.Hour)), e.ts(day), e.ts(day)))
		case 2, 3:
			state, off = "ALERT", 2
		case 10, 20, 30, 40, 50, 60, 70, 80, 90, 95:
			state, off = "STOPPED", 0
		}
		cs = append(cs, fmt.Sprintf("('%s','acme','s%d',1,'','%s',3,'%s','1.30.2',1,2,'medium',%s,%s)", id, k, state, op, e.ts(day), e.ts(day)))
		for m := range 3 {
			role, power := "WORKER", "RUNNING"
			if m == 0 {
				role = "CONTROL"
			}
			if off == 0 || m == off {
				power = "STOPPED"
			}
			ms = append(ms, fmt.Sprintf("('%s','%s','%s','%s',1,'1.30.2','medium',%s,%s)", machineID(k, m), id, role, power, e.ts(day), e.ts(day)))
		}
		js = append(js, fmt.Sprintf("('%s','create','acme','%s','peer','inc','SUCCEEDED','{}','','',%s,%s,%s,%s)", jobID(k), id, e.ts(day.Add(time.Hour)), e.ts(day), e.ts(day), e.ts(day)))
	}
	if len(cs) > 0 {
		e.insertClusters(b, cs, ms, js)
	}
	if e.backend == "mysql" {
		_, err := e.rawW.Exec("ANALYZE TABLE clusters, machines, jobs, servers")
		must(b, err)
	}
	e.seeded = n
}

// take returns n RUNNING clusters no benchmark has used, from a pool seeded
// 20,000 at a time: seeding between two measurements would leave the
// database busy flushing it during the second.
func (e *env) take(b *testing.B, n int) []string {
	if len(e.pool) < n {
		e.pool = append(e.pool, e.seedRunning(b, max(n, 20000), 0)...)
	}
	ids := e.pool[:n]
	e.pool = e.pool[n:]
	return ids
}
