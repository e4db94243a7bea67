// Command racedemo shows, in a few seconds, the bug idem exists to fix. It
// serves one payment handler, whose provider call takes ~200ms, behind the
// common "cache the response" middleware and behind idem (nethttpidem +
// memstore), each on its own 127.0.0.1 port, fires the same burst of
// concurrent duplicates (same Idempotency-Key, same body) at each, and
// prints how many times each charged the card. It then sends the key once
// more with a different amount: the cache replays the wrong receipt, idem
// answers 422.
//
//	go run ./examples/racedemo [-n 20] [-latency 200ms]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	var cfg Config
	flag.IntVar(&cfg.N, "n", 20, "concurrent duplicates in the burst")
	flag.DurationVar(&cfg.Latency, "latency", 200*time.Millisecond, "payment provider latency")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rep.Print(os.Stdout)
}
