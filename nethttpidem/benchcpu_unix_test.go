//go:build unix

package nethttpidem_test

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user + system, all threads, GC included) the
// process has used so far, or -1 if unknown. Per-operation CPU time is
// steadier than wall time on a shared machine.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
