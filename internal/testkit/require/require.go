// Package require is package assert that stops the test (t.FailNow) on the first failed check:
// the subset of testify's require API used by the root module's tests (see internal/testkit).
// Like testify's, call it only from the test's own goroutine.
package require

import (
	"time"

	"github.com/idemkit/idem/internal/testkit/assert"
)

// TestingT is what the checks need of a *testing.T.
type TestingT interface {
	Errorf(format string, args ...any)
	FailNow()
}

type helper interface{ Helper() }

// Equal asserts expected and actual are equal (ObjectsAreEqual).
func Equal(t TestingT, expected, actual any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.Equal(t, expected, actual, msgAndArgs...) {
		t.FailNow()
	}
}

// EqualValues asserts equality after converting to the same type.
func EqualValues(t TestingT, expected, actual any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.EqualValues(t, expected, actual, msgAndArgs...) {
		t.FailNow()
	}
}

// NotEqual asserts the values differ.
func NotEqual(t TestingT, expected, actual any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.NotEqual(t, expected, actual, msgAndArgs...) {
		t.FailNow()
	}
}

// Same asserts two pointers point at the same object.
func Same(t TestingT, expected, actual any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.Same(t, expected, actual, msgAndArgs...) {
		t.FailNow()
	}
}

// True asserts value is true.
func True(t TestingT, value bool, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.True(t, value, msgAndArgs...) {
		t.FailNow()
	}
}

// False asserts value is false.
func False(t TestingT, value bool, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.False(t, value, msgAndArgs...) {
		t.FailNow()
	}
}

// Nil asserts object is nil (or a nil pointer, map, slice, ...).
func Nil(t TestingT, object any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.Nil(t, object, msgAndArgs...) {
		t.FailNow()
	}
}

// NotNil asserts object is not nil.
func NotNil(t TestingT, object any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.NotNil(t, object, msgAndArgs...) {
		t.FailNow()
	}
}

// Empty asserts object is its zero value or has length zero.
func Empty(t TestingT, object any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.Empty(t, object, msgAndArgs...) {
		t.FailNow()
	}
}

// NotEmpty asserts object is neither zero nor of length zero.
func NotEmpty(t TestingT, object any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.NotEmpty(t, object, msgAndArgs...) {
		t.FailNow()
	}
}

// Zero asserts i is the zero value of its type.
func Zero(t TestingT, i any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.Zero(t, i, msgAndArgs...) {
		t.FailNow()
	}
}

// Len asserts object has length n.
func Len(t TestingT, object any, n int, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.Len(t, object, n, msgAndArgs...) {
		t.FailNow()
	}
}

// Contains asserts s (string, slice, array or map keys) contains element.
func Contains(t TestingT, s, element any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.Contains(t, s, element, msgAndArgs...) {
		t.FailNow()
	}
}

// NotContains asserts s does not contain element.
func NotContains(t TestingT, s, element any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.NotContains(t, s, element, msgAndArgs...) {
		t.FailNow()
	}
}

// Greater asserts e1 > e2 (same ordered type).
func Greater(t TestingT, e1, e2 any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.Greater(t, e1, e2, msgAndArgs...) {
		t.FailNow()
	}
}

// GreaterOrEqual asserts e1 >= e2.
func GreaterOrEqual(t TestingT, e1, e2 any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.GreaterOrEqual(t, e1, e2, msgAndArgs...) {
		t.FailNow()
	}
}

// Less asserts e1 < e2.
func Less(t TestingT, e1, e2 any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.Less(t, e1, e2, msgAndArgs...) {
		t.FailNow()
	}
}

// Positive asserts e > 0.
func Positive(t TestingT, e any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.Positive(t, e, msgAndArgs...) {
		t.FailNow()
	}
}

// NoError asserts err is nil.
func NoError(t TestingT, err error, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.NoError(t, err, msgAndArgs...) {
		t.FailNow()
	}
}

// Error asserts err is not nil.
func Error(t TestingT, err error, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.Error(t, err, msgAndArgs...) {
		t.FailNow()
	}
}

// ErrorIs asserts errors.Is(err, target).
func ErrorIs(t TestingT, err, target error, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.ErrorIs(t, err, target, msgAndArgs...) {
		t.FailNow()
	}
}

// ErrorAs asserts errors.As(err, target).
func ErrorAs(t TestingT, err error, target any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.ErrorAs(t, err, target, msgAndArgs...) {
		t.FailNow()
	}
}

// WithinDuration asserts |expected - actual| <= delta.
func WithinDuration(t TestingT, expected, actual time.Time, delta time.Duration, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.WithinDuration(t, expected, actual, delta, msgAndArgs...) {
		t.FailNow()
	}
}

// Regexp asserts str matches rx (a string or *regexp.Regexp).
func Regexp(t TestingT, rx, str any, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.Regexp(t, rx, str, msgAndArgs...) {
		t.FailNow()
	}
}

// NotPanics asserts f does not panic.
func NotPanics(t TestingT, f func(), msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.NotPanics(t, f, msgAndArgs...) {
		t.FailNow()
	}
}

// Eventually asserts condition returns true within waitFor, checking every tick.
func Eventually(t TestingT, condition func() bool, waitFor, tick time.Duration, msgAndArgs ...any) {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !assert.Eventually(t, condition, waitFor, tick, msgAndArgs...) {
		t.FailNow()
	}
}
