//go:build !unix

package fiberidem_test

import "time"

func processCPU() time.Duration { return -1 }
