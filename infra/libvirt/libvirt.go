// Package libvirt is an infrastructure driver whose machines are libvirt
// domains, spoken to over libvirt's RPC protocol by a pure-Go client
// (github.com/digitalocean/go-libvirt), so clusterd stays free of cgo.
//
// # What a machine is
//
// Machine <id> is the domain clusterd-<id>: domain type qemu (TCG; no KVM is
// needed), booted directly from a kernel and initramfs (Config.Kernel and
// Config.Initrd, console=ttyS0), with a small raw state volume from the
// storage pool Config.Pool (a directory pool under Config.PoolDir) as its
// virtio disk, a cdrom for the version's binaries ISO and a virtio-serial
// channel whose host end is the unix socket <PoolDir>/clusterd-<id>.agent,
// through which the node agent in the guest answers. Guests get no network
// interface, so no guest has an address the host could reach.
//
// The domain itself is clusterd's record of the machine: an element in
// clusterd's XML namespace (MetadataNamespace) in the domain's <metadata>
// holds the machine id, cluster, role, offering, Kubernetes version, joined
// and cordoned state, attached ISO, creation time, the cluster's network
// filter and the fencing token of the last job that changed it. Machines
// lists the domains that carry it; nothing is kept elsewhere, so servers
// sharing one libvirtd see the same machines.
//
// # Kubernetes
//
// The Kubernetes-level steps (join, upgrade, drain, uncordon, delete node,
// wait_api, fetch_kubeconfig, deploy_*) are requests to the node agent
// (Agents): newline-delimited JSON over the channel's socket. The agent
// installs the version it finds on the attached ISO, so a join needs the
// version's ISO attached first. With libvirt's test driver no guest runs;
// MemoryAgents plays the agents in process with the same rules.
//
// # Network rules
//
// A cluster's rules are one libvirt network filter, clusterd-<cluster id>:
// one accept rule per (machine, kind, port), the machine and kind recorded
// in the rule's comment, which is where Rules reads them back. A filter is
// bound to a domain through an interface's <filterref>; since the guests
// have no interface, the binding is recorded instead: each of the
// cluster's domains names the filter in its metadata, and the filter is
// undefined with the cluster's last domain. libvirt's test driver has no
// network filters, so for a test: URI they are kept on qemu:///system
// (Config.FilterURI), where a filter bound to nothing changes no firewall.
//
// # Fencing
//
// libvirt cannot join clusterd's database transactions, so each change is
// fenced as infra's package doc asks of an external API: the Guard checks
// under the cluster's row lock, immediately before and immediately after
// the change, that the call's job (at its attempt) holds the cluster, and
// the job and attempt are written into the domain's metadata with (or
// before) the change. A call of the same job at a lower attempt than the
// one a domain records is refused with infra.ErrFenced and changes nothing:
// an adopted job's old attempt, resumed after a pause, cannot undo its
// successor's work even between the successor's check and its change.
//
// Fencing orders one cluster's jobs, not two clusters': validate_node,
// which takes a free machine into a cluster, is decided in the database
// instead (Config.Takes; see takes.go), so that servers sharing a
// libvirtd never give one machine to two clusters.
package libvirt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/repository"
)

// Guard says whether a job still holds its cluster (repository.Store's
// CheckHolder): it locks the cluster's row, then the job's, and returns an
// error wrapping repository.ErrFenced when the job, at f.Attempt, does not
// hold f.ClusterID. The driver calls it before and after each change.
type Guard interface {
	CheckHolder(ctx context.Context, f repository.Fence) error
}

// Offering is what a service offering gives a machine.
type Offering struct {
	CPUs      uint
	MemoryMiB uint
}

// DefaultOfferings is used when Config.Offerings is nil: the service
// catalog's offerings, each scaled down to fit this project's test
// machines (1 vCPU, at most 256 MiB: a node image's busybox agent needs no
// more); an operator with real capacity configures real sizes
// (--libvirt-offerings).
func DefaultOfferings() map[string]Offering {
	return map[string]Offering{
		"small":  {CPUs: 1, MemoryMiB: 128},
		"medium": {CPUs: 1, MemoryMiB: 192},
		"large":  {CPUs: 1, MemoryMiB: 256},
		"xlarge": {CPUs: 1, MemoryMiB: 256},
	}
}

