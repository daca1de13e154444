package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// The ISO9660 subset clusterd writes and reads: a primary volume
// descriptor and a root directory holding a file VERSION, whose content is
// the Kubernetes version. The guest parses the image itself, so the node
// image needs neither the isofs module nor a mount.

const (
	isoSector = 2048
	// isoVersionFile is the name of the version file in the root directory.
	isoVersionFile = "VERSION"
	// maxVersionLen bounds what is read as a version.
	maxVersionLen = 256
)

// ErrNoVersion means the device or file is not an ISO9660 image holding a
// VERSION file (a cdrom with no medium reads as this too).
var ErrNoVersion = errors.New("no ISO9660 image with a VERSION file")

// ISOFile reads the version from an ISO9660 image in a file or device,
// opened afresh at each call, so a medium the host swapped is seen at once.
type ISOFile struct {
	// Path is the image or the cdrom device (/dev/sr0 in the guest).
	Path string
}

// Version returns VERSION's content without surrounding white space.
func (i ISOFile) Version() (string, error) {
	f, err := os.Open(i.Path)
	if err != nil {
		return "", fmt.Errorf("iso %s: %w (%w)", i.Path, ErrNoVersion, err)
	}
	defer f.Close()
	v, err := ReadISOVersion(f)
	if err != nil {
		return "", fmt.Errorf("iso %s: %w", i.Path, err)
	}
	return v, nil
}

// ReadISOVersion parses an ISO9660 image and returns its VERSION file's
// content, trimmed. Only the primary volume descriptor's root directory is
// read (extensions such as Rock Ridge and Joliet are ignored).
func ReadISOVersion(r io.ReaderAt) (string, error) {
	pvd := make([]byte, isoSector)
	if _, err := r.ReadAt(pvd, 16*isoSector); err != nil {
		return "", fmt.Errorf("%w: read volume descriptor: %w", ErrNoVersion, err)
	}
	if pvd[0] != 1 || string(pvd[1:6]) != "CD001" {
		return "", fmt.Errorf("%w: no primary volume descriptor", ErrNoVersion)
	}
	if bs := binary.LittleEndian.Uint16(pvd[128:]); bs != isoSector {
		return "", fmt.Errorf("%w: block size %d", ErrNoVersion, bs)
	}
	root := pvd[156 : 156+34]
	dirLBA, dirLen := binary.LittleEndian.Uint32(root[2:]), binary.LittleEndian.Uint32(root[10:])
	if dirLen > 64*isoSector {
		return "", fmt.Errorf("%w: root directory of %d bytes", ErrNoVersion, dirLen)
	}
	dir := make([]byte, dirLen)
	if _, err := r.ReadAt(dir, int64(dirLBA)*isoSector); err != nil {
		return "", fmt.Errorf("%w: read root directory: %w", ErrNoVersion, err)
	}
	for off := 0; off < len(dir); {
		n := int(dir[off])
		if n == 0 {
			// Records do not cross sectors: the rest of this one is padding.
			off = (off/isoSector + 1) * isoSector
			continue
		}
		if n < 34 || off+n > len(dir) || 33+int(dir[off+32]) > n {
			return "", fmt.Errorf("%w: bad directory record at %d", ErrNoVersion, off)
		}
		rec := dir[off : off+n]
		off += n
		name := string(rec[33 : 33+int(rec[32])])
		name, _, _ = strings.Cut(name, ";")
		if rec[25]&2 != 0 || !strings.EqualFold(strings.TrimSuffix(name, "."), isoVersionFile) {
			continue
		}
		size := binary.LittleEndian.Uint32(rec[10:])
		if size > maxVersionLen {
			return "", fmt.Errorf("%w: VERSION of %d bytes", ErrNoVersion, size)
		}
		data := make([]byte, size)
		if _, err := r.ReadAt(data, int64(binary.LittleEndian.Uint32(rec[2:]))*isoSector); err != nil {
			return "", fmt.Errorf("%w: read VERSION: %w", ErrNoVersion, err)
		}
		v := strings.TrimSpace(string(data))
		if v == "" {
			return "", fmt.Errorf("%w: VERSION is empty", ErrNoVersion)
		}
		return v, nil
	}
	return "", ErrNoVersion
}

