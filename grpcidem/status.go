package grpcidem

import (
	"context"
	"errors"
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
func Code(problem string) codes.Code {
	switch problem {
	case core.ProblemInFlight:
		return codes.Aborted
	case core.ProblemPayloadMismatch:
		return codes.FailedPrecondition
	case core.ProblemNotRetained:
		return codes.AlreadyExists
	case core.ProblemMissingKey, core.ProblemInvalidKey:
		return codes.InvalidArgument
	case core.ProblemScopeUnavailable:
		return codes.Unauthenticated
	case core.ProblemBodyTooLarge:
		return codes.ResourceExhausted
	case core.ProblemStoreUnavailable:
		return codes.Unavailable
	case core.ProblemCanceled:
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
	if info, ok := core.LookupProblem(ce.Problem); ok {
		msg = "grpcidem: " + info.Title
	}
	if ce.Problem == core.ProblemInFlight {
		secs := max(int64(ce.RetryAfter.Seconds()), 1)
		_ = grpc.SetTrailer(ctx, metadata.Pairs(
			RetryAfterTrailer, strconv.FormatInt(secs, 10),
			PushbackTrailer, strconv.FormatInt(secs*1000, 10)))
	}
	return status.Error(Code(ce.Problem), msg)
}
