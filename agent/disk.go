package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync"
)

// DiskStore keeps the agent's state on a raw block device (or file) with no
// filesystem, so the node image needs no mkfs and no filesystem driver. The
// device holds two slots, at offset 0 and at slotSize; each save writes the
// slot the last save did not, with a sequence number and a checksum, so a
// machine that loses power in the middle of a save still finds the
// previous state. A device that is all zeros (a new volume) holds no state.
type DiskStore struct {
	// Path is the device, /dev/vda in the guest.
	Path string

	mu  sync.Mutex
	seq uint64 // the sequence number of the newest valid slot, once read
	cur int    // that slot (0 or 1), valid when seq > 0
}

const (
	// slotSize is each slot's share of the device; the device must hold
	// two (a 2 MiB volume does).
	slotSize = 1 << 20
	// diskMagic starts every written slot.
	diskMagic = "CLUSTERD-AGENT/1"
	// slotHeader is magic (16), sequence (8), length (4), CRC-32C (4).
	slotHeader = 32
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Load returns the newest valid slot's data, nil when neither is valid.
func (d *DiskStore) Load() ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f, err := os.Open(d.Path)
	if err != nil {
		return nil, fmt.Errorf("disk store: %w", err)
	}
	defer f.Close()
	var best []byte
	d.seq = 0
	for slot := range 2 {
		seq, data, err := readSlot(f, slot)
		if err != nil {
			return nil, fmt.Errorf("disk store %s: %w", d.Path, err)
		}
		if seq > d.seq {
			d.seq, d.cur, best = seq, slot, data
		}
	}
	return best, nil
}

// Save writes data to the slot the newest state is not in, and syncs.
func (d *DiskStore) Save(data []byte) error {
	if len(data) > slotSize-slotHeader {
		return fmt.Errorf("disk store: state of %d bytes does not fit a slot", len(data))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	f, err := os.OpenFile(d.Path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("disk store: %w", err)
	}
	defer f.Close()
	if d.seq == 0 {
		// Not read yet in this process: find the newest slot first.
		for slot := range 2 {
			seq, _, err := readSlot(f, slot)
			if err != nil {
				return fmt.Errorf("disk store %s: %w", d.Path, err)
			}
			if seq > d.seq {
				d.seq, d.cur = seq, slot
			}
		}
	}
	slot := 0
	if d.seq > 0 {
		slot = 1 - d.cur
	}
	buf := make([]byte, slotHeader+len(data))
	copy(buf, diskMagic)
	binary.LittleEndian.PutUint64(buf[16:], d.seq+1)
	binary.LittleEndian.PutUint32(buf[24:], uint32(len(data)))
	binary.LittleEndian.PutUint32(buf[28:], crc32.Checksum(append(buf[16:28:28], data...), castagnoli))
	copy(buf[slotHeader:], data)
	if _, err := f.WriteAt(buf, int64(slot)*slotSize); err != nil {
		return fmt.Errorf("disk store %s: write: %w", d.Path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("disk store %s: sync: %w", d.Path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("disk store %s: close: %w", d.Path, err)
	}
	d.seq, d.cur = d.seq+1, slot
	return nil
}

// readSlot returns a slot's sequence number and data, or 0 when the slot
// holds no valid state (never written, torn, or a short device).
func readSlot(f *os.File, slot int) (uint64, []byte, error) {
	head := make([]byte, slotHeader)
	if _, err := f.ReadAt(head, int64(slot)*slotSize); err != nil {
		if errors.Is(err, io.EOF) {
			return 0, nil, nil
		}
		return 0, nil, fmt.Errorf("read slot %d: %w", slot, err)
	}
	if !bytes.Equal(head[:16], []byte(diskMagic)) {
		return 0, nil, nil
	}
	n := binary.LittleEndian.Uint32(head[24:])
	if n > slotSize-slotHeader {
		return 0, nil, nil
	}
	data := make([]byte, n)
	if _, err := f.ReadAt(data, int64(slot)*slotSize+slotHeader); err != nil {
		if errors.Is(err, io.EOF) {
			return 0, nil, nil
		}
		return 0, nil, fmt.Errorf("read slot %d: %w", slot, err)
	}
	if crc32.Checksum(append(head[16:28:28], data...), castagnoli) != binary.LittleEndian.Uint32(head[28:]) {
		return 0, nil, nil
	}
	return binary.LittleEndian.Uint64(head[16:]), data, nil
}
