package e2e

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// privateGalera is a 3-node Galera cluster of one test's own (scripts/
// galera.sh with its own folder and ports), which it may kill nodes of
// without disturbing the shared one other tests use.
type privateGalera struct {
	env []string
}

func startPrivateGalera(t *testing.T) *privateGalera {
	t.Helper()
	if _, ok := repotest.Galera(t); !ok {
		t.Skip("no Galera (see the banner): the private cluster needs galera-4 as the shared one does")
	}
	dir := fmt.Sprintf("/tmp/clusterd-galera-%s-%d", strings.ToLower(t.Name()), os.Getpid())
	var err error
	// Another test run on this machine may take the same ports between
	// the probe and the start: then try other ones.
	for attempt := 1; attempt <= 3; attempt++ {
		g := &privateGalera{env: append(os.Environ(), "GALERA_DIR="+dir, fmt.Sprintf("GALERA_PORT=%d", galeraBase(t)))}
		if err = g.run("start"); err == nil {
			t.Cleanup(func() { _ = g.run("destroy") })
			return g
		}
		_ = g.run("destroy")
	}
	t.Fatalf("start a private Galera cluster: %v", err)
	return nil
}

// galeraBases are the GALERA_PORT values this package's private clusters
// take: 1306, 1406, ... 3206. Their ports (scripts/galera.sh: SQL P+1..3,
// group communication and IST P+10262..P+10267, SST P+10268..P+10270) meet
// neither each other's (a joining node listens on its SST port even when
// it rejoins by IST, so those ports must be free too), nor make test's own
// cluster's (scripts/test.sh: 10306-15206), nor make chaos-galera's (4306),
// and stay below the ephemeral range.
var galeraBases = struct {
	sync.Mutex
	taken map[int]bool
}{taken: map[int]bool{}}

// galeraBase picks a GALERA_PORT from galeraBases that no other test of this
// process took and whose every port nothing on the machine listens on,
// starting at random, so that two test runs on one machine rarely try the
// same.
func galeraBase(t *testing.T) int {
	t.Helper()
	galeraBases.Lock()
	defer galeraBases.Unlock()
	const first, step, n = 1306, 100, 20
	start := rand.IntN(n)
	for i := range n {
		base := first + step*((start+i)%n)
		if galeraBases.taken[base] || !galeraPortsFree(base) {
			continue
		}
		galeraBases.taken[base] = true
		return base
	}
	t.Fatal("no free ports for a private Galera cluster")
	return 0
}

// galeraPortsFree says whether nothing listens on any port of a Galera
// cluster at base.
func galeraPortsFree(base int) bool {
	for _, off := range []int{1, 2, 3, 10262, 10263, 10264, 10265, 10266, 10267, 10268, 10269, 10270} {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+off))
		if err != nil {
			return false
		}
		_ = l.Close()
	}
	return true
}

func (g *privateGalera) run(args ...string) error {
	cmd := exec.Command("bash", append([]string{"../scripts/galera.sh"}, args...)...)
	cmd.Env = g.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		// The last lines come first too, on the error's own line: a CI
		// summary that keeps only a failure's first line still says why.
		return fmt.Errorf("galera.sh %s: %w (last lines: %s)\n%s", strings.Join(args, " "), err, lastLines(string(out), 4), out)
	}
	return nil
}

// lastLines is the last n non-empty lines of out, joined by " | ".
func lastLines(out string, n int) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// killNodes kills nodes ns, one after the other.
func (g *privateGalera) killNodes(t *testing.T, ns ...string) {
	t.Helper()
	for _, n := range ns {
		if err := g.run("kill", n); err != nil {
			t.Fatal(err)
		}
	}
}

