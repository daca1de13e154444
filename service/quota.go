package service

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/clusterd/clusterd/auth"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository"
)

// quotaCheck is what a claim that may grow an account's clusters passes
// to the repository, which enforces the quota in the claim's transaction
// with node sizes from the catalog's offerings.
func (s *Clusters) quotaCheck() *repository.QuotaCheck {
	return &repository.QuotaCheck{Default: s.defaultQuota}
}

// ParseQuota reads "clusters=10,nodes=100,cpus=400,memory_mb=819200" (the
// --default-quota flag); a limit not named is unlimited, and so is "".
func ParseQuota(s string) (repository.Limits, error) {
	var l repository.Limits
	if strings.TrimSpace(s) == "" {
		return l, nil
	}
	for _, item := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil || n < 0 {
			return l, fmt.Errorf("quota %q: want limit=N, N a non-negative integer", item)
		}
		var dst **int64
		switch k {
		case repository.LimitClusters:
			dst = &l.Clusters
		case repository.LimitNodes:
			dst = &l.Nodes
		case repository.LimitCPUs:
			dst = &l.CPUs
		case repository.LimitMemoryMB:
			dst = &l.MemoryMB
		default:
			return l, fmt.Errorf("quota %q: unknown limit %q (known: clusters, nodes, cpus, memory_mb)", item, k)
		}
		if *dst != nil {
			return l, fmt.Errorf("quota %q: %s named twice", s, k)
		}
		*dst = &n
	}
	return l, nil
}

// QuotaStore is the part of the repository the Quotas handlers use.
type QuotaStore interface {
	GetQuota(ctx context.Context, account string, check repository.QuotaCheck) (repository.Quota, error)
	ListQuotas(ctx context.Context, check repository.QuotaCheck) ([]repository.Quota, error)
	SetQuota(ctx context.Context, account string, l repository.Limits) error
}

// Quotas implements clusterlifecycle.v1.Quotas. It shares the cluster
// handlers' default and offering sizes, so what it reports is what claims
// enforce.
type Quotas struct {
	clv1.UnimplementedQuotasServer
	store    QuotaStore
	clusters *Clusters
}

// NewQuotas returns the Quotas handlers.
func NewQuotas(store QuotaStore, clusters *Clusters) *Quotas {
	return &Quotas{store: store, clusters: clusters}
}

// Check is the default limits and node sizes quotas are computed with
// (metrics and the web view read usage with it).
func (q *Quotas) Check() repository.QuotaCheck { return *q.clusters.quotaCheck() }

const (
	accountPrefix = "accounts/"
	quotaSuffix   = "/quota"
	maxAccountLen = 63
)

// parseQuotaName reads accounts/{account}/quota.
func parseQuotaName(field, name string) (string, error) {
	account, ok := strings.CutPrefix(name, accountPrefix)
	if ok {
		account, ok = strings.CutSuffix(account, quotaSuffix)
	}
	if !ok || account == "" || len(account) > maxAccountLen || strings.Contains(account, "/") {
		return "", invalid(field, "want accounts/{account}/quota, got %q", Clip(name))
	}
	return account, nil
}

// GetQuota returns an account's limits and usage (accounts/-/quota: the
// caller's own); another account's quota is NOT_FOUND to a user, as another
// account's cluster is.
func (q *Quotas) GetQuota(ctx context.Context, req *clv1.GetQuotaRequest) (*clv1.Quota, error) {
	who, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	account, err := parseQuotaName("name", req.GetName())
	if err != nil {
		return nil, err
	}
	if account == "-" {
		// AIP-159's wildcard: the caller's own account.
		account = who.Account
	}
	if err := visible(who, account, req.GetName()); err != nil {
		return nil, err
	}
	got, err := q.store.GetQuota(ctx, account, q.Check())
	if err != nil {
		return nil, err
	}
	return toQuota(got), nil
}

