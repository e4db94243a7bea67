// Package doccheck holds tests that keep the user-facing documentation
// honest: every program the README links is a function that exists (and
// CI compiles and runs it as a godoc example), every file it links exists,
// no document cites a design file users do not have, and speed figures
// stay in BENCHMARKS.md, next to the command that measured them.
package doccheck
