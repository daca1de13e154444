package libvirt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"libvirt.org/go/libvirtxml"

	"github.com/clusterd/clusterd/agent"
	"github.com/clusterd/clusterd/infra"
)

// The steps. A step that changes a machine runs in change: the Guard
// before, the machine's domain read and checked (it belongs to the call's
// cluster or to the free pool; the call's attempt is not older than the
// domain's fencing token), the call's token written, the change, and the
// Guard after. A step run again finds what it did and does nothing more.

// ProvisionMachine creates machine id's state volume and domain for the
// call's cluster and starts it. A domain that exists for that cluster
// already is started if it is not running.
func (d *Driver) ProvisionMachine(ctx context.Context, c infra.Call, id string, role infra.Role, offering, version string) (infra.Machine, error) {
	const step = infra.StepProvisionMachine
	if c.MachineID == "" {
		c.MachineID = id
	}
	if u, err := uuid.Parse(id); err != nil || u.String() != id {
		return infra.Machine{}, fmt.Errorf("%s: machine id %q is not a lowercase UUID", step, id)
	}
	if c.ClusterID == "" {
		return infra.Machine{}, fmt.Errorf("%s: machine %s: the call names no cluster", step, id)
	}
	if role != infra.RoleControl && role != infra.RoleWorker {
		return infra.Machine{}, fmt.Errorf("%s: machine %s: a cluster provisions %s or %s machines, not %q", step, id, infra.RoleControl, infra.RoleWorker, role)
	}
	off, ok := d.offers[offering]
	if !ok {
		return infra.Machine{}, fmt.Errorf("%s: machine %s: unknown service offering %q", step, id, offering)
	}
	if err := d.fence(ctx, step, c, "before"); err != nil {
		return infra.Machine{}, err
	}
	unlock := d.lock(id)
	defer unlock()
	dm, err := d.read(ctx, id)
	if errors.Is(err, errNoDomain) {
		m := meta{ID: id, Cluster: c.ClusterID, Role: string(role), Offering: offering, Version: version,
			Created: d.now().UTC().Format(time.RFC3339Nano), Job: c.Operation, Attempt: c.Attempt}
		dm, err = d.define(ctx, m, off)
	} else if err == nil {
		err = d.owned(step, c, dm.meta, false)
		if err == nil {
			err = d.token(ctx, c, &dm)
		}
	}
	if err != nil {
		return infra.Machine{}, fmt.Errorf("%s: %w", step, err)
	}
	if err := d.start(ctx, dm.dom); err != nil {
		return infra.Machine{}, fmt.Errorf("%s: %w", step, err)
	}
	if err := d.fence(ctx, step, c, "after"); err != nil {
		return infra.Machine{}, err
	}
	d.log.Info("machine provisioned", "machine", id, "cluster", c.ClusterID, "role", role, "offering", offering)
	return dm.meta.machine(infra.PowerRunning), nil
}

// define creates the state volume and defines the domain, its metadata in
// the same definition.
func (d *Driver) define(ctx context.Context, m meta, off Offering) (domain, error) {
	vol, err := d.stateVolume(ctx, m.ID)
	if err != nil {
		return domain{}, err
	}
	x, err := d.domainXML(m, off, vol)
	if err != nil {
		return domain{}, err
	}
	if err := ctx.Err(); err != nil {
		return domain{}, err
	}
	dom, err := d.conn().DomainDefineXML(x)
	if err != nil {
		return domain{}, fmt.Errorf("define domain %s: %w", DomainName(m.ID), err)
	}
	return domain{dom: dom, meta: m}, nil
}

// start boots the domain unless it runs.
func (d *Driver) start(ctx context.Context, dom golibvirt.Domain) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	state, err := d.settled(ctx, dom)
	if err != nil || isRunning(state) {
		return err
	}
	if err := d.conn().DomainCreate(dom); err != nil && libvirtCode(err) != golibvirt.ErrOperationInvalid {
		return fmt.Errorf("start domain %s: %w", dom.Name, err)
	}
	return nil
}

