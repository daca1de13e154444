package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/clusterd/clusterd/auth"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// The catalog's rules, which the repository's package doc
// details: versions and offerings are rows an admin manages; every
// authenticated caller reads them. Requests are validated against them here
// (an unknown entry, or an offering smaller than the version asks of a
// node, is INVALID_ARGUMENT naming the field); whether the entry is still
// there and ENABLED is decided by the claim's own transaction, which takes
// it (FAILED_PRECONDITION, CATALOG_ENTRY_UNUSABLE, otherwise), and a delete
// is refused in its transaction while a cluster uses the entry
// (FAILED_PRECONDITION, CATALOG_ENTRY_IN_USE). A check made here is never
// what keeps a cluster off a deleted entry.

// CatalogStore is the part of the repository the Catalog handlers use.
type CatalogStore interface {
	CatalogReader
	CreateKubernetesVersion(ctx context.Context, v repository.KubernetesVersion) (repository.KubernetesVersion, error)
	UpdateKubernetesVersion(ctx context.Context, version string, ch repository.KubernetesVersionChanges) (repository.KubernetesVersion, error)
	DeleteKubernetesVersion(ctx context.Context, version string) error
	CreateServiceOffering(ctx context.Context, o repository.ServiceOffering) (repository.ServiceOffering, error)
	UpdateServiceOffering(ctx context.Context, name string, ch repository.ServiceOfferingChanges) (repository.ServiceOffering, error)
	DeleteServiceOffering(ctx context.Context, name string) error
}

// CatalogReader reads the catalog: what the cluster handlers validate
// requests against.
type CatalogReader interface {
	GetKubernetesVersion(ctx context.Context, version string) (repository.KubernetesVersion, error)
	ListKubernetesVersions(ctx context.Context) ([]repository.KubernetesVersion, error)
	GetServiceOffering(ctx context.Context, name string) (repository.ServiceOffering, error)
	ListServiceOfferings(ctx context.Context) ([]repository.ServiceOffering, error)
}

const (
	versionPrefix  = "kubernetesVersions/"
	offeringPrefix = "serviceOfferings/"
)

// catalogName is the resource name of a catalog entry of the repository's
// kind ("kubernetes version" or "service offering").
func catalogName(kind, name string) string {
	if strings.HasPrefix(kind, "kubernetes") {
		return versionPrefix + name
	}
	return offeringPrefix + name
}

// CatalogService implements clusterlifecycle.v1.Catalog.
type CatalogService struct {
	clv1.UnimplementedCatalogServer
	store    CatalogStore
	clusters *Clusters
}

// NewCatalogService returns the Catalog handlers; clusters answers
// upgrades_for (the cluster, as its caller may see it).
func NewCatalogService(store CatalogStore, clusters *Clusters) *CatalogService {
	return &CatalogService{store: store, clusters: clusters}
}

// admin refuses a write by a caller who is not an admin (the server's
// interceptor refuses it first; this keeps a wiring mistake from opening
// the catalog to every account).
func admin(ctx context.Context, what string) error {
	who, err := caller(ctx)
	if err != nil {
		return err
	}
	if !who.IsAdmin() {
		return fmt.Errorf("%w: %s is for admins only", auth.ErrAdminOnly, what)
	}
	return nil
}

func toVersion(v repository.KubernetesVersion) *clv1.KubernetesVersion {
	return &clv1.KubernetesVersion{
		Name: versionPrefix + v.Version, Version: v.Version, State: catalogState(v.State),
		MinCpus: v.MinCPUs, MinMemoryMb: v.MinMemoryMB, BinariesIso: v.BinariesISO,
		CreateTime: timestamppb.New(v.CreateTime), UpdateTime: timestamppb.New(v.UpdateTime),
	}
}

