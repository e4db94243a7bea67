// Package calltest is the conformance suite of core's Engine.Call, run on
// every store: Run checks the call's guarantees in one process (at most
// one execution under concurrent duplicates, replay, the typed refusals,
// fencing of an owner that lost its lease, steps); Processes checks them
// across processes (duplicates from several processes, and the takeover
// of a key whose owner was SIGKILLed mid-call), by re-executing the test
// binary.
//
// It is used by core's tests (memstore) and by the SQL stores' tests.
package calltest
