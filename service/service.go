// Package service holds clusterd's RPC handlers: they validate a request,
// ask the state machine, claim the cluster through the repository and hand
// the work to the job runner. Errors are returned as domain errors and turned
// into gRPC statuses in one place (Status).
package service

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/runner"
	"github.com/clusterd/clusterd/secrets"
)

// Store is the part of the repository the cluster handlers use.
type Store interface {
	CatalogReader
	GetCluster(ctx context.Context, id string) (repository.Cluster, error)
	ListClusters(ctx context.Context, q repository.ClusterQuery) ([]repository.Cluster, error)
	ListEvents(ctx context.Context, clusterID string, after int64, limit int) ([]repository.Event, error)
	CreateCluster(ctx context.Context, nc repository.NewCluster, nj repository.NewJob) (repository.Cluster, repository.Job, error)
	Claim(ctx context.Context, t repository.Transition, nj repository.NewJob) (repository.Cluster, repository.Job, error)
	Transition(ctx context.Context, t repository.Transition) (repository.Cluster, error)
	FinishJob(ctx context.Context, f repository.Finish) (repository.Job, error)
	GetJobByRequestID(ctx context.Context, account, requestID string) (repository.Job, error)
	RecordEvent(ctx context.Context, e repository.Event) error
	// AdoptJob and HandOffJob move a running job between servers (SPEC §5
	// step 4; see Clusters.Adopt).
	AdoptJob(ctx context.Context, a repository.Adoption) (repository.Job, error)
	HandOffJob(ctx context.Context, h repository.HandOff) (repository.Job, error)
	// ClusterSecrets reads a cluster's sealed credentials, recording the
	// read in its history (GetKubeconfig).
	ClusterSecrets(ctx context.Context, clusterID string, audit *repository.Event) ([]repository.Secret, error)
}

// JobStarter runs claimed jobs asynchronously (the runner). Reserve lists a
// job as this server's before its claim commits, so the scanner never sees
// it IN_PROGRESS yet unknown to the runner, and refuses one it lists
// already, so this server never adopts a job it runs.
type JobStarter interface {
	Reserve(jobID string) (release func(), err error)
	Start(t runner.Task) error
}

// ClustersConfig is what the ClusterLifecycle handlers need.
type ClustersConfig struct {
	Store  Store
	Runner JobStarter
	Infra  infra.Infrastructure
	// Catalog bounds what clusters may be made of (default DefaultCatalog()).
	Catalog *Catalog
	// DefaultQuota limits the accounts an admin set no quota for (the
	// zero Limits: unlimited).
	DefaultQuota repository.Limits
	// ServerID and Incarnation are recorded on every job this server runs.
	ServerID    string
	Incarnation string
	Deadlines   Deadlines
	// Clock stamps job deadlines (default time.Now).
	Clock  func() time.Time
	Logger *slog.Logger
	// Lease, optional, says whether this server may take work: a server
	// whose heartbeat lapsed must not claim clusters (its peers may be
	// recovering them), nor repair on behalf of a job that failed.
	Lease Lease
	// HandOff: a job claimed just as this server began stopping, which the
	// runner no longer starts, is handed off for a live server to adopt
	// rather than failed (--on-owner-loss=resume).
	HandOff bool
	// Secrets seals the credentials every create makes and opens them for
	// GetKubeconfig (the --secrets-key-file). Nil: a key that lives in
	// memory only (secrets.Ephemeral), for tests, whose credentials no
	// other process can open.
	Secrets *secrets.Keyring
	// Hub, when set, serves WatchClusters and WatchOperation (without
	// one they are UNIMPLEMENTED).
	Hub *Hub
}

// Lease says whether this server may act (package lease).
type Lease interface {
	Check() error
}

// Clusters implements clusterlifecycle.v1.ClusterLifecycle.
type Clusters struct {
	clv1.UnimplementedClusterLifecycleServer
	store       Store
	runner      JobStarter
	infra       infra.Infrastructure
	catalog     Catalog
	serverID    string
	incarnation string
	deadlines   Deadlines
	now         func() time.Time
	log         *slog.Logger
	lease       Lease
	handOff     bool
	secrets     *secrets.Keyring
	hub         *Hub
	// defaultQuota is the limits of accounts without their own.
	defaultQuota repository.Limits
	// draining is set by Drain: the server is stopping and claims nothing.
	draining atomic.Bool
	// repairs counts the leftovers recovery has converged (SPEC §5.3).
	repairs atomic.Int64
}

// Drain makes the handlers, and the scanner's recovery, claim nothing more
// (UNAVAILABLE / SHUTTING_DOWN, so a client retries on another server): the
// first step of a graceful stop. Operations already claimed run on until the
// runner stops them.
func (s *Clusters) Drain() { s.draining.Store(true) }

// Repairs is how many leftovers of interrupted operations recovery has
// repaired since the process started.
func (s *Clusters) Repairs() int64 { return s.repairs.Load() }