// BuildISO writes an ISO9660 image holding VERSION (version and a newline)
// at path, replacing what is there only once the new image is complete. The
// image is the same bytes for the same version, so a driver may build it
// again rather than track whether it exists.
func BuildISO(path, version string) error {
	if version == "" || len(version) > maxVersionLen-1 || strings.ContainsAny(version, " \t\r\n") {
		return fmt.Errorf("build iso: bad version %q", version)
	}
	img := isoImage(version)
	tmp, err := os.CreateTemp(filepath.Dir(path), ".iso-*")
	if err != nil {
		return fmt.Errorf("build iso: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(img); err != nil {
		tmp.Close()
		return fmt.Errorf("build iso: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("build iso: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("build iso: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("build iso: %w", err)
	}
	return nil
}

// isoImage lays out: system area (sectors 0-15), primary volume descriptor
// (16), terminator (17), little- and big-endian path tables (18, 19), root
// directory (20), VERSION's data (21).
func isoImage(version string) []byte {
	content := []byte(version + "\n")
	const pvdLBA, termLBA, lPathLBA, mPathLBA, rootLBA, fileLBA = 16, 17, 18, 19, 20, 21
	total := fileLBA + (len(content)+isoSector-1)/isoSector
	img := make([]byte, total*isoSector)

	both32 := func(b []byte, v uint32) {
		binary.LittleEndian.PutUint32(b, v)
		binary.BigEndian.PutUint32(b[4:], v)
	}
	both16 := func(b []byte, v uint16) {
		binary.LittleEndian.PutUint16(b, v)
		binary.BigEndian.PutUint16(b[2:], v)
	}
	padded := func(b []byte, s string) {
		copy(b, s+strings.Repeat(" ", len(b)-len(s)))
	}
	dirRecord := func(name []byte, lba, size uint32, dir bool) []byte {
		n := 33 + len(name)
		if n%2 == 1 {
			n++
		}
		rec := make([]byte, n)
		rec[0] = byte(n)
		both32(rec[2:], lba)
		both32(rec[10:], size)
		// Recording date: 2000-01-01 00:00:00 UTC, fixed so the image is
		// reproducible.
		copy(rec[18:], []byte{100, 1, 1, 0, 0, 0, 0})
		if dir {
			rec[25] = 2
		}
		both16(rec[28:], 1)
		rec[32] = byte(len(name))
		copy(rec[33:], name)
		return rec
	}
	noDate := "0000000000000000\x00"

	pvd := img[pvdLBA*isoSector:]
	pvd[0], pvd[6] = 1, 1
	copy(pvd[1:], "CD001")
	padded(pvd[8:40], "LINUX")
	padded(pvd[40:72], "CLUSTERD")
	both32(pvd[80:], uint32(total))
	both16(pvd[120:], 1)
	both16(pvd[124:], 1)
	both16(pvd[128:], isoSector)
	both32(pvd[132:], 10)
	binary.LittleEndian.PutUint32(pvd[140:], lPathLBA)
	binary.BigEndian.PutUint32(pvd[148:], mPathLBA)
	copy(pvd[156:190], dirRecord([]byte{0}, rootLBA, isoSector, true))
	for _, f := range [][2]int{{190, 128}, {318, 128}, {446, 128}, {574, 128}, {702, 37}, {739, 37}, {776, 37}} {
		padded(pvd[f[0]:f[0]+f[1]], "")
	}
	padded(pvd[574:702], "CLUSTERD")
	for _, at := range []int{813, 830, 847, 864} {
		copy(pvd[at:], noDate)
	}
	pvd[881] = 1

	term := img[termLBA*isoSector:]
	term[0], term[6] = 255, 1
	copy(term[1:], "CD001")

	// Path tables: the root only (name length 1, name 0, parent 1).
	l := img[lPathLBA*isoSector:]
	l[0] = 1
	binary.LittleEndian.PutUint32(l[2:], rootLBA)
	binary.LittleEndian.PutUint16(l[6:], 1)
	m := img[mPathLBA*isoSector:]
	m[0] = 1
	binary.BigEndian.PutUint32(m[2:], rootLBA)
	binary.BigEndian.PutUint16(m[6:], 1)

	var root bytes.Buffer
	root.Write(dirRecord([]byte{0}, rootLBA, isoSector, true))
	root.Write(dirRecord([]byte{1}, rootLBA, isoSector, true))
	root.Write(dirRecord([]byte(isoVersionFile+".;1"), fileLBA, uint32(len(content)), false))
	copy(img[rootLBA*isoSector:], root.Bytes())
	copy(img[fileLBA*isoSector:], content)
	return img
}
