// Package hook carries what pgstore lets its test kits set and no caller
// can: pgstore fills it in when it loads.
package hook

// BatchLimit returns a pgstore.Option that pins the statements of each
// kind in flight at n instead of adapting (see pgstore's batch.go).
var BatchLimit func(n int) any
