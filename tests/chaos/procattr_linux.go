package chaos

import (
	"os/exec"
	"syscall"
)

// killWithParent makes the kernel kill the child if the test binary dies
// (a timeout panic skips t.Cleanup), so no instance outlives the test.
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
