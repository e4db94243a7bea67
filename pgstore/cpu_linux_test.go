package pgstore

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// backendCPU is the time the process pid (a PostgreSQL backend on this
// machine) has spent on a CPU, from /proc/<pid>/schedstat (nanoseconds).
func backendCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
	if err != nil {
		return 0, err
	}
	f := bytes.Fields(b)
	if len(f) == 0 {
		return 0, fmt.Errorf("schedstat of %d: empty", pid)
	}
	ns, err := strconv.ParseInt(string(f[0]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("schedstat of %d: %w", pid, err)
	}
	return time.Duration(ns), nil
}

// serverCPU is the time all PostgreSQL processes on this machine (backends,
// WAL writer, checkpointer, ...) have spent on a CPU; processes that exit
// in between are lost, so measure with a pool whose connections stay open.
func serverCPU() (time.Duration, error) {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var total time.Duration
	found := false
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile("/proc/" + d.Name() + "/comm")
		if err != nil || string(bytes.TrimSpace(comm)) != "postgres" {
			continue
		}
		t, err := backendCPU(pid)
		if err != nil {
			continue // exited
		}
		total += t
		found = true
	}
	if !found {
		return 0, fmt.Errorf("no postgres process on this machine")
	}
	return total, nil
}

// processCPU is the CPU time (user + system, all threads, GC included) the
// test process has used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
