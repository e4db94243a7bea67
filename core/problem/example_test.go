package problem_test

import (
	"fmt"

	"github.com/idemkit/idem/core/problem"
)

// A non-HTTP adapter maps a refusal's problem name to its status.
func ExampleLookup() {
	d, ok := problem.Lookup(problem.InFlight)
	fmt.Println(ok, d.Status, d.Type)
	// Output: true 409 https://idemkit.dev/problems/in-flight
}