func toOffering(o repository.ServiceOffering) *clv1.ServiceOffering {
	return &clv1.ServiceOffering{
		Name: offeringPrefix + o.Name, Cpus: o.CPUs, MemoryMb: o.MemoryMB, Description: o.Description,
		State: catalogState(o.State), CreateTime: timestamppb.New(o.CreateTime), UpdateTime: timestamppb.New(o.UpdateTime),
	}
}

func catalogState(st repository.CatalogState) clv1.CatalogState {
	return clv1.CatalogState(clv1.CatalogState_value[string(st)])
}

// fromCatalogState reads a requested state: unset means ENABLED on create.
func fromCatalogState(v *violations, field string, st clv1.CatalogState) repository.CatalogState {
	switch st {
	case clv1.CatalogState_CATALOG_STATE_UNSPECIFIED, clv1.CatalogState_ENABLED:
		return repository.CatalogEnabled
	case clv1.CatalogState_DISABLED:
		return repository.CatalogDisabled
	}
	v.add(field, "must be ENABLED or DISABLED, got %d", st)
	return ""
}

// versionID checks a version's name part (x.y.z).
func versionID(v *violations, field, id string) {
	if _, ok := parseVersion(id); !ok || len(id) > 32 {
		v.add(field, "must be a Kubernetes version x.y.z, got %q", Clip(id))
	}
}

// catalogID reads the last part of a catalog resource name.
func catalogID(field, name, prefix string) (string, error) {
	id, ok := strings.CutPrefix(name, prefix)
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", invalid(field, "%q is not a %s{id} name", Clip(name), prefix)
	}
	return id, nil
}

func checkSizes(v *violations, field string, cpus, memoryMB int32) {
	if cpus < 0 {
		v.add(field+".min_cpus", "must not be negative, got %d", cpus)
	}
	if memoryMB < 0 {
		v.add(field+".min_memory_mb", "must not be negative, got %d", memoryMB)
	}
}

// CreateKubernetesVersion adds a version (admins only).
func (c *CatalogService) CreateKubernetesVersion(ctx context.Context, req *clv1.CreateKubernetesVersionRequest) (*clv1.KubernetesVersion, error) {
	if err := admin(ctx, "CreateKubernetesVersion"); err != nil {
		return nil, err
	}
	var v violations
	id := req.GetKubernetesVersionId()
	versionID(&v, "kubernetes_version_id", id)
	in := req.GetKubernetesVersion()
	if in == nil {
		v.add("kubernetes_version", "is required")
		return nil, v.err()
	}
	st := fromCatalogState(&v, "kubernetes_version.state", in.GetState())
	checkSizes(&v, "kubernetes_version", in.GetMinCpus(), in.GetMinMemoryMb())
	if len(in.GetBinariesIso()) > 255 {
		v.add("kubernetes_version.binaries_iso", "must be at most 255 bytes, got %d", len(in.GetBinariesIso()))
	}
	if err := v.err(); err != nil {
		return nil, err
	}
	out, err := c.store.CreateKubernetesVersion(ctx, repository.KubernetesVersion{Version: id, State: st,
		MinCPUs: in.GetMinCpus(), MinMemoryMB: in.GetMinMemoryMb(), BinariesISO: in.GetBinariesIso()})
	if errors.Is(err, repository.ErrAlreadyExists) {
		return nil, &AlreadyExistsError{What: versionPrefix + id}
	}
	if err != nil {
		return nil, err
	}
	return toVersion(out), nil
}

// GetKubernetesVersion returns one version.
func (c *CatalogService) GetKubernetesVersion(ctx context.Context, req *clv1.GetKubernetesVersionRequest) (*clv1.KubernetesVersion, error) {
	if _, err := caller(ctx); err != nil {
		return nil, err
	}
	id, err := catalogID("name", req.GetName(), versionPrefix)
	if err != nil {
		return nil, err
	}
	out, err := c.store.GetKubernetesVersion(ctx, id)
	if err != nil {
		return nil, notFound(err, req.GetName())
	}
	return toVersion(out), nil
}

