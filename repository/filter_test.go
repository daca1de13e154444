package repository_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// TestListFilters runs every kind of filter the service builds against both
// backends: comparisons of each field type, AND, OR, NOT, nesting, times
// ordered at microsecond precision, and values that look like SQL.
func TestListFilters(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			// A clock that moves one second per row written, from a known
			// instant, so create_time is predictable.
			var mu sync.Mutex
			now := time.Date(2026, 1, 1, 10, 0, 0, 500_000_000, time.UTC)
			clock := func() time.Time {
				mu.Lock()
				defer mu.Unlock()
				now = now.Add(time.Second)
				return now
			}
			dsn := b.NewDSN(t)
			ctx := ctxT(t)
			s, err := repository.Open(ctx, dsn, repository.WithClock(clock))
			if err != nil {
				t.Fatal(err)
			}
			repotest.SeedCatalog(t, s)
			t.Cleanup(func() { _ = s.Close() })

			// web-1 RUNNING (acme), web-2 CREATED (acme), db STOPPED (other),
			// "x' OR 1=1 --" CREATED (acme).
			web1 := running(t, s, "web-1")
			web2, web2Job := create(t, s, "web-2")
			db := running(t, s, "db")
			stopped, err := s.Transition(ctx, repository.Transition{ClusterID: db.ID, Expect: db.Expect(), Event: lifecycle.StopRequested, Operation: "op"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Transition(ctx, repository.Transition{ClusterID: db.ID, Expect: stopped.Expect(), Event: lifecycle.OperationSucceeded}); err != nil {
				t.Fatal(err)
			}
			odd, _ := create(t, s, "x' OR 1=1 --")
			other, _, err := s.CreateCluster(ctx, repository.NewCluster{Account: "other", DisplayName: "web-1", Spec: spec},
				repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}

			names := map[string]string{web1.ID: "web-1", web2.ID: "web-2", db.ID: "db", odd.ID: "odd", other.ID: "other/web-1"}
			eq := func(f repository.Field, v any) repository.Filter { return repository.Compare(f, repository.Eq, v) }
			cases := []struct {
				name  string
				where repository.Filter
				want  []string
			}{
				{"all", repository.Filter{}, []string{"web-1", "web-2", "db", "odd", "other/web-1"}},
				{"state =", eq(repository.ClusterState, lifecycle.Running), []string{"web-1"}},
				{"state !=", repository.Compare(repository.ClusterState, repository.Ne, lifecycle.Created), []string{"web-1", "db"}},
				{"OR", repository.Or(eq(repository.ClusterState, lifecycle.Running), eq(repository.ClusterState, lifecycle.Stopped)), []string{"web-1", "db"}},
				{"AND", repository.And(eq(repository.ClusterAccount, "acme"), eq(repository.ClusterDisplayName, "web-1")), []string{"web-1"}},
				{"NOT", repository.Not(eq(repository.ClusterAccount, "acme")), []string{"other/web-1"}},
				{"AND of OR", repository.And(
					repository.Or(eq(repository.ClusterDisplayName, "web-1"), eq(repository.ClusterDisplayName, "web-2")),
					repository.Not(eq(repository.ClusterAccount, "other"))), []string{"web-1", "web-2"}},
				{"empty OR", repository.Or(), nil},
				{"SQL in a value is a value", eq(repository.ClusterDisplayName, "x' OR 1=1 --"), []string{"odd"}},
				{"create_time >", repository.Compare(repository.ClusterCreateTime, repository.Gt, db.CreateTime), []string{"odd", "other/web-1"}},
				{"create_time >=", repository.Compare(repository.ClusterCreateTime, repository.Ge, db.CreateTime), []string{"db", "odd", "other/web-1"}},
				{"create_time <", repository.Compare(repository.ClusterCreateTime, repository.Lt, web2.CreateTime), []string{"web-1"}},
				{"create_time = to the microsecond", eq(repository.ClusterCreateTime, web2.CreateTime), []string{"web-2"}},
				{"create_time in another zone", eq(repository.ClusterCreateTime, web2.CreateTime.In(time.FixedZone("CET", 3600))), []string{"web-2"}},
				{"create_time a microsecond later", repository.Compare(repository.ClusterCreateTime, repository.Lt, web2.CreateTime.Add(time.Microsecond)), []string{"web-1", "web-2"}},
				{"update_time after db's stop", repository.Compare(repository.ClusterUpdateTime, repository.Gt, stopped.UpdateTime), []string{"db", "odd", "other/web-1"}},
			}
			for _, tc := range cases {
				got, err := s.ListClusters(ctx, repository.ClusterQuery{Where: tc.where, Limit: 100})
				if err != nil {
					t.Errorf("%s: %v", tc.name, err)
					continue
				}
				var gotNames []string
				for _, c := range got {
					gotNames = append(gotNames, names[c.ID])
				}
				if !slices.Equal(gotNames, tc.want) {
					t.Errorf("%s (%v) = %v; want %v", tc.name, tc.where, gotNames, tc.want)
				}
				// A watch applies the same filter in memory: it must keep
				// exactly the rows the database keeps.
				all, err := s.ListClusters(ctx, repository.ClusterQuery{Limit: 100})
				if err != nil {
					t.Fatal(err)
				}
				var matched []string
				for _, c := range all {
					if m, err := tc.where.MatchCluster(c); err != nil {
						t.Errorf("%s: MatchCluster: %v", tc.name, err)
					} else if m {
						matched = append(matched, names[c.ID])
					}
				}
				if !slices.Equal(matched, tc.want) {
					t.Errorf("%s (%v) in memory = %v; want %v", tc.name, tc.where, matched, tc.want)
				}
			}

			// The filter combines with keyset pagination.
			page, err := s.ListClusters(ctx, repository.ClusterQuery{
				Where: repository.Or(eq(repository.ClusterState, lifecycle.Created), eq(repository.ClusterState, lifecycle.Running)),
				After: web1.ID, Limit: 2})
			if err != nil || len(page) != 2 || page[0].ID != web2.ID || page[1].ID != odd.ID {
				t.Errorf("OR filter after web-1, 2 per page = %v, %v; want web-2, odd", page, err)
			}

			// A job of a server that predates resource_id: NULL, not ''.
			repotest.Exec(t, dsn, "INSERT INTO jobs (id, kind, resource_id, server_id, server_incarnation, status, params, result, error, deadline, create_time, update_time) "+
				"VALUES (?, 'stop', NULL, 'old', '', 'SUCCEEDED', '', '', '', ?, ?, ?)", "legacy-job", now, now, now)

			jobs := []struct {
				name  string
				where repository.Filter
				want  int
			}{
				{"running jobs of web-2", repository.And(eq(repository.JobCluster, web2.ID), eq(repository.JobDone, false)), 1},
				{"done jobs of web-2", repository.And(eq(repository.JobCluster, web2.ID), eq(repository.JobDone, true)), 0},
				{"done != false", repository.And(eq(repository.JobCluster, web1.ID), repository.Compare(repository.JobDone, repository.Ne, false)), 1},
				{"kind", eq(repository.JobKind, "create"), 5},
				// NULL resource ids must not vanish from != and NOT.
				{"not of a cluster", repository.Not(eq(repository.JobCluster, web2.ID)), 5},
				{"!= a cluster", repository.Compare(repository.JobCluster, repository.Ne, web2.ID), 5},
				{"of no cluster", eq(repository.JobCluster, ""), 1},
				{"created before web-2's job", repository.Compare(repository.JobCreateTime, repository.Lt, web2Job.CreateTime), 1},
			}
			for _, tc := range jobs {
				got, err := s.ListJobs(ctx, repository.JobQuery{Where: tc.where, Limit: 100})
				if err != nil || len(got) != tc.want {
					t.Errorf("jobs %s (%v) = %d, %v; want %d", tc.name, tc.where, len(got), err, tc.want)
				}
			}

			// Filters the service must never build are refused, not run.
			for _, bad := range []repository.Filter{
				eq(repository.JobKind, "create"),                                      // a job field on clusters
				eq(repository.ClusterState, "RUNNING"),                                // a string for a state
				repository.Compare(repository.ClusterDisplayName, repository.Lt, "m"), // ordering a string
				repository.Compare(repository.ClusterState, "LIKE", lifecycle.Running),
			} {
				if _, err := s.ListClusters(ctx, repository.ClusterQuery{Where: bad, Limit: 10}); err == nil {
					t.Errorf("ListClusters(%v) ran; want an error", bad)
				}
				if _, err := bad.MatchCluster(web1); err == nil {
					t.Errorf("MatchCluster(%v) ran; want an error", bad)
				}
			}
		})
	}
}
