package libvirt

import (
	"cmp"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/clusterd/clusterd/infra"
)

// MetadataNamespace is the XML namespace of clusterd's element in a
// domain's <metadata>; MetadataPrefix is its prefix.
const (
	MetadataNamespace = "https://clusterd.dev/xmlns/machine/1"
	MetadataPrefix    = "clusterd"
)

// meta is clusterd's record of a machine, kept in its domain's metadata as
// one element with attributes.
type meta struct {
	XMLName  xml.Name `xml:"machine"`
	ID       string   `xml:"id,attr"`
	Cluster  string   `xml:"cluster,attr"`
	Role     string   `xml:"role,attr"`
	Offering string   `xml:"offering,attr"`
	Version  string   `xml:"version,attr"`
	Joined   bool     `xml:"joined,attr"`
	Cordoned bool     `xml:"cordoned,attr"`
	ISO      string   `xml:"iso,attr"`
	Created  string   `xml:"created,attr"`
	// Filter is the cluster's network filter the machine is bound to.
	Filter string `xml:"filter,attr"`
	// Job and Attempt are the fencing token of the last job that changed
	// the machine.
	Job     string `xml:"job,attr"`
	Attempt int32  `xml:"attempt,attr"`
}

// element is m as the metadata element, without a namespace (libvirt puts
// it in MetadataNamespace with MetadataPrefix).
func (m meta) element() (string, error) {
	b, err := xml.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("encode metadata of machine %s: %w", m.ID, err)
	}
	return string(b), nil
}

// qualified is m as it stands in a domain's XML, in clusterd's namespace.
func (m meta) qualified() (string, error) {
	s, err := m.element()
	if err != nil {
		return "", err
	}
	s = strings.Replace(s, "<machine", "<"+MetadataPrefix+":machine xmlns:"+MetadataPrefix+`="`+MetadataNamespace+`"`, 1)
	return strings.Replace(s, "</machine>", "</"+MetadataPrefix+":machine>", 1), nil
}

func (m meta) machine(power infra.Power) infra.Machine {
	created, _ := time.Parse(time.RFC3339Nano, m.Created)
	return infra.Machine{
		ID: m.ID, ClusterID: m.Cluster, Role: infra.Role(m.Role), Power: power, Joined: m.Joined,
		Cordoned: m.Cordoned, KubernetesVersion: m.Version, AttachedISO: m.ISO, Offering: m.Offering,
		CreateTime: created,
	}
}

// domain is a machine's domain with clusterd's record of it.
type domain struct {
	dom  golibvirt.Domain
	meta meta
}

// errNoDomain: the machine's domain does not exist.
var errNoDomain = errors.New("no domain")

// read finds machine id's domain and its metadata (persistent config):
// errNoDomain when there is none, infra.ErrNotFound wrapped when the domain
// carries no clusterd metadata.
func (d *Driver) read(ctx context.Context, id string) (domain, error) {
	if err := ctx.Err(); err != nil {
		return domain{}, err
	}
	dom, err := d.conn().DomainLookupByName(DomainName(id))
	if libvirtCode(err) == golibvirt.ErrNoDomain {
		return domain{}, fmt.Errorf("machine %s: %w", id, errNoDomain)
	}
	if err != nil {
		return domain{}, fmt.Errorf("look up domain %s: %w", DomainName(id), err)
	}
	m, err := d.metaOf(dom)
	if err != nil {
		return domain{}, err
	}
	return domain{dom: dom, meta: m}, nil
}

// metaOf reads clusterd's metadata of dom; a domain without it is
// infra.ErrNotFound (not clusterd's machine).
func (d *Driver) metaOf(dom golibvirt.Domain) (meta, error) {
	s, err := d.conn().DomainGetMetadata(dom, int32(golibvirt.DomainMetadataElement), golibvirt.OptString{MetadataNamespace}, golibvirt.DomainAffectConfig)
	switch {
	case libvirtCode(err) == golibvirt.ErrNoDomainMetadata:
		return meta{}, fmt.Errorf("domain %s has no clusterd metadata: %w", dom.Name, infra.ErrNotFound)
	case libvirtCode(err) == golibvirt.ErrNoDomain:
		return meta{}, fmt.Errorf("domain %s: %w", dom.Name, errNoDomain)
	case err != nil:
		return meta{}, fmt.Errorf("read metadata of domain %s: %w", dom.Name, err)
	}
	var m meta
	if err := xml.Unmarshal([]byte(s), &m); err != nil {
		return meta{}, fmt.Errorf("decode metadata of domain %s: %w", dom.Name, err)
	}
	return m, nil
}