// ListKubernetesVersions lists versions oldest first (by version number);
// with upgrades_for, the ENABLED versions that cluster can upgrade to.
func (c *CatalogService) ListKubernetesVersions(ctx context.Context, req *clv1.ListKubernetesVersionsRequest) (*clv1.ListKubernetesVersionsResponse, error) {
	if _, err := caller(ctx); err != nil {
		return nil, err
	}
	size, err := pageSize("page_size", req.GetPageSize())
	if err != nil {
		return nil, err
	}
	query := "kubernetesVersions?" + req.GetUpgradesFor()
	after, err := decodePageToken("page_token", req.GetPageToken(), query)
	if err != nil {
		return nil, err
	}
	var vs []repository.KubernetesVersion
	if req.GetUpgradesFor() != "" {
		vs, err = c.clusters.upgradeTargets(ctx, "upgrades_for", req.GetUpgradesFor())
	} else {
		vs, err = c.store.ListKubernetesVersions(ctx)
		sortVersions(vs)
	}
	if err != nil {
		return nil, err
	}
	if after != "" {
		a, _ := parseVersion(after)
		vs = slices.DeleteFunc(vs, func(v repository.KubernetesVersion) bool {
			p, _ := parseVersion(v.Version)
			return !a.less(p)
		})
	}
	resp := &clv1.ListKubernetesVersionsResponse{}
	more := len(vs) > size
	if more {
		vs = vs[:size]
		resp.NextPageToken = encodePageToken(vs[len(vs)-1].Version, query, true)
	}
	for _, v := range vs {
		resp.KubernetesVersions = append(resp.KubernetesVersions, toVersion(v))
	}
	return resp, nil
}

// sortVersions orders versions by number (1.9.0 before 1.10.0).
func sortVersions(vs []repository.KubernetesVersion) {
	slices.SortFunc(vs, func(a, b repository.KubernetesVersion) int {
		pa, _ := parseVersion(a.Version)
		pb, _ := parseVersion(b.Version)
		switch {
		case pa.less(pb):
			return -1
		case pb.less(pa):
			return 1
		}
		return strings.Compare(a.Version, b.Version)
	})
}

// UpdateKubernetesVersion changes the fields of update_mask (admins only).
func (c *CatalogService) UpdateKubernetesVersion(ctx context.Context, req *clv1.UpdateKubernetesVersionRequest) (*clv1.KubernetesVersion, error) {
	if err := admin(ctx, "UpdateKubernetesVersion"); err != nil {
		return nil, err
	}
	in := req.GetKubernetesVersion()
	id, err := catalogID("kubernetes_version.name", in.GetName(), versionPrefix)
	if err != nil {
		return nil, err
	}
	var (
		v  violations
		ch repository.KubernetesVersionChanges
	)
	if len(req.GetUpdateMask().GetPaths()) == 0 {
		v.add("update_mask", "is required: name the fields to change (state, min_cpus, min_memory_mb, binaries_iso)")
	}
	for _, p := range req.GetUpdateMask().GetPaths() {
		switch p {
		case "state":
			st := fromCatalogState(&v, "kubernetes_version.state", in.GetState())
			ch.State = &st
		case "min_cpus":
			ch.MinCPUs = ptr(in.GetMinCpus())
		case "min_memory_mb":
			ch.MinMemoryMB = ptr(in.GetMinMemoryMb())
		case "binaries_iso":
			ch.BinariesISO = ptr(in.GetBinariesIso())
		default:
			v.add("update_mask", "cannot change %q (only state, min_cpus, min_memory_mb, binaries_iso)", Clip(p))
		}
	}
	checkSizes(&v, "kubernetes_version", in.GetMinCpus(), in.GetMinMemoryMb())
	if err := v.err(); err != nil {
		return nil, err
	}
	out, err := c.store.UpdateKubernetesVersion(ctx, id, ch)
	if err != nil {
		return nil, notFound(err, in.GetName())
	}
	return toVersion(out), nil
}

