// Package grpcidemtest is grpcidem's conformance suite, run on every
// store (Run), and the hand-registered test service it uses: no protoc,
// wrapperspb.StringValue in and out.
package grpcidemtest

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Service names of the test service.
const (
	Service = "test.Payments"
	Charge  = "/test.Payments/Charge" // protected
	Lookup  = "/test.Payments/Lookup" // not protected
)

// Handler is the test service's method body.
type Handler func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error)

// Register registers the test service on srv, with charge and lookup as
// its methods' bodies.
func Register(srv *grpc.Server, charge, lookup Handler) {
	method := func(name string, h Handler) grpc.MethodDesc {
		full := "/" + Service + "/" + name
		return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			run := func(ctx context.Context, req any) (any, error) { return h(ctx, req.(*wrapperspb.StringValue)) }
			if ic == nil {
				return run(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, run)
		}}
	}
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: Service,
		HandlerType: (*any)(nil),
		Methods:     []grpc.MethodDesc{method("Charge", charge), method("Lookup", lookup)},
	}, struct{}{})
}

// Serve starts srv on a loopback port, stopped when the test ends, and
// returns its address.
func Serve(t testing.TB, srv *grpc.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return lis.Addr().String()
}

// Dial connects to target (closed when the test ends).
func Dial(t testing.TB, target string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	cc, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}
