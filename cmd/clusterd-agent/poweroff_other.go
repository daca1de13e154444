//go:build !linux

package main

import "log"

// powerOff is a no-op off Linux: the agent is a guest's init only there.
func powerOff() { log.Print("power button pressed: power off needs Linux") }