// DeleteKubernetesVersion deletes a version no cluster uses (admins only).
func (c *CatalogService) DeleteKubernetesVersion(ctx context.Context, req *clv1.DeleteKubernetesVersionRequest) (*emptypb.Empty, error) {
	if err := admin(ctx, "DeleteKubernetesVersion"); err != nil {
		return nil, err
	}
	id, err := catalogID("name", req.GetName(), versionPrefix)
	if err != nil {
		return nil, err
	}
	if err := c.store.DeleteKubernetesVersion(ctx, id); err != nil {
		return nil, notFound(err, req.GetName())
	}
	return &emptypb.Empty{}, nil
}

// CreateServiceOffering adds an offering (admins only).
func (c *CatalogService) CreateServiceOffering(ctx context.Context, req *clv1.CreateServiceOfferingRequest) (*clv1.ServiceOffering, error) {
	if err := admin(ctx, "CreateServiceOffering"); err != nil {
		return nil, err
	}
	var v violations
	id := req.GetServiceOfferingId()
	if !dnsLabel.MatchString(id) {
		v.add("service_offering_id", "must be a DNS label (lower-case letters, digits and '-', at most 63), got %q", Clip(id))
	}
	in := req.GetServiceOffering()
	if in == nil {
		v.add("service_offering", "is required")
		return nil, v.err()
	}
	if in.GetCpus() < 1 {
		v.add("service_offering.cpus", "must be at least 1, got %d", in.GetCpus())
	}
	if in.GetMemoryMb() < 1 {
		v.add("service_offering.memory_mb", "must be at least 1, got %d", in.GetMemoryMb())
	}
	if len(in.GetDescription()) > maxDescription {
		v.add("service_offering.description", "must be at most %d bytes, got %d", maxDescription, len(in.GetDescription()))
	}
	st := fromCatalogState(&v, "service_offering.state", in.GetState())
	if err := v.err(); err != nil {
		return nil, err
	}
	out, err := c.store.CreateServiceOffering(ctx, repository.ServiceOffering{Name: id, CPUs: in.GetCpus(), MemoryMB: in.GetMemoryMb(),
		Description: in.GetDescription(), State: st})
	if errors.Is(err, repository.ErrAlreadyExists) {
		return nil, &AlreadyExistsError{What: offeringPrefix + id}
	}
	if err != nil {
		return nil, err
	}
	return toOffering(out), nil
}

// GetServiceOffering returns one offering.
func (c *CatalogService) GetServiceOffering(ctx context.Context, req *clv1.GetServiceOfferingRequest) (*clv1.ServiceOffering, error) {
	if _, err := caller(ctx); err != nil {
		return nil, err
	}
	id, err := catalogID("name", req.GetName(), offeringPrefix)
	if err != nil {
		return nil, err
	}
	out, err := c.store.GetServiceOffering(ctx, id)
	if err != nil {
		return nil, notFound(err, req.GetName())
	}
	return toOffering(out), nil
}

// ListServiceOfferings lists offerings by name.
func (c *CatalogService) ListServiceOfferings(ctx context.Context, req *clv1.ListServiceOfferingsRequest) (*clv1.ListServiceOfferingsResponse, error) {
	if _, err := caller(ctx); err != nil {
		return nil, err
	}
	size, err := pageSize("page_size", req.GetPageSize())
	if err != nil {
		return nil, err
	}
	const query = "serviceOfferings"
	after, err := decodePageToken("page_token", req.GetPageToken(), query)
	if err != nil {
		return nil, err
	}
	os, err := c.store.ListServiceOfferings(ctx)
	if err != nil {
		return nil, err
	}
	os = slices.DeleteFunc(os, func(o repository.ServiceOffering) bool { return after != "" && o.Name <= after })
	resp := &clv1.ListServiceOfferingsResponse{}
	if len(os) > size {
		os = os[:size]
		resp.NextPageToken = encodePageToken(os[len(os)-1].Name, query, true)
	}
	for _, o := range os {
		resp.ServiceOfferings = append(resp.ServiceOfferings, toOffering(o))
	}
	return resp, nil
}

