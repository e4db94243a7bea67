// Package assert reports a failed check with t.Errorf and lets the test go on: the subset of
// testify's assert API used by the root module's tests (see internal/testkit).
package assert

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"time"
)

// TestingT is what the checks need of a *testing.T.
type TestingT interface {
	Errorf(format string, args ...any)
}

type helper interface{ Helper() }

// Fail reports failure with the check's own message followed by the caller's message.
func Fail(t TestingT, failure string, msgAndArgs ...any) bool {
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if m := message(msgAndArgs...); m != "" {
		failure += "\n\tmessage: " + m
	}
	t.Errorf("\n%s", failure)
	return false
}

func message(msgAndArgs ...any) string {
	switch len(msgAndArgs) {
	case 0:
		return ""
	case 1:
		if s, ok := msgAndArgs[0].(string); ok {
			return s
		}
		return fmt.Sprintf("%+v", msgAndArgs[0])
	default:
		if f, ok := msgAndArgs[0].(string); ok {
			return fmt.Sprintf(f, msgAndArgs[1:]...)
		}
		return fmt.Sprintf("%+v", msgAndArgs)
	}
}

// ObjectsAreEqual is testify's equality: bytes.Equal for []byte, reflect.DeepEqual otherwise.
func ObjectsAreEqual(expected, actual any) bool {
	if expected == nil || actual == nil {
		return expected == actual
	}
	exp, ok := expected.([]byte)
	if !ok {
		return reflect.DeepEqual(expected, actual)
	}
	act, ok := actual.([]byte)
	if !ok {
		return false
	}
	if exp == nil || act == nil {
		return exp == nil && act == nil
	}
	return bytes.Equal(exp, act)
}

func objectsAreEqualValues(expected, actual any) bool {
	if ObjectsAreEqual(expected, actual) {
		return true
	}
	if expected == nil || actual == nil {
		return false
	}
	ev, av := reflect.ValueOf(expected), reflect.ValueOf(actual)
	if !ev.Type().ConvertibleTo(av.Type()) || !av.Type().ConvertibleTo(ev.Type()) {
		return false
	}
	// Convert both ways so a narrowing conversion (300 -> uint8) cannot make unequal values equal.
	return reflect.DeepEqual(ev.Convert(av.Type()).Interface(), actual) &&
		reflect.DeepEqual(av.Convert(ev.Type()).Interface(), expected)
}

func diff(expected, actual any) string {
	return fmt.Sprintf("expected: %#v\n\tactual  : %#v", expected, actual)
}

// Equal asserts expected and actual are equal (ObjectsAreEqual).
func Equal(t TestingT, expected, actual any, msgAndArgs ...any) bool {
	if ObjectsAreEqual(expected, actual) {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, "Not equal:\n\t"+diff(expected, actual), msgAndArgs...)
}

// EqualValues asserts equality after converting to the same type.
func EqualValues(t TestingT, expected, actual any, msgAndArgs ...any) bool {
	if objectsAreEqualValues(expected, actual) {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, "Not equal (values):\n\t"+diff(expected, actual), msgAndArgs...)
}

// NotEqual asserts the values differ.
func NotEqual(t TestingT, expected, actual any, msgAndArgs ...any) bool {
	if !ObjectsAreEqual(expected, actual) {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, fmt.Sprintf("Should not be: %#v", actual), msgAndArgs...)
}

// Same asserts two pointers point at the same object.
func Same(t TestingT, expected, actual any, msgAndArgs ...any) bool {
	ev, av := reflect.ValueOf(expected), reflect.ValueOf(actual)
	if ev.Kind() == reflect.Pointer && av.Kind() == reflect.Pointer && ev.Type() == av.Type() && ev.Pointer() == av.Pointer() {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, fmt.Sprintf("Not same: %p %#v and %p %#v", expected, expected, actual, actual), msgAndArgs...)
}

// True asserts value is true.
func True(t TestingT, value bool, msgAndArgs ...any) bool {
	if value {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, "Should be true", msgAndArgs...)
}

// False asserts value is false.
func False(t TestingT, value bool, msgAndArgs ...any) bool {
	if !value {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, "Should be false", msgAndArgs...)
}

func isNil(object any) bool {
	if object == nil {
		return true
	}
	v := reflect.ValueOf(object)
	switch v.Kind() {
	case reflect.Chan, reflect.Func, reflect.Interface, reflect.Map, reflect.Pointer, reflect.Slice, reflect.UnsafePointer:
		return v.IsNil()
	}
	return false
}

