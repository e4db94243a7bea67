package storekit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/core/internal/redact"
)

// ErrLeaseLive is returned by Admin.Release for a record whose owner's
// lease is still running: releasing it could let a retry run beside a live
// owner. Release it anyway only when the owner is known dead.
var ErrLeaseLive = errors.New("idem: lease still live")

// AdminRecord is a record as an operator sees it: the record, and what the
// store knows besides.
type AdminRecord struct {
	Record
	// CompletedAt is when the record completed (zero otherwise).
	CompletedAt time.Time
	// Waiters: a duplicate in wait mode asked to be woken (stores with
	// Watcher).
	Waiters bool
	// Now is the store's clock when the record was read: compare
	// LockedUntil and ExpiresAt with it, never with the caller's clock.
	Now time.Time
}

// Stuck reports a processing record whose lease has lapsed: its owner
// stopped heartbeating (crashed, or cut off from the store).
func (r AdminRecord) Stuck() bool {
	return r.Status == StatusProcessing && !r.LockedUntil.After(r.Now)
}

// StatusCount is the number of records in one status, by age.
type StatusCount struct {
	Status Status
	Count  int64
	// By age since CreatedAt: under a minute, an hour, a day, and older.
	UnderMinute, UnderHour, UnderDay, Older int64
	// Expired counts records past ExpiresAt (the key is new again; Sweep or
	// Maintain deletes them after the retention margin).
	Expired int64
	// Stuck counts processing records whose lease lapsed.
	Stuck int64
	// Oldest is the earliest CreatedAt (zero when Count is 0).
	Oldest time.Time
}

// Stats is a store's census of its records.
type Stats struct {
	ByStatus []StatusCount
	Now      time.Time // the store's clock
}

// Admin is an optional Store capability for operators (cmd/idemctl): read
// one record with everything the store keeps, list stuck keys, release one,
// count, and run retention. Every instant comes from the store's clock.
type Admin interface {
	// Inspect returns the record for (scope, key), response included, or
	// ErrNotFound.
	Inspect(ctx context.Context, scope, key string) (AdminRecord, error)
	// Stuck lists up to limit processing records whose lease lapsed,
	// the longest lapsed first, without their responses.
	Stuck(ctx context.Context, limit int) ([]AdminRecord, error)
	// Release marks the processing record f names failed, so a retry runs
	// it again at once. It is fenced by f.Token like an owner's write: if
	// another request took the record over since it was read, or it is no
	// longer processing, it returns ErrLeaseLost and changes nothing; a
	// stale owner's later Commit then gets ErrLeaseLost (in pgstore's
	// transactional mode its business writes roll back). A record whose
	// lease is still live is refused with ErrLeaseLive unless live is true.
	Release(ctx context.Context, f Fence, live bool) error
	// Stats counts the records by status and age.
	Stats(ctx context.Context) (Stats, error)
	// Sweep deletes up to batch expired records and returns how many.
	Sweep(ctx context.Context, batch int) (int, error)
	// Maintain runs all the store's retention work.
	Maintain(ctx context.Context) error
}

// ReleaseRefused explains why a fenced Release of f matched nothing, from
// the record as read right after it (r; err is that read's error): gone
// (ErrNotFound), still owned by a live lease (ErrLeaseLive, when live is
// false), or taken over or finished since f was read (ErrLeaseLost). Stores
// share it so idemctl sees the same answer from each; they add their name.
func ReleaseRefused(r AdminRecord, err error, f Fence, live bool) error {
	switch {
	case err != nil:
		return err
	case r.Token == f.Token && r.Status == StatusProcessing && !live && r.LockedUntil.After(r.Now):
		return fmt.Errorf("lease runs %v more: %w", r.LockedUntil.Sub(r.Now).Round(time.Millisecond), ErrLeaseLive)
	default:
		return fmt.Errorf("record is %s under token %d, not processing under token %d: %w",
			r.Status, r.Token, f.Token, ErrLeaseLost)
	}
}

// ScrubText returns s with every occurrence of key replaced by
// core.RedactKey(key): verbatim; escaped as Go, JSON, SQL literals and URLs
// escape it (each applied twice); and hex-encoded; and the first 16 bytes
// or more of any of these (text cut short inside the key). A form shorter than 8
// bytes is replaced only where it stands alone ("a" is scrubbed from
// `key "a"`, not from "abort"). Stores and tools pass text from elsewhere
// (a driver's error) through it before it reaches a log or an operator.
func ScrubText(s, key string) string { return redact.Text(s, key) }
