package libvirt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// stateVolumeBytes is the size of a machine's state volume (raw): the agent
// keeps the node's state there.
const stateVolumeBytes = 16 << 20

// storagePool returns the driver's directory pool, defining, building and
// starting it when missing or inactive.
func (d *Driver) storagePool(ctx context.Context) (golibvirt.StoragePool, error) {
	d.poolMu.Lock()
	defer d.poolMu.Unlock()
	if err := ctx.Err(); err != nil {
		return golibvirt.StoragePool{}, err
	}
	p, err := d.conn().StoragePoolLookupByName(d.pool)
	if libvirtCode(err) == golibvirt.ErrNoStoragePool {
		x, merr := (&libvirtxml.StoragePool{Type: "dir", Name: d.pool, Target: &libvirtxml.StoragePoolTarget{Path: d.poolDir}}).Marshal()
		if merr != nil {
			return golibvirt.StoragePool{}, fmt.Errorf("encode storage pool %s: %w", d.pool, merr)
		}
		p, err = d.conn().StoragePoolDefineXML(x, 0)
		if err != nil {
			// Another server may have defined it meanwhile.
			p, err = d.conn().StoragePoolLookupByName(d.pool)
		}
		if err == nil {
			_ = d.conn().StoragePoolSetAutostart(p, 1)
		}
	}
	if err != nil {
		return golibvirt.StoragePool{}, fmt.Errorf("storage pool %s: %w", d.pool, err)
	}
	if d.poolReady {
		return p, nil
	}
	active, err := d.conn().StoragePoolIsActive(p)
	if err != nil {
		return golibvirt.StoragePool{}, fmt.Errorf("storage pool %s: %w", d.pool, err)
	}
	if active == 0 {
		if err := d.conn().StoragePoolCreate(p, 0); err != nil && libvirtCode(err) != golibvirt.ErrOperationInvalid {
			return golibvirt.StoragePool{}, fmt.Errorf("start storage pool %s: %w", d.pool, err)
		}
	}
	d.poolReady = true
	return p, nil
}

// stateVolume returns the path of machine id's state volume, creating it
// when missing.
func (d *Driver) stateVolume(ctx context.Context, id string) (string, error) {
	p, err := d.storagePool(ctx)
	if err != nil {
		return "", err
	}
	name := volumeName(id)
	v, err := d.conn().StorageVolLookupByName(p, name)
	if libvirtCode(err) == golibvirt.ErrNoStorageVol {
		x, merr := (&libvirtxml.StorageVolume{
			Type: "file", Name: name,
			Capacity: &libvirtxml.StorageVolumeSize{Value: stateVolumeBytes, Unit: "bytes"},
			Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "raw"}},
		}).Marshal()
		if merr != nil {
			return "", fmt.Errorf("encode volume %s: %w", name, merr)
		}
		v, err = d.conn().StorageVolCreateXML(p, x, 0)
		if err != nil {
			if again, lerr := d.conn().StorageVolLookupByName(p, name); lerr == nil {
				v, err = again, nil // created concurrently
			}
		}
	}
	if err != nil {
		return "", fmt.Errorf("state volume %s: %w", name, err)
	}
	path, err := d.conn().StorageVolGetPath(v)
	if err != nil {
		return "", fmt.Errorf("path of volume %s: %w", name, err)
	}
	return path, nil
}

// deleteStateVolume deletes machine id's state volume; gone is deleted.
func (d *Driver) deleteStateVolume(ctx context.Context, id string) error {
	p, err := d.storagePool(ctx)
	if err != nil {
		return err
	}
	v, err := d.conn().StorageVolLookupByName(p, volumeName(id))
	if libvirtCode(err) == golibvirt.ErrNoStorageVol {
		return nil
	}
	if err == nil {
		err = d.conn().StorageVolDelete(v, 0)
	}
	if err != nil && libvirtCode(err) != golibvirt.ErrNoStorageVol {
		return fmt.Errorf("delete volume %s: %w", volumeName(id), err)
	}
	return nil
}

// VersionOfISO is the Kubernetes version an ISO named by clusterd's catalog
// holds: "kubernetes-1.30.2.iso" holds 1.30.2; another name holds its base
// name without ".iso".
func VersionOfISO(iso string) string {
	return strings.TrimSuffix(strings.TrimPrefix(iso, "kubernetes-"), ".iso")
}

// isoPath builds (once; it is cached in the pool folder) the ISO named iso,
// holding a file VERSION with its version, and returns its path.
func (d *Driver) isoPath(ctx context.Context, iso string) (string, error) {
	if iso == "" || strings.ContainsAny(iso, `/\`) || strings.HasPrefix(iso, ".") {
		return "", fmt.Errorf("ISO name %q is not a file name", iso)
	}
	path := filepath.Join(d.poolDir, "iso", iso)
	d.isoMu.Lock()
	defer d.isoMu.Unlock()
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	dir, err := os.MkdirTemp(filepath.Join(d.poolDir, "iso"), ".build-")
	if err != nil {
		return "", fmt.Errorf("build ISO %s: %w", iso, err)
	}
	defer os.RemoveAll(dir)
	if err := os.MkdirAll(filepath.Join(dir, "root"), 0o755); err != nil {
		return "", fmt.Errorf("build ISO %s: %w", iso, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "root", "VERSION"), []byte(VersionOfISO(iso)+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("build ISO %s: %w", iso, err)
	}
	tmp := filepath.Join(dir, "out.iso")
	out, err := exec.CommandContext(ctx, "xorriso", "-as", "mkisofs", "-quiet", "-V", "CLUSTERD", "-o", tmp, filepath.Join(dir, "root")).CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", fmt.Errorf("build ISO %s with xorriso: %w: %s", iso, err, strings.TrimSpace(string(out)))
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return "", fmt.Errorf("build ISO %s: %w", iso, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("build ISO %s: %w", iso, err)
	}
	return path, nil
}

// ISOVersion is the version the ISO attached to machine id holds ("" with
// none attached): what its agent finds when it mounts the cdrom.
func (d *Driver) ISOVersion(ctx context.Context, id string) (string, error) {
	dm, err := d.read(ctx, id)
	if errors.Is(err, errNoDomain) {
		return "", fmt.Errorf("machine %s: no domain", id)
	}
	if err != nil || dm.meta.ISO == "" {
		return "", err
	}
	return VersionOfISO(dm.meta.ISO), nil
}