// Nil asserts object is nil (or a nil pointer, map, slice, ...).
func Nil(t TestingT, object any, msgAndArgs ...any) bool {
	if isNil(object) {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, fmt.Sprintf("Expected nil, but got: %#v", object), msgAndArgs...)
}

// NotNil asserts object is not nil.
func NotNil(t TestingT, object any, msgAndArgs ...any) bool {
	if !isNil(object) {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, "Expected value not to be nil.", msgAndArgs...)
}

func isEmpty(object any) bool {
	if object == nil {
		return true
	}
	v := reflect.ValueOf(object)
	switch v.Kind() {
	case reflect.Chan, reflect.Map, reflect.Slice, reflect.String, reflect.Array:
		return v.Len() == 0
	case reflect.Pointer:
		if v.IsNil() {
			return true
		}
		return isEmpty(v.Elem().Interface())
	}
	return v.IsZero()
}

// Empty asserts object is its zero value or has length zero.
func Empty(t TestingT, object any, msgAndArgs ...any) bool {
	if isEmpty(object) {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, fmt.Sprintf("Should be empty, but was %#v", object), msgAndArgs...)
}

// NotEmpty asserts object is neither zero nor of length zero.
func NotEmpty(t TestingT, object any, msgAndArgs ...any) bool {
	if !isEmpty(object) {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, fmt.Sprintf("Should NOT be empty, but was %#v", object), msgAndArgs...)
}

// Zero asserts i is the zero value of its type.
func Zero(t TestingT, i any, msgAndArgs ...any) bool {
	if i == nil || reflect.ValueOf(i).IsZero() {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, fmt.Sprintf("Should be zero, but was %#v", i), msgAndArgs...)
}

// Len asserts object has length n.
func Len(t TestingT, object any, n int, msgAndArgs ...any) bool {
	v := reflect.ValueOf(object)
	switch v.Kind() {
	case reflect.Chan, reflect.Map, reflect.Slice, reflect.String, reflect.Array:
		if v.Len() == n {
			return true
		}
		if h, ok := t.(helper); ok {
			h.Helper()
		}
		return Fail(t, fmt.Sprintf("%#v should have %d item(s), but has %d", object, n, v.Len()), msgAndArgs...)
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, fmt.Sprintf("could not apply len() to %#v", object), msgAndArgs...)
}

// contains reports (found, ok): ok is false when container cannot hold element.
func contains(container, element any) (found, ok bool) {
	v := reflect.ValueOf(container)
	switch v.Kind() {
	case reflect.String:
		e, isStr := element.(string)
		if !isStr {
			return false, false
		}
		return strings.Contains(v.String(), e), true
	case reflect.Map:
		for _, k := range v.MapKeys() {
			if ObjectsAreEqual(k.Interface(), element) {
				return true, true
			}
		}
		return false, true
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if ObjectsAreEqual(v.Index(i).Interface(), element) {
				return true, true
			}
		}
		return false, true
	}
	return false, false
}

