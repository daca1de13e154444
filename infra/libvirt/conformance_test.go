package libvirt_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/infratest"
	"github.com/clusterd/clusterd/infra/libvirt"
	"github.com/clusterd/clusterd/infra/libvirt/libvirttest"
	"github.com/clusterd/clusterd/repository/repotest"
)

// The libvirt driver passes the drivers' conformance suite on libvirt's
// test driver, fenced by a repository on SQLite. The repository's guard is
// the same code on every backend, and the simulator's conformance run
// covers MariaDB; here the driver is under test, and one backend halves a
// run that takes minutes on a loaded machine.
// Each group of cases gets a driver and storage pool of its own; its
// clean-up removes every domain, volume and network filter the group
// named, and fails the group if any of them is still there afterwards.
func TestConformance(t *testing.T) {
	for _, b := range repotest.Backends(t)[:1] {
		t.Run(b.Name, func(t *testing.T) {
			infratest.Run(t, func(t *testing.T) infratest.Harness {
				e := newEnvOn(t, b, nil)
				return infratest.Harness{
					Infra:  e.d,
					Peer:   e.peer(t),
					Holder: infratest.NewHolder(e.store),
					External: func(ctx context.Context) (string, error) {
						m, err := e.d.CreateMachine(ctx, infra.RoleExternal)
						return m.ID, err
					},
					Cleanup: e.remove,
				}
			})
		})
	}
}

// remove destroys and undefines the domains of machines, deletes their
// volumes and undefines the network filters of clusters, through raw
// connections (not the driver under test), then checks that none of them
// is left. Gone is fine: a case may never have made it, or removed it.
func (e *env) remove(_ context.Context, machines, clusters []string) error {
	for _, id := range machines {
		e.track(id, "")
		libvirttest.RemoveDomain(e.raw, id)
		if p, err := e.raw.StoragePoolLookupByName(e.pool); err == nil {
			if v, err := e.raw.StorageVolLookupByName(p, volume(id)); err == nil {
				_ = e.raw.StorageVolDelete(v, 0)
			}
		}
	}
	for _, c := range clusters {
		e.track("", c)
		if f, err := e.filters.NwfilterLookupByName(libvirt.FilterName(c)); err == nil {
			_ = e.filters.NwfilterUndefine(f)
		}
	}
	var errs []error
	for _, id := range machines {
		if _, err := e.raw.DomainLookupByName(libvirt.DomainName(id)); !isNoDomain(err) {
			errs = append(errs, fmt.Errorf("domain %s is still defined (%v)", libvirt.DomainName(id), err))
		}
		if p, err := e.raw.StoragePoolLookupByName(e.pool); err == nil {
			if _, err := e.raw.StorageVolLookupByName(p, volume(id)); err == nil {
				errs = append(errs, fmt.Errorf("volume %s is still in pool %s", volume(id), e.pool))
			}
		}
	}
	for _, c := range clusters {
		if _, err := e.filters.NwfilterLookupByName(libvirt.FilterName(c)); err == nil {
			errs = append(errs, fmt.Errorf("network filter %s is still defined", libvirt.FilterName(c)))
		}
	}
	return errors.Join(errs...)
}

// volume is machine id's state volume in the pool.
func volume(id string) string { return libvirt.DomainName(id) + ".img" }

// isNoDomain says err is libvirt's "no such domain".
func isNoDomain(err error) bool {
	var e golibvirt.Error
	return errors.As(err, &e) && golibvirt.ErrorNumber(e.Code) == golibvirt.ErrNoDomain
}
