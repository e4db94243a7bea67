// Package fleet holds the tests of a mixed-framework fleet: the six
// adapters (echo v4 and v5, fiber v2 and v3 count apart; and
// examples/payments processes with different -framework flags) serving one
// route set on one shared PostgreSQL schema, where a key first served by
// any of them replays byte-identically through every other and an in-flight
// duplicate through another gets 409, never 422. It also checks that the
// adapters hold no flow of their own. It lives under internal/ because it
// imports every adapter (no import cycles) and is not API.
package fleet
