//go:build !unix

package nethttpidem_test

import "time"

func processCPU() time.Duration { return -1 }
