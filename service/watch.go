package service

import (
	"context"
	"errors"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/clusterd/clusterd/auth"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// errNoHub: the server was built without a watch hub.
var errNoHub = &NotImplementedError{Method: "watch"}

// clusterWatch is what one WatchClusters call keeps: who watches what.
type clusterWatch struct {
	scope     string // the caller's account, "" for an admin that sees all
	clusterID string // one cluster, or ""
	where     repository.Filter
}

// keeps reports whether a change to cluster c (as the change left it) is
// for this watch.
func (w clusterWatch) keeps(c repository.Cluster) bool {
	if w.scope != "" && c.Account != w.scope {
		return false
	}
	if w.clusterID != "" && c.ID != w.clusterID {
		return false
	}
	ok, err := w.where.MatchCluster(c)
	return err == nil && ok
}

// left reports whether the transition e moved cluster c (as e left it)
// out of this watch: the watch kept it in e's from-state.
func (w clusterWatch) left(c repository.Cluster, e *repository.Event) bool {
	if e == nil || e.From == e.To {
		return false
	}
	c.State = e.From
	return w.keeps(c)
}

// watchCaller is who opens a watch: refused when this server has no hub
// (errNoHub) or the call no identity.
func (s *Clusters) watchCaller(ctx context.Context) (auth.Identity, error) {
	if s.hub == nil {
		return auth.Identity{}, errNoHub
	}
	return caller(ctx)
}

// WatchClusters streams the changes of the clusters the caller may see
// (see the proto and the package's resume tokens, watchtoken.go).
func (s *Clusters) WatchClusters(req *clv1.WatchClustersRequest, stream grpc.ServerStreamingServer[clv1.WatchClustersResponse]) error {
	ctx := stream.Context()
	who, err := s.watchCaller(ctx)
	if err != nil {
		return err
	}
	if len(req.GetResumeToken()) > maxResumeTokenLen {
		return invalid("resume_token", "is %d bytes; at most %d", len(req.GetResumeToken()), maxResumeTokenLen)
	}
	filter, err := parseFilter("filter", req.GetFilter(), clusterFilter)
	if err != nil {
		return err
	}
	w := clusterWatch{scope: who.Scope(), where: filter.Where}
	if req.GetName() != "" {
		c, err := s.visibleCluster(ctx, "name", req.GetName())
		if err != nil {
			return err
		}
		w.clusterID = c.ID
	}
	var tok watchToken
	if req.GetResumeToken() != "" {
		if tok, err = decodeWatchToken(req.GetResumeToken()); err != nil {
			return invalid("resume_token", "%v", err)
		}
	}
	release, err := s.hub.openWatch(who.Account)
	if err != nil {
		return err
	}
	defer release()
	if err := s.hub.waitReady(ctx); err != nil {
		return err
	}
	if req.GetResumeToken() != "" {
		purged, err := s.hub.cfg.Store.ChangesPurgedThrough(ctx)
		if err != nil {
			return err
		}
		if tok.Floor < purged {
			return errWatchExpired
		}
	} else if tok, err = s.sendExisting(ctx, stream, w, filter); err != nil {
		return err
	}
	sentFloor := tok.Floor // the floor of the last token sent
	visit := func(it watchItem, tok watchToken) (watchToken, error) {
		if it.change == nil {
			tok = tok.raise(it.floor)
			if !it.bookmark || tok.Floor <= sentFloor {
				return tok, nil
			}
			sentFloor = tok.Floor
			return tok, stream.Send(&clv1.WatchClustersResponse{Kind: clv1.WatchClustersResponse_BOOKMARK, ResumeToken: tok.encode()})
		}
		c := it.change
		keeps, left := false, false
		if tok.fresh(c.ID) && it.cluster != nil {
			keeps = w.keeps(*it.cluster)
			left = !keeps && w.left(*it.cluster, c.Event)
		}
		tok = tok.pass(*c, keeps || left)
		if !keeps && !left {
			return tok, nil
		}
		sentFloor = tok.Floor
		msg := changeMessage(it, tok)
		if left {
			msg.Kind = clv1.WatchClustersResponse_LEFT_FILTER
		}
		return tok, stream.Send(msg)
	}
	watcher, tok, err := s.hub.attach(ctx, who.Account, tok, visit)
	if err != nil {
		return err
	}
	defer s.hub.detach(watcher)
	return drain(ctx, watcher, tok, visit, watchToken.encode)
}

// drain feeds the watcher's items to visit until the stream's context
// ends, the hub ends the watcher or visit fails. A watcher the hub cut off
// for falling behind ends with a WatchTooSlowError that carries the token
// resume makes of where it was ("" when it cannot be resumed).
func drain(ctx context.Context, w *watcher, tok watchToken, visit func(watchItem, watchToken) (watchToken, error), resume func(watchToken) string) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.done:
			var slow *WatchTooSlowError
			if errors.As(w.err, &slow) {
				return &WatchTooSlowError{Token: resume(tok)}
			}
			return w.err
		case it := <-w.items:
			var err error
			if tok, err = visit(it, tok); err != nil {
				return err
			}
		}
	}
}

