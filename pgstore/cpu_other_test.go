//go:build !linux

package pgstore

import (
	"errors"
	"time"
)

func backendCPU(int) (time.Duration, error) {
	return 0, errors.New("backend CPU time is read from /proc (Linux only)")
}

func serverCPU() (time.Duration, error) {
	return 0, errors.New("server CPU time is read from /proc (Linux only)")
}

func processCPU() time.Duration { return 0 }
