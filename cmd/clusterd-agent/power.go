package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Linux input events (linux/input.h, linux/input-event-codes.h): what the
// ACPI power button (the kernel's button driver, read through evdev)
// reports when libvirt asks the guest to shut down (virsh shutdown sends
// QEMU's system_powerdown, an ACPI power-button press).
const (
	evKey    = 0x01
	keyPower = 116
	// inputEventSize is struct input_event on 64-bit Linux: a timeval of
	// two 64-bit words, then type (u16), code (u16) and value (s32).
	inputEventSize = 24
)

// powerPressed reads input events from r until the power key is pressed
// (nil) or r fails (its error; io.EOF at its end).
func powerPressed(r io.Reader) error {
	buf := make([]byte, inputEventSize)
	for {
		if _, err := io.ReadFull(r, buf); err != nil {
			return err
		}
		typ := binary.LittleEndian.Uint16(buf[16:])
		code := binary.LittleEndian.Uint16(buf[18:])
		value := int32(binary.LittleEndian.Uint32(buf[20:]))
		if typ == evKey && code == keyPower && value == 1 {
			return nil
		}
	}
}

// watchPowerButton calls press once the power key is pressed on any input
// device in dir (/dev/input/event*), looking for new devices every second
// while ctx lasts: the button's device appears once init has loaded the
// button and evdev modules, which may be after the agent starts. It
// returns once ctx is done or press has returned, its readers ended.
func watchPowerButton(ctx context.Context, dir string, press func()) {
	pressed := make(chan struct{}, 1)
	watched := map[string]bool{}
	var open []*os.File
	var readers sync.WaitGroup
	defer func() {
		for _, f := range open {
			f.Close()
		}
		readers.Wait()
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		devs, _ := filepath.Glob(filepath.Join(dir, "event*"))
		for _, dev := range devs {
			if watched[dev] {
				continue
			}
			f, err := os.Open(dev)
			if err != nil {
				continue // tried again on the next tick
			}
			watched[dev] = true
			open = append(open, f)
			readers.Add(1)
			go func() {
				defer readers.Done()
				err := powerPressed(f)
				if err == nil {
					select {
					case pressed <- struct{}{}:
					default:
					}
					return
				}
				if !errors.Is(err, os.ErrClosed) {
					log.Print(fmt.Errorf("input device %s: %w", dev, err))
				}
			}()
		}
		select {
		case <-ctx.Done():
			return
		case <-pressed:
			press()
			return
		case <-tick.C:
		}
	}
}