// UpdateServiceOffering changes an offering's state or description (admins
// only); its size never changes, since quotas count clusters' sizes by
// offering.
func (c *CatalogService) UpdateServiceOffering(ctx context.Context, req *clv1.UpdateServiceOfferingRequest) (*clv1.ServiceOffering, error) {
	if err := admin(ctx, "UpdateServiceOffering"); err != nil {
		return nil, err
	}
	in := req.GetServiceOffering()
	id, err := catalogID("service_offering.name", in.GetName(), offeringPrefix)
	if err != nil {
		return nil, err
	}
	var (
		v  violations
		ch repository.ServiceOfferingChanges
	)
	if len(req.GetUpdateMask().GetPaths()) == 0 {
		v.add("update_mask", "is required: name the fields to change (state, description)")
	}
	for _, p := range req.GetUpdateMask().GetPaths() {
		switch p {
		case "state":
			st := fromCatalogState(&v, "service_offering.state", in.GetState())
			ch.State = &st
		case "description":
			if len(in.GetDescription()) > maxDescription {
				v.add("service_offering.description", "must be at most %d bytes, got %d", maxDescription, len(in.GetDescription()))
			}
			ch.Description = ptr(in.GetDescription())
		case "cpus", "memory_mb":
			v.add("service_offering."+p, "is immutable: an offering's size never changes (quotas count clusters by it); create another offering")
		default:
			v.add("update_mask", "cannot change %q (only state, description)", Clip(p))
		}
	}
	if err := v.err(); err != nil {
		return nil, err
	}
	out, err := c.store.UpdateServiceOffering(ctx, id, ch)
	if err != nil {
		return nil, notFound(err, in.GetName())
	}
	return toOffering(out), nil
}

// DeleteServiceOffering deletes an offering no cluster uses (admins only).
func (c *CatalogService) DeleteServiceOffering(ctx context.Context, req *clv1.DeleteServiceOfferingRequest) (*emptypb.Empty, error) {
	if err := admin(ctx, "DeleteServiceOffering"); err != nil {
		return nil, err
	}
	id, err := catalogID("name", req.GetName(), offeringPrefix)
	if err != nil {
		return nil, err
	}
	if err := c.store.DeleteServiceOffering(ctx, id); err != nil {
		return nil, notFound(err, req.GetName())
	}
	return &emptypb.Empty{}, nil
}

func ptr[T any](v T) *T { return &v }

// offeringSize is the size of the service offering named name, DISABLED or
// not (an offering's size never changes): what a scale compares offerings
// by. A missing offering is ErrNotFound.
func (s *Clusters) offeringSize(ctx context.Context, name string) (Offering, error) {
	o, err := s.store.GetServiceOffering(ctx, name)
	if err != nil {
		return Offering{}, err
	}
	return Offering{Name: o.Name, CPUs: o.CPUs, MemoryMB: o.MemoryMB}, nil
}

// upgradeTargets are the ENABLED versions the cluster named name can
// upgrade to (a later patch of its minor, or the next minor), oldest first.
func (s *Clusters) upgradeTargets(ctx context.Context, field, name string) ([]repository.KubernetesVersion, error) {
	who, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	id, err := parseName(field, name, clusterPrefix)
	if err != nil {
		return nil, err
	}
	c, err := s.store.GetCluster(ctx, id)
	if err == nil && c.State == lifecycle.Destroyed {
		err = repository.ErrNotFound
	}
	if err != nil {
		return nil, notFound(err, name)
	}
	if err := visible(who, c.Account, name); err != nil {
		return nil, err
	}
	vs, err := s.store.ListKubernetesVersions(ctx)
	if err != nil {
		return nil, err
	}
	vs = slices.DeleteFunc(vs, func(v repository.KubernetesVersion) bool {
		return v.State != repository.CatalogEnabled || checkUpgrade(c.Spec.KubernetesVersion, v.Version) != nil
	})
	sortVersions(vs)
	return vs, nil
}

