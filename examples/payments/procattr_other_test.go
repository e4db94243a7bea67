//go:build !linux

package main

import "os/exec"

// killWithParent has no portable equivalent outside Linux; t.Cleanup still
// stops the child on every normal exit of the test.
func killWithParent(*exec.Cmd) {}
