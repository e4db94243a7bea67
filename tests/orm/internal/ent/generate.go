// Package ent is the ent client of the orm tests, generated from ./schema
// (go generate, with entgo.io/ent's command at the version tests/go.mod
// requires).
package ent

//go:generate go run -mod=mod entgo.io/ent/cmd/ent generate ./schema
