package service

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/clusterd/clusterd/repository"
)

// Offering is a machine size a cluster's nodes can have.
type Offering struct {
	Name     string
	CPUs     int32
	MemoryMB int32
}

// Catalog is the operator's configuration of what clusters may be made of:
// the largest cluster, and the Kubernetes versions and service offerings
// that seed an empty database catalog at start (Seed). Once seeded, the
// versions and offerings are resources admins manage (CatalogService), and
// requests are validated against the database, never against these lists.
type Catalog struct {
	// Versions are the installable Kubernetes versions (x.y.z) to seed.
	Versions []string
	// Offerings by name, to seed.
	Offerings map[string]Offering
	// MaxClusterSize bounds control + worker nodes.
	MaxClusterSize int32
}

// Minimum resources of a node, as in the model: below this Kubernetes does
// not run reliably. Seeded versions ask this of their nodes.
const (
	minCPUs     = 2
	minMemoryMB = 2048
)

// Seed is the catalog as the rows SeedCatalog writes into an empty
// database: every version ENABLED and asking minCPUs / minMemoryMB of its
// nodes, every offering ENABLED.
func (c Catalog) Seed() ([]repository.KubernetesVersion, []repository.ServiceOffering) {
	vs := make([]repository.KubernetesVersion, 0, len(c.Versions))
	for _, v := range c.Versions {
		vs = append(vs, repository.KubernetesVersion{Version: v, State: repository.CatalogEnabled, MinCPUs: minCPUs, MinMemoryMB: minMemoryMB})
	}
	names := slices.Sorted(maps.Keys(c.Offerings))
	os := make([]repository.ServiceOffering, 0, len(names))
	for _, n := range names {
		o := c.Offerings[n]
		os = append(os, repository.ServiceOffering{Name: n, CPUs: o.CPUs, MemoryMB: o.MemoryMB, State: repository.CatalogEnabled})
	}
	return vs, os
}

// DefaultCatalog is used when the operator configures nothing.
func DefaultCatalog() Catalog {
	return Catalog{
		Versions: []string{"1.28.9", "1.29.4", "1.29.6", "1.30.2", "1.30.5", "1.31.1"},
		Offerings: map[string]Offering{
			"small":  {Name: "small", CPUs: 1, MemoryMB: 1024},
			"medium": {Name: "medium", CPUs: 2, MemoryMB: 2048},
			"large":  {Name: "large", CPUs: 4, MemoryMB: 8192},
			"xlarge": {Name: "xlarge", CPUs: 8, MemoryMB: 16384},
		},
		MaxClusterSize: 50,
	}
}

// ParseOfferings reads "name:cpus:memoryMB,..." (the --service-offerings flag).
func ParseOfferings(s string) (map[string]Offering, error) {
	out := map[string]Offering{}
	for _, item := range strings.Split(s, ",") {
		parts := strings.Split(strings.TrimSpace(item), ":")
		if len(parts) != 3 || parts[0] == "" {
			return nil, fmt.Errorf("offering %q: want name:cpus:memoryMB", item)
		}
		cpus, err1 := strconv.ParseInt(parts[1], 10, 32)
		mem, err2 := strconv.ParseInt(parts[2], 10, 32)
		if err1 != nil || err2 != nil || cpus < 1 || mem < 1 {
			return nil, fmt.Errorf("offering %q: cpus and memory must be positive integers", item)
		}
		out[parts[0]] = Offering{Name: parts[0], CPUs: int32(cpus), MemoryMB: int32(mem)}
	}
	return out, nil
}

// ParseVersions reads "1.30.2,1.31.1" (the --kubernetes-versions flag).
func ParseVersions(s string) ([]string, error) {
	var out []string
	for _, v := range strings.Split(s, ",") {
		v = strings.TrimSpace(v)
		if _, ok := parseVersion(v); !ok {
			return nil, fmt.Errorf("kubernetes version %q: want x.y.z", v)
		}
		out = append(out, v)
	}
	return out, nil
}

// version is a parsed x.y.z.
type version struct{ major, minor, patch int }

func parseVersion(s string) (version, bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return version{}, false
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 || (len(p) > 1 && p[0] == '0') {
			return version{}, false
		}
		n[i] = v
	}
	return version{n[0], n[1], n[2]}, true
}

func (v version) less(o version) bool {
	return v.major < o.major || (v.major == o.major && (v.minor < o.minor || (v.minor == o.minor && v.patch < o.patch)))
}

// isoFor names the ISO that installs a Kubernetes version by default (a
// version's binaries_iso names another).
func isoFor(version string) string { return "kubernetes-" + version + ".iso" }

// Deadlines bounds how long each kind of operation may run (SPEC §4; the
// model uses 3600 s) before its job fails.
type Deadlines struct {
	Default time.Duration
	ByKind  map[string]time.Duration
}

// For returns the deadline of an operation kind.
func (d Deadlines) For(kind string) time.Duration {
	if v, ok := d.ByKind[kind]; ok && v > 0 {
		return v
	}
	if d.Default > 0 {
		return d.Default
	}
	return time.Hour
}

// ParseDeadlines reads "1h" or "1h,create=30m,upgrade=2h" (the
// --operation-deadline flag).
func ParseDeadlines(s string) (Deadlines, error) {
	d := Deadlines{ByKind: map[string]time.Duration{}}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		kind, val, named := strings.Cut(item, "=")
		if !named {
			val, kind = kind, ""
		}
		dur, err := time.ParseDuration(val)
		if err != nil || dur <= 0 {
			return Deadlines{}, fmt.Errorf("operation deadline %q: want a positive duration", item)
		}
		if !named {
			d.Default = dur
			continue
		}
		if !slices.Contains(Verbs(), kind) {
			return Deadlines{}, fmt.Errorf("operation deadline %q: unknown operation %q (known: %s)", item, kind, strings.Join(Verbs(), ", "))
		}
		d.ByKind[kind] = dur
	}
	return d, nil
}
