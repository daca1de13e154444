package libvirt

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/clusterd/clusterd/infra"
)

// CreateMachine adds a free, running EXTERNAL machine (a domain with
// clusterd's metadata and no cluster) that AddNodes can take, sized by the
// smallest offering. Like the simulator's, it is not a step: no job makes
// it, so it is not fenced. Machines of other roles only exist in a cluster.
func (d *Driver) CreateMachine(ctx context.Context, role infra.Role) (infra.Machine, error) {
	if role != infra.RoleExternal {
		return infra.Machine{}, fmt.Errorf("create machine: only %s machines can exist without a cluster, not %q", infra.RoleExternal, role)
	}
	name, off := d.smallest()
	m := meta{ID: uuid.Must(uuid.NewV7()).String(), Role: string(infra.RoleExternal), Offering: name,
		Created: d.now().UTC().Format(time.RFC3339Nano)}
	unlock := d.lock(m.ID)
	defer unlock()
	dm, err := d.define(ctx, m, off)
	if err != nil {
		return infra.Machine{}, fmt.Errorf("create machine: %w", err)
	}
	if err := d.start(ctx, dm.dom); err != nil {
		return infra.Machine{}, fmt.Errorf("create machine: %w", err)
	}
	d.log.Info("machine created", "machine", m.ID, "role", m.Role)
	return m.machine(infra.PowerRunning), nil
}

// smallest is the offering with the least memory.
func (d *Driver) smallest() (string, Offering) {
	var name string
	var off Offering
	for n, o := range d.offers {
		if name == "" || o.MemoryMiB < off.MemoryMiB || (o.MemoryMiB == off.MemoryMiB && n < name) {
			name, off = n, o
		}
	}
	return name, off
}

// SetMachinePower starts or stops (destroys) a machine out of band, as an
// operator's virsh or a failure would: not a step, so not fenced.
func (d *Driver) SetMachinePower(ctx context.Context, id string, p infra.Power) (infra.Machine, error) {
	if p != infra.PowerRunning && p != infra.PowerStopped {
		return infra.Machine{}, fmt.Errorf("set power of machine %s: power %q is not %s or %s", id, p, infra.PowerRunning, infra.PowerStopped)
	}
	if _, err := d.Machine(ctx, id); err != nil {
		return infra.Machine{}, fmt.Errorf("set power of machine %s: %w", id, err)
	}
	dm, err := d.read(ctx, id)
	if err != nil {
		return infra.Machine{}, fmt.Errorf("set power of machine %s: %w", id, err)
	}
	if p == infra.PowerRunning {
		err = d.start(ctx, dm.dom)
	} else if running, rerr := d.running(dm.dom); rerr != nil {
		err = rerr
	} else if running {
		err = d.conn().DomainDestroy(dm.dom)
	}
	if err != nil {
		return infra.Machine{}, fmt.Errorf("set power of machine %s: %w", id, err)
	}
	return d.Machine(ctx, id)
}
