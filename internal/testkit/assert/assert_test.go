package assert

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

type fakeT struct{ failed int }

func (f *fakeT) Errorf(string, ...any) { f.failed++ }

// TestChecks pins that every check passes on a true claim and fails on a false one: a check
// that cannot fail would turn the root module's tests into tests that pass without testing.
func TestChecks(t *testing.T) {
	errA := errors.New("a")
	wrapped := fmt.Errorf("w: %w", errA)
	var target *time.ParseError
	now := time.Now()
	cases := []struct {
		name       string
		pass, fail func(TestingT) bool
	}{
		{"Equal", func(t TestingT) bool { return Equal(t, []byte("x"), []byte("x")) }, func(t TestingT) bool { return Equal(t, 1, int64(1)) }},
		{"EqualValues", func(t TestingT) bool { return EqualValues(t, 1, int64(1)) }, func(t TestingT) bool { return EqualValues(t, 300, uint8(44)) }},
		{"NotEqual", func(t TestingT) bool { return NotEqual(t, 1, 2) }, func(t TestingT) bool { return NotEqual(t, "a", "a") }},
		{"True", func(t TestingT) bool { return True(t, true) }, func(t TestingT) bool { return True(t, false, "msg %d", 1) }},
		{"False", func(t TestingT) bool { return False(t, false) }, func(t TestingT) bool { return False(t, true) }},
		{"Nil", func(t TestingT) bool { return Nil(t, (*int)(nil)) }, func(t TestingT) bool { return Nil(t, 0) }},
		{"NotNil", func(t TestingT) bool { return NotNil(t, &now) }, func(t TestingT) bool { return NotNil(t, []int(nil)) }},
		{"Empty", func(t TestingT) bool { return Empty(t, "") }, func(t TestingT) bool { return Empty(t, []int{1}) }},
		{"NotEmpty", func(t TestingT) bool { return NotEmpty(t, map[int]int{1: 1}) }, func(t TestingT) bool { return NotEmpty(t, 0) }},
		{"Zero", func(t TestingT) bool { return Zero(t, time.Time{}) }, func(t TestingT) bool { return Zero(t, 1) }},
		{"Len", func(t TestingT) bool { return Len(t, "ab", 2) }, func(t TestingT) bool { return Len(t, []int{1}, 2) }},
		{"Contains", func(t TestingT) bool { return Contains(t, []string{"a", "b"}, "b") }, func(t TestingT) bool { return Contains(t, "abc", "d") }},
		{"NotContains", func(t TestingT) bool { return NotContains(t, "abc", "d") }, func(t TestingT) bool { return NotContains(t, map[string]int{"k": 1}, "k") }},
		{"Greater", func(t TestingT) bool { return Greater(t, 2, 1) }, func(t TestingT) bool { return Greater(t, 1, 1) }},
		{"GreaterOrEqual", func(t TestingT) bool { return GreaterOrEqual(t, 1.0, 1.0) }, func(t TestingT) bool { return GreaterOrEqual(t, 1, 2) }},
		{"Less", func(t TestingT) bool { return Less(t, time.Second, time.Minute) }, func(t TestingT) bool { return Less(t, 1, int64(2)) }},
		{"Positive", func(t TestingT) bool { return Positive(t, 3) }, func(t TestingT) bool { return Positive(t, -1) }},
		{"Same", func(t TestingT) bool { return Same(t, &now, &now) }, func(t TestingT) bool { n := now; return Same(t, &now, &n) }},
		{"NoError", func(t TestingT) bool { return NoError(t, nil) }, func(t TestingT) bool { return NoError(t, errA) }},
		{"Error", func(t TestingT) bool { return Error(t, errA) }, func(t TestingT) bool { return Error(t, nil) }},
		{"ErrorIs", func(t TestingT) bool { return ErrorIs(t, wrapped, errA) }, func(t TestingT) bool { return ErrorIs(t, errA, wrapped) }},
		{"ErrorAs", func(t TestingT) bool { _, err := time.Parse("2006", "x"); return ErrorAs(t, err, &target) }, func(t TestingT) bool { return ErrorAs(t, errA, &target) }},
		{"WithinDuration", func(t TestingT) bool { return WithinDuration(t, now, now.Add(time.Second), time.Second) }, func(t TestingT) bool { return WithinDuration(t, now, now.Add(2*time.Second), time.Second) }},
		{"Regexp", func(t TestingT) bool { return Regexp(t, "^a+$", "aaa") }, func(t TestingT) bool { return Regexp(t, "^a+$", "ab") }},
		{"NotPanics", func(t TestingT) bool { return NotPanics(t, func() {}) }, func(t TestingT) bool { return NotPanics(t, func() { panic("x") }) }},
		{"Eventually", func(t TestingT) bool {
			return Eventually(t, func() bool { return true }, time.Second, time.Millisecond)
		}, func(t TestingT) bool {
			return Eventually(t, func() bool { return false }, 5*time.Millisecond, time.Millisecond)
		}},
	}
	for _, c := range cases {
		ok := &fakeT{}
		if !c.pass(ok) || ok.failed != 0 {
			t.Errorf("%s: a true claim failed", c.name)
		}
		bad := &fakeT{}
		if c.fail(bad) || bad.failed != 1 {
			t.Errorf("%s: a false claim passed (%d failures reported)", c.name, bad.failed)
		}
	}
}
