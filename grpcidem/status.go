package grpcidem

import (
	"context"
	"errors"
	"github.com/idemkit/idem/core/problem"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/core"
)

// Code returns the status code a refusal of core.Engine.Call (a
// *core.CallError with this problem) is answered with; the package
// documentation has the table.
func Code(name string) codes.Code {
	switch name {
	case problem.InFlight:
		return codes.Aborted
	case problem.PayloadMismatch:
		return codes.FailedPrecondition
	case problem.NotRetained:
		return codes.AlreadyExists
	case problem.MissingKey, problem.InvalidKey:
		return codes.InvalidArgument
	case problem.ScopeUnavailable:
		return codes.Unauthenticated
	case problem.BodyTooLarge:
		return codes.ResourceExhausted
	case problem.StoreUnavailable:
		return codes.Unavailable
	case problem.Canceled:
		return codes.Canceled
	}
	return codes.Internal // handler-panic, handler-error
}

// statusOf turns Call's error into the call's status: the handler's own
// error as it is, idem's refusals by Code, with a fixed message (never a
// cause, which may hold a panic's stack or a database's words).
func statusOf(ctx context.Context, err error) error {
	var ce *core.CallError
	if !errors.As(err, &ce) {
		return err
	}
	msg := "grpcidem: " + ce.Problem
	if info, ok := problem.Lookup(ce.Problem); ok {
		msg = "grpcidem: " + info.Title
	}
	if ce.Problem == problem.InFlight {
		secs := max(int64(ce.RetryAfter.Seconds()), 1)
		_ = grpc.SetTrailer(ctx, metadata.Pairs(
			RetryAfterTrailer, strconv.FormatInt(secs, 10),
			PushbackTrailer, strconv.FormatInt(secs*1000, 10)))
	}
	return status.Error(Code(ce.Problem), msg)
}