// owned checks that the machine may be changed by the call: it belongs to
// the call's cluster, or (unless only the cluster's own machines may be)
// to the free pool, and the call is not an older attempt of the job whose
// token the domain records.
func (d *Driver) owned(step string, c infra.Call, m meta, clusterOnly bool) error {
	if m.Cluster != c.ClusterID && (clusterOnly || m.Cluster != "") {
		where := "the free pool"
		if m.Cluster != "" {
			where = "cluster " + m.Cluster
		}
		return fmt.Errorf("machine %s belongs to %s, not cluster %s: %w", m.ID, where, c.ClusterID, infra.ErrUnusable)
	}
	if m.Job == c.Operation && c.Attempt < m.Attempt {
		d.log.Warn("libvirt step refused: an older attempt of the job", "step", step, "machine", m.ID,
			"operation", c.Operation, "attempt", c.Attempt, "recorded", m.Attempt)
		return fmt.Errorf("%s on machine %s by operation %s attempt %d: %w: the machine records attempt %d",
			step, m.ID, c.Operation, c.Attempt, infra.ErrFenced, m.Attempt)
	}
	return nil
}

// token writes the call's fencing token into the domain's metadata, before
// the change it precedes.
func (d *Driver) token(ctx context.Context, c infra.Call, dm *domain) error {
	if dm.meta.Job == c.Operation && dm.meta.Attempt == c.Attempt {
		return nil
	}
	dm.meta.Job, dm.meta.Attempt = c.Operation, c.Attempt
	return d.writeMeta(ctx, dm.dom, dm.meta)
}

// change runs fn, a change of the call's machine, fenced (see above).
func (d *Driver) change(ctx context.Context, step string, c infra.Call, fn func(dm *domain) error) error {
	if c.MachineID == "" {
		return fmt.Errorf("%s: the call names no machine", step)
	}
	if err := d.fence(ctx, step, c, "before"); err != nil {
		return err
	}
	if err := d.changeLocked(ctx, step, c, false, fn); err != nil {
		return err
	}
	return d.fence(ctx, step, c, "after")
}

