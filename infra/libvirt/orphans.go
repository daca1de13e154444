package libvirt

import (
	"context"
	"errors"
	"fmt"
	"os"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/clusterd/clusterd/infra"
)

// ErrMachineChanged: a machine RemoveOrphan was asked to remove no longer
// belongs to the cluster it was judged an orphan of.
var ErrMachineChanged = errors.New("the machine changed since it was judged an orphan")

// OwnMachines lists the machines this driver may remove as orphans: the
// domains carrying clusterd's metadata whose state volume is in this
// driver's storage pool (Config.Pool). Several clusterd deployments, or
// tests, may share one libvirtd, each with a pool (and a database) of its
// own; a domain of another's pool names clusters this one's database does
// not know, and is not this one's to judge.
func (d *Driver) OwnMachines(ctx context.Context) ([]infra.Machine, error) {
	all, err := d.Machines(ctx)
	if err != nil {
		return nil, err
	}
	p, err := d.storagePool(ctx)
	if err != nil {
		return nil, err
	}
	var out []infra.Machine
	for _, m := range all {
		_, err := d.conn().StorageVolLookupByName(p, volumeName(m.ID))
		switch {
		case err == nil:
			out = append(out, m)
		case libvirtCode(err) == golibvirt.ErrNoStorageVol:
		default:
			return nil, fmt.Errorf("look up volume %s: %w", volumeName(m.ID), err)
		}
	}
	return out, nil
}

// RemoveOrphan destroys machine id, which the caller judged an orphan of
// cluster clusterID, with its volume, agent socket and, when it was the
// cluster's last domain, the cluster's network filter. It is not a step
// and takes no fencing token: the caller judges a machine an orphan only
// when its cluster is destroyed or unknown to the database, terminal
// conditions no job can leave, so no job holds the cluster or ever will,
// and there is no holder to check. What it does check, under the
// machine's lock, is that the domain still names clusterID (else
// ErrMachineChanged, and nothing is removed). Gone counts as removed.
func (d *Driver) RemoveOrphan(ctx context.Context, id, clusterID string) error {
	unlock := d.lock(id)
	defer unlock()
	dm, err := d.read(ctx, id)
	switch {
	case errors.Is(err, errNoDomain):
	case err != nil:
		return fmt.Errorf("remove orphan machine %s: %w", id, err)
	case dm.meta.Cluster != clusterID:
		return fmt.Errorf("remove orphan machine %s of cluster %s: it now names cluster %q: %w", id, clusterID, dm.meta.Cluster, ErrMachineChanged)
	default:
		if err := d.undefine(ctx, dm); err != nil {
			return fmt.Errorf("remove orphan machine %s: %w", id, err)
		}
	}
	if err := d.leftovers(ctx, id, clusterID); err != nil {
		return fmt.Errorf("remove orphan machine %s: %w", id, err)
	}
	d.log.Info("orphan machine removed", "machine", id, "cluster", clusterID)
	return nil
}

// undefine destroys (powers off at once) and undefines dm's domain; gone
// counts as done.
func (d *Driver) undefine(ctx context.Context, dm domain) error {
	if err := d.conn().DomainDestroy(dm.dom); err != nil && libvirtCode(err) != golibvirt.ErrOperationInvalid && libvirtCode(err) != golibvirt.ErrNoDomain {
		return fmt.Errorf("destroy domain %s: %w", dm.dom.Name, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := d.conn().DomainUndefineFlags(dm.dom, golibvirt.DomainUndefineManagedSave); err != nil && libvirtCode(err) != golibvirt.ErrNoDomain {
		return fmt.Errorf("undefine domain %s: %w", dm.dom.Name, err)
	}
	return nil
}

// leftovers removes what machine id's domain leaves behind: its state
// volume, its agent socket, agent and console log, and cluster clusterID's network
// filter when no domain of the cluster is left.
func (d *Driver) leftovers(ctx context.Context, id, clusterID string) error {
	if err := d.deleteStateVolume(ctx, id); err != nil {
		return err
	}
	if err := os.Remove(AgentSocket(d.poolDir, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove agent socket: %w", err)
	}
	if err := os.Remove(ConsoleLog(d.poolDir, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove console log: %w", err)
	}
	if f, ok := d.agents.(interface{ Forget(string) }); ok {
		f.Forget(id)
	}
	return d.dropFilterIfLast(ctx, clusterID)
}
