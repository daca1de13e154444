package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/clusterd/clusterd/auth"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// TestIdentity_ReloadEndsTheCallsOfRevokedTokens: when a reload removes a
// token from the file, the calls it has open (a WaitOperation over gRPC and
// one over REST, both on an operation held so that it cannot end) end with
// UNAUTHENTICATED, reason CREDENTIALS_REVOKED, and so do those of a token
// the file now gives another role (the admin made a user); another
// identity's open wait goes on and returns the finished operation.
func TestIdentity_ReloadEndsTheCallsOfRevokedTokens(t *testing.T) {
	b := repotest.Backends(t)[0]
	reload := make(chan os.Signal)
	var path string
	h := start(t, b, withTokens(t), func(c *Config) { path = c.AuthTokens; c.Reload = reload })
	fault, err := h.srv.sim.InjectFault(sim.Fault{Step: "join_node", Mode: sim.ModeHold, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	create := func(token, name string) *longrunningpb.Operation {
		op, err := h.clients.clusters.CreateCluster(bearerContext(tctx(t), token), &clv1.CreateClusterRequest{Cluster: fxCluster(name, 1)})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		fxWaitHeld(t, h, fxMetadata(t, op).GetCluster(), "join_node")
		return op
	}
	opA, opB := create(tokenA, "kept"), create(tokenB, "revoked")

	// The waits ask for far longer than the test may take: only the
	// revocation (or, for a, the operation's end) can end them.
	type result struct {
		op  *longrunningpb.Operation
		err error
	}
	grpcWait := func(token string, op *longrunningpb.Operation) <-chan result {
		out := make(chan result, 1)
		go func() {
			got, err := h.clients.ops.WaitOperation(bearerContext(tctx(t), token),
				&longrunningpb.WaitOperationRequest{Name: op.GetName(), Timeout: durationpb.New(4 * time.Minute)})
			out <- result{got, err}
		}()
		return out
	}
	type restResult struct {
		code int
		body map[string]any
		err  error
	}
	restWait := func(token string, op *longrunningpb.Operation) <-chan restResult {
		out := make(chan restResult, 1)
		go func() {
			req, err := http.NewRequestWithContext(tctx(t), http.MethodPost, h.base+"/v1/"+op.GetName()+":wait", strings.NewReader(`{"timeout":"240s"}`))
			if err != nil {
				out <- restResult{err: err}
				return
			}
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				out <- restResult{err: err}
				return
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			r := restResult{code: resp.StatusCode}
			r.err = json.Unmarshal(raw, &r.body)
			out <- r
		}()
		return out
	}
	waitA, waitB, restB, waitAdmin := grpcWait(tokenA, opA), grpcWait(tokenB, opB), restWait(tokenB, opB), grpcWait(tokenAdmin, opB)
	waitFor(t, func() bool { return h.srv.ops.Waiting() == 4 })

	if err := os.WriteFile(path, []byte(tokenLine(tokenA, "team-a", "user")+tokenLine(tokenAdmin, "ops", "user")), 0o600); err != nil {
		t.Fatal(err)
	}
	reload <- syscall.SIGHUP

	timeout := time.After(time.Minute)
	select {
	case r := <-waitB:
		if code, reason := codeOf(t, r.err); code != codes.Unauthenticated || reason != service.ReasonCredentialsRevoked {
			t.Errorf("b's open gRPC wait after b's token was removed: %v %s (%v); want UNAUTHENTICATED %s", code, reason, r.op, service.ReasonCredentialsRevoked)
		}
	case <-timeout:
		t.Fatal("b's open gRPC wait did not end within a minute of the reload that removed b's token")
	}
	select {
	case r := <-restB:
		info := vDetail(r.body, "google.rpc.ErrorInfo")
		if r.err != nil || r.code != http.StatusUnauthorized || info == nil || info["reason"] != service.ReasonCredentialsRevoked {
			t.Errorf("b's open REST wait after b's token was removed: %d %v (%v); want 401 with ErrorInfo %s", r.code, r.body, r.err, service.ReasonCredentialsRevoked)
		}
	case <-timeout:
		t.Fatal("b's open REST wait did not end within a minute of the reload that removed b's token")
	}
	select {
	case r := <-waitAdmin:
		if code, reason := codeOf(t, r.err); code != codes.Unauthenticated || reason != service.ReasonCredentialsRevoked {
			t.Errorf("the admin's open wait after its token became a user's: %v %s (%v); want UNAUTHENTICATED %s", code, reason, r.op, service.ReasonCredentialsRevoked)
		}
	case <-timeout:
		t.Fatal("the admin's open wait did not end within a minute of the reload that made its token a user's")
	}
	// The other calls have returned, so the one wait left is a's.
	if n := h.srv.ops.Waiting(); n != 1 {
		t.Errorf("%d WaitOperation calls open after the reload; want a's alone", n)
	}

	if _, err := h.srv.sim.ReleaseHeld(fault.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-waitA:
		if r.err != nil || !r.op.GetDone() || r.op.GetError() != nil {
			t.Errorf("a's open wait, whose token stayed: %v, %v; want the finished operation", r.op, r.err)
		}
	case <-timeout:
		t.Fatal("a's wait did not return within a minute of its operation's release")
	}
}

// TestOpenCallsRevokeWhatNoLongerAuthenticates: a reload that swaps the
// table between a call's authentication and its registration (so that its
// scan of the registry misses the call) still ends it: open checks again.
func TestOpenCallsRevokeWhatNoLongerAuthenticates(t *testing.T) {
	calls := newOpenCalls()
	gone := func(auth.Credentials, auth.Identity) bool { return false }
	kept := func(auth.Credentials, auth.Identity) bool { return true }
	late, doneLate := calls.open(context.Background(), auth.Credentials{}, auth.Identity{Account: "team-b"}, gone)
	defer doneLate()
	if revoked(late) == nil {
		t.Error("a call registered after its token was removed is not ended")
	}
	live, doneLive := calls.open(context.Background(), auth.Credentials{}, auth.Identity{Account: "team-a"}, kept)
	if n := calls.revoke(kept); n != 0 || live.Err() != nil {
		t.Errorf("revoke with every identity kept ended %d calls (live: %v)", n, live.Err())
	}
	if n := calls.revoke(gone); n != 1 || revoked(live) == nil {
		t.Errorf("revoke with every identity gone ended %d calls (live: %v); want 1, revoked", n, context.Cause(live))
	}
	doneLive()
	if n := calls.revoke(gone); n != 0 {
		t.Errorf("revoke after every call returned ended %d; want 0", n)
	}
}

// TestIdentity_ReloadEndsTheWatchesOfRevokedTokens: a reload that removes
// a token ends that token's open WatchClusters stream with UNAUTHENTICATED,
// reason CREDENTIALS_REVOKED; another identity's watch goes on and sees
// the next change of its cluster.
func TestIdentity_ReloadEndsTheWatchesOfRevokedTokens(t *testing.T) {
	b := repotest.Backends(t)[0]
	reload := make(chan os.Signal)
	var path string
	h := start(t, b, withTokens(t), func(c *Config) { path = c.AuthTokens; c.Reload = reload })
	kept := h.create(t, "kept", 1) // the admin's, in account ops
	watch := func(token string) <-chan error {
		stream, err := h.clients.clusters.WatchClusters(bearerContext(tctx(t), token), &clv1.WatchClustersRequest{})
		if err != nil {
			t.Fatalf("WatchClusters: %v", err)
		}
		for {
			m, err := stream.Recv()
			if err != nil {
				t.Fatalf("the watch ended before it was in sync: %v", err)
			}
			if m.GetKind() == clv1.WatchClustersResponse_SYNCED {
				break
			}
		}
		out := make(chan error, 1)
		go func() {
			for {
				m, err := stream.Recv()
				if err != nil {
					out <- err
					return
				}
				if m.GetCluster().GetName() == kept.GetName() && m.GetCluster().GetState() == clv1.Cluster_STOPPED {
					out <- nil
					return
				}
			}
		}()
		return out
	}
	watchB, watchAdmin := watch(tokenB), watch(tokenAdmin)

	if err := os.WriteFile(path, []byte(tokenLine(tokenA, "team-a", "user")+tokenLine(tokenAdmin, "ops", "admin")), 0o600); err != nil {
		t.Fatal(err)
	}
	reload <- syscall.SIGHUP
	select {
	case err := <-watchB:
		if code, reason := codeOf(t, err); code != codes.Unauthenticated || reason != service.ReasonCredentialsRevoked {
			t.Errorf("b's watch after b's token was removed: %v %s (%v); want UNAUTHENTICATED %s", code, reason, err, service.ReasonCredentialsRevoked)
		}
	case <-time.After(time.Minute):
		t.Fatal("b's watch did not end within a minute of the reload that removed b's token")
	}
	op, err := h.clients.clusters.StopCluster(tctx(t), &clv1.StopClusterRequest{Name: kept.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	h.wait(t, op)
	select {
	case err := <-watchAdmin:
		if err != nil {
			t.Errorf("the admin's watch, whose token stayed, ended: %v; want it to see the stop", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the admin's watch did not see the stop within a minute")
	}
}
