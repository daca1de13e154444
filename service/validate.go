package service

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

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

// offering checks that name is an offering of the catalog big enough for a
// Kubernetes node.
func (c Catalog) checkOffering(v *violations, field, name string) (Offering, bool) {
	if name == "" {
		v.add(field, "is required (one of %s)", c.offeringNames())
		return Offering{}, false
	}
	o, ok := c.Offerings[name]
	if !ok {
		v.add(field, "unknown service offering %q (one of %s)", Clip(name), c.offeringNames())
		return Offering{}, false
	}
	if o.CPUs < minCPUs || o.MemoryMB < minMemoryMB {
		v.add(field, "offering %q has %d vCPU / %d MB; a node needs at least %d vCPU / %d MB", name, o.CPUs, o.MemoryMB, minCPUs, minMemoryMB)
		return o, false
	}
	return o, true
}

func (c Catalog) offeringNames() string {
	names := make([]string, 0, len(c.Offerings))
	for n, o := range c.Offerings {
		if o.CPUs >= minCPUs && o.MemoryMB >= minMemoryMB {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
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

// validateCreate checks a CreateClusterRequest and returns the cluster to
// insert, in account, and the canonical request id.
func (s *Clusters) validateCreate(req *clv1.CreateClusterRequest, account string) (repository.NewCluster, string, error) {
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
	if !s.catalog.hasVersion(cl.GetKubernetesVersion()) {
		v.add("cluster.kubernetes_version", "unsupported version %q (one of %s)", Clip(cl.GetKubernetesVersion()), strings.Join(s.catalog.Versions, ", "))
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
	s.catalog.checkOffering(&v, "cluster.service_offering", cl.GetServiceOffering())
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
			Autoscaling: repository.Autoscaling{
				Enabled: cl.GetAutoscaling().GetEnabled(),
				MinSize: cl.GetAutoscaling().GetMinSize(),
				MaxSize: cl.GetAutoscaling().GetMaxSize(),
			},
		},
	}, requestID, nil
}
