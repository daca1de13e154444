// Package bench_test measures clusterd's service paths beside the raw SQL
// they rest on, in the same process and run, on SQLite and on MariaDB, and
// prints the ratios (make bench; BENCHMARKS.md). Everything here is test
// code: the raw-SQL baselines (baseline_test.go) and the seeding write SQL
// that the repository, the only place clusterd's own SQL lives, does not.
package bench_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	"github.com/clusterd/clusterd/auth"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/runner"
	"github.com/clusterd/clusterd/scanner"
	"github.com/clusterd/clusterd/service"
)

// env is one backend's database with clusterd's pieces on it and raw
// connections beside them.
type env struct {
	backend string
	dsn     string
	store   *repository.Store
	// clusters runs jobs for real (contention); parked only claims: its
	// jobs are accepted and never run, so admission is measured alone.
	clusters, parked *service.Clusters
	scan             *scanner.Scanner
	// rawW writes (SQLite: one connection, like the repository's writer);
	// rawR reads (SQLite: a pool of readers, like the repository's).
	rawW, rawR *sql.DB
	self       repository.Server
	seeded     int // clusters seeded for the scanner benchmarks
	pool       []string
	// ended has a closed channel for every job the runner ended, and an open
	// one for every job someone waits for (see wait).
	endMu sync.Mutex
	ended map[string]chan struct{}
}

// end marks job id ended, waking whoever waits for it.
func (e *env) end(id string) {
	e.endMu.Lock()
	defer e.endMu.Unlock()
	if ch, ok := e.ended[id]; ok {
		close(ch)
		delete(e.ended, id)
		return
	}
	ch := make(chan struct{})
	close(ch)
	e.ended[id] = ch
}

// wait blocks until the runner has ended job id.
func (e *env) wait(id string) {
	e.endMu.Lock()
	ch, ok := e.ended[id]
	if !ok {
		ch = make(chan struct{})
		e.ended[id] = ch
	} else {
		delete(e.ended, id)
	}
	e.endMu.Unlock()
	<-ch
}

var (
	envsMu sync.Mutex
	envs   = map[string]*env{}
)

// backends is SQLite and, when reachable, MariaDB.
func backends(b *testing.B) []repotest.Backend { return repotest.Backends(b) }

// getEnv returns the process's env of backend be for purpose ("ops": the
// RPC benchmarks, "scan": the scanner's fleet, "frontdoor": the front
// door's, so what it measures does not depend on which benchmarks ran
// before it in the process), made on first use. Its
// databases outlive the benchmark that made it (they are dropped when the
// process ends).
func getEnv(b *testing.B, be repotest.Backend, purpose string) *env {
	envsMu.Lock()
	defer envsMu.Unlock()
	if e := envs[be.Name+"/"+purpose]; e != nil {
		return e
	}
	t := &holder{}
	e := &env{backend: be.Name, dsn: be.NewDSN(t)}
	cleanups = append(cleanups, t.cleanups...)
	ctx := context.Background()
	var err error
	if e.store, err = repository.Open(ctx, e.dsn, repository.WithServerID("bench")); err != nil {
		b.Fatal(err)
	}
	if e.self, err = e.store.RegisterServer(ctx, "bench"); err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	e.ended = map[string]chan struct{}{}
	r := runner.New(runner.Config{Store: e.store, Logger: log, OnDone: func(j repository.Job) { e.end(j.ID) }})
	infra, err := sim.Open(ctx, e.store, sim.Config{})
	if err != nil {
		b.Fatal(err)
	}
	cfg := service.ClustersConfig{Store: e.store, Runner: r, Infra: infra, ServerID: "bench", Incarnation: e.self.Incarnation, Logger: log}
	e.clusters = service.NewClusters(cfg)
	cfg.Runner = parkedRunner{}
	e.parked = service.NewClusters(cfg)
	e.scan = scanner.New(scanner.Config{
		Store: e.store, Recoverer: e.clusters, Infra: infra, Self: e.self, Running: r.Running,
		// Every pass is a full one (reconciliation and purge included); the
		// seeded peer stays alive however long the benchmark runs.
		PeerTimeout: 24 * time.Hour, ReconcileInterval: time.Nanosecond, Logger: log,
	})
	e.rawW, e.rawR = openRaw(b, e.dsn)
	envs[be.Name+"/"+purpose] = e
	return e
}

// holder collects the cleanups of databases that live as long as the process.
type holder struct {
	testing.TB
	cleanups []func()
}

func (h *holder) Helper()                   {}
func (h *holder) Cleanup(f func())          { h.cleanups = append(h.cleanups, f) }
func (h *holder) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (h *holder) Errorf(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
func (h *holder) Log(a ...any)              { fmt.Fprintln(os.Stderr, a...) }
func (h *holder) Fatal(a ...any)            { panic(fmt.Sprint(a...)) }
func (h *holder) Name() string              { return "bench" }
func (h *holder) TempDir() string {
	d, err := os.MkdirTemp("", "clusterd-bench-")
	if err != nil {
		panic(err)
	}
	h.cleanups = append(h.cleanups, func() { _ = os.RemoveAll(d) })
	return d
}

var cleanups []func()

// parkedRunner accepts every job and runs none: the claim is measured
// without its work competing for the database.
type parkedRunner struct{}

func (parkedRunner) Reserve(string) (func(), error) { return func() {}, nil }
func (parkedRunner) Start(runner.Task) error        { return nil }

// openRaw opens the baselines' connections the way the repository opens its
// own: on SQLite one writer (WAL, synchronous=NORMAL, immediate
// transactions) and four readers; on MariaDB one pool with arguments
// interpolated.
func openRaw(b *testing.B, dsn string) (w, r *sql.DB) {
	if path, ok := strings.CutPrefix(dsn, "sqlite:"); ok {
		var err error
		if w, err = sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate&_time_format=sqlite"); err != nil {
			b.Fatal(err)
		}
		w.SetMaxOpenConns(1)
		if r, err = sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)&_pragma=query_only(1)&_time_format=sqlite"); err != nil {
			b.Fatal(err)
		}
		r.SetMaxOpenConns(4)
		r.SetMaxIdleConns(4)
		return w, r
	}
	w, err := sql.Open("mysql", repotest.DriverDSN(b, dsn)+"&interpolateParams=true&parseTime=true")
	if err != nil {
		b.Fatal(err)
	}
	w.SetMaxOpenConns(32)
	w.SetMaxIdleConns(16)
	return w, w
}

// caller is the identity every benchmark request carries.
func caller() context.Context {
	return auth.NewContext(context.Background(), auth.Identity{Account: "acme", Role: auth.RoleAdmin, All: true, Subject: "bench"})
}

// must fails the benchmark on an error.
func must(b *testing.B, err error) {
	if err != nil {
		b.Helper()
		b.Fatal(err)
	}
}

// jobOf is the job id of an operation's name.
func jobOf(op *longrunningpb.Operation) string {
	return strings.TrimPrefix(op.GetName(), "operations/")
}
