package main

import (
	"os/exec"
	"syscall"
)

// killWithParent makes the kernel kill the child if loadgen dies, so no
// server outlives its driver.
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