// ParseOfferings reads "name:cpus:memoryMiB,..." (--libvirt-offerings).
func ParseOfferings(s string) (map[string]Offering, error) {
	out := map[string]Offering{}
	for _, part := range strings.Split(s, ",") {
		f := strings.Split(strings.TrimSpace(part), ":")
		if len(f) != 3 || f[0] == "" {
			return nil, fmt.Errorf("libvirt offering %q is not name:cpus:memoryMiB", part)
		}
		cpus, err1 := strconv.ParseUint(f[1], 10, 16)
		mem, err2 := strconv.ParseUint(f[2], 10, 32)
		if err1 != nil || err2 != nil || cpus == 0 || mem < 64 {
			return nil, fmt.Errorf("libvirt offering %q: cpus must be at least 1 and memory at least 64 MiB", part)
		}
		out[f[0]] = Offering{CPUs: uint(cpus), MemoryMiB: uint(mem)}
	}
	return out, nil
}

// Config configures a Driver.
type Config struct {
	// URI is the libvirt connection, e.g. qemu:///system or, for tests,
	// test+unix:///default (libvirt's in-memory test driver through
	// libvirtd). Empty is qemu:///system.
	URI string
	// FilterURI is the connection network filters are defined on; empty is
	// URI, or qemu:///system when URI is a test driver's (which has none).
	FilterURI string
	// PoolDir holds the storage pool's volumes, the agents' sockets and the
	// cached ISOs. Empty is /var/lib/clusterd/libvirt.
	PoolDir string
	// Pool names the directory storage pool (created when missing); empty
	// is "clusterd".
	Pool string
	// Kernel and Initrd are the node image, booted directly.
	Kernel, Initrd string
	// Offerings maps service offerings to sizes; nil is DefaultOfferings.
	Offerings map[string]Offering
	// Guard fences every change (required).
	Guard Guard
	// Takes is the database validate_node takes free machines in, so that
	// of servers sharing this libvirtd exactly one gives a free machine to
	// a cluster (see takes.go): the Store the Guard checks on. New
	// migrates the driver's table there. Nil refuses every validate_node.
	Takes TakeStore
	// Agents talks to the node agents; nil is MemoryAgents for a test
	// driver's URI, and the agents' sockets (SocketAgents) otherwise.
	Agents Agents
	// ShutdownTimeout bounds a graceful shutdown before power_off destroys
	// the domain; zero is 30s.
	ShutdownTimeout time.Duration
	// Clock stamps creation times; nil is time.Now.
	Clock func() time.Time
	// Logger records changes and refusals; nil discards.
	Logger *slog.Logger
}

// Driver implements infra.Infrastructure on libvirt. It is safe for
// concurrent use; Close releases its connections.
type Driver struct {
	// lv and filters (lv, or a connection of its own: Config.FilterURI)
	// are read through conn and filterConn: redial replaces them.
	connMu  sync.RWMutex
	lv      *golibvirt.Libvirt
	filters *golibvirt.Libvirt
	uri     string
	// url is uri parsed, and filterURL filters' URI when it is a
	// connection of its own (else nil), to dial again.
	url       *url.URL
	filterURL *url.URL
	// dialMu serialises redials.
	dialMu   sync.Mutex
	poolDir  string
	pool     string
	kernel   string
	initrd   string
	offers   map[string]Offering
	guard    Guard
	takes    TakeStore
	agents   Agents
	shutdown time.Duration
	// ownAgents: the driver made agents (Config.Agents was nil), and closes them.
	ownAgents bool
	now       func() time.Time
	log       *slog.Logger

	poolMu    sync.Mutex
	poolReady bool
	isoMu     sync.Mutex // builds of cached ISOs
	locksMu   sync.Mutex
	locks     map[string]*sync.Mutex // per machine: its read-modify-writes of metadata
}