// checkOffering checks that name is an offering of the catalog big enough
// for a node of version ver, and returns it. With ver nil (a version the
// request got wrong, which its own violation names) the offering is held to
// the default node minimum (minCPUs, minMemoryMB), so that one answer names
// every bad field.
func (s *Clusters) checkOffering(ctx context.Context, v *violations, field, name string, ver *repository.KubernetesVersion) (repository.ServiceOffering, error) {
	if name == "" {
		v.add(field, "is required (one of %s)", s.offeringNames(ctx, ver))
		return repository.ServiceOffering{}, nil
	}
	o, err := s.store.GetServiceOffering(ctx, name)
	if errors.Is(err, repository.ErrNotFound) {
		v.add(field, "unknown service offering %q (one of %s)", Clip(name), s.offeringNames(ctx, ver))
		return o, nil
	}
	if err != nil {
		return o, err
	}
	if ver == nil {
		if o.CPUs < minCPUs || o.MemoryMB < minMemoryMB {
			v.add(field, "offering %q has %d vCPU / %d MB; a node needs at least %d vCPU / %d MB", name, o.CPUs, o.MemoryMB, minCPUs, minMemoryMB)
		}
		return o, nil
	}
	if o.CPUs < ver.MinCPUs || o.MemoryMB < ver.MinMemoryMB {
		v.add(field, "offering %q has %d vCPU / %d MB; a node of Kubernetes %s needs at least %d vCPU / %d MB",
			name, o.CPUs, o.MemoryMB, ver.Version, ver.MinCPUs, ver.MinMemoryMB)
	}
	return o, nil
}

// offeringNames lists the ENABLED offerings big enough for a node of ver,
// for error messages.
func (s *Clusters) offeringNames(ctx context.Context, ver *repository.KubernetesVersion) string {
	os, err := s.store.ListServiceOfferings(ctx)
	if err != nil {
		return "see ListServiceOfferings"
	}
	minC, minM := int32(minCPUs), int32(minMemoryMB)
	if ver != nil {
		minC, minM = ver.MinCPUs, ver.MinMemoryMB
	}
	var names []string
	for _, o := range os {
		if o.State == repository.CatalogEnabled && o.CPUs >= minC && o.MemoryMB >= minM {
			names = append(names, o.Name)
		}
	}
	return strings.Join(names, ", ")
}

// checkVersion checks that ver is a version of the catalog and returns it
// (nil when it is not).
func (s *Clusters) checkVersion(ctx context.Context, v *violations, field, ver string) (*repository.KubernetesVersion, error) {
	got, err := s.store.GetKubernetesVersion(ctx, ver)
	if errors.Is(err, repository.ErrNotFound) {
		v.add(field, "unsupported version %q (one of %s)", Clip(ver), s.versionNames(ctx))
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &got, nil
}

// versionNames lists the ENABLED versions, for error messages.
func (s *Clusters) versionNames(ctx context.Context) string {
	vs, err := s.store.ListKubernetesVersions(ctx)
	if err != nil {
		return "see ListKubernetesVersions"
	}
	sortVersions(vs)
	var names []string
	for _, v := range vs {
		if v.State == repository.CatalogEnabled {
			names = append(names, v.Version)
		}
	}
	return strings.Join(names, ", ")
}

// isoOf names the ISO that installs version: the version's binaries_iso,
// or the default name when it has none (or cannot be read: the default is
// what every version had before the catalog held ISOs).
func (s *Clusters) isoOf(ctx context.Context, version string) string {
	v, err := s.store.GetKubernetesVersion(ctx, version)
	if err == nil && v.BinariesISO != "" {
		return v.BinariesISO
	}
	return isoFor(version)
}