// sendExisting sends the current state of every cluster the watch keeps
// (as ListClusters lists them) and SYNCED, and returns the token a watch
// of the changes since starts from: the feed's head, read before the
// clusters, so no change is lost between the two (one made in between may
// come as a change too).
func (s *Clusters) sendExisting(ctx context.Context, stream grpc.ServerStreamingServer[clv1.WatchClustersResponse], w clusterWatch, filter parsedFilter) (watchToken, error) {
	head, err := s.hub.cfg.Store.ChangeHead(ctx, s.hub.cfg.Settle)
	if err != nil {
		return watchToken{}, err
	}
	tok := watchToken{Floor: head.Floor, Seen: head.Above}
	for len(tok.Seen) > maxTokenIDs {
		tok = tok.raise(tok.Seen[len(tok.Seen)-maxTokenIDs-1])
	}
	q := repository.ClusterQuery{Where: filter.Where, Account: w.scope, Limit: 200}
	if !filter.Uses["state"] {
		q.Where = repository.And(q.Where, repository.Compare(repository.ClusterState, repository.Ne, lifecycle.Destroyed))
	}
	for {
		var page []repository.Cluster
		if w.clusterID != "" {
			c, err := s.store.GetCluster(ctx, w.clusterID)
			if err != nil {
				return tok, err
			}
			if ok, _ := q.Where.MatchCluster(c); ok {
				page = append(page, c)
			}
		} else if page, err = s.store.ListClusters(ctx, q); err != nil {
			return tok, err
		}
		views, err := s.withNodes(ctx, page...)
		if err != nil {
			return tok, err
		}
		for _, v := range views {
			if err := stream.Send(&clv1.WatchClustersResponse{Kind: clv1.WatchClustersResponse_EXISTING, Cluster: v, ResumeToken: tok.encode()}); err != nil {
				return tok, err
			}
		}
		if w.clusterID != "" || len(page) < q.Limit {
			break
		}
		q.After = page[len(page)-1].ID
	}
	return tok, stream.Send(&clv1.WatchClustersResponse{Kind: clv1.WatchClustersResponse_SYNCED, ResumeToken: tok.encode()})
}

// changeMessage presents one change of the feed, with the token after it.
func changeMessage(it watchItem, tok watchToken) *clv1.WatchClustersResponse {
	c := it.change
	out := &clv1.WatchClustersResponse{ResumeToken: tok.encode()}
	if it.view != nil && it.cluster != nil {
		out.Cluster = proto.Clone(it.view).(*clv1.Cluster)
		as := *it.cluster
		out.Cluster.State, out.Cluster.Etag, out.Cluster.CurrentOperation = clusterState(as.State), etag(as), operationName(as.CurrentOperation)
	}
	switch c.Kind {
	case repository.ChangeHistory:
		out.Kind = clv1.WatchClustersResponse_CHANGED
		if c.Event != nil {
			out.Event = toEvent(*c.Event)
			switch {
			case c.Event.Name == repository.ClusterCreated:
				out.Kind = clv1.WatchClustersResponse_CREATED
			case c.Event.To == lifecycle.Destroyed && c.Event.From != lifecycle.Destroyed:
				out.Kind = clv1.WatchClustersResponse_DELETED
			}
		}
		if j := it.job; j != nil && c.CurrentOperation == j.ID {
			out.Progress = &clv1.OperationProgress{Operation: operationName(j.ID), Verb: j.Kind, Step: j.Step,
				StepsDone: j.StepsDone, StepsTotal: j.StepsTotal, Done: j.Status.Done()}
		}
	case repository.ChangeProgress, repository.ChangeJobEnded:
		out.Kind = clv1.WatchClustersResponse_PROGRESS
		if c.Kind == repository.ChangeJobEnded {
			out.Kind = clv1.WatchClustersResponse_OPERATION_ENDED
		}
		out.Progress = &clv1.OperationProgress{Operation: operationName(c.Operation), Step: c.Step,
			StepsDone: c.StepsDone, StepsTotal: c.StepsTotal, Done: c.Status.Done()}
		if it.job != nil {
			out.Progress.Verb = it.job.Kind
		}
	}
	return out
}