// ListQuotas lists every account with clusters or limits of its own
// (admins only).
func (q *Quotas) ListQuotas(ctx context.Context, req *clv1.ListQuotasRequest) (*clv1.ListQuotasResponse, error) {
	if err := adminOnly(ctx, "ListQuotas"); err != nil {
		return nil, err
	}
	size, err := pageSize("page_size", req.GetPageSize())
	if err != nil {
		return nil, err
	}
	after, err := decodePageToken("page_token", req.GetPageToken(), "quotas")
	if err != nil {
		return nil, err
	}
	all, err := q.store.ListQuotas(ctx, q.Check())
	if err != nil {
		return nil, err
	}
	resp := &clv1.ListQuotasResponse{}
	last := ""
	for _, got := range all {
		if got.Account <= after {
			continue
		}
		if len(resp.Quotas) == size {
			resp.NextPageToken = encodePageToken(last, "quotas", true)
			break
		}
		resp.Quotas = append(resp.Quotas, toQuota(got))
		last = got.Account
	}
	return resp, nil
}

// UpdateQuota sets the limits the mask names (admins only); the others keep
// their current values.
func (q *Quotas) UpdateQuota(ctx context.Context, req *clv1.UpdateQuotaRequest) (*clv1.Quota, error) {
	if err := adminOnly(ctx, "UpdateQuota"); err != nil {
		return nil, err
	}
	if req.GetQuota() == nil {
		return nil, invalid("quota", "is required")
	}
	account, err := parseQuotaName("quota.name", req.GetQuota().GetName())
	if err != nil {
		return nil, err
	}
	in := req.GetQuota().GetLimits()
	var v violations
	for name, n := range map[string]*int64{"clusters": in.Clusters, "nodes": in.Nodes, "cpus": in.Cpus, "memory_mb": in.MemoryMb} {
		if n != nil && *n < 0 {
			v.add("quota.limits."+name, "must not be negative, got %d", *n)
		}
	}
	paths := req.GetUpdateMask().GetPaths()
	if len(paths) == 0 || (len(paths) == 1 && paths[0] == "*") {
		paths = []string{"limits"}
	}
	cur, err := q.store.GetQuota(ctx, account, q.Check())
	if err != nil {
		return nil, err
	}
	l := cur.Limits
	for _, p := range paths {
		switch p {
		case "limits":
			l = repository.Limits{Clusters: in.Clusters, Nodes: in.Nodes, CPUs: in.Cpus, MemoryMB: in.MemoryMb}
		case "limits.clusters":
			l.Clusters = in.Clusters
		case "limits.nodes":
			l.Nodes = in.Nodes
		case "limits.cpus":
			l.CPUs = in.Cpus
		case "limits.memory_mb":
			l.MemoryMB = in.MemoryMb
		default:
			v.add("update_mask", "cannot update %q (only limits, limits.clusters, limits.nodes, limits.cpus, limits.memory_mb)", Clip(p))
		}
	}
	if err := v.err(); err != nil {
		return nil, err
	}
	if err := q.store.SetQuota(ctx, account, l); err != nil {
		return nil, err
	}
	got, err := q.store.GetQuota(ctx, account, q.Check())
	if err != nil {
		return nil, err
	}
	return toQuota(got), nil
}

// adminOnly refuses a user (PERMISSION_DENIED).
func adminOnly(ctx context.Context, method string) error {
	who, err := caller(ctx)
	if err != nil {
		return err
	}
	if !who.IsAdmin() {
		return fmt.Errorf("%w: Quotas.%s is for admins only", auth.ErrAdminOnly, method)
	}
	return nil
}

// toQuota presents a quota.
func toQuota(q repository.Quota) *clv1.Quota {
	out := &clv1.Quota{
		Name: accountPrefix + q.Account + quotaSuffix,
		Limits: &clv1.QuotaLimits{
			Clusters: q.Limits.Clusters, Nodes: q.Limits.Nodes, Cpus: q.Limits.CPUs, MemoryMb: q.Limits.MemoryMB,
		},
		Usage: &clv1.QuotaUsage{
			Clusters: q.Usage.Clusters, Nodes: q.Usage.Nodes, Cpus: q.Usage.CPUs, MemoryMb: q.Usage.MemoryMB,
		},
		Explicit: q.Explicit,
	}
	if q.Explicit {
		out.UpdateTime = timestamppb.New(q.UpdateTime)
	}
	return out
}