func (d *Driver) changeLocked(ctx context.Context, step string, c infra.Call, clusterOnly bool, fn func(dm *domain) error) error {
	unlock := d.lock(c.MachineID)
	defer unlock()
	dm, err := d.read(ctx, c.MachineID)
	if errors.Is(err, errNoDomain) {
		err = fmt.Errorf("machine %s: %w", c.MachineID, infra.ErrNotFound)
	}
	if err == nil {
		err = d.owned(step, c, dm.meta, clusterOnly)
	}
	if err == nil {
		err = d.token(ctx, c, &dm)
	}
	if err == nil {
		err = fn(&dm)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	return nil
}

// PowerOn starts the call's machine.
func (d *Driver) PowerOn(ctx context.Context, c infra.Call) error {
	return d.change(ctx, infra.StepPowerOn, c, func(dm *domain) error { return d.start(ctx, dm.dom) })
}

// PowerOff shuts the call's machine down gracefully, and destroys (pulls
// the plug of) a guest still running after Config.ShutdownTimeout.
func (d *Driver) PowerOff(ctx context.Context, c infra.Call) error {
	return d.change(ctx, infra.StepPowerOff, c, func(dm *domain) error { return d.stop(ctx, dm.dom) })
}

func (d *Driver) stop(ctx context.Context, dom golibvirt.Domain) error {
	// Off means shut off: a guest still being shut down has a QEMU, which
	// a start right after would find "already running".
	state, err := d.settled(ctx, dom)
	if err != nil || !isRunning(state) {
		return err
	}
	// A guest that cannot be asked (paused, or stopped meanwhile) is
	// destroyed at once; destroying a stopped one is a no-op.
	if err := d.conn().DomainShutdown(dom); err != nil {
		d.log.Info("graceful shutdown refused; destroying", "domain", dom.Name, "error", err)
	} else {
		deadline := time.NewTimer(d.shutdown)
		defer deadline.Stop()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
	wait:
		for {
			if state, err = d.settled(ctx, dom); err != nil || !isRunning(state) {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-deadline.C:
				d.log.Info("guest did not shut down in time; destroying", "domain", dom.Name, "timeout", d.shutdown)
				break wait
			case <-tick.C:
			}
		}
	}
	if err := d.conn().DomainDestroy(dom); err != nil && libvirtCode(err) != golibvirt.ErrOperationInvalid {
		return fmt.Errorf("destroy domain %s: %w", dom.Name, err)
	}
	return nil
}

// ResizeMachine gives the call's machine another offering's vCPUs and
// memory in its persistent definition: a running guest gets them at its
// next boot (a TCG guest has no memory or vCPU hot-plug to rely on).
func (d *Driver) ResizeMachine(ctx context.Context, c infra.Call, offering string) error {
	const step = infra.StepResizeMachine
	off, ok := d.offers[offering]
	if !ok {
		return fmt.Errorf("%s: machine %s: unknown service offering %q", step, c.MachineID, offering)
	}
	return d.change(ctx, step, c, func(dm *domain) error {
		if err := d.redefine(ctx, dm.dom, func(x *libvirtxml.Domain) {
			x.Memory = &libvirtxml.DomainMemory{Value: off.MemoryMiB, Unit: "MiB"}
			x.CurrentMemory = &libvirtxml.DomainCurrentMemory{Value: off.MemoryMiB, Unit: "MiB"}
			x.VCPU = &libvirtxml.DomainVCPU{Placement: "static", Value: off.CPUs}
		}); err != nil {
			return err
		}
		if dm.meta.Offering == offering {
			return nil
		}
		dm.meta.Offering = offering
		return d.writeMeta(ctx, dm.dom, dm.meta)
	})
}

// redefine changes the domain's persistent definition.
func (d *Driver) redefine(ctx context.Context, dom golibvirt.Domain, edit func(*libvirtxml.Domain)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s, err := d.conn().DomainGetXMLDesc(dom, golibvirt.DomainXMLInactive|golibvirt.DomainXMLSecure)
	if err != nil {
		return fmt.Errorf("read definition of domain %s: %w", dom.Name, err)
	}
	var x libvirtxml.Domain
	if err := x.Unmarshal(s); err != nil {
		return fmt.Errorf("decode definition of domain %s: %w", dom.Name, err)
	}
	edit(&x)
	out, err := x.Marshal()
	if err != nil {
		return fmt.Errorf("encode definition of domain %s: %w", dom.Name, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := d.conn().DomainDefineXML(out); err != nil {
		return fmt.Errorf("redefine domain %s: %w", dom.Name, err)
	}
	return nil
}

// AttachISO puts the ISO named iso (built and cached on first use) in the
// call's machine's cdrom, replacing any other.
func (d *Driver) AttachISO(ctx context.Context, c infra.Call, iso string) error {
	const step = infra.StepAttachISO
	if iso == "" {
		return fmt.Errorf("%s: machine %s: empty ISO name", step, c.MachineID)
	}
	path, err := d.isoPath(ctx, iso)
	if err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	return d.change(ctx, step, c, func(dm *domain) error { return d.media(ctx, dm, iso, path) })
}

// DetachISO ejects whatever ISO the call's machine has.
func (d *Driver) DetachISO(ctx context.Context, c infra.Call) error {
	return d.change(ctx, infra.StepDetachISO, c, func(dm *domain) error { return d.media(ctx, dm, "", "") })
}

// media changes the cdrom's media to path (none when empty) in the
// persistent definition and, while the domain runs, live (a driver without
// live media changes, like libvirt's test driver, changes the definition
// only), and records iso.
func (d *Driver) media(ctx context.Context, dm *domain, iso, path string) error {
	if err := d.redefine(ctx, dm.dom, func(x *libvirtxml.Domain) {
		for i, disk := range x.Devices.Disks {
			if disk.Device == "cdrom" {
				x.Devices.Disks[i].Source = cdrom(path).Source
			}
		}
	}); err != nil {
		return err
	}
	running, err := d.running(dm.dom)
	if err != nil {
		return err
	}
	if running {
		disk := cdrom(path)
		x, err := disk.Marshal()
		if err != nil {
			return fmt.Errorf("encode cdrom of domain %s: %w", dm.dom.Name, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		err = d.changeMedia(ctx, dm, x)
		if err != nil && libvirtCode(err) != golibvirt.ErrNoSupport {
			return fmt.Errorf("change cdrom of running domain %s: %w", dm.dom.Name, err)
		}
	}
	if dm.meta.ISO == iso {
		return nil
	}
	dm.meta.ISO = iso
	return d.writeMeta(ctx, dm.dom, dm.meta)
}

// changeMedia swaps the cdrom of a running domain. The guest may close the
// tray between QEMU's opening it and removing the medium (a kernel that
// closes the tray when the cdrom is opened, or locks it while it is read):
// QEMU then refuses with "Tray ... is not open", and the swap is tried again
// for up to trayWait, the pause growing from 300 ms to 2 s. An error after
// that says how many tries there were and where libvirt believes the tray
// is: open there but closed in QEMU means libvirt missed the guest's
// closing it; closed in both means the guest closed it after every opening.
func (d *Driver) changeMedia(ctx context.Context, dm *domain, xml string) error {
	const trayWait = 20 * time.Second
	deadline := time.Now().Add(trayWait)
	pause := 300 * time.Millisecond
	for try := 1; ; try++ {
		err := d.conn().DomainUpdateDeviceFlags(dm.dom, xml, golibvirt.DomainDeviceModifyLive|golibvirt.DomainDeviceModifyForce)
		if err == nil || !strings.Contains(err.Error(), "Tray") {
			return err
		}
		if time.Now().Add(pause).After(deadline) {
			return fmt.Errorf("%w (%d tries in %v; libvirt has the tray %s)", err, try, trayWait, d.trayState(dm.dom))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, 2*time.Second)
	}
}

// trayState is where libvirt believes the running domain's cdrom tray is
// ("open" or "closed"), or why that could not be read.
func (d *Driver) trayState(dom golibvirt.Domain) string {
	s, err := d.conn().DomainGetXMLDesc(dom, 0)
	if err != nil {
		return "unknown: " + err.Error()
	}
	var x libvirtxml.Domain
	if err := x.Unmarshal(s); err != nil {
		return "unknown: " + err.Error()
	}
	for _, disk := range x.Devices.Disks {
		if disk.Device == "cdrom" && disk.Target != nil {
			if disk.Target.Tray == "" {
				return "closed"
			}
			return disk.Target.Tray
		}
	}
	return "unknown: no cdrom"
}

// agent sends req to the machine's agent, which must be running, and
// records what the agent reports of the node in the machine's metadata.
func (d *Driver) agent(ctx context.Context, dm *domain, req agent.Request) (agent.Response, error) {
	running, err := d.running(dm.dom)
	if err != nil {
		return agent.Response{}, err
	}
	if !running {
		return agent.Response{}, fmt.Errorf("machine %s is powered off", dm.meta.ID)
	}
	resp, err := d.agents.Do(ctx, dm.meta.ID, req)
	if err != nil {
		return resp, err
	}
	st := resp.Status
	if dm.meta.Joined == st.Joined && dm.meta.Cordoned == st.Cordoned && (st.Version == "" || dm.meta.Version == st.Version) {
		return resp, nil
	}
	dm.meta.Joined, dm.meta.Cordoned = st.Joined, st.Cordoned
	if st.Version != "" {
		dm.meta.Version = st.Version
	}
	return resp, d.writeMeta(ctx, dm.dom, dm.meta)
}

// JoinNode asks the call's machine's agent to install version (from the
// attached ISO) and join the cluster; the machine must be running.
func (d *Driver) JoinNode(ctx context.Context, c infra.Call, version string, creds infra.NodeCredentials) error {
	return d.change(ctx, infra.StepJoinNode, c, func(dm *domain) error {
		_, err := d.agent(ctx, dm, agent.Request{Op: agent.OpJoin, Cluster: c.ClusterID, Version: version,
			CACert: string(creds.CACert), CAKey: string(creds.CAKey)})
		return err
	})
}

// UpgradeNode asks the call's machine's agent to install version (from the
// attached ISO) and uncordon the node.
func (d *Driver) UpgradeNode(ctx context.Context, c infra.Call, version string) error {
	if version == "" {
		return fmt.Errorf("%s: machine %s: empty version", infra.StepUpgradeNode, c.MachineID)
	}
	return d.change(ctx, infra.StepUpgradeNode, c, func(dm *domain) error {
		_, err := d.agent(ctx, dm, agent.Request{Op: agent.OpUpgrade, Cluster: c.ClusterID, Version: version})
		return err
	})
}

// DrainNode asks the call's machine's agent to cordon and drain the node.
func (d *Driver) DrainNode(ctx context.Context, c infra.Call) error {
	return d.change(ctx, infra.StepDrainNode, c, func(dm *domain) error {
		_, err := d.agent(ctx, dm, agent.Request{Op: agent.OpDrain, Cluster: c.ClusterID})
		return err
	})
}

// UncordonNode asks the call's machine's agent to let work back on.
func (d *Driver) UncordonNode(ctx context.Context, c infra.Call) error {
	return d.change(ctx, infra.StepUncordonNode, c, func(dm *domain) error {
		_, err := d.agent(ctx, dm, agent.Request{Op: agent.OpUncordon, Cluster: c.ClusterID})
		return err
	})
}

// DeleteNode asks the call's machine's agent to leave the cluster (a
// stopped machine is not asked: its node is removed all the same) and
// returns the machine to the free pool as an EXTERNAL machine with no ISO.
func (d *Driver) DeleteNode(ctx context.Context, c infra.Call) error {
	return d.change(ctx, infra.StepDeleteNode, c, func(dm *domain) error {
		running, err := d.running(dm.dom)
		if err != nil {
			return err
		}
		if running {
			if _, err := d.agent(ctx, dm, agent.Request{Op: agent.OpLeave, Cluster: c.ClusterID}); err != nil {
				return err
			}
		}
		if err := d.media(ctx, dm, "", ""); err != nil {
			return err
		}
		free := dm.meta
		free.Cluster, free.Role, free.Joined, free.Cordoned, free.ISO, free.Filter = "", string(infra.RoleExternal), false, false, "", ""
		if free == dm.meta {
			return nil
		}
		dm.meta = free
		return d.writeMeta(ctx, dm.dom, dm.meta)
	})
}

// ValidateNode takes a free, running EXTERNAL machine whose agent answers
// into the call's cluster as a worker (infra.ErrUnusable otherwise). A
// machine the call's cluster has already validates. Clusters racing for
// one machine, from this server or others sharing the libvirtd, are
// decided by the take (takes.go): one conditional insert in the database,
// fenced with the call, before the domain's metadata is read; the others
// get infra.ErrUnusable, or find the winner's cluster in the metadata.
func (d *Driver) ValidateNode(ctx context.Context, c infra.Call) error {
	const step = infra.StepValidateNode
	if c.MachineID == "" || c.ClusterID == "" {
		return fmt.Errorf("%s: the call must name a cluster and a machine", step)
	}
	if c.Operation == "" {
		return fmt.Errorf("%s: the call names no job: %w", step, infra.ErrFenced)
	}
	if err := d.take(ctx, step, c); err != nil {
		return err
	}
	err := d.changeLocked(ctx, step, c, false, func(dm *domain) error {
		if dm.meta.Cluster == c.ClusterID {
			return nil
		}
		if dm.meta.Role != string(infra.RoleExternal) {
			return fmt.Errorf("machine %s is a %s machine, not %s: %w", dm.meta.ID, dm.meta.Role, infra.RoleExternal, infra.ErrUnusable)
		}
		running, err := d.running(dm.dom)
		if err != nil {
			return err
		}
		if !running {
			return fmt.Errorf("machine %s is powered off: %w", dm.meta.ID, infra.ErrUnusable)
		}
		if _, err := d.agents.Do(ctx, dm.meta.ID, agent.Request{Op: agent.OpStatus}); err != nil {
			return fmt.Errorf("machine %s: its agent does not answer: %w: %w", dm.meta.ID, infra.ErrUnusable, err)
		}
		dm.meta.Cluster, dm.meta.Role = c.ClusterID, string(infra.RoleWorker)
		return d.writeMeta(ctx, dm.dom, dm.meta)
	})
	// The metadata now says who has the machine (or that it is not to be
	// had): it is the record again.
	d.release(ctx, c)
	if errors.Is(err, infra.ErrNotFound) {
		return fmt.Errorf("%s: no such machine %s: %w", step, c.MachineID, infra.ErrUnusable)
	}
	if err != nil {
		return err
	}
	return d.fence(ctx, step, c, "after")
}

// DestroyMachine destroys the call's machine's domain, undefines it and
// deletes its state volume; a machine that is gone is destroyed. The
// cluster's network filter goes with its last machine.
func (d *Driver) DestroyMachine(ctx context.Context, c infra.Call) error {
	const step = infra.StepDestroyMachine
	if c.MachineID == "" {
		return fmt.Errorf("%s: the call names no machine", step)
	}
	if err := d.fence(ctx, step, c, "before"); err != nil {
		return err
	}
	err := d.changeLocked(ctx, step, c, false, func(dm *domain) error { return d.undefine(ctx, *dm) })
	if err != nil && !errors.Is(err, infra.ErrNotFound) {
		return err
	}
	// Gone or just undefined: what it leaves behind goes too.
	if err := d.leftovers(ctx, c.MachineID, c.ClusterID); err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	if err := d.fence(ctx, step, c, "after"); err != nil {
		return err
	}
	d.log.Info("machine destroyed", "machine", c.MachineID, "cluster", c.ClusterID)
	return nil
}

// control returns a running control machine of the call's cluster: the
// Kubernetes-level cluster steps talk to its agent.
func (d *Driver) control(ctx context.Context, c infra.Call) (string, error) {
	ms, err := d.Machines(ctx, c.ClusterID)
	if err != nil {
		return "", err
	}
	if len(ms) == 0 {
		return "", fmt.Errorf("cluster %s has no machines", c.ClusterID)
	}
	for _, m := range ms {
		if m.Role == infra.RoleControl && m.Power == infra.PowerRunning {
			return m.ID, nil
		}
	}
	return "", fmt.Errorf("cluster %s has no running control machine", c.ClusterID)
}

// clusterStep sends req to the agent of a running control machine of the
// call's cluster, fenced like a change of that machine.
func (d *Driver) clusterStep(ctx context.Context, step string, c infra.Call, req agent.Request) (agent.Response, error) {
	if c.ClusterID == "" {
		return agent.Response{}, fmt.Errorf("%s: the call names no cluster", step)
	}
	if err := d.fence(ctx, step, c, "before"); err != nil {
		return agent.Response{}, err
	}
	id, err := d.control(ctx, c)
	if err != nil {
		return agent.Response{}, fmt.Errorf("%s: %w", step, err)
	}
	c.MachineID = id
	var resp agent.Response
	if err := d.changeLocked(ctx, step, c, true, func(dm *domain) error {
		resp, err = d.agent(ctx, dm, req)
		return err
	}); err != nil {
		return agent.Response{}, err
	}
	return resp, d.fence(ctx, step, c, "after")
}

// WaitAPI succeeds once a running control machine's agent answers, and
// returns the API endpoint.
func (d *Driver) WaitAPI(ctx context.Context, c infra.Call) (string, error) {
	resp, err := d.clusterStep(ctx, infra.StepWaitAPI, c, agent.Request{Op: agent.OpStatus, Cluster: c.ClusterID})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("https://%s:6443", DomainName(resp.Status.Machine)), nil
}

// FetchKubeconfig asks a control machine's agent for the cluster's
// kubeconfig; an empty one is an error.
func (d *Driver) FetchKubeconfig(ctx context.Context, c infra.Call) error {
	const step = infra.StepFetchKubeconfig
	resp, err := d.clusterStep(ctx, step, c, agent.Request{Op: agent.OpKubeconfig, Cluster: c.ClusterID})
	if err != nil {
		return err
	}
	if resp.Kubeconfig == "" {
		return fmt.Errorf("%s: cluster %s: the agent returned an empty kubeconfig", step, c.ClusterID)
	}
	return nil
}

// DeployProvider asks a control machine's agent to deploy the cloud provider.
func (d *Driver) DeployProvider(ctx context.Context, c infra.Call) error {
	_, err := d.clusterStep(ctx, infra.StepDeployProvider, c, agent.Request{Op: agent.OpDeploy, Cluster: c.ClusterID, Name: agent.AddonProvider})
	return err
}

// DeployAutoscaler asks a control machine's agent to deploy the autoscaler
// when enabled; disabled, it only checks that the agent answers (the agent
// protocol has no removal yet).
func (d *Driver) DeployAutoscaler(ctx context.Context, c infra.Call, enabled bool, minSize, maxSize int32) error {
	const step = infra.StepDeployAutoscaler
	if enabled && (minSize < 0 || maxSize < minSize) {
		return fmt.Errorf("%s: cluster %s: invalid autoscaler sizes %d..%d", step, c.ClusterID, minSize, maxSize)
	}
	req := agent.Request{Op: agent.OpStatus, Cluster: c.ClusterID}
	if enabled {
		req = agent.Request{Op: agent.OpDeploy, Cluster: c.ClusterID, Name: agent.AddonAutoscaler}
	}
	_, err := d.clusterStep(ctx, step, c, req)
	return err
}