// WatchOperation streams an operation until it is done (see the proto).
func (s *Clusters) WatchOperation(req *clv1.WatchOperationRequest, stream grpc.ServerStreamingServer[longrunningpb.Operation]) error {
	ctx := stream.Context()
	who, err := s.watchCaller(ctx)
	if err != nil {
		return err
	}
	id, err := parseName("name", req.GetName(), operationPrefix)
	if err != nil {
		return err
	}
	release, err := s.hub.openWatch(who.Account)
	if err != nil {
		return err
	}
	defer release()
	if err := s.hub.waitReady(ctx); err != nil {
		return err
	}
	// The head first, then the job: a change made in between comes again
	// as a change, none is lost.
	head, err := s.hub.cfg.Store.ChangeHead(ctx, s.hub.cfg.Settle)
	if err != nil {
		return err
	}
	j, err := s.hub.cfg.Store.GetJob(ctx, id)
	if err != nil {
		return notFound(err, req.GetName())
	}
	if err := visible(who, j.Account, req.GetName()); err != nil {
		return err
	}
	var (
		last      *longrunningpb.Operation
		lastSteps int32
	)
	send := func(j repository.Job) (bool, error) {
		lastSteps = max(lastSteps, j.StepsDone)
		op, err := toOperation(j)
		if err != nil {
			return false, err
		}
		if last != nil && proto.Equal(op, last) {
			return op.GetDone(), nil
		}
		last = op
		return op.GetDone(), stream.Send(op)
	}
	if done, err := send(j); done || err != nil {
		return err
	}
	tok := watchToken{Floor: head.Floor, Seen: head.Above}
	for len(tok.Seen) > maxTokenIDs {
		tok = tok.raise(tok.Seen[len(tok.Seen)-maxTokenIDs-1])
	}
	errDone := errors.New("operation done")
	visit := func(it watchItem, tok watchToken) (watchToken, error) {
		if it.change == nil {
			return tok.raise(it.floor), nil
		}
		c := it.change
		mine := tok.fresh(c.ID) && c.Operation == id && it.job != nil
		tok = tok.pass(*c, mine)
		if !mine {
			return tok, nil
		}
		j := *it.job
		if c.Kind == repository.ChangeProgress {
			if c.StepsDone < lastSteps {
				// A step made before the operation was first read and
				// sent: the operation never goes back.
				return tok, nil
			}
			// The job as this step left it, though it may be further on.
			j.Status, j.Step, j.StepsDone, j.StepsTotal, j.EndTime = repository.JobInProgress, c.Step, c.StepsDone, c.StepsTotal, nil
		}
		done, err := send(j)
		if err == nil && done {
			err = errDone
		}
		return tok, err
	}
	watcher, _, err := s.hub.attach(ctx, who.Account, tok, visit)
	if errors.Is(err, errDone) {
		return nil
	}
	if err != nil {
		return err
	}
	defer s.hub.detach(watcher)
	// Cut off for falling behind, there is nothing to resume from: the
	// caller watches again.
	err = drain(ctx, watcher, tok, visit, func(watchToken) string { return "" })
	if errors.Is(err, errDone) {
		return nil
	}
	return err
}
