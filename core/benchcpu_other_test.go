//go:build !unix

package core_test

import "time"

func processCPU() time.Duration { return -1 }
