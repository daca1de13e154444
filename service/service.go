// Package service holds clusterd's RPC handlers: they validate a request,
// ask the state machine, claim the cluster through the repository and hand
// the work to the job runner. Errors are returned as domain errors and turned
// into gRPC statuses in one place (Status).
package service

import (
	"context"
	"strconv"
	"strings"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// ClusterStore is the part of the repository the cluster handlers read.
type ClusterStore interface {
	GetCluster(ctx context.Context, id string) (repository.Cluster, error)
	ListClusters(ctx context.Context, q repository.ClusterQuery) ([]repository.Cluster, error)
	ListEvents(ctx context.Context, clusterID string, after int64, limit int) ([]repository.Event, error)
}

// Clusters implements clusterlifecycle.v1.ClusterLifecycle.
type Clusters struct {
	clv1.UnimplementedClusterLifecycleServer
	store ClusterStore
}

// NewClusters returns the ClusterLifecycle handlers over store.
func NewClusters(store ClusterStore) *Clusters {
	return &Clusters{store: store}
}

// GetCluster returns one cluster.
func (s *Clusters) GetCluster(ctx context.Context, req *clv1.GetClusterRequest) (*clv1.Cluster, error) {
	id, err := parseName("name", req.GetName(), clusterPrefix)
	if err != nil {
		return nil, err
	}
	c, err := s.store.GetCluster(ctx, id)
	if err != nil {
		return nil, notFound(err, req.GetName())
	}
	return toCluster(c), nil
}

// clusterFilterFields are the fields ListClusters can filter on.
var clusterFilterFields = []string{"state", "display_name", "account"}

// ListClusters returns a page of clusters in creation order.
func (s *Clusters) ListClusters(ctx context.Context, req *clv1.ListClustersRequest) (*clv1.ListClustersResponse, error) {
	size, err := pageSize("page_size", req.GetPageSize())
	if err != nil {
		return nil, err
	}
	terms, err := parseFilter("filter", req.GetFilter(), clusterFilterFields...)
	if err != nil {
		return nil, err
	}
	q := repository.ClusterQuery{Limit: size + 1}
	for _, t := range terms {
		switch t.Field {
		case "state":
			st, err := lifecycle.ParseState(strings.ToUpper(t.Value))
			if err != nil {
				return nil, invalid("filter", "unknown state %q", t.Value)
			}
			q.States = append(q.States, st)
		case "display_name":
			q.DisplayName = t.Value
		case "account":
			q.Account = t.Value
		}
	}
	if len(q.States) > 1 {
		return nil, invalid("filter", "state can be given once")
	}
	if q.After, err = decodePageToken("page_token", req.GetPageToken(), "clusters?"+req.GetFilter()); err != nil {
		return nil, err
	}
	cs, err := s.store.ListClusters(ctx, q)
	if err != nil {
		return nil, err
	}
	more := len(cs) > size
	if more {
		cs = cs[:size]
	}
	resp := &clv1.ListClustersResponse{Clusters: make([]*clv1.Cluster, len(cs))}
	for i, c := range cs {
		resp.Clusters[i] = toCluster(c)
	}
	if more {
		resp.NextPageToken = encodePageToken(cs[len(cs)-1].ID, "clusters?"+req.GetFilter(), true)
	}
	return resp, nil
}

// ListClusterEvents returns a page of a cluster's history, oldest first.
func (s *Clusters) ListClusterEvents(ctx context.Context, req *clv1.ListClusterEventsRequest) (*clv1.ListClusterEventsResponse, error) {
	id, err := parseName("parent", req.GetParent(), clusterPrefix)
	if err != nil {
		return nil, err
	}
	size, err := pageSize("page_size", req.GetPageSize())
	if err != nil {
		return nil, err
	}
	query := "events?" + id
	afterTok, err := decodePageToken("page_token", req.GetPageToken(), query)
	if err != nil {
		return nil, err
	}
	var after int64
	if afterTok != "" {
		if after, err = parseInt(afterTok); err != nil {
			return nil, invalid("page_token", "is not a token this service issued")
		}
	}
	if _, err := s.store.GetCluster(ctx, id); err != nil {
		return nil, notFound(err, req.GetParent())
	}
	evs, err := s.store.ListEvents(ctx, id, after, size+1)
	if err != nil {
		return nil, err
	}
	more := len(evs) > size
	if more {
		evs = evs[:size]
	}
	resp := &clv1.ListClusterEventsResponse{Events: make([]*clv1.ClusterEvent, len(evs))}
	for i, e := range evs {
		resp.Events[i] = toEvent(e)
	}
	if more {
		resp.NextPageToken = encodePageToken(formatInt(evs[len(evs)-1].ID), query, true)
	}
	return resp, nil
}

func parseInt(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }

func formatInt(n int64) string { return strconv.FormatInt(n, 10) }