// Contains asserts s (string, slice, array or map keys) contains element.
func Contains(t TestingT, s, element any, msgAndArgs ...any) bool {
	found, ok := contains(s, element)
	if ok && found {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !ok {
		return Fail(t, fmt.Sprintf("%#v could not be applied builtin len()", s), msgAndArgs...)
	}
	return Fail(t, fmt.Sprintf("%#v does not contain %#v", s, element), msgAndArgs...)
}

// NotContains asserts s does not contain element.
func NotContains(t TestingT, s, element any, msgAndArgs ...any) bool {
	found, ok := contains(s, element)
	if ok && !found {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	if !ok {
		return Fail(t, fmt.Sprintf("%#v could not be applied builtin len()", s), msgAndArgs...)
	}
	return Fail(t, fmt.Sprintf("%#v should not contain %#v", s, element), msgAndArgs...)
}

// compare returns -1, 0 or 1 for two values of the same ordered kind; ok is false otherwise.
func compare(a, b any) (int, bool) {
	av, bv := reflect.ValueOf(a), reflect.ValueOf(b)
	if !av.IsValid() || !bv.IsValid() || av.Type() != bv.Type() {
		return 0, false
	}
	if ta, ok := a.(time.Time); ok {
		return ta.Compare(b.(time.Time)), true
	}
	switch av.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		x, y := av.Int(), bv.Int()
		return cmp3(x < y, x > y), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		x, y := av.Uint(), bv.Uint()
		return cmp3(x < y, x > y), true
	case reflect.Float32, reflect.Float64:
		x, y := av.Float(), bv.Float()
		return cmp3(x < y, x > y), true
	case reflect.String:
		x, y := av.String(), bv.String()
		return cmp3(x < y, x > y), true
	}
	return 0, false
}

func cmp3(less, greater bool) int {
	switch {
	case less:
		return -1
	case greater:
		return 1
	}
	return 0
}

func ordered(t TestingT, e1, e2 any, ok func(int) bool, rel string, msgAndArgs ...any) bool {
	c, comparable := compare(e1, e2)
	if comparable && ok(c) {
		return true
	}
	if h, isH := t.(helper); isH {
		h.Helper()
	}
	if !comparable {
		return Fail(t, fmt.Sprintf("cannot compare %#v and %#v (need the same ordered type)", e1, e2), msgAndArgs...)
	}
	return Fail(t, fmt.Sprintf("\"%v\" is not %s \"%v\"", e1, rel, e2), msgAndArgs...)
}

// Greater asserts e1 > e2 (same ordered type).
func Greater(t TestingT, e1, e2 any, msgAndArgs ...any) bool {
	return ordered(t, e1, e2, func(c int) bool { return c > 0 }, "greater than", msgAndArgs...)
}

// GreaterOrEqual asserts e1 >= e2.
func GreaterOrEqual(t TestingT, e1, e2 any, msgAndArgs ...any) bool {
	return ordered(t, e1, e2, func(c int) bool { return c >= 0 }, "greater than or equal to", msgAndArgs...)
}

// Less asserts e1 < e2.
func Less(t TestingT, e1, e2 any, msgAndArgs ...any) bool {
	return ordered(t, e1, e2, func(c int) bool { return c < 0 }, "less than", msgAndArgs...)
}

// Positive asserts e > 0.
func Positive(t TestingT, e any, msgAndArgs ...any) bool {
	zero := reflect.Zero(reflect.TypeOf(e)).Interface()
	return ordered(t, e, zero, func(c int) bool { return c > 0 }, "greater than", msgAndArgs...)
}

// NoError asserts err is nil.
func NoError(t TestingT, err error, msgAndArgs ...any) bool {
	if err == nil {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, fmt.Sprintf("Received unexpected error:\n\t%+v", err), msgAndArgs...)
}

// Error asserts err is not nil.
func Error(t TestingT, err error, msgAndArgs ...any) bool {
	if err != nil {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, "An error is expected but got nil.", msgAndArgs...)
}

// ErrorIs asserts errors.Is(err, target).
func ErrorIs(t TestingT, err, target error, msgAndArgs ...any) bool {
	if errors.Is(err, target) {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, fmt.Sprintf("Target error should be in err chain:\n\texpected: %v\n\tin chain: %v", target, err), msgAndArgs...)
}

// ErrorAs asserts errors.As(err, target).
func ErrorAs(t TestingT, err error, target any, msgAndArgs ...any) bool {
	if errors.As(err, target) {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, fmt.Sprintf("Should be in error chain:\n\texpected: %T\n\tin chain: %v", target, err), msgAndArgs...)
}

// WithinDuration asserts |expected - actual| <= delta.
func WithinDuration(t TestingT, expected, actual time.Time, delta time.Duration, msgAndArgs ...any) bool {
	d := expected.Sub(actual)
	if d >= -delta && d <= delta {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, fmt.Sprintf("Max difference between %v and %v allowed is %v, but difference was %v", expected, actual, delta, d), msgAndArgs...)
}

// Regexp asserts str matches rx (a string or *regexp.Regexp).
func Regexp(t TestingT, rx, str any, msgAndArgs ...any) bool {
	r, ok := rx.(*regexp.Regexp)
	if !ok {
		r = regexp.MustCompile(fmt.Sprint(rx))
	}
	if r.MatchString(fmt.Sprint(str)) {
		return true
	}
	if h, ok := t.(helper); ok {
		h.Helper()
	}
	return Fail(t, fmt.Sprintf("Expect \"%v\" to match \"%v\"", str, r), msgAndArgs...)
}

// NotPanics asserts f does not panic.
func NotPanics(t TestingT, f func(), msgAndArgs ...any) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			if h, isH := t.(helper); isH {
				h.Helper()
			}
			ok = Fail(t, fmt.Sprintf("func %p should not panic\n\tpanic value: %v", f, r), msgAndArgs...)
		}
	}()
	f()
	return true
}

// Eventually asserts condition returns true within waitFor, checking every tick.
func Eventually(t TestingT, condition func() bool, waitFor, tick time.Duration, msgAndArgs ...any) bool {
	deadline := time.Now().Add(waitFor)
	for {
		if condition() {
			return true
		}
		if time.Now().After(deadline) {
			if h, ok := t.(helper); ok {
				h.Helper()
			}
			return Fail(t, "Condition never satisfied", msgAndArgs...)
		}
		time.Sleep(tick)
	}
}
