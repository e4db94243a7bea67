package grpcidem_test

import (
	"context"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/grpcidem"
)

func ExampleUnaryServerInterceptor() {
	engine, err := core.New(memstore.New()) // pgstore or mysqlstore across servers
	if err != nil {
		log.Fatal(err)
	}
	ic, err := grpcidem.UnaryServerInterceptor(engine,
		grpcidem.WithMethods("/payments.v1.Payments/Charge"),
		grpcidem.WithScope(func(ctx context.Context) (string, error) {
			return "tenant-from-auth", nil // the authenticated caller, in a real server
		}))
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic))
	_ = srv // register services, then srv.Serve(listener)
}

func ExampleUnaryClientInterceptor() {
	conn, err := grpc.NewClient("localhost:50051",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor()),
		grpc.WithDefaultServiceConfig(`{"methodConfig": [{"name": [{"service": "payments.v1.Payments"}],
			"retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "2s",
			"backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "ABORTED"]}}]}`))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
}
