package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/clusterd/clusterd/client"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// Reconnecting a watch waits watchBackoffMin after a failure, doubling up
// to watchBackoffMax, and gives up after watchAttempts failures in a row
// (a message received starts the count again): a server restarting or a
// load balancer moving the stream is bridged, a server gone for good is
// reported.
const (
	watchBackoffMin = 200 * time.Millisecond
	watchBackoffMax = 5 * time.Second
	watchAttempts   = 10
)

// waitOperation follows op to its end through WatchOperation, calling
// progress as client.Wait does: once at the start, on every change of step
// or progress, and once done. A server without WatchOperation (Unimplemented,
// an older clusterd), a stream that ends before the operation does, or one
// that breaks (UNAVAILABLE) fall back to client.Wait's polling from where the
// stream left off. Its results are client.Wait's: the done operation, with an
// *client.OperationError when it did not succeed.
func waitOperation(ctx context.Context, c *client.Client, op *longrunningpb.Operation, progress client.ProgressFunc) (*longrunningpb.Operation, error) {
	var last *clv1.OperationMetadata
	report := func(op *longrunningpb.Operation) {
		md, err := client.MetadataOf(op)
		if err != nil || progress == nil || (last != nil && sameProgress(last, md) && !op.GetDone()) {
			return
		}
		last = md
		progress(md)
	}
	poll := func(op *longrunningpb.Operation) (*longrunningpb.Operation, error) {
		// client.Wait reports op again at its start: already shown, so
		// drop that one call unless it moved.
		return c.Wait(ctx, op, func(md *clv1.OperationMetadata) {
			if last != nil && sameProgress(last, md) {
				return
			}
			last = md
			if progress != nil {
				progress(md)
			}
		}, client.PollEvery(pollEvery))
	}
	if op.GetDone() {
		return c.Wait(ctx, op, progress)
	}
	report(op)
	stream, err := c.Clusters.WatchOperation(ctx, &clv1.WatchOperationRequest{Name: op.GetName()})
	if err != nil {
		if fallBack(ctx, err) {
			return poll(op)
		}
		return op, fmt.Errorf("wait for %s: %w", op.GetName(), err)
	}
	for {
		next, err := stream.Recv()
		if err != nil {
			if fallBack(ctx, err) || errors.Is(err, io.EOF) {
				return poll(op)
			}
			return op, fmt.Errorf("wait for %s: %w", op.GetName(), err)
		}
		op = next
		report(op)
		if op.GetDone() {
			break
		}
	}
	if st := op.GetError(); st != nil {
		return op, &client.OperationError{Name: op.GetName(), Status: status.FromProto(st)}
	}
	return op, nil
}

// fallBack reports whether a WatchOperation error leaves polling to do: the
// server does not have the RPC, or the stream broke while ctx goes on.
func fallBack(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	switch client.Code(err) {
	case codes.Unimplemented, codes.Unavailable:
		return true
	}
	return false
}

// sameProgress reports whether two metadata show the same step and progress
// (client.Wait's rule for what is worth reporting).
func sameProgress(a, b *clv1.OperationMetadata) bool {
	return a.GetStep() == b.GetStep() && a.GetStepsDone() == b.GetStepsDone() &&
		a.GetStepsTotal() == b.GetStepsTotal() && a.GetRequestedCancellation() == b.GetRequestedCancellation()
}

// watchStream is what a watch reads: a WatchClusters stream (a fake one in
// tests of the resume rules).
type watchStream interface {
	Recv() (*clv1.WatchClustersResponse, error)
}

// openWatch opens a WatchClusters stream going on after token ("" for a
// fresh watch that starts with the current state).
type openWatch func(ctx context.Context, token string) (watchStream, error)

// watchOpener opens WatchClusters on c with filter and name.
func watchOpener(c *client.Client, filter, name string) openWatch {
	return func(ctx context.Context, token string) (watchStream, error) {
		return c.Clusters.WatchClusters(ctx, &clv1.WatchClustersRequest{Filter: filter, Name: name, ResumeToken: token})
	}
}

