package service

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Offering is a machine size a cluster's nodes can have.
type Offering struct {
	Name     string
	CPUs     int32
	MemoryMB int32
}

// Catalog is what clusters may be made of: the Kubernetes versions that can
// be installed, the service offerings, and the largest cluster. Operators
// configure it; requests are validated against it.
type Catalog struct {
	// Versions are the installable Kubernetes versions (x.y.z).
	Versions []string
	// Offerings by name.
	Offerings map[string]Offering
	// MaxClusterSize bounds control + worker nodes.
	MaxClusterSize int32
}

// Minimum resources of a node, as in the model: below this Kubernetes does
// not run reliably.
const (
	minCPUs     = 2
	minMemoryMB = 2048
)

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

func (c Catalog) hasVersion(v string) bool { return slices.Contains(c.Versions, v) }

// isoFor names the ISO that installs a Kubernetes version.
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