// writeMeta replaces the domain's metadata, in its persistent config and,
// while it runs, in the live one.
func (d *Driver) writeMeta(ctx context.Context, dom golibvirt.Domain, m meta) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	el, err := m.element()
	if err != nil {
		return err
	}
	flags := golibvirt.DomainAffectConfig
	if running, err := d.running(dom); err != nil {
		return err
	} else if running {
		flags |= golibvirt.DomainAffectLive
	}
	if err := d.conn().DomainSetMetadata(dom, int32(golibvirt.DomainMetadataElement), golibvirt.OptString{el},
		golibvirt.OptString{MetadataPrefix}, golibvirt.OptString{MetadataNamespace}, flags); err != nil {
		return fmt.Errorf("write metadata of domain %s: %w", dom.Name, err)
	}
	return nil
}

// power is the domain's power state.
func (d *Driver) power(dom golibvirt.Domain) (infra.Power, error) {
	running, err := d.running(dom)
	if err != nil {
		return "", err
	}
	if running {
		return infra.PowerRunning, nil
	}
	return infra.PowerStopped, nil
}

// running says whether the domain's guest runs (running, blocked in the
// hypervisor, or paused).
func (d *Driver) running(dom golibvirt.Domain) (bool, error) {
	state, err := d.state(dom)
	return isRunning(state), err
}

// describeDomain is machine id's domain as the log shows it when its agent
// is silent: its state and the CPU time its guest has used, which grows
// while the guest runs.
func (d *Driver) describeDomain(id string) string {
	dom, err := d.conn().DomainLookupByName(DomainName(id))
	if err != nil {
		return "lookup: " + err.Error()
	}
	state, _, _, vcpus, cpuTime, err := d.conn().DomainGetInfo(dom)
	if err != nil {
		return "info: " + err.Error()
	}
	names := map[golibvirt.DomainState]string{golibvirt.DomainNostate: "nostate", golibvirt.DomainRunning: "running", golibvirt.DomainBlocked: "blocked",
		golibvirt.DomainPaused: "paused", golibvirt.DomainShutdown: "shutting-down", golibvirt.DomainShutoff: "shutoff", golibvirt.DomainCrashed: "crashed", golibvirt.DomainPmsuspended: "pmsuspended"}
	return fmt.Sprintf("state=%s vcpus=%d cpu_time=%s console_tail=%q", names[golibvirt.DomainState(state)], vcpus,
		time.Duration(cpuTime).Round(time.Millisecond), consoleTail(ConsoleLog(d.poolDir, id), 600))
}

// consoleTail is the last n bytes of a guest's console log, or why there
// are none.
func consoleTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	off := max(info.Size()-n, 0)
	buf := make([]byte, info.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return err.Error()
	}
	return strings.ToValidUTF8(string(buf), "?")
}

func (d *Driver) state(dom golibvirt.Domain) (golibvirt.DomainState, error) {
	state, _, err := d.conn().DomainGetState(dom, 0)
	if err != nil {
		return 0, fmt.Errorf("state of domain %s: %w", dom.Name, err)
	}
	return golibvirt.DomainState(state), nil
}

func isRunning(s golibvirt.DomainState) bool {
	switch s {
	case golibvirt.DomainRunning, golibvirt.DomainBlocked, golibvirt.DomainPaused:
		return true
	}
	return false
}

