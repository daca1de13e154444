//go:build !linux

package e2e

import "os/exec"

// dieWithParent does nothing here: only Linux kills a child with its
// parent; t.Cleanup still kills the servers of tests that end normally.
func dieWithParent(*exec.Cmd) {}
