package service

import (
	"context"
	"fmt"
	"regexp"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository"
)

// dnsLabel is RFC 1123: what Kubernetes and DNS accept as a cluster name.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

const maxDescription = 1024

// violations collects field violations so a client learns about every bad
// field in one round trip.
type violations []FieldViolation

func (v *violations) add(field, format string, args ...any) {
	*v = append(*v, FieldViolation{Field: field, Description: fmt.Sprintf(format, args...)})
}

func (v violations) err() error {
	if len(v) == 0 {
		return nil
	}
	return &InvalidArgumentError{Violations: v}
}

// checkAutoscaling validates autoscaler bounds against the cluster's size.
func (c Catalog) checkAutoscaling(v *violations, field string, a *clv1.Autoscaling, control, workers int32) {
	if a == nil || !a.GetEnabled() {
		if a != nil && (a.GetMinSize() != 0 || a.GetMaxSize() != 0) {
			v.add(field, "min_size and max_size are only allowed with enabled = true")
		}
		return
	}
	switch {
	case a.GetMinSize() < 1:
		v.add(field+".min_size", "must be at least 1, got %d", a.GetMinSize())
	case a.GetMaxSize() < a.GetMinSize():
		v.add(field+".max_size", "must be at least min_size (%d), got %d", a.GetMinSize(), a.GetMaxSize())
	case sum(control, a.GetMaxSize()) > int64(c.MaxClusterSize):
		v.add(field+".max_size", "%d control + %d workers exceeds the maximum cluster size %d", control, a.GetMaxSize(), c.MaxClusterSize)
	case workers != 0 && (workers < a.GetMinSize() || workers > a.GetMaxSize()):
		v.add(field, "worker_node_count %d must be within [min_size %d, max_size %d]", workers, a.GetMinSize(), a.GetMaxSize())
	}
}

// validateCreate checks a CreateClusterRequest against the catalog and
// returns the cluster to insert, in account, and the canonical request id.
// That the version and offerings are still there and ENABLED is the claim's
// to decide (CreateCluster takes them in its transaction).
func (s *Clusters) validateCreate(ctx context.Context, req *clv1.CreateClusterRequest, account string) (repository.NewCluster, string, error) {
	var v violations
	requestID, err := canonicalRequestID(req.GetRequestId())
	if err != nil {
		return repository.NewCluster{}, "", err
	}
	cl := req.GetCluster()
	if cl == nil {
		v.add("cluster", "is required")
		return repository.NewCluster{}, "", v.err()
	}
	if !dnsLabel.MatchString(cl.GetDisplayName()) {
		v.add("cluster.display_name", "must be a DNS label (lower-case letters, digits and '-', starting and ending with a letter or digit, at most 63), got %q", Clip(cl.GetDisplayName()))
	}
	if len(cl.GetDescription()) > maxDescription {
		v.add("cluster.description", "must be at most %d bytes, got %d", maxDescription, len(cl.GetDescription()))
	}
	ver, err := s.checkVersion(ctx, &v, "cluster.kubernetes_version", cl.GetKubernetesVersion())
	if err != nil {
		return repository.NewCluster{}, "", err
	}
	control := cl.GetControlNodeCount()
	if control == 0 {
		control = 1
	}
	limit := s.catalog.MaxClusterSize
	controlOK := false
	switch {
	case control < 0:
		v.add("cluster.control_node_count", "must be positive, got %d", control)
	case control > limit:
		v.add("cluster.control_node_count", "must be at most the maximum cluster size %d, got %d", limit, control)
	case control > 1 && control%2 == 0:
		v.add("cluster.control_node_count", "must be odd (etcd quorum), got %d", control)
	default:
		controlOK = true
	}
	workers := cl.GetWorkerNodeCount()
	switch {
	case workers < 1:
		v.add("cluster.worker_node_count", "must be at least 1, got %d", workers)
	case workers > limit:
		v.add("cluster.worker_node_count", "must be at most the maximum cluster size %d, got %d", limit, workers)
	case controlOK && sum(control, workers) > int64(limit):
		v.add("cluster.worker_node_count", "%d control + %d workers exceeds the maximum cluster size %d", control, workers, limit)
	}
	if _, err := s.checkOffering(ctx, &v, "cluster.service_offering", cl.GetServiceOffering(), ver); err != nil {
		return repository.NewCluster{}, "", err
	}
	controlOffering := cl.GetControlOffering()
	if controlOffering == cl.GetServiceOffering() {
		controlOffering = ""
	}
	if controlOffering != "" {
		if _, err := s.checkOffering(ctx, &v, "cluster.control_offering", controlOffering, ver); err != nil {
			return repository.NewCluster{}, "", err
		}
	}
	s.catalog.checkAutoscaling(&v, "cluster.autoscaling", cl.GetAutoscaling(), control, workers)
	if err := v.err(); err != nil {
		return repository.NewCluster{}, "", err
	}
	return repository.NewCluster{
		Account:     account,
		DisplayName: cl.GetDisplayName(),
		Description: cl.GetDescription(),
		Spec: repository.Spec{
			KubernetesVersion: cl.GetKubernetesVersion(),
			ControlNodeCount:  control,
			WorkerNodeCount:   workers,
			ServiceOffering:   cl.GetServiceOffering(),
			ControlOffering:   controlOffering,
			Autoscaling: repository.Autoscaling{
				Enabled: cl.GetAutoscaling().GetEnabled(),
				MinSize: cl.GetAutoscaling().GetMinSize(),
				MaxSize: cl.GetAutoscaling().GetMaxSize(),
			},
		},
	}, requestID, nil
}
