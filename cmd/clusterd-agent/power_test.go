package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// event encodes one struct input_event as the kernel's evdev delivers it.
func event(typ, code uint16, value int32) []byte {
	b := make([]byte, inputEventSize)
	binary.LittleEndian.PutUint16(b[16:], typ)
	binary.LittleEndian.PutUint16(b[18:], code)
	binary.LittleEndian.PutUint32(b[20:], uint32(value))
	return b
}

func TestPowerPressedOnlyByThePowerKeysPress(t *testing.T) {
	const evSyn, keyA = 0x00, 30
	noise := bytes.Join([][]byte{
		event(evKey, keyA, 1),     // another key
		event(evKey, keyPower, 0), // the power key released
		event(evSyn, 0, 0),
		event(0x02, keyPower, 1), // a relative axis, not a key
	}, nil)
	if err := powerPressed(bytes.NewReader(noise)); !errors.Is(err, io.EOF) {
		t.Fatalf("events without a power key press: %v; want io.EOF", err)
	}
	withPress := append(append([]byte{}, noise...), event(evKey, keyPower, 1)...)
	if err := powerPressed(bytes.NewReader(withPress)); err != nil {
		t.Fatalf("events ending in a power key press: %v; want it found", err)
	}
	if err := powerPressed(bytes.NewReader(event(evKey, keyPower, 1)[:10])); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a torn event: %v; want io.ErrUnexpectedEOF", err)
	}
}

// TestWatchPowerButtonFindsALateDevice: the button's device may appear
// after the agent starts; a press on it is seen, one on no device is not.
func TestWatchPowerButtonFindsALateDevice(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "event0"), event(evKey, 30, 1), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pressed := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchPowerButton(ctx, dir, func() { close(pressed) })
	}()
	select {
	case <-pressed:
		t.Fatal("power off without a power key press")
	case <-time.After(1500 * time.Millisecond): // the watcher has looked at least once
	}
	if err := os.WriteFile(filepath.Join(dir, "event1"), event(evKey, keyPower, 1), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-pressed:
	case <-ctx.Done():
		t.Fatal("the press on a device that appeared later was not seen")
	}
	<-done
}
