//go:build unix

package lease

import (
	"errors"
	"syscall"
)

// processAlive reports whether a process with this pid exists on this host.
// Only "no such process" counts as gone; a process we may not signal exists.
func processAlive(pid int) bool {
	return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