// settled returns the domain's state once it is not being shut down. A
// guest that has powered itself off (the ACPI shutdown power_off asks for)
// is DomainShutdown until libvirt has ended its QEMU, which takes seconds
// on a loaded host: a start in that window is refused as "already
// running", and the guest is gone a moment later.
func (d *Driver) settled(ctx context.Context, dom golibvirt.Domain) (golibvirt.DomainState, error) {
	for {
		state, err := d.state(dom)
		if err != nil || state != golibvirt.DomainShutdown {
			return state, err
		}
		select {
		case <-ctx.Done():
			return state, fmt.Errorf("domain %s is still shutting down: %w", dom.Name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Machines lists the domains carrying clusterd's metadata, of the given
// clusters (all of them, free machines too, when none is given), oldest
// first.
func (d *Driver) Machines(ctx context.Context, clusterIDs ...string) ([]infra.Machine, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	doms, _, err := d.conn().ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, fmt.Errorf("list domains: %w", err)
	}
	var out []infra.Machine
	for _, dom := range doms {
		if !strings.HasPrefix(dom.Name, "clusterd-") {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		m, err := d.metaOf(dom)
		if errors.Is(err, infra.ErrNotFound) || errors.Is(err, errNoDomain) {
			continue // not clusterd's, or removed while listing
		}
		if err != nil {
			return nil, err
		}
		if len(clusterIDs) > 0 && !slices.Contains(clusterIDs, m.Cluster) {
			continue
		}
		p, err := d.power(dom)
		if libvirtCode(err) == golibvirt.ErrNoDomain {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, m.machine(p))
	}
	slices.SortFunc(out, func(a, b infra.Machine) int {
		return cmp.Or(a.CreateTime.Compare(b.CreateTime), strings.Compare(a.ID, b.ID))
	})
	return out, nil
}

// Machine reads one machine (infra.ErrNotFound).
func (d *Driver) Machine(ctx context.Context, id string) (infra.Machine, error) {
	dm, err := d.read(ctx, id)
	if errors.Is(err, errNoDomain) {
		return infra.Machine{}, fmt.Errorf("machine %s: %w", id, infra.ErrNotFound)
	}
	if err != nil {
		return infra.Machine{}, err
	}
	p, err := d.power(dm.dom)
	if err != nil {
		return infra.Machine{}, err
	}
	return dm.meta.machine(p), nil
}

// kernelCmdline is a machine's kernel command line: its serial console
// (the console log), its id for the node agent, and no_timer_check. Without
// QEMU's acceleration (TCG) on a loaded host, a guest's vCPU can be starved
// while the kernel checks that its timer interrupt arrives through the
// IO-APIC; the check then fails and the kernel panics at boot ("IO-APIC +
// timer doesn't work!", seen in a machine's console log during make test).
// no_timer_check skips that check, as virtual machine images do.
func kernelCmdline(machineID string) string {
	return "console=ttyS0 no_timer_check clusterd.machine=" + machineID
}

// domainXML is the definition of a new machine's domain.
func (d *Driver) domainXML(m meta, off Offering, volume string) (string, error) {
	md, err := m.qualified()
	if err != nil {
		return "", err
	}
	name := DomainName(m.ID)
	dom := libvirtxml.Domain{
		Type:          "qemu",
		Name:          name,
		Metadata:      &libvirtxml.DomainMetadata{XML: md},
		Memory:        &libvirtxml.DomainMemory{Value: off.MemoryMiB, Unit: "MiB"},
		CurrentMemory: &libvirtxml.DomainCurrentMemory{Value: off.MemoryMiB, Unit: "MiB"},
		VCPU:          &libvirtxml.DomainVCPU{Placement: "static", Value: off.CPUs},
		OS: &libvirtxml.DomainOS{
			Type:    &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "pc", Type: "hvm"},
			Kernel:  d.kernel,
			Initrd:  d.initrd,
			Cmdline: kernelCmdline(m.ID),
		},
		// ACPI: libvirt's graceful shutdown presses the guest's power
		// button, which the node agent answers by powering off.
		Features:   &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Disks: []libvirtxml.DomainDisk{
				{
					Device: "disk",
					Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"},
					Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: volume}},
					Target: &libvirtxml.DomainDiskTarget{Dev: "vda", Bus: "virtio"},
				},
				cdrom(""),
			},
			// The cdrom sits on virtio-scsi: the node image's kernel
			// (Debian's cloud kernel) has no AHCI driver for SATA.
			Controllers: []libvirtxml.DomainController{{Type: "scsi", Index: new(uint), Model: "virtio-scsi"}},
			Channels: []libvirtxml.DomainChannel{{
				Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind", Path: AgentSocket(d.poolDir, m.ID)}},
				Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: "org.clusterd.agent.0"}},
			}},
			// The serial console (the guest's kernel and init write to
			// ttyS0) is also logged to a file, from each start of QEMU
			// afresh: what a guest whose agent does not answer has said.
			Serials: []libvirtxml.DomainSerial{{
				Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Log:    &libvirtxml.DomainChardevLog{File: ConsoleLog(d.poolDir, m.ID), Append: "off"},
			}},
			Consoles: []libvirtxml.DomainConsole{{Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}}, Target: &libvirtxml.DomainConsoleTarget{Type: "serial"}}},
		},
	}
	s, err := dom.Marshal()
	if err != nil {
		return "", fmt.Errorf("encode domain %s: %w", name, err)
	}
	return s, nil
}

// cdrom is the machine's cdrom holding the ISO at path (empty: no media).
func cdrom(path string) libvirtxml.DomainDisk {
	disk := libvirtxml.DomainDisk{
		Device:   "cdrom",
		Driver:   &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"},
		Target:   &libvirtxml.DomainDiskTarget{Dev: "sda", Bus: "scsi"},
		ReadOnly: &libvirtxml.DomainDiskReadOnly{},
	}
	if path != "" {
		disk.Source = &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: path}}
	}
	return disk
}