// watchLoop hands every message of a watch to handle until ctx ends (which
// is a watch's normal end: nil) or handle fails. A stream that breaks
// UNAVAILABLE, or RESOURCE_EXHAUSTED with a resume_token (a watcher that
// fell behind), is opened again after the last message handled (or the
// error's token), after a backoff, so nothing is missed or repeated. A token
// the server no longer keeps (WATCH_EXPIRED) starts a fresh watch: restarted
// is called first (its EXISTING messages follow again). Anything else is
// returned.
func (a *app) watchLoop(ctx context.Context, open openWatch, handle func(*clv1.WatchClustersResponse) error, restarted func() error) error {
	token := ""
	failures := 0
	delay := watchBackoffMin
	for {
		err := func() error {
			sctx, cancel := context.WithCancel(ctx)
			defer cancel()
			s, err := open(sctx, token)
			if err != nil {
				return err
			}
			for {
				m, err := s.Recv()
				if err != nil {
					return err
				}
				failures, delay = 0, watchBackoffMin
				if t := m.GetResumeToken(); t != "" {
					token = t
				}
				if err := handle(m); err != nil {
					return handleError{err}
				}
			}
		}()
		if ctx.Err() != nil {
			return nil
		}
		var he handleError
		if errors.As(err, &he) {
			return he.err
		}
		switch code := client.Code(err); {
		case code == codes.FailedPrecondition && client.Reason(err) == "WATCH_EXPIRED":
			token = ""
			if err := restarted(); err != nil {
				return err
			}
			continue
		case errors.Is(err, io.EOF), code == codes.Unavailable,
			code == codes.ResourceExhausted && client.ErrorInfo(err).GetMetadata()["resume_token"] != "":
			if t := client.ErrorInfo(err).GetMetadata()["resume_token"]; t != "" {
				token = t
			}
		default:
			return err
		}
		if failures++; failures > watchAttempts {
			return fmt.Errorf("watch: gave up after %d attempts: %w", watchAttempts, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, watchBackoffMax)
	}
}

// handleError marks an error of the handler, which ends a watch as it is.
type handleError struct{ err error }

// Error is the handler's error.
func (h handleError) Error() string { return h.err.Error() }

// checkWatchOutput refuses the formats a watch cannot print as a stream.
func (a *app) checkWatchOutput() error {
	switch a.output {
	case "table", "wide", "json":
		return nil
	}
	return usageError{fmt.Errorf("-w: -o %s cannot follow changes; use the table, -o wide or -o json (one JSON object a line)", a.output)}
}

// printNDJSON writes one message as one line of protojson.
func (a *app) printNDJSON(m *clv1.WatchClustersResponse) error {
	b, err := protojson.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %T as JSON: %w", m, err)
	}
	_, err = fmt.Fprintf(a.stdout, "%s\n", b)
	return err
}

// changeLine is one change of a watch in a table: its time (the history
// entry's, or now), its kind, the cluster's display name when the watch is
// of many, its state, the operation's step n/m, and the entry's event and
// message.
func (a *app) changeLine(m *clv1.WatchClustersResponse, withName bool) string {
	t := stamp(m.GetEvent().GetTime())
	if m.GetEvent().GetTime() == nil {
		t = a.now().Local().Format("2006-01-02 15:04:05.000 MST")
	}
	fields := []string{t, m.GetKind().String()}
	if withName {
		fields = append(fields, dash(m.GetCluster().GetDisplayName()))
	}
	fields = append(fields, m.GetCluster().GetState().String())
	// The progress is the operation's as the server read it when it sent
	// the change: an entry's operation may have ended since, which only
	// OPERATION_ENDED says.
	if p := m.GetProgress(); p != nil && (!p.GetDone() || m.GetKind() != clv1.WatchClustersResponse_CHANGED) {
		step := p.GetStep()
		if step == "" {
			step = "starting"
		}
		if m.GetKind() == clv1.WatchClustersResponse_OPERATION_ENDED {
			step = "ended"
		}
		fields = append(fields, fmt.Sprintf("%s %s %d/%d", p.GetVerb(), step, p.GetStepsDone(), p.GetStepsTotal()))
	}
	if e := m.GetEvent(); e != nil {
		fields = append(fields, e.GetEvent())
		if msg := oneLine(e.GetMessage()); msg != "" {
			fields = append(fields, msg)
		}
	}
	return strings.Join(fields, "  ")
}

