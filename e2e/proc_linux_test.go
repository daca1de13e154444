package e2e

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill the server if the test binary dies
// (a test timeout's panic skips t.Cleanup), so no clusterd is left running.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
