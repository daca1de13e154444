package main

import (
	"log"
	"syscall"
)

// powerOff flushes what the agent wrote and turns the machine off: as the
// guest's PID 1 the agent is its init, and a graceful shutdown (ACPI) that
// nobody answers would leave the host to wait and then pull the plug.
func powerOff() {
	log.Print("power button pressed: powering off")
	syscall.Sync()
	if err := syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		log.Printf("power off: %v", err)
	}
}