// watchClusters prints what a watch sees: the current state (one cluster
// with single, else the table of them), then one line per change until ctx
// ends (Ctrl-C); -o json prints every message as one JSON line.
func (a *app) watchClusters(ctx context.Context, open openWatch, single bool) error {
	if err := a.checkWatchOutput(); err != nil {
		return err
	}
	synced := false
	var existing []*clv1.Cluster
	handle := func(m *clv1.WatchClustersResponse) error {
		kind := m.GetKind()
		if kind == clv1.WatchClustersResponse_BOOKMARK {
			return nil
		}
		if a.output == "json" {
			return a.printNDJSON(m)
		}
		switch {
		case kind == clv1.WatchClustersResponse_EXISTING && !synced:
			existing = append(existing, m.GetCluster())
			return nil
		case kind == clv1.WatchClustersResponse_SYNCED && !synced:
			synced = true
			if single {
				if len(existing) == 0 {
					return nil
				}
				return a.printCluster(existing[0])
			}
			return a.printClusters(&clv1.ListClustersResponse{Clusters: existing})
		case kind == clv1.WatchClustersResponse_SYNCED:
			return nil
		}
		_, err := fmt.Fprintln(a.stdout, a.changeLine(m, !single))
		return err
	}
	restarted := func() error {
		fmt.Fprintln(a.stderr, "clusterctl: the watch expired (its resume token is older than the server keeps); restarted it with a fresh watch")
		return nil
	}
	return a.watchLoop(ctx, open, handle, restarted)
}

// followEvents prints a cluster's history so far, then each new history
// entry as a watch of the cluster sees it, until ctx ends (Ctrl-C). The
// watch opens first and the history is read once it has synced, so an
// entry written between the two is printed once.
func (a *app) followEvents(ctx context.Context, c *client.Client, name string, open openWatch) error {
	if err := a.checkWatchOutput(); err != nil {
		return err
	}
	seen := map[string]bool{}
	synced := false
	handle := func(m *clv1.WatchClustersResponse) error {
		switch m.GetKind() {
		case clv1.WatchClustersResponse_SYNCED:
			if synced {
				return nil
			}
			synced = true
			events, err := listAll(ctx, a, 0, func(ctx context.Context, token string) ([]*clv1.ClusterEvent, string, error) {
				resp, err := c.Clusters.ListClusterEvents(ctx, &clv1.ListClusterEventsRequest{Parent: name, PageSize: 1000, PageToken: token})
				return resp.GetEvents(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			for _, e := range events {
				seen[e.GetName()] = true
			}
			if a.output == "json" {
				for _, e := range events {
					if err := a.printEventLine(e); err != nil {
						return err
					}
				}
				return nil
			}
			return a.printEvents(&clv1.ListClusterEventsResponse{Events: events})
		}
		e := m.GetEvent()
		if !synced || e == nil || seen[e.GetName()] {
			return nil
		}
		seen[e.GetName()] = true
		if a.output == "json" {
			return a.printEventLine(e)
		}
		from := e.GetFromState().String()
		if e.GetFromState() == clv1.Cluster_STATE_UNSPECIFIED {
			from = "-"
		}
		_, err := fmt.Fprintf(a.stdout, "%s  %s  %s  %s  %s  %s  %s\n", stamp(e.GetTime()), e.GetEvent(), from, e.GetToState(),
			dash(e.GetOperation()), dash(e.GetServer()), oneLine(e.GetMessage()))
		return err
	}
	restarted := func() error {
		// A fresh watch reads no history: the entries written while the
		// old token was kept are read again, and those seen are skipped.
		synced = false
		fmt.Fprintln(a.stderr, "clusterctl: the watch expired (its resume token is older than the server keeps); restarted it with a fresh watch")
		return nil
	}
	return a.watchLoop(ctx, open, func(m *clv1.WatchClustersResponse) error {
		if m.GetKind() == clv1.WatchClustersResponse_SYNCED && synced {
			return nil
		}
		if m.GetKind() == clv1.WatchClustersResponse_SYNCED && len(seen) > 0 {
			// After a restart: print only the entries not seen.
			synced = true
			events, err := listAll(ctx, a, 0, func(ctx context.Context, token string) ([]*clv1.ClusterEvent, string, error) {
				resp, err := c.Clusters.ListClusterEvents(ctx, &clv1.ListClusterEventsRequest{Parent: name, PageSize: 1000, PageToken: token})
				return resp.GetEvents(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			for _, e := range events {
				if err := handle(&clv1.WatchClustersResponse{Kind: clv1.WatchClustersResponse_CHANGED, Event: e}); err != nil {
					return err
				}
			}
			return nil
		}
		return handle(m)
	}, restarted)
}

// printEventLine writes one history entry as one line of protojson.
func (a *app) printEventLine(e *clv1.ClusterEvent) error {
	b, err := protojson.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode %T as JSON: %w", e, err)
	}
	_, err = fmt.Fprintf(a.stdout, "%s\n", b)
	return err
}
