package e2e

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository/repotest"
)

// TestCrossPrimaryRaces runs two clusterd servers on two nodes of a Galera
// cluster and sends each round's operation to both at once: exactly one is
// accepted, the other refused as a lost race (ABORTED), or, when it came
// only after the winner's operation had ended, by the state machine
// (FAILED_PRECONDITION); never INTERNAL or any other code. A server whose
// database stalled past its lease refuses with UNAVAILABLE (it claims
// nothing); a round nobody won that way is raced again, at most 20 times.
// CLUSTERD_GALERA_RACE_ROUNDS sets the rounds (make test runs
// 100, make chaos-galera 1000).
func TestCrossPrimaryRaces(t *testing.T) {
	t.Parallel()
	b, ok := repotest.Galera(t)
	if !ok {
		return
	}
	rounds := repotest.GaleraRounds(t, 100)
	dsns := b.NodeDSNs(t)
	servers := []*server{
		startServer(t, dsns[0], "e2e-galera-1", "--reconcile-interval", "1h"),
		startServer(t, dsns[1], "e2e-galera-2", "--reconcile-interval", "1h"),
	}
	cluster := servers[0].create(t, "cross-primary").GetName()
	refusals := map[string]int{}
	began := time.Now()
	retries := 0
	for round := 0; round < rounds; round++ {
		// Both servers' nodes have the cluster as it is at rest before the
		// race (the node of the server that ran the last operation may be
		// ahead of the other).
		waitUntil(t, fmt.Sprintf("round %d: both nodes agree on the cluster at rest", round), func() bool {
			a, b := servers[0].cluster(t, cluster), servers[1].cluster(t, cluster)
			return a.GetEtag() == b.GetEtag() && a.GetCurrentOperation() == ""
		})
		stop := round%2 == 0
		var wg sync.WaitGroup
		ops := make([]*longrunningpb.Operation, len(servers))
		errs := make([]error, len(servers))
		for i, s := range servers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := rpcCtx()
				defer cancel()
				if stop {
					ops[i], errs[i] = s.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: cluster})
				} else {
					ops[i], errs[i] = s.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: cluster})
				}
			}()
		}
		wg.Wait()
		var winner *longrunningpb.Operation
		var at *server
		for i, err := range errs {
			if err == nil {
				if winner != nil {
					t.Fatalf("round %d: both servers accepted (%s and %s)", round, winner.GetName(), ops[i].GetName())
				}
				winner, at = ops[i], servers[i]
				continue
			}
			st := status.Convert(err)
			if st.Code() == codes.Unavailable {
				// A server whose database stalled past its lease takes no
				// new work (SERVER_UNAVAILABLE, "please retry"): it claimed
				// nothing, and the round is raced again when nobody won.
				refusals["UNAVAILABLE"]++
				continue
			}
			reason := ""
			for _, d := range st.Details() {
				if info, ok := d.(*errdetails.ErrorInfo); ok {
					reason = info.GetReason()
				}
			}
			if st.Code() != codes.Aborted && (st.Code() != codes.FailedPrecondition || reason != "INVALID_STATE_TRANSITION") {
				t.Fatalf("round %d: server %d refused with %v %s (%s); want ABORTED (a lost race) or FAILED_PRECONDITION (too late)", round, i+1, st.Code(), reason, st.Message())
			}
			refusals[reason]++
		}
		if winner == nil {
			if retries < 20 && slices.ContainsFunc(errs, func(err error) bool { return status.Code(err) == codes.Unavailable }) {
				retries++
				round--
				continue
			}
			t.Fatalf("round %d: both servers refused: %v", round, errs)
		}
		if done := at.waitOp(t, winner.GetName()); done.GetError() != nil {
			t.Fatalf("round %d: the accepted operation failed: %v", round, done.GetError())
		}
	}
	t.Logf("%d rounds, two servers on two Galera nodes: exactly one accepted each round, refusals %v (%d rounds raced again after UNAVAILABLE), 0 other codes; %s",
		rounds, refusals, retries, time.Since(began).Round(time.Millisecond))
}

// galeraPatience is how long a Galera test waits for the nodes to agree.
const galeraPatience = 2 * time.Minute

// waitUntil polls cond (replication, which nothing announces) for up to
// galeraPatience: replication takes well under a second, but on a loaded
// machine a Galera cluster has stalled every node for more than 30s (both
// servers' heartbeats timing out) and then gone on.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(galeraPatience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, galeraPatience)
		}
		time.Sleep(pollEvery)
	}
}