var _ infra.Infrastructure = (*Driver)(nil)

// New connects to cfg.URI (and cfg.FilterURI) and returns a driver.
func New(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.Guard == nil {
		return nil, errors.New("libvirt driver: no guard: every change must be fenced")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d := &Driver{
		uri: cfg.URI, poolDir: cfg.PoolDir, pool: cfg.Pool, kernel: cfg.Kernel, initrd: cfg.Initrd,
		offers: cfg.Offerings, guard: cfg.Guard, takes: cfg.Takes, agents: cfg.Agents, shutdown: cfg.ShutdownTimeout,
		now: cfg.Clock, log: cfg.Logger, locks: map[string]*sync.Mutex{},
	}
	if d.uri == "" {
		d.uri = "qemu:///system"
	}
	if d.poolDir == "" {
		d.poolDir = "/var/lib/clusterd/libvirt"
	}
	if d.pool == "" {
		d.pool = "clusterd"
	}
	if d.offers == nil {
		d.offers = DefaultOfferings()
	}
	if d.shutdown <= 0 {
		d.shutdown = 30 * time.Second
	}
	if d.now == nil {
		d.now = time.Now
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	// A unix socket's path holds at most 107 bytes (sun_path).
	if n := len(AgentSocket(d.poolDir, "00000000-0000-0000-0000-000000000000")); n > 107 {
		return nil, fmt.Errorf("libvirt driver: pool folder %q is too long: its agent sockets' paths would have %d bytes, more than a unix socket's 107", d.poolDir, n)
	}
	if err := os.MkdirAll(filepath.Join(d.poolDir, "iso"), 0o755); err != nil {
		return nil, fmt.Errorf("libvirt driver: pool folder: %w", err)
	}
	u, err := url.Parse(d.uri)
	if err != nil {
		return nil, fmt.Errorf("libvirt driver: URI %q: %w", d.uri, err)
	}
	if d.takes != nil {
		if err := Migrate(ctx, d.takes); err != nil {
			return nil, err
		}
	}
	test := strings.HasPrefix(u.Scheme, "test")
	d.url = u
	d.lv, err = golibvirt.ConnectToURI(u)
	if err != nil {
		return nil, fmt.Errorf("libvirt driver: connect to %s: %w", d.uri, err)
	}
	d.filters = d.lv
	filterURI := cfg.FilterURI
	if filterURI == "" && test {
		filterURI = "qemu:///system"
	}
	if filterURI != "" && filterURI != d.uri {
		fu, err := url.Parse(filterURI)
		if err == nil {
			d.filterURL = fu
			d.filters, err = golibvirt.ConnectToURI(fu)
		}
		if err != nil {
			_ = d.lv.Disconnect()
			return nil, fmt.Errorf("libvirt driver: connect to %s for network filters: %w", filterURI, err)
		}
	}
	if d.agents == nil {
		d.ownAgents = true
		if test {
			d.agents = NewMemoryAgents(d.ISOVersion)
		} else {
			sa := NewSocketAgents(d.poolDir)
			sa.Log = d.log
			sa.Describe = d.describeDomain
			d.agents = sa
		}
	}
	return d, nil
}

// Close disconnects from libvirt (and from the agents).
func (d *Driver) Close() error {
	err := d.conn().Disconnect()
	if c, ok := d.agents.(*SocketAgents); ok && d.ownAgents {
		err = errors.Join(err, c.Close())
	}
	if d.filterURL != nil {
		err = errors.Join(err, d.filterConn().Disconnect())
	}
	if err != nil {
		return fmt.Errorf("libvirt driver: disconnect: %w", err)
	}
	return nil
}

// conn is the driver's connection to libvirt.
func (d *Driver) conn() *golibvirt.Libvirt {
	d.connMu.RLock()
	defer d.connMu.RUnlock()
	return d.lv
}

// filterConn is the connection network filters are kept on.
func (d *Driver) filterConn() *golibvirt.Libvirt {
	d.connMu.RLock()
	defer d.connMu.RUnlock()
	return d.filters
}

// redial replaces the driver's connections that were lost (a libvirtd
// restart) by new ones: the steps from then on use them; a step that ran
// while one was down failed with a connection error, and its job retries
// or fails as for any infrastructure error. (go-libvirt can connect a
// client again in place, but not while other goroutines use it.)
func (d *Driver) redial() error {
	d.dialMu.Lock()
	defer d.dialMu.Unlock()
	if lv := d.conn(); !lv.IsConnected() {
		n, err := golibvirt.ConnectToURI(d.url)
		if err != nil {
			return fmt.Errorf("libvirt driver: connect to %s again: %w", d.uri, err)
		}
		d.connMu.Lock()
		if d.filterURL == nil {
			d.filters = n
		}
		d.lv = n
		d.connMu.Unlock()
		d.log.Info("connected to libvirt again", "uri", d.uri)
	}
	if d.filterURL == nil {
		return nil
	}
	if f := d.filterConn(); !f.IsConnected() {
		n, err := golibvirt.ConnectToURI(d.filterURL)
		if err != nil {
			return fmt.Errorf("libvirt driver: connect to %s again for network filters: %w", d.filterURL, err)
		}
		d.connMu.Lock()
		d.filters = n
		d.connMu.Unlock()
		d.log.Info("connected to libvirt again", "uri", d.filterURL.String())
	}
	return nil
}

// DomainName is the domain of machine id.
func DomainName(id string) string { return "clusterd-" + id }

// FilterName is the network filter of cluster id.
func FilterName(clusterID string) string { return "clusterd-" + clusterID }

// volumeName is machine id's state volume in the pool.
func volumeName(id string) string { return DomainName(id) + ".img" }

// AgentSocket is the host end of machine id's agent channel.
func AgentSocket(poolDir, id string) string { return filepath.Join(poolDir, DomainName(id)+".agent") }

// ConsoleLog is where machine id's serial console is logged.
func ConsoleLog(poolDir, id string) string {
	return filepath.Join(poolDir, DomainName(id)+".console.log")
}

// lock serialises the read-modify-writes of one machine's metadata in this
// process (across processes, fencing orders the jobs).
func (d *Driver) lock(id string) func() {
	d.locksMu.Lock()
	m, ok := d.locks[id]
	if !ok {
		m = &sync.Mutex{}
		d.locks[id] = m
	}
	d.locksMu.Unlock()
	m.Lock()
	return m.Unlock
}

// libvirtCode is the libvirt error number of err, or -1.
func libvirtCode(err error) golibvirt.ErrorNumber {
	var e golibvirt.Error
	if errors.As(err, &e) {
		return golibvirt.ErrorNumber(e.Code)
	}
	return -1
}

// fence runs the Guard for the call's step; a refusal wraps infra.ErrFenced.
func (d *Driver) fence(ctx context.Context, step string, c infra.Call, when string) error {
	if c.ClusterID == "" || c.Operation == "" {
		return fmt.Errorf("%s: the call names no job or no cluster: %w", step, infra.ErrFenced)
	}
	err := d.guard.CheckHolder(ctx, repository.Fence{ClusterID: c.ClusterID, JobID: c.Operation, Attempt: c.Attempt, Step: step, MachineID: c.MachineID})
	if errors.Is(err, repository.ErrFenced) {
		d.log.Warn("libvirt step refused: its job no longer holds the cluster", "step", step, "when", when,
			"cluster", c.ClusterID, "operation", c.Operation, "attempt", c.Attempt, "machine", c.MachineID, "error", err)
		return fmt.Errorf("%s on cluster %s by operation %s (%s): %w: %v", step, c.ClusterID, c.Operation, when, infra.ErrFenced, err)
	}
	if err != nil {
		return fmt.Errorf("%s: check the job holds cluster %s: %w", step, c.ClusterID, err)
	}
	return nil
}
