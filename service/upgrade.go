package service

import (
	"context"
	"slices"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// upgradePlan is an UpgradeCluster's job parameters.
type upgradePlan struct {
	Version string `json:"version"`
}

// UpgradeCluster upgrades a running cluster to a later patch or the next
// minor version. Nodes already at the target are skipped, so running an
// interrupted upgrade again resumes it.
func (s *Clusters) UpgradeCluster(ctx context.Context, req *clv1.UpgradeClusterRequest) (*longrunningpb.Operation, error) {
	target := req.GetKubernetesVersion()
	if _, err := parseName("name", req.GetName(), clusterPrefix); err != nil {
		return nil, err
	}
	var v violations
	if _, err := s.checkVersion(ctx, &v, "kubernetes_version", target); err != nil {
		return nil, err
	}
	if err := v.err(); err != nil {
		return nil, err
	}
	plan := upgradePlan{Version: target}
	return s.run(ctx, request{
		msg: req, name: req.GetName(), requestID: req.GetRequestId(), etag: req.GetEtag(),
		verb: VerbUpgrade, event: lifecycle.UpgradeRequested, params: plan,
		// The claim takes the target: refused (FAILED_PRECONDITION) if it
		// is DISABLED or deleted by then, and kept from a delete while the
		// upgrade runs.
		uses: repository.Uses{Version: target},
		check: func(_ context.Context, c repository.Cluster) error {
			return checkUpgrade(c.Spec.KubernetesVersion, target)
		},
		work: func(ctx context.Context, o *op) (repository.Changes, error) { return s.upgradeWork(ctx, o, plan) },
	})
}

// checkUpgrade allows a later patch of the same minor, or the next minor.
func checkUpgrade(current, target string) error {
	cur, ok1 := parseVersion(current)
	next, ok2 := parseVersion(target)
	if !ok1 || !ok2 || !cur.less(next) || next.major != cur.major || next.minor > cur.minor+1 {
		return invalid("kubernetes_version", "cannot upgrade from %s to %s: only a later patch or the next minor version", current, target)
	}
	return nil
}

// upgradeWork attaches the target's ISO, then per node (control nodes
// first) drains, upgrades and uncordons it, then detaches the ISOs. Nodes
// at the target are skipped, so an upgrade run again, or adopted, goes on
// from the first node not yet upgraded.
func (s *Clusters) upgradeWork(ctx context.Context, o *op, p upgradePlan) (repository.Changes, error) {
	c := o.cluster
	machines, err := s.infra.Machines(ctx, c.ID)
	if err != nil {
		return repository.Changes{}, err
	}
	// Control plane first: Kubernetes supports a newer control plane with
	// older kubelets, not the reverse.
	slices.SortStableFunc(machines, func(a, b infra.Machine) int {
		return boolInt(a.Role != infra.RoleControl) - boolInt(b.Role != infra.RoleControl)
	})
	var todo []infra.Machine
	for _, m := range machines {
		if m.KubernetesVersion != p.Version {
			todo = append(todo, m)
		}
	}
	// attach, drain, upgrade, detach per node
	o.expect(int32(4 * len(todo)))
	iso := s.isoOf(ctx, p.Version)
	for _, m := range todo {
		if m.AttachedISO == iso {
			continue
		}
		if err := o.do(ctx, infra.StepAttachISO, func() error { return s.infra.AttachISO(ctx, o.call(m.ID), iso) }); err != nil {
			return repository.Changes{}, err
		}
	}
	for _, m := range todo {
		if err := o.drain(ctx, m); err != nil {
			return repository.Changes{}, err
		}
		if err := o.do(ctx, infra.StepUpgradeNode, func() error { return s.infra.UpgradeNode(ctx, o.call(m.ID), p.Version) }); err != nil {
			return repository.Changes{}, err
		}
	}
	if err := o.detachISOs(ctx, c.ID); err != nil {
		return repository.Changes{}, err
	}
	spec := c.Spec
	spec.KubernetesVersion = p.Version
	return repository.Changes{Spec: &spec}, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
