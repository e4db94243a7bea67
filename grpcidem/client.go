package grpcidem

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// UnaryClientInterceptor gives each logical unary call an idempotency key
// (KeyHeader), unless the caller already set one in the outgoing metadata
// (to keep one key across retries of its own, put it there:
// metadata.AppendToOutgoingContext(ctx, grpcidem.KeyHeader, key)).
//
// gRPC's retry policy (the service config's retryPolicy) and transparent
// retries re-send the call below the interceptors, with the same
// metadata: every attempt carries the one key, so the server runs the
// call once. A retry made by calling the method again is a new logical
// call with a new key, unless the caller passes its key as above.
func UnaryClientInterceptor(opts ...ClientOption) grpc.UnaryClientInterceptor {
	cfg := clientConfig{newKey: randomKey}
	for _, o := range opts {
		if o != nil {
			o.applyClient(&cfg)
		}
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if cfg.methods != nil && !cfg.methods[method] {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		if md, ok := metadata.FromOutgoingContext(ctx); !ok || len(md.Get(KeyHeader)) == 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, KeyHeader, cfg.newKey())
		}
		return invoker(ctx, method, req, reply, cc, callOpts...)
	}
}

func randomKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
