package grpcidem

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/core"
)

// Metadata keys (gRPC metadata keys are lower case).
const (
	// KeyHeader carries the idempotency key of a call.
	KeyHeader = "idempotency-key"
	// ReplayedHeader, "true" in the response header metadata, marks a
	// replayed response: the engine's core.WithReplayedHeader, lower case;
	// this is its default.
	ReplayedHeader = "idempotent-replayed"
	// RetryAfterTrailer, in the trailer metadata of an Aborted in-flight
	// answer, is the number of seconds after which a retry may find the
	// first call finished (or its owner's lease lapsed).
	RetryAfterTrailer = "retry-after"
	// PushbackTrailer is gRPC's own retry pushback (A6), set with
	// RetryAfterTrailer so that a client's retry policy waits as long.
	PushbackTrailer = "grpc-retry-pushback-ms"
)

// marshal is deterministic so that one request always fingerprints, and
// one response is always stored, the same way.
var marshal = proto.MarshalOptions{Deterministic: true}

// UnaryServerInterceptor protects the unary methods named by WithMethods
// with e: each runs at most once per (scope, key) across the servers
// sharing e's store (core.Engine.Call, named by the method's full name,
// with the marshalled request as input), and a retry gets the stored
// response, byte for byte, with ReplayedHeader set. See the package
// documentation for the status codes of idem's answers. It returns an
// error when no scope is configured (WithScope) and the engine does not
// share one key space.
func UnaryServerInterceptor(e *core.Engine, opts ...Option) (grpc.UnaryServerInterceptor, error) {
	if e == nil {
		return nil, errors.New("grpcidem: engine is nil")
	}
	var cfg config
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := e.CheckScope("grpcidem.WithScope", cfg.scope != nil); err != nil {
		return nil, err
	}
	cfg.replayed = strings.ToLower(e.Policy().ReplayedHeader)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !cfg.methods[info.FullMethod] {
			return handler(ctx, req)
		}
		return serve(ctx, e, &cfg, req, info.FullMethod, handler)
	}, nil
}

func serve(ctx context.Context, e *core.Engine, cfg *config, req any, method string, handler grpc.UnaryHandler) (any, error) {
	keys := metadata.ValueFromIncomingContext(ctx, KeyHeader)
	switch len(keys) {
	case 0:
		return nil, status.Error(codes.InvalidArgument, "grpcidem: the "+KeyHeader+" metadata is required for "+method)
	case 1:
	default:
		return nil, status.Error(codes.InvalidArgument, "grpcidem: several "+KeyHeader+" values")
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "grpcidem: request of %s is %T, not a proto message", method, req)
	}
	input, err := marshal.Marshal(msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "grpcidem: marshal request: %v", err)
	}
	var scope string
	if cfg.scope != nil {
		if scope, err = cfg.scope(ctx); err != nil {
			// Why is logged by the scope function's owner, not told the client.
			return nil, status.Error(codes.Unauthenticated, "grpcidem: the call's tenant could not be determined")
		}
	}
	var resp any
	res, err := e.Call(ctx, core.CallRequest{Scope: scope, Key: keys[0], Name: method, Input: input},
		func(ctx context.Context) ([]byte, error) {
			out, err := handler(ctx, req)
			if err != nil {
				return nil, err
			}
			m, ok := out.(proto.Message)
			if !ok {
				return nil, fmt.Errorf("grpcidem: response of %s is %T, not a proto message", method, out)
			}
			b, err := marshal.Marshal(m)
			if err != nil {
				return nil, fmt.Errorf("grpcidem: marshal response: %w", err)
			}
			resp = out
			return b, nil
		})
	if err != nil {
		return nil, statusOf(ctx, err)
	}
	if !res.Replayed {
		return resp, nil
	}
	// A header that cannot be set (already sent by an outer interceptor)
	// does not make the stored response any less the answer.
	_ = grpc.SetHeader(ctx, metadata.Pairs(cfg.replayed, "true"))
	return &replayed{b: res.Value}, nil
}