// startNodes starts nodes ns again, together (a node that was out of the
// primary component regains one once a majority of the last is back), and
// waits for them.
func (g *privateGalera) startNodes(t *testing.T, ns ...string) {
	t.Helper()
	errs := make(chan error, len(ns))
	for _, n := range ns {
		go func() { errs <- g.run("start-node", n) }()
	}
	for range ns {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func (g *privateGalera) dsn(t *testing.T, n int) string {
	t.Helper()
	cmd := exec.Command("bash", "../scripts/galera.sh", "dsn", fmt.Sprint(n))
	cmd.Env = g.env
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// TestGaleraNodeOutOfPrimary: when the Galera node under a clusterd server
// loses the primary component (its two peers die), the server reports
// NOT_SERVING and answers UNAVAILABLE (never INTERNAL); when the peers come
// back, it serves again without a restart.
func TestGaleraNodeOutOfPrimary(t *testing.T) {
	t.Parallel()
	g := startPrivateGalera(t)
	s := startServer(t, g.dsn(t, 3), "e2e-galera-minority", "--peer-timeout", "3s", "--heartbeat-interval", "500ms")
	cluster := s.create(t, "minority").GetName()
	g.killNodes(t, "1", "2")
	lost := time.Now()
	health := healthpb.NewHealthClient(s.conn)
	servingIs := func(want healthpb.HealthCheckResponse_ServingStatus) func() bool {
		return func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
			return err == nil && resp.GetStatus() == want
		}
	}
	waitUntil(t, "NOT_SERVING once its node left the primary component", servingIs(healthpb.HealthCheckResponse_NOT_SERVING))
	t.Logf("NOT_SERVING %s after the node lost its peers", time.Since(lost).Round(time.Millisecond))
	// Reads go on until the node itself notices it is alone (its group
	// timeouts); from then on they are refused. Nothing is ever INTERNAL.
	waitUntil(t, "GetCluster UNAVAILABLE once the node is out of the primary component", func() bool {
		ctx, cancel := rpcCtx()
		defer cancel()
		_, err := s.clusters.GetCluster(ctx, &clv1.GetClusterRequest{Name: cluster})
		if code := status.Code(err); code != codes.OK && code != codes.Unavailable {
			t.Fatalf("GetCluster while the node loses its peers: %v; want OK or UNAVAILABLE", err)
		}
		return status.Code(err) == codes.Unavailable
	})
	ctx, cancel := rpcCtx()
	_, err := s.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: cluster})
	cancel()
	if code := status.Code(err); code != codes.Unavailable {
		t.Errorf("StopCluster on a node out of the primary component: %v; want UNAVAILABLE", err)
	}
	g.startNodes(t, "1", "2")
	back := time.Now()
	waitUntil(t, "SERVING once the primary component is back", servingIs(healthpb.HealthCheckResponse_SERVING))
	t.Logf("SERVING %s after the peers were back", time.Since(back).Round(time.Millisecond))
	var op string
	waitUntil(t, "a stop accepted again", func() bool {
		ctx, cancel := rpcCtx()
		defer cancel()
		resp, err := s.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: cluster})
		if err == nil {
			op = resp.GetName()
		}
		return err == nil
	})
	if done := s.waitOp(t, op); done.GetError() != nil {
		t.Errorf("the stop after the outage failed: %v", done.GetError())
	}
}

// TestATransactionCutOffFromThePrimaryNeverCommits: a Galera node outside
// the primary component refuses a transaction's next statement and its
// ROLLBACK (1047), and keeps the transaction open; the Store's connection
// that carried it is then retired, so that once the node is back no later
// BEGIN on that connection commits what the transaction wrote before it was
// cut off. (A claim's compare-and-set and history entry, without its job,
// were committed that way.)
func TestATransactionCutOffFromThePrimaryNeverCommits(t *testing.T) {
	t.Parallel()
	g := startPrivateGalera(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := repository.Open(ctx, g.dsn(t, 3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	db, ok := s.Conn().(*sql.DB)
	if !ok {
		t.Fatalf("the Store's pool is a %T", s.Conn())
	}
	// One connection, so that the next transaction would get the one the
	// cut-off transaction used, were it kept.
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, "CREATE TABLE cutoff (id INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO cutoff VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	g.killNodes(t, "1", "2")
	// A reader of node 3 of its own tells when the node has left the
	// primary component.
	probe := openSQL(t, g.dsn(t, 3))
	waitUntil(t, "node 3 refuses reads out of the primary component", func() bool {
		var n int
		return isOutOfPrimary(probe.QueryRowContext(ctx, "SELECT COUNT(*) FROM cutoff").Scan(&n))
	})
	if _, err := tx.ExecContext(ctx, "INSERT INTO cutoff VALUES (2)"); !isOutOfPrimary(err) {
		t.Fatalf("a statement out of the primary component: %v; want error 1047", err)
	}
	rbErr := tx.Rollback()
	t.Logf("ROLLBACK out of the primary component: %v", rbErr)

	g.startNodes(t, "1", "2")
	// The Store's next transactions, on its only connection.
	waitUntil(t, "a transaction commits once the primary component is back", func() bool {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return false
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO cutoff VALUES (3)"); err != nil {
			_ = tx.Rollback()
			return false
		}
		return tx.Commit() == nil
	})
	for i := range 5 {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO cutoff VALUES (?)", 10+i); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	for n := 1; n <= 3; n++ {
		var ids []int
		rows, err := openSQL(t, g.dsn(t, n)).QueryContext(ctx, "SELECT id FROM cutoff ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id int
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := rows.Close(); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(ids, 1) || slices.Contains(ids, 2) || !slices.Contains(ids, 3) {
			t.Errorf("node %d holds rows %v; want 3 and 10-14, never 1 or 2 (the transaction cut off from the primary component)", n, ids)
		}
	}
}

// isOutOfPrimary reports whether err is a node's refusal of a statement
// while it is outside the primary component (1047, WSREP has not yet
// prepared node for application use).
func isOutOfPrimary(err error) bool {
	var my *mysql.MySQLError
	return errors.As(err, &my) && my.Number == 1047
}