// NewClusters returns the ClusterLifecycle handlers.
func NewClusters(cfg ClustersConfig) *Clusters {
	s := &Clusters{
		store: cfg.Store, runner: cfg.Runner, infra: cfg.Infra, serverID: cfg.ServerID,
		incarnation: cfg.Incarnation, deadlines: cfg.Deadlines, now: cfg.Clock, log: cfg.Logger, lease: cfg.Lease,
		handOff: cfg.HandOff, secrets: cfg.Secrets, defaultQuota: cfg.DefaultQuota, hub: cfg.Hub,
	}
	if s.secrets == nil {
		s.secrets = secrets.Ephemeral()
	}
	if cfg.Catalog != nil {
		s.catalog = *cfg.Catalog
	} else {
		s.catalog = DefaultCatalog()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s
}

// withNodes presents clusters with their nodes, in one infrastructure query.
func (s *Clusters) withNodes(ctx context.Context, cs ...repository.Cluster) ([]*clv1.Cluster, error) {
	ids := make([]string, len(cs))
	out := make([]*clv1.Cluster, len(cs))
	byID := map[string]*clv1.Cluster{}
	for i, c := range cs {
		ids[i] = c.ID
		out[i] = toCluster(c)
		byID[c.ID] = out[i]
	}
	if len(cs) == 0 {
		return out, nil
	}
	machines, err := s.infra.Machines(ctx, ids...)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	for _, m := range machines {
		if c := byID[m.ClusterID]; c != nil {
			c.Nodes = append(c.Nodes, toNode(c.DisplayName, m))
		}
	}
	return out, nil
}

// GetCluster returns one cluster.
func (s *Clusters) GetCluster(ctx context.Context, req *clv1.GetClusterRequest) (*clv1.Cluster, error) {
	in, joined := s.infra.(clusterWithMachines)
	if !joined {
		c, err := s.visibleCluster(ctx, "name", req.GetName())
		if err != nil {
			return nil, err
		}
		out, err := s.withNodes(ctx, c)
		if err != nil {
			return nil, err
		}
		return out[0], nil
	}
	var ms []infra.Machine
	c, err := s.visibleClusterBy(ctx, "name", req.GetName(), func(ctx context.Context, id string) (c repository.Cluster, err error) {
		c, ms, err = in.ClusterWithMachines(ctx, id)
		return c, err
	})
	if err != nil {
		return nil, err
	}
	out := toCluster(c)
	out.Nodes = make([]*clv1.Node, len(ms))
	for i, m := range ms {
		out.Nodes[i] = toNode(c.DisplayName, m)
	}
	return out, nil
}

// clusterWithMachines is an infrastructure that keeps its machines in
// clusterd's database (the simulator): it reads a cluster and its machines
// in one statement, where the store and Machines would make two reads. It
// reads the clusters of the database the handlers' Store reads, and answers
// a missing cluster with repository.ErrNotFound, as the Store does.
type clusterWithMachines interface {
	ClusterWithMachines(ctx context.Context, id string) (repository.Cluster, []infra.Machine, error)
}

// visibleCluster reads the cluster a request names in field, answering
// NOT_FOUND for a cluster of an account the caller may not see.
func (s *Clusters) visibleCluster(ctx context.Context, field, name string) (repository.Cluster, error) {
	return s.visibleClusterBy(ctx, field, name, s.store.GetCluster)
}

// visibleClusterBy is visibleCluster reading the cluster with read, which
// answers a missing cluster with repository.ErrNotFound (GetCluster reads
// it with its machines).
func (s *Clusters) visibleClusterBy(ctx context.Context, field, name string,
	read func(ctx context.Context, id string) (repository.Cluster, error)) (repository.Cluster, error) {
	who, err := caller(ctx)
	if err != nil {
		return repository.Cluster{}, err
	}
	id, err := parseName(field, name, clusterPrefix)
	if err != nil {
		return repository.Cluster{}, err
	}
	c, err := read(ctx, id)
	if err != nil {
		return repository.Cluster{}, notFound(err, name)
	}
	if err := visible(who, c.Account, name); err != nil {
		return repository.Cluster{}, err
	}
	return c, nil
}

// ListClusters returns a page of the clusters the caller may see, in
// creation order. DESTROYED clusters are listed only when the filter names
// the state.
func (s *Clusters) ListClusters(ctx context.Context, req *clv1.ListClustersRequest) (*clv1.ListClustersResponse, error) {
	who, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	size, err := pageSize("page_size", req.GetPageSize())
	if err != nil {
		return nil, err
	}
	filter, err := parseFilter("filter", req.GetFilter(), clusterFilter)
	if err != nil {
		return nil, err
	}
	q := repository.ClusterQuery{Where: filter.Where, Account: who.Scope(), Limit: size + 1}
	if !filter.Uses["state"] {
		q.Where = repository.And(q.Where, repository.Compare(repository.ClusterState, repository.Ne, lifecycle.Destroyed))
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
	resp := &clv1.ListClustersResponse{}
	if resp.Clusters, err = s.withNodes(ctx, cs...); err != nil {
		return nil, err
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
	c, err := s.visibleCluster(ctx, "parent", req.GetParent())
	if err != nil {
		return nil, err
	}
	evs, err := s.store.ListEvents(ctx, c.ID, after, size+1)
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
